"""`imgbuild verify`, the command (`verify`): one container of the image, started through its entrypoint (so sshd
starts) with the run profile's devices and GPUs when the host has them (engine/runprofile.py), the checks of
`imgbuild.checks` run in it through pytest-testinfra, while a second, entrypoint-less container scans the image's own
filesystem for keys (keyscan.py); every container is removed whatever happens (errors, Ctrl-C;
engine/containers.py). `--host local|ssh://USER@HOST` runs the host-level checks on a machine instead, against the
recipe's lock; `--nodes N` goes on to multinode.py.

This is an edge module: it talks to the Docker engine (docker-py) and to containers and hosts (testinfra).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

import imgbuild.verify.gpuchecks  # noqa: F401  (registers the checks that run the image's launch line)
from imgbuild.blocks import runtime_order
from imgbuild.checks import registry
from imgbuild.checks.context import CheckContext
from imgbuild.checks.results import CheckResult
from imgbuild.core import platforms, validate
from imgbuild.core.errors import Interrupted, VerifyError
from imgbuild.core.interrupts import sigint_deferred
from imgbuild.engine import client as engine
from imgbuild.engine import rootfs
from imgbuild.engine.containers import LABEL as LABEL_VERIFY
from imgbuild.engine.containers import Containers
from imgbuild.engine.runprofile import EFA_DEVICE_GLOB, RunSpec, for_engine, host_efa_devices, host_has_gpu, run_spec
from imgbuild.image.manifest import MANIFEST_PATH, Manifest
from imgbuild.verify.keyscan import ImageScan
from imgbuild.verify.report import VerifyReport
from imgbuild.verify.target import Target, image_labels, looks_like_image, names_recipe, resolve_target

READY_TIMEOUT_S = 60.0
# How much longer the waits are for an image of another architecture than the host's, run under QEMU: its entrypoint
# makes sshd's host keys (RSA 3072) in emulation, which took 26-29 s here against 30 s of native wait for sshd.
EMULATION_SLOWDOWN = 5.0


def verify(
    what: str | Target,
    *,
    host: str | None = None,
    devices: Sequence[str] = (),
    expect_efa: bool = False,
    nodes: int = 1,
    workers: int = 8,
    arch: str | None = None,
) -> VerifyReport:
    """Verify RECIPE|IMAGE in one container (or, with `host`, on that machine); then `nodes` >= 2 across nodes. WHAT: a
    recipe's target (`target_for_recipe`, from the lock the command read) or a name `resolve_target` looks up.
    `arch` (--platform linux/arm64): which of the recipe's architectures, its image `identity.of(resolved).ref(arch)`;
    another architecture than this machine's runs under QEMU (binfmt_misc), through the same checks."""
    if nodes < 1:
        raise VerifyError(f"--nodes must be at least 1, got {nodes}")
    if host and nodes > 1:
        raise VerifyError("--nodes runs containers: it cannot be combined with --host")
    start = time.monotonic()
    timings: dict[str, float] = {}
    try:
        if host:
            report = _verify_host(what, host, expect_efa=expect_efa, workers=workers, timings=timings, arch=arch)
        else:
            report = _verify_container(what, devices=devices, expect_efa=expect_efa, nodes=nodes, workers=workers,
                                       timings=timings, arch=arch)  # fmt: skip
    except KeyboardInterrupt:
        raise Interrupted("interrupted: the verification's containers were removed") from None
    timings["total_s"] = round(time.monotonic() - start, 3)
    return report


_SSH_HOST_RE = re.compile(r"ssh://(?:(?P<user>[^@/]*)@)?(?P<host>\[[^\]/]*\]|[^:/@\[\]]*)(?::(?P<port>\d{1,5}))?")


def host_spec(host: str) -> str:
    """--host value -> testinfra host spec: 'local' -> local://, ssh://[USER@]HOST[:PORT] as is. The user and the
    host are checked by their grammars (validate.user_name, validate.host): testinfra hands them to ssh with no `--`
    before them, so neither may start with '-' (`ssh://-oProxyCommand=...` would be an option of ssh)."""
    if host in ("local", "local://"):
        return "local://"
    expected = "expected 'local' or ssh://[USER@]HOST[:PORT]"
    m = _SSH_HOST_RE.fullmatch(host)
    if m is None:
        raise VerifyError(f"--host {validate.shown(host)}: {expected}")
    try:
        validate.argument(m["host"], "--host")
        validate.host(m["host"].strip("[]"))
        if m["user"] is not None and ":" in m["user"]:
            raise ValueError("it holds a password (USER:PASSWORD@), which is not repeated; ssh logs in with keys")
        if m["user"] is not None:
            validate.user_name(validate.argument(m["user"], "--host"))
        if m["port"] is not None and not 1 <= int(m["port"]) <= 65535:
            raise ValueError(f"expected a port 1-65535, got {m['port']}")
    except ValueError as exc:
        raise VerifyError(f"--host {validate.shown(host)}: {expected}: {exc}") from None
    return host


def _verify_host(
    what: str | Target, host: str, *, expect_efa: bool, workers: int, timings: dict[str, float], arch: str | None = None
) -> VerifyReport:
    import testinfra

    spec = host_spec(host)
    t = time.monotonic()
    target = what if isinstance(what, Target) else None
    client = None
    if target is None and looks_like_image(str(what)):
        client = engine.connect()
    try:
        target = target or resolve_target(str(what), client, arch)
    finally:
        if client is not None:
            client.close()
    if target.resolved is None or target.expected_manifest is None:
        raise VerifyError(f"{target.ref}: --host checks need a recipe with a lock ({target.note})")
    timings["resolve_s"] = round(time.monotonic() - t, 3)
    th = testinfra.get_host(spec)
    if spec != "local://":
        _reach(th, spec)
    probe = CheckContext(host=th, scope="host", components={})
    # The host's Python: this interpreter on local:// (a DLAMI's torch lives in it), python3 over ssh.
    python = sys.executable if spec == "local://" else "python3"
    found_manifest = _host_manifest(probe)
    gpu_run = probe.run("command -v nvidia-smi >/dev/null 2>&1 || test -e /dev/nvidia0")
    efa = probe.run(f"ls {EFA_DEVICE_GLOB} 2>/dev/null")
    ctx = CheckContext(
        host=th,
        scope="host",
        components=target.expected_manifest.components,
        manifest=found_manifest,
        expected_manifest=target.expected_manifest.as_data(),
        manifest_note=target.note,
        python=python,
        efa_devices=tuple(efa.out.split()),
        expect_efa=expect_efa,
        gpu=gpu_run.ok,
        gpu_reason="no GPU on this host (no nvidia-smi, no /dev/nvidia0)",
        machine=platforms.MACHINE.get(str(found_manifest.get("arch", platforms.DEFAULT_ARCH)))
        if found_manifest
        else None,
    )
    t = time.monotonic()
    selected = registry.selected(ctx.components, "host", runtime_order())
    results = registry.run_checks(ctx, selected, workers=workers)
    timings["checks_s"] = round(time.monotonic() - t, 3)
    return VerifyReport(target.ref, target.image, target.recipe, spec, target.note, results, timings)


def _reach(th: Any, spec: str) -> None:
    """The ssh host answers a command; else VerifyError (exit 11) naming it and ssh's own words (testinfra raises
    RuntimeError for ssh's exit 255: the connection, not the command, failed)."""
    try:
        th.run("true")
    except RuntimeError as exc:
        result = exc.args[0] if exc.args else None
        said = str(getattr(result, "stderr", "") or exc).strip().splitlines()
        raise VerifyError(
            f"--host {validate.shown(spec)}: ssh could not reach the host: {validate.shown(said[-1] if said else '')}",
            hint="check the name, the port (ssh://USER@HOST:PORT), that the host runs sshd and accepts your key",
        ) from None


def _host_manifest(ctx: CheckContext) -> dict[str, Any] | None:
    ran = ctx.run(f"cat {MANIFEST_PATH}")
    if not ran.ok:
        return None
    try:
        data = json.loads(ran.out)
    except json.JSONDecodeError:
        return {"unreadable": ran.out[:200]}
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------------------------------------------
# One container


@dataclass(frozen=True)
class RunOptions:
    """How the verification container is started, and what that means for the checks."""

    spec: RunSpec
    efa_devices: tuple[str, ...]  # the EFA devices among spec.devices (paths inside the container)
    gpu: bool
    gpu_reason: str
    notes: tuple[str, ...] = ()


def run_options(
    manifest: Manifest, extra_devices: Sequence[str], runtimes: Sequence[str], *, has_gpu: bool | None = None
) -> RunOptions:
    """The image's run profile (`runprofile.run_spec`) with --device, for this engine and host (network: the
    engine's default, so a verification never takes the host's ports)."""
    efa = host_efa_devices() if manifest.runtime.efa_devices else []
    spec = run_spec(manifest.runtime, efa, extra_devices)
    if has_gpu is None:
        has_gpu = host_has_gpu()
    spec, notes = for_engine(spec, runtimes=runtimes, has_gpu=has_gpu)
    if manifest.runtime.efa_devices and not efa:
        notes.append("the recipe uses EFA devices; this host has none")
    wants_gpu = manifest.platform.accelerator == "nvidia" or bool(manifest.runtime.gpus)
    gpu = wants_gpu and has_gpu
    reason = "" if gpu else "no GPU on this host (/dev/nvidia0)" if wants_gpu else "the recipe is not for NVIDIA GPUs"
    efa_inside = tuple(d for d in spec.devices_inside if d.startswith("/dev/infiniband/uverbs"))
    return RunOptions(spec, efa_inside, gpu, reason, tuple(notes))


def runs_sleep(command: str) -> bool:
    """Whether a process's command line (`docker top`'s CMD) is `sleep ...`: under QEMU (binfmt_misc with the P flag)
    it is the interpreter's, `/usr/libexec/qemu-binfmt/aarch64-binfmt-P /usr/bin/sleep sleep infinity`."""
    words = command.split()
    if words and ("qemu" in words[0] or "binfmt" in words[0]):
        words = words[1:]
    return bool(words) and words[0].rsplit("/", 1)[-1].startswith("sleep")


def _wait_ready(client: docker.DockerClient, cid: str, timeout_s: float = READY_TIMEOUT_S) -> str | None:
    """Wait until the entrypoint has exec'd the command (PID 1 is `sleep`); None when it runs, else why it exited.

    A container still running after `timeout_s` whose entrypoint never exec'd counts as running: check it anyway.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.api.inspect_container(cid)
        state = info.get("State") or {}
        if not state.get("Running"):
            logs = client.api.logs(cid, stdout=True, stderr=True, tail=20).decode("utf-8", "replace").strip()
            return f"the container exited ({state.get('ExitCode')}): {logs[-600:] or 'no output'}"
        try:
            procs = client.api.top(cid).get("Processes") or []
        except docker.errors.APIError:
            procs = []
        if procs and runs_sleep(procs[0][-1]):
            return None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def image_manifest(containers: Containers, target: Target) -> Manifest | None:
    """The image's /etc/imgbuild/manifest.json (None when it has none; a `VerifyError` when it is not valid)."""
    assert target.image is not None
    raw = containers.read_image_file(target.image, MANIFEST_PATH)
    return None if raw is None else Manifest.parse(raw, target.image)


def _verify_container(
    what: str | Target,
    *,
    devices: Sequence[str],
    expect_efa: bool,
    nodes: int,
    workers: int,
    timings: dict[str, float],
    arch: str | None = None,
) -> VerifyReport:
    import testinfra

    t = time.monotonic()
    named: Target | None = None  # a recipe's target, its lock read before the engine: none is exit 4 either way
    if isinstance(what, Target):
        named = what
    elif names_recipe(what):
        named = resolve_target(what, None, arch)
    if shutil.which("docker") is None:
        raise VerifyError("the docker command line is not installed (testinfra runs `docker exec`)",
                          hint=engine.SETUP_HINT)  # fmt: skip
    client = engine.connect()
    containers = Containers(client)
    try:
        target = named or resolve_target(str(what), client, arch)
        assert target.image is not None
        if image_labels(client, target.image) is None:
            hint = f"imgbuild build {target.ref}" if target.kind == "recipe" else None
            if hint and arch is not None:
                hint += f" --platform {platforms.docker_platform(arch)}"
            raise VerifyError(f"image {target.image} is not in the engine", hint=hint)
        timings["resolve_s"] = round(time.monotonic() - t, 3)

        t = time.monotonic()
        manifest = image_manifest(containers, target)
        timings["manifest_read_s"] = round(time.monotonic() - t, 3)
        # What to check and how to start: the image's manifest; an image without one (not built by imgbuild,
        # or its manifest deleted) is checked against the lock, and fails the `manifest` check.
        profile = manifest or target.expected_manifest
        if profile is None:
            raise VerifyError(f"{target.image} has no {MANIFEST_PATH} and no lock to compare with ({target.note})")
        if problem := rootfs.emulation_problem(profile.arch):
            raise VerifyError(f"cannot run {target.image}: {problem}", hint=rootfs.emulation_hint(profile.arch))
        runtimes = list((client.info().get("Runtimes") or {}).keys())
        opts = run_options(profile, devices, runtimes)

        scan = ImageScan(containers, target.image)
        scan.start()

        t = time.monotonic()
        try:
            container, spec, memlock_note = containers.start(target.image, ["sleep", "infinity"], "main", opts.spec)
        except docker.errors.APIError as exc:
            raise VerifyError(f"cannot start a container of {target.image}: {engine.reason(exc)}") from exc
        slowdown = 1.0 if profile.arch == rootfs.host_arch() else EMULATION_SLOWDOWN
        not_ready = _wait_ready(client, container.id, READY_TIMEOUT_S * slowdown)
        timings["container_start_s"] = round(time.monotonic() - t, 3)

        components = profile.components
        ctx = CheckContext(
            host=testinfra.get_host(f"docker://{container.id}"),
            scope="container",
            components=components,
            manifest=manifest.as_data() if manifest is not None else None,
            expected_manifest=target.expected_manifest.as_data() if target.expected_manifest is not None else None,
            manifest_note=target.note,
            python=profile.python,
            devices=spec.devices_inside,
            efa_devices=opts.efa_devices,
            expect_efa=expect_efa,
            gpu=opts.gpu,
            gpu_reason=opts.gpu_reason,
            image_scan=scan.result,
            machine=platforms.MACHINE[profile.arch],
        )
        t = time.monotonic()
        selected = registry.selected(components, "container", runtime_order())
        if not_ready:
            results = [CheckResult("container-start", "fail", "running", "exited", not_ready, component="image")]
            static = [c for c in selected if c.name in ("manifest", "no-keys-in-image")]
            results += registry.run_checks(ctx, static, workers=workers)
            results += [CheckResult(c.name, "skip", reason="the container did not start", component=c.components[0])
                        for c in selected if c not in static]  # fmt: skip
        else:
            results = registry.run_checks(ctx, selected, workers=workers)
        timings["checks_s"] = round(time.monotonic() - t, 3)
        scan.result()
        timings["image_scan_s"] = scan.duration_s
    finally:
        t = time.monotonic()
        with sigint_deferred("the verification's containers"):
            left = containers.remove_all()
            client.close()
        timings["cleanup_s"] = round(time.monotonic() - t, 3)
    if left:
        raise VerifyError(f"could not remove {', '.join(left)} (labelled {LABEL_VERIFY}={containers.run_id})")

    if nodes > 1:
        t = time.monotonic()
        if manifest is None:
            results.append(CheckResult("multinode", "fail", f"{nodes} nodes", "not run",
                                       f"the image has no {MANIFEST_PATH}: its mpirun line is unknown",
                                       component="multinode"))  # fmt: skip
        else:
            import imgbuild.verify.multinode as multinode

            results += multinode.run_multinode(target.image, manifest, nodes, slowdown=slowdown)
        timings["multinode_s"] = round(time.monotonic() - t, 3)
    notes = "; ".join(n for n in (target.note, *opts.notes, memlock_note or "") if n)
    return VerifyReport(target.ref, target.image, target.recipe, "container", notes, results, timings)
