"""The checks `imgbuild verify` runs, each contributed by the component it verifies.

A check is a function of a `CheckContext`: the machine to look at (anything with testinfra's
`run(command) -> result with rc/stdout/stderr`: a container, this host, an ssh host, or a fake in tests), the
components expected there (from the recipe's lock, else from the image's manifest) and what the run passed in
(devices, GPUs). `REGISTRY` maps a component name to its checks (each component's module registers its own
with `@check`); only the checks of components the image holds run, plus those registered here under "image"
(the manifest, keys, environment) and "platform" (GPUs), which run everywhere. Checks that only make sense for
an image (sshd, SageMaker, keys...) have the "container" scope; `--host` runs the "host" scope against a
machine with no container at all.

This module does not import docker or testinfra: `imgbuild.verify` connects, this module only asks questions.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from imgbuild.checks.results import CheckResult, Status
from imgbuild.core.paths import MANIFEST_PATH

if TYPE_CHECKING:
    from imgbuild.blocks import Pin

Scope = Literal["container", "host"]
BOTH: tuple[Scope, ...] = ("container", "host")
CONTAINER: tuple[Scope, ...] = ("container",)

SECRETS_DIR = "/run/secrets"  # where BuildKit mounts build secrets (dockerfile.CA_SECRET_PATH is one of them)
LEGACY_CA_DIR = "/usr/local/share/ca-certificates/imgbuild"  # where builds before BuildKit's secrets put the bundle
COMMAND_TIMEOUT_S = 60


# --------------------------------------------------------------------------------------------------------------
# What checks look at


class CommandOutput(Protocol):
    rc: int

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class Host(Protocol):
    """testinfra's Host, as far as checks use it."""

    def run(self, command: str, *args: str) -> CommandOutput: ...


@dataclass(frozen=True)
class Ran:
    """One command's outcome."""

    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self) -> str:
        """The end of stderr (or stdout) to explain a failure."""
        text = (self.err.strip() or self.out.strip() or f"exit status {self.rc}").splitlines()
        return " | ".join(text[-3:])[:300]


@dataclass(frozen=True)
class ImageScan:
    """Key material found in the image's own filesystem (a container whose entrypoint did not run)."""

    files: tuple[str, ...] = ()
    error: str | None = None


@dataclass
class CheckContext:
    """Everything a check may look at.

    components: the expected pins by component, with their typed details (the lock's when there is one).
    manifest: the manifest found in the image / on the host (None when there is none).
    expected_manifest: the manifest the lock renders (None without a lock).
    """

    host: Host
    scope: Scope
    components: Mapping[str, Pin]
    manifest: dict[str, Any] | None = None
    expected_manifest: dict[str, Any] | None = None
    manifest_note: str = ""
    python: str = "python3"
    devices: tuple[str, ...] = ()  # device paths as the container (or host) sees them
    efa_devices: tuple[str, ...] = ()  # the EFA uverbs devices among them
    expect_efa: bool = False
    gpu: bool = False
    gpu_reason: str = "no GPU"
    image_scan: Callable[[], ImageScan] | None = None
    # What `uname -m` must say (x86_64, aarch64): the machine of the manifest's architecture, which the caller
    # looks up (core.platforms.MACHINE); None where no manifest says which.
    machine: str | None = None
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _key_locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)

    def run(self, command: str, *, timeout_s: int | None = COMMAND_TIMEOUT_S) -> Ran:
        """Run a shell command on the target (bounded by `timeout` when the target has it)."""
        if timeout_s:
            command = (
                f"if command -v timeout >/dev/null 2>&1; then timeout {timeout_s} /bin/sh -c {shlex.quote(command)}; "
                f"else /bin/sh -c {shlex.quote(command)}; fi"
            )
        result = self.host.run(command)
        return Ran(int(result.rc), _text(result.stdout), _text(result.stderr))

    def python_json(self, code: str, *args: str, timeout_s: int = COMMAND_TIMEOUT_S) -> tuple[Any, Ran]:
        """Run a Python snippet on the target that prints one JSON document; (the document or None, the run)."""
        cmd = " ".join(shlex.quote(a) for a in (self.python, "-c", code, *args))
        ran = self.run(cmd, timeout_s=timeout_s)
        lines = [line for line in ran.out.splitlines() if line.startswith(("{", "["))]
        try:
            return (json.loads(lines[-1]) if lines and ran.ok else None), ran
        except json.JSONDecodeError:
            return None, ran

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """Compute a probe once per verification, however many checks (in threads) ask for it."""
        with self._memo_lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._memo:
                self._memo[key] = compute()
            return self._memo[key]

    def has(self, component: str) -> bool:
        return component in self.components

    def version(self, component: str) -> str | None:
        pin = self.components.get(component)
        return str(pin.version) if pin is not None and pin.version else None

    def details(self, component: str) -> Any:
        """The component's typed pin details (None when it is not expected here)."""
        pin = self.components.get(component)
        return pin.details if pin is not None else None

    def prefix(self, component: str) -> str | None:
        """Where the component is installed (its pin's prefix; None: absent or in the system's paths)."""
        details = self.details(component)
        return details.prefix if details is not None else None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value or "")


# --------------------------------------------------------------------------------------------------------------
# The registry


CheckFn = Callable[[CheckContext], CheckResult]


@dataclass(frozen=True)
class Check:
    """One registered check: its name, the components that contribute it and where it makes sense."""

    name: str
    components: tuple[str, ...]
    scopes: tuple[Scope, ...]
    fn: CheckFn
    doc: str


ALWAYS = ("image", "platform")  # pseudo-components whose checks run for every image
REGISTRY: dict[str, list[Check]] = {}


def check(name: str, *components: str, scopes: tuple[Scope, ...] = BOTH) -> Callable[[CheckFn], CheckFn]:
    """Register a check under each component that contributes it (it runs once when any is present)."""

    def deco(fn: CheckFn) -> CheckFn:
        item = Check(name, components, scopes, fn, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        for comp in components:
            REGISTRY.setdefault(comp, []).append(item)
        return fn

    return deco


def selected(components: Iterable[str], scope: Scope, order: Sequence[str]) -> list[Check]:
    """The checks for these components (plus the always-run ones) in `scope`: the image's first, then each
    component's in `order` (the blocks' layer order), the platform's (GPUs) last. The blocks register their checks
    when they are imported (the registry, imgbuild.blocks, imports them all)."""
    present = set(components) | set(ALWAYS)
    rank = {name: i for i, name in enumerate(("image", *order, "platform"))}
    seen: dict[str, tuple[int, int, Check]] = {}
    for comp, items in REGISTRY.items():
        if comp not in present:
            continue
        for i, item in enumerate(items):
            key = (rank.get(item.components[0], len(rank)), i, item)
            if scope in item.scopes and item.name not in seen:
                seen[item.name] = key
    return [item for _, _, item in sorted(seen.values(), key=lambda k: (k[0], k[1]))]


def run_checks(ctx: CheckContext, checks: list[Check], *, workers: int = 8) -> list[CheckResult]:
    """Run checks concurrently (each is a few commands on the target); results keep the checks' order."""

    def one(item: Check) -> CheckResult:
        start = time.monotonic()
        try:
            result = item.fn(ctx)
        except Exception as exc:  # a broken check is a failed check, never a crashed verification
            result = fail(f"the check itself failed: {type(exc).__name__}: {exc}")
        comp = next((c for c in item.components if c in ctx.components), item.components[0])
        return replace(result, name=item.name, component=comp, duration_s=round(time.monotonic() - start, 3))

    if workers <= 1 or len(checks) <= 1:
        return [one(c) for c in checks]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="imgbuild-check")
    try:
        results = list(pool.map(one, checks))
    except BaseException:
        # Ctrl-C or SIGTERM: drop the checks not started and do not wait here for the running ones (a command in the
        # container may take its whole timeout); the caller removes the containers they run in, which ends them.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def _result(status: Status, expected: str, found: str, reason: str, details: dict[str, Any] | None) -> CheckResult:
    return CheckResult(name="", status=status, expected=expected, found=found, reason=reason, details=details or {})


def passed(expected: str = "", found: str = "", reason: str = "", **details: Any) -> CheckResult:
    return _result("pass", expected, found, reason, details)


def fail(reason: str, expected: str = "", found: str = "", **details: Any) -> CheckResult:
    return _result("fail", expected, found, reason, details)


def skip(reason: str, expected: str = "", **details: Any) -> CheckResult:
    return _result("skip", expected, "", reason, details)


def compare(expected: str | None, found: str | None, what: str, **details: Any) -> CheckResult:
    """pass when found matches the pin (a pin 1.2 matches 1.2.x / 1.2amzn...), or when nothing is pinned."""
    if found is None:
        return fail(f"could not read the {what}", expected=expected or "(any)", **details)
    if expected is None:
        return passed("(not pinned)", found, "no version pinned: recorded what is there", **details)
    if _matches(expected, found):
        return passed(expected, found, **details)
    return fail(f"{what} {found} is not the pinned {expected}", expected=expected, found=found, **details)


def _matches(expected: str, found: str) -> bool:
    return found == expected or (found.startswith(expected) and not found[len(expected)].isdigit())


def ldd_missing(output: str) -> list[str]:
    """The libraries ldd could not find, from its output: the NAME of each `NAME => not found` line."""
    return [line.split("=>")[0].strip() for line in output.splitlines() if "not found" in line]


# --------------------------------------------------------------------------------------------------------------
# image: the manifest, the environment, keys, the build's CA, devices


@check("manifest", "image")
def manifest_matches_lock(ctx: CheckContext) -> CheckResult:
    """/etc/imgbuild/manifest.json is present and equals the lock (component versions and lock digest)."""
    found, want = ctx.manifest, ctx.expected_manifest
    if found is None:
        if ctx.scope == "host":
            return skip(f"no {MANIFEST_PATH} on this host (not an imgbuild image)")
        return fail(f"no {MANIFEST_PATH} in the image", expected="present", found="missing")
    digest = str(found.get("lock_digest", ""))[:12]
    got = f"lock {digest or '?'}, {len(found.get('components', {}))} components"
    if want is None:
        return skip(ctx.manifest_note or "no lock to compare with", found=got)
    diffs = manifest_diffs(want, found)
    expected = f"lock {str(want.get('lock_digest', ''))[:12]}, {len(want.get('components', {}))} components"
    if diffs:
        return fail("; ".join(diffs), expected=expected, found=got, differences=diffs)
    return passed(expected, got, ctx.manifest_note)


def manifest_diffs(want: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """What differs between the lock's manifest and the image's, one line each (empty when equal)."""
    diffs = []
    for key in ("recipe", "lock_digest"):
        if want.get(key) != found.get(key):
            diffs.append(f"{key}: lock {want.get(key)!r}, image {found.get(key)!r}")
    # Which of the recipe's architectures: a manifest written before platform.arch existed is amd64's (its default).
    if want.get("arch", "amd64") != found.get("arch", "amd64"):
        diffs.append(f"arch: expected {want.get('arch', 'amd64')!r}, image {found.get('arch', 'amd64')!r}")
    wc, fc = want.get("components", {}), found.get("components", {})
    for name in sorted(set(wc) | set(fc)):
        if name not in fc:
            diffs.append(f"{name}: in the lock, not in the image")
        elif name not in wc:
            diffs.append(f"{name}: in the image, not in the lock")
        elif wc[name].get("version") != fc[name].get("version"):
            diffs.append(f"{name}: lock {wc[name].get('version')}, image {fc[name].get('version')}")
    if want.get("env") != found.get("env"):
        diffs.append(f"env: lock {want.get('env')}, image {found.get('env')}")
    return diffs


@check("machine", "image")
def machine_matches(ctx: CheckContext) -> CheckResult:
    """`uname -m` is the machine of the manifest's architecture (aarch64 for arm64, run under QEMU on x86 hosts)."""
    if ctx.machine is None:
        return skip("no manifest says which architecture this is")
    ran = ctx.run("uname -m")
    found = ran.out.strip()
    if not ran.ok or not found:
        return fail(f"uname -m failed: {ran.why()}", expected=ctx.machine)
    if found != ctx.machine:
        return fail(f"uname -m says {found}, the manifest's architecture is {ctx.machine}", ctx.machine, found)
    return passed(ctx.machine, found)


@check("env", "image", scopes=CONTAINER)
def recipe_env(ctx: CheckContext) -> CheckResult:
    """The recipe's environment variables (the manifest's `env`) are set in the container."""
    source = ctx.expected_manifest or ctx.manifest or {}
    want: dict[str, str] = {str(k): str(v) for k, v in source.get("env", {}).items()}
    if not want:
        return skip("the recipe sets no environment variables")
    ran = ctx.run("env")
    if not ran.ok:
        return fail(f"env failed: {ran.why()}")
    have = dict(line.split("=", 1) for line in ran.out.splitlines() if "=" in line)
    wrong = [f"{k}={have.get(k, '(unset)')}" for k, v in want.items() if have.get(k) != v]
    expected = ", ".join(f"{k}={v}" for k, v in want.items())
    if wrong:
        return fail(f"not as the recipe sets: {', '.join(wrong)}", expected=expected, found=", ".join(wrong))
    return passed(expected, f"{len(want)} set")


@check("ca-bundle-absent", "image", scopes=CONTAINER)
def ca_bundle_absent(ctx: CheckContext) -> CheckResult:
    """The build's CA bundle (a build secret, mounted only while a RUN downloads) did not reach the image: nothing
    under /run/secrets but empty mount points, no folder of extra CA certificates, and no environment variable of
    the image naming a path under /run/secrets (a tool pointed at a secret that is not there)."""
    ran = ctx.run(
        f"find {SECRETS_DIR} -mindepth 1 ! -empty 2>/dev/null | head -n 20 | sed 's/^/file /'; "
        f"if [ -e {LEGACY_CA_DIR} ]; then echo 'file {LEGACY_CA_DIR}'; fi; "
        f"env | grep -F '{SECRETS_DIR}/' | cut -d= -f1 | sed 's/^/env /'; echo done"
    )
    if not ran.out.rstrip().endswith("done"):
        return fail(f"could not look for the CA bundle: {ran.why()}", expected="absent")
    lines = ran.out.splitlines()
    files = [line[5:] for line in lines if line.startswith("file ")]
    env = [line[4:] for line in lines if line.startswith("env ")]
    problems = ([f"in the image: {', '.join(files)}"] if files else []) + (
        [f"the image's environment names {SECRETS_DIR}: {', '.join(env)}"] if env else []
    )
    if problems:
        return fail(
            f"the build's CA bundle leaked: {'; '.join(problems)}", expected="absent", found="; ".join(problems)
        )
    return passed("absent", "absent", f"nothing under {SECRETS_DIR}, no variable naming it")


@check("no-keys-in-image", "image", scopes=CONTAINER)
def no_keys_in_image(ctx: CheckContext) -> CheckResult:
    """No ssh host keys, no id_* private keys and no PEM private key anywhere in the image itself."""
    if ctx.image_scan is None:
        return skip("the image's own filesystem was not scanned")
    scan = ctx.image_scan()
    if scan.error:
        return fail(f"could not scan the image: {scan.error}", expected="no keys")
    if scan.files:
        shown = ", ".join(scan.files[:5]) + (f" (+{len(scan.files) - 5} more)" if len(scan.files) > 5 else "")
        return fail(f"key material baked into the image: {shown}", "no keys", shown, files=list(scan.files))
    return passed("no keys", "none found")


@check("devices", "image", scopes=CONTAINER)
def devices_visible(ctx: CheckContext) -> CheckResult:
    """The devices passed to the container (--device, EFA uverbs) are visible in it."""
    if not ctx.devices:
        return skip("no devices passed (--device, or the recipe's EFA devices on an EFA host)")
    paths = " ".join(shlex.quote(d) for d in ctx.devices)
    ran = ctx.run(f'for d in {paths}; do [ -e "$d" ] || echo "$d"; done')
    missing = [line for line in ran.out.split() if line]
    if missing:
        return fail(f"not visible in the container: {', '.join(missing)}", ", ".join(ctx.devices), "missing")
    return passed(", ".join(ctx.devices), "all visible")


def first_executable(ctx: CheckContext, candidates: list[str], name: str) -> str | None:
    """The first of `candidates` (shell words, may use $VARS) that is executable, else `name` on PATH."""
    words = " ".join(f'"{c}"' for c in candidates)
    ran = ctx.run(f'for f in {words} "$(command -v {name})"; do [ -n "$f" ] && [ -x "$f" ] && echo "$f" && exit 0; '
                  "done; exit 1")  # fmt: skip
    return ran.out.strip().splitlines()[0] if ran.ok and ran.out.strip() else None


# --------------------------------------------------------------------------------------------------------------
# GPUs (only where one is present)


@check("gpu-nvidia-smi", "platform")
def gpu_nvidia_smi(ctx: CheckContext) -> CheckResult:
    """nvidia-smi lists the GPUs."""
    if not ctx.gpu:
        return skip(ctx.gpu_reason)
    ran = ctx.run("nvidia-smi -L")
    gpus = [line for line in ran.out.splitlines() if line.startswith("GPU ")]
    if not ran.ok or not gpus:
        return fail(f"nvidia-smi -L: {ran.why()}", expected=">= 1 GPU", found="none")
    return passed(">= 1 GPU", f"{len(gpus)} GPU(s): {gpus[0].split('(')[0].strip()}", gpus=gpus)
