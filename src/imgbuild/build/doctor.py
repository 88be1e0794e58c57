"""`imgbuild doctor`: what this machine has and lacks for the recipes a user wants to build.

`run_checks()` never raises: an unreachable engine is one failing check and everything that does not need
the engine is still reported. The builder check says which builder `imgbuild build` will use and why
(`builders.select`), and which docker CLIs it skipped; no usable builder fails doctor like an unreachable engine.
The caller says which recipes need which base images and container runtimes;
`failed()` then picks the checks that stop the wanted recipes.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from imgbuild.engine.rootfs import can_bootstrap

Status = Literal["ok", "missing", "warn", "info"]

LOW_DISK_BYTES = 30 * 1024**3  # a CUDA training image and its build cache take tens of GB
ENGINE_CHECK = "engine"
BUILDER_CHECK = "builder"
DRIVER_CHECK = "host driver"
IMEX_CHECK = "imex channels"
ENGINE_HINT = (
    "install and start a Docker engine, or set DOCKER_HOST to one that answers; "
    "from a checkout of imgbuild, scripts/setup.sh does the first"
)

RUNTIME_HINTS = {
    "nvidia": "install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker`",
    "habana": "install habanalabs-container-runtime and register it in /etc/docker/daemon.json",
}
# device check name -> (glob, what it is, runtime whose recipes need it)
DEVICES = {
    "device efa": ("/dev/infiniband/uverbs*", "EFA/InfiniBand verbs devices", None),
    "device gaudi": ("/dev/accel*", "Gaudi accelerators", "habana"),
    "device nvidia-gpu": ("/dev/nvidia[0-9]*", "NVIDIA GPUs", "nvidia"),
}


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    needed_by: tuple[str, ...] = ()
    data: dict[str, Any] | None = None  # more for --json (the builder check's `builders.Builder.to_json`)


def _default_client() -> Any:
    from imgbuild.engine import client as engine

    return engine.new_client(timeout=15)


def _builder_checks(select: Callable[[], Any]) -> list[Check]:
    """The builder `imgbuild build` will use and why, then one info row per docker CLI it skipped."""
    from imgbuild.build.builders import NoBuilder, Skipped
    from imgbuild.core.errors import EngineError

    skipped: tuple[Skipped, ...]
    try:
        chosen = select()
    except EngineError as exc:
        skipped = exc.skipped if isinstance(exc, NoBuilder) else ()
        data = {
            "kind": None,
            "error": exc.message,
            "hint": exc.hint,
            "skipped": [{"cli": s.cli, "version": s.version, "reason": s.reason} for s in skipped],
        }
        detail = exc.message + (f" ({exc.hint})" if exc.hint else "")
        checks = [Check(BUILDER_CHECK, "missing", detail, data=data)]
    else:
        skipped = chosen.skipped
        detail = f"{chosen.describe()}: {chosen.why}"
        checks = [Check(BUILDER_CHECK, "ok", detail, data=chosen.to_json())]
    for s in skipped:
        version = f" {s.version}" if s.version else ""
        checks.append(Check(f"docker CLI {s.cli}", "info", f"skipped{version}: {s.reason}"))
    return checks


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB"


def _short_reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    for needle, reason in (
        ("Connection refused", "connection refused"),
        ("No such file or directory", "socket not found"),
        ("Permission denied", "permission denied on the socket"),
        ("timed out", "timed out"),
        ("Name or service not known", "host name not found"),
    ):
        if needle in text:
            return reason
    return text.splitlines()[0][:160]


def _engine_checks(client_factory: Callable[[], Any]) -> tuple[Any | None, dict[str, Any], list[Check]]:
    """(client or None, docker info, checks) for the engine and its disk."""
    try:
        client = client_factory()
        version = client.version()
        info = client.info()
    except Exception as exc:  # docker-py raises DockerException, requests errors, or plain OSError
        from imgbuild.core.validate import redact
        from imgbuild.engine import client as engine

        malformed = engine.malformed_host(exc)  # a DOCKER_HOST that is no address: named with the forms it takes
        if malformed is not None:
            detail = malformed.message + (f" ({malformed.hint})" if malformed.hint else "")
            return None, {}, [Check(ENGINE_CHECK, "missing", detail)]
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        detail = f"no Docker engine answers at {host}: {_short_reason(exc)}"
        return None, {}, [Check(ENGINE_CHECK, "missing", redact(f"{detail} ({ENGINE_HINT})"))]
    driver = info.get("Driver", "?")
    checks = [
        Check(
            ENGINE_CHECK,
            "ok",
            f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')}), "
            f"storage driver {driver}, {info.get('NCPU', '?')} CPUs, {_gib(info.get('MemTotal', 0))} memory",
        )
    ]
    if driver == "vfs":
        checks.append(Check("storage driver", "warn", "vfs copies every layer in full: slow and disk-hungry"))
    root_dir = info.get("DockerRootDir") or ""
    base_url = str(getattr(getattr(client, "api", None), "base_url", ""))
    local = base_url.startswith("http+docker://") and bool(root_dir) and os.path.isdir(root_dir)
    if local:
        usage = shutil.disk_usage(root_dir)
        status: Status = "ok" if usage.free >= LOW_DISK_BYTES else "warn"
        detail = f"{_gib(usage.free)} free of {_gib(usage.total)} at {root_dir}"
        if status == "warn":
            detail += f" (under {_gib(LOW_DISK_BYTES)}: GPU images may not fit)"
        checks.append(Check("disk", status, detail))
    else:
        checks.append(Check("disk", "info", f"engine is remote or its root dir {root_dir or '?'} is not visible"))
    return client, info, checks


def _base_image_checks(client: Any | None, base_images: Mapping[str, Iterable[str]]) -> list[Check]:
    checks: list[Check] = []
    for name, recipes in sorted(base_images.items()):
        needers = tuple(sorted(set(recipes)))
        label = f"base image {name}"
        if client is None:
            checks.append(Check(label, "warn", "unknown: the engine cannot be reached", needers))
            continue
        try:
            image = client.images.get(name)
        except Exception as exc:
            import docker.errors

            if not isinstance(exc, docker.errors.ImageNotFound):
                checks.append(Check(label, "warn", f"could not look it up: {exc}", needers))
                continue
            hint = f"imgbuild base bootstrap {name}" if can_bootstrap(name) else f"docker pull {name}"
            checks.append(Check(label, "missing", hint, needers))
            continue
        size = image.attrs.get("Size", 0)
        checks.append(Check(label, "ok", f"{image.short_id.removeprefix('sha256:')} ({size / 1e6:.0f} MB)", needers))
    return checks


def _debootstrap_check(checks: list[Check]) -> Check:
    needers = sorted(
        {
            r
            for c in checks
            if c.status == "missing" and c.detail.startswith("imgbuild base bootstrap")
            for r in c.needed_by
        }
    )
    path = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap") else None)
    if path:
        return Check("debootstrap", "ok", path)
    if needers:
        return Check(
            "debootstrap",
            "missing",
            "apt-get install debootstrap (needed to bootstrap base images)",
            tuple(needers),
        )
    return Check("debootstrap", "info", "not installed (only needed by `imgbuild base bootstrap`)")


def _runtime_checks(info: dict[str, Any] | None, runtimes_needed: Mapping[str, Iterable[str]]) -> list[Check]:
    checks: list[Check] = []
    have = set((info or {}).get("Runtimes") or {})
    default = (info or {}).get("DefaultRuntime", "runc")
    for runtime in sorted({"nvidia", "habana", *runtimes_needed}):
        needers = tuple(sorted(set(runtimes_needed.get(runtime, ()))))
        label = f"runtime {runtime}"
        if info is None:
            checks.append(Check(label, "warn", "unknown: the engine cannot be reached", needers))
        elif runtime in have:
            extra = " (default runtime)" if runtime == default else ""
            checks.append(Check(label, "ok", f"registered with the engine{extra}", needers))
        else:
            hint = RUNTIME_HINTS.get(runtime, f"register runtime {runtime!r} with the engine")
            status: Status = "missing" if needers else "info"
            checks.append(Check(label, status, f"not registered: {hint}", needers))
    return checks


def _device_checks(
    runtimes_needed: Mapping[str, Iterable[str]], devices_needed: Mapping[str, Iterable[str]]
) -> list[Check]:
    checks: list[Check] = []
    for label, (pattern, what, runtime) in DEVICES.items():
        key = label.removeprefix("device ")
        needers_set = set(devices_needed.get(key, ()))
        if runtime is not None and key not in devices_needed:
            needers_set |= set(runtimes_needed.get(runtime, ()))
        needers = tuple(sorted(needers_set))
        found = sorted(glob.glob(pattern))
        if found:
            shown = ", ".join(found[:4]) + (f" (+{len(found) - 4})" if len(found) > 4 else "")
            checks.append(Check(label, "info" if not needers else "ok", f"{len(found)} {what}: {shown}", needers))
        else:
            status: Status = "missing" if needers else "info"
            checks.append(Check(label, status, f"no {what} ({pattern})", needers))
    return checks


def _platform_checks(platforms_needed: Mapping[str, Iterable[str]]) -> list[Check]:
    """One row per architecture of another machine than this one that recipes list (platform.arch): whether QEMU
    runs its binaries here (binfmt_misc). A warning, not a failure, when it does not: the recipe's first architecture
    still builds; `imgbuild build --platform` for that one stops with the same hint."""
    from imgbuild.core import platforms
    from imgbuild.engine import rootfs

    checks = []
    for arch, recipes in sorted(platforms_needed.items()):
        if arch == rootfs.host_arch():
            continue
        label, needers = f"emulation linux/{arch}", tuple(sorted(set(recipes)))
        problem = rootfs.emulation_problem(arch)
        if problem is None:
            entry = rootfs.BINFMT_DIR / f"qemu-{platforms.MACHINE[arch]}"
            checks.append(Check(label, "ok", f"QEMU through {entry} (build and run --platform linux/{arch})", needers))
        else:
            checks.append(Check(label, "warn", f"{problem}: {rootfs.emulation_hint(arch)}", needers))
    return checks


def images_of(groups: Iterable[tuple[Any, tuple[str, ...]]]) -> list[dict[str, Any]]:
    """doctor --json's `driver.images`: each finding with the recipes it is for."""
    return [{**f.to_json(), "recipes": list(r)} for f, r in groups]


def _driver_check(cuda_needed: Mapping[str, Iterable[str]], read_driver: Callable[[], str]) -> Check:
    """The host's NVIDIA driver against the CUDA of each wanted recipe's image (blocks.cuda.driver, NVIDIA's table): ok,
    behind (missing for the recipes whose CUDA needs a newer one, with what to do), or no driver here (info: a build
    host needs none). `data` is doctor --json's `driver`."""
    from imgbuild.blocks.cuda import driver

    printed = read_driver()
    read = driver.parse(printed)
    groups = [(driver.judge(read, cuda, printed), tuple(sorted(set(r)))) for cuda, r in sorted(cuda_needed.items())]
    version, source = read if read is not None else (None, None)
    if version is None and (why := driver.unreadable(printed)) is not None:
        data = {"status": "unknown", "version": None, "source": None, "images": images_of(groups), "printed": why}
        return Check(DRIVER_CHECK, "warn", f"NVIDIA driver not read: {why}", data=data)
    images = images_of(groups)
    behind = [(f, r) for f, r in groups if f.status == "behind"]
    unknown = [f"{', '.join(r)}: {f.advice}" for f, r in groups if f.status == "unknown"]
    if version is None:
        floors = "; ".join(f"CUDA {f.cuda} ({', '.join(r)}) needs >= {f.needs}" for f, r in groups if f.needs)
        detail = f"no NVIDIA driver here (no nvidia-smi answer, no {driver.PROC_VERSION}): only GPU hosts need one"
        data = {"status": "no driver", "version": None, "source": None, "images": images}
        return Check(DRIVER_CHECK, "info", detail + (f"; {floors}" if floors else ""), data=data)
    head = f"NVIDIA driver {version} ({source})"
    if behind:
        needers = tuple(sorted({n for _, r in behind for n in r}))
        parts = [f"{', '.join(r)} (CUDA {f.cuda}): {f.advice}" for f, r in behind] + unknown
        data = {"status": "behind", "version": version, "source": source, "images": images}
        return Check(DRIVER_CHECK, "missing", f"{head}: " + "; ".join(parts), needers, data=data)
    fine = [f"CUDA {f.cuda} ({', '.join(r)}, needs >= {f.needs})" for f, r in groups if f.status == "ok"]
    parts = ([f"runs {', '.join(fine)}"] if fine else ["no recipe checked for needs CUDA"]) + unknown
    data = {"status": "ok", "version": version, "source": source, "images": images}
    return Check(DRIVER_CHECK, "ok" if fine else "info", f"{head}: " + "; ".join(parts), data=data)


def _imex_check(imex_needed: Iterable[str]) -> Check:
    """The host's IMEX channels: what NVLink across nodes (GB200 NVL72 across trays) needs, created per job (info
    either way: a build or login host has none, and a job's nodes get them when it starts)."""
    from imgbuild.blocks.cuda.driver import IMEX_CHANNEL_DIR, IMEX_CHANNEL_GLOB

    needers = tuple(sorted(set(imex_needed)))
    found = sorted(glob.glob(IMEX_CHANNEL_GLOB))
    if found:
        shown = ", ".join(found[:4]) + (f" (+{len(found) - 4})" if len(found) > 4 else "")
        detail = f"{len(found)} IMEX channel(s): {shown}: `imgbuild run` and verify pass them to GPU containers"
        return Check(IMEX_CHECK, "info", detail, needers)
    detail = (
        f"no IMEX channel ({IMEX_CHANNEL_DIR}/channelN): only NVLink across nodes needs one (GB200 NVL72 across trays; "
        "without it CUDA calls across trays fail with 'insufficient permission'). IMEX is set up per job: on "
        "Slurm (AWS PCS) a job prolog starts the IMEX daemon for the job's nodes and makes the channel; on EKS the "
        "ComputeDomain of NVIDIA's DRA driver does"
    )
    return Check(IMEX_CHECK, "info", detail, needers)


def run_checks(
    *,
    base_images: Mapping[str, Iterable[str]],
    runtimes_needed: Mapping[str, Iterable[str]],
    client_factory: Callable[[], Any] = _default_client,
    devices_needed: Mapping[str, Iterable[str]] | None = None,
    builder_select: Callable[[], Any] | None = None,
    platforms_needed: Mapping[str, Iterable[str]] | None = None,
    cuda_needed: Mapping[str, Iterable[str]] | None = None,
    imex_needed: Iterable[str] = (),
    read_driver: Callable[[], str] | None = None,
) -> list[Check]:
    """Everything doctor reports, in display order. Never raises.

    `devices_needed` (keys "efa", "gaudi", "nvidia-gpu") overrides who needs a device; by default GPU
    devices are needed by the recipes needing the nvidia runtime, Gaudi devices by those needing habana.
    `platforms_needed` (architecture -> recipes listing it): a row for each one this machine emulates.
    `cuda_needed` (the CUDA of an image -> its recipes): the host driver row judges the driver `read_driver` returns
    (default: nvidia-smi, else /proc/driver/nvidia/version, blocks.cuda.driver.read_here) against each.
    `imex_needed`: the recipes whose jobs span an NVLink domain (the IMEX row names them).
    """
    from imgbuild.blocks.cuda import driver
    from imgbuild.build import builders

    client, info, checks = _engine_checks(client_factory)
    checks += _builder_checks(builder_select or builders.select)
    checks += _base_image_checks(client, base_images)
    checks.append(_debootstrap_check(checks))
    checks += _runtime_checks(info if client is not None else None, runtimes_needed)
    checks += _device_checks(runtimes_needed, devices_needed or {})
    checks += _platform_checks(platforms_needed or {})
    checks.append(_driver_check(cuda_needed or {}, read_driver or driver.read_here))
    checks.append(_imex_check(imex_needed))
    if client is not None:
        with contextlib.suppress(Exception):
            client.close()
    return [_redacted(c) for c in checks]


def _redacted(check: Check) -> Check:
    """The check with any credential in what it says redacted (a DOCKER_HOST or registry URL a docker CLI echoes)."""
    import dataclasses
    import json

    from imgbuild.core.validate import redact

    data = None if check.data is None else json.loads(redact(json.dumps(check.data)))
    return dataclasses.replace(check, detail=redact(check.detail), data=data)


STATUS_STYLE = {"ok": "green", "missing": "bold red", "warn": "yellow", "info": "dim"}


def render_table(checks: Iterable[Check], console: Any) -> None:
    """Print the checks as a rich table: check, status, detail, needed by."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="imgbuild doctor", show_lines=False)
    table.add_column("check", overflow="fold", max_width=48)
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    table.add_column("needed by", overflow="fold")
    for c in checks:
        table.add_row(
            c.name,
            Text(c.status, style=STATUS_STYLE.get(c.status, "")),
            Text(c.detail),
            Text(", ".join(c.needed_by)),
        )
    console.print(table)


def to_json(checks: Iterable[Check], bad: Iterable[Check], recipes: Iterable[str]) -> dict[str, Any]:
    """`imgbuild doctor --json`: the recipes checked for, every check as the table shows it (name, status, detail,
    needed_by), `failed`, the names of the checks that stop them (non-empty: exit 13), and `builder`: the builder
    `imgbuild build` will use (kind, cli, cli_version, name, driver, registry_cache, why, skipped), or, when there
    is none, kind null with the error, the hint and the skipped CLIs; `driver`: the host's NVIDIA driver (status ok,
    behind or "no driver"; version; source: nvidia-smi or /proc/driver/nvidia/version; images: per CUDA of the
    recipes, the driver it needs, that image's status, what to do, and its recipes)."""
    bad_names = [c.name for c in bad]
    checks = list(checks)
    return {
        "recipes": list(recipes),
        "ok": not bad_names,
        "failed": bad_names,
        "builder": next((c.data for c in checks if c.name == BUILDER_CHECK), None),
        "driver": next((c.data for c in checks if c.name == DRIVER_CHECK), None),
        "checks": [
            {"name": c.name, "status": c.status, "detail": c.detail, "needed_by": list(c.needed_by)} for c in checks
        ],
    }


def failed(checks: Iterable[Check], wanted_recipes: set[str] | None) -> list[Check]:
    """The checks that stop a wanted recipe (any recipe when None); an unreachable engine or no builder always
    does."""
    out = []
    for c in checks:
        if c.status != "missing":
            continue
        if c.name in (ENGINE_CHECK, BUILDER_CHECK) or (
            c.needed_by and (wanted_recipes is None or wanted_recipes.intersection(c.needed_by))
        ):
            out.append(c)
    return out
