"""The checks `imgbuild verify` runs, each contributed by the component it verifies.

A check is a function of a `CheckContext`: the machine to look at (anything with testinfra's
`run(command) -> result with rc/stdout/stderr`: a container, this host, an ssh host, or a fake in tests), the
components expected there (from the recipe's lock, else from the image's manifest) and what the run passed in
(devices, GPUs). `REGISTRY` maps a component name to its checks; only the checks of components the image
holds run, plus those registered under "image" (the manifest, keys, environment) and "platform" (GPUs), which
run everywhere. Checks that only make sense for an image (sshd, SageMaker, keys...) have the "container"
scope; `--host` runs the "host" scope against a machine with no container at all.

This module does not import docker or testinfra: `verify.py` connects, this module only asks questions.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from imgbuild.report import CheckResult, Status

Scope = Literal["container", "host"]
BOTH: tuple[Scope, ...] = ("container", "host")
CONTAINER: tuple[Scope, ...] = ("container",)

MANIFEST_PATH = "/etc/imgbuild/manifest.json"
CA_DIR = "/usr/local/share/ca-certificates/imgbuild"
NCCL_TESTS_BINARIES = ("all_reduce_perf", "all_gather_perf", "broadcast_perf", "reduce_scatter_perf")
PLUGIN_DIRS = ("/opt/amazon/ofi-nccl", "/opt/aws-ofi-nccl")
GPU_TIMEOUT_S = 240
COMMAND_TIMEOUT_S = 60
SSHD_WAIT_S = 10


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

    components: the expected manifest entries by component (the lock's when there is one).
    manifest: the manifest found in the image / on the host (None when there is none).
    expected_manifest: the manifest the lock renders (None without a lock).
    """

    host: Host
    scope: Scope
    components: dict[str, dict[str, Any]]
    manifest: dict[str, Any] | None = None
    expected_manifest: dict[str, Any] | None = None
    manifest_note: str = ""
    python: str = "python3"
    devices: tuple[str, ...] = ()  # device paths as the container (or host) sees them
    efa_devices: tuple[str, ...] = ()  # the EFA uverbs devices among them
    expect_efa: bool = False
    gpu: bool = False
    gpu_reason: str = "no GPU"
    permit_root_login: str | None = None  # the recipe's sshd setting, when a recipe is known
    image_scan: Callable[[], ImageScan] | None = None
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
        v = self.components.get(component, {}).get("version")
        return str(v) if v else None


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


def selected(components: Iterable[str], scope: Scope) -> list[Check]:
    """The checks for these components (plus the always-run ones) in `scope`, in registration order."""
    present = set(components) | set(ALWAYS)
    seen: dict[str, Check] = {}
    for comp, items in REGISTRY.items():
        if comp not in present:
            continue
        for item in items:
            if scope in item.scopes and item.name not in seen:
                seen[item.name] = item
    order = {c.name: i for i, c in enumerate(c for items in REGISTRY.values() for c in items)}
    return sorted(seen.values(), key=lambda c: order[c.name])


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
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="imgbuild-check") as pool:
        return list(pool.map(one, checks))


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
    """The build's CA bundle (builder stage only) did not reach the image."""
    ran = ctx.run(f"test -e {CA_DIR}")
    if ran.rc == 0:
        return fail(f"{CA_DIR} is in the image: the build's CA bundle leaked", expected="absent", found="present")
    return passed("absent", "absent")


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


# --------------------------------------------------------------------------------------------------------------
# Open MPI, libfabric, EFA


def _first_executable(ctx: CheckContext, candidates: list[str], name: str) -> str | None:
    """The first of `candidates` (shell words, may use $VARS) that is executable, else `name` on PATH."""
    words = " ".join(f'"{c}"' for c in candidates)
    ran = ctx.run(f'for f in {words} "$(command -v {name})"; do [ -n "$f" ] && [ -x "$f" ] && echo "$f" && exit 0; '
                  "done; exit 1")  # fmt: skip
    return ran.out.strip().splitlines()[0] if ran.ok and ran.out.strip() else None


@check("openmpi-version", "openmpi")
def openmpi_version(ctx: CheckContext) -> CheckResult:
    """`mpirun --version` reports the pinned Open MPI."""
    prefix = ctx.components["openmpi"].get("prefix")
    mpirun = _first_executable(ctx, [f"{prefix}/bin/mpirun"] if prefix else [], "mpirun")
    if mpirun is None:
        return fail("mpirun not found", expected=ctx.version("openmpi") or "mpirun", found="missing")
    ran = ctx.run(f"{shlex.quote(mpirun)} --version")
    m = re.search(r"\(Open MPI\)\s+(\S+)", ran.out + ran.err)
    if not ran.ok or m is None:
        return fail(f"{mpirun} --version: {ran.why()}", expected=ctx.version("openmpi") or "Open MPI")
    return compare(ctx.version("openmpi"), m.group(1), "Open MPI", path=mpirun)


def _fi_info(ctx: CheckContext) -> str | None:
    def find() -> str | None:
        lf = ctx.components.get("libfabric", {})
        candidates = ["${LIBFABRIC_ROOT:+$LIBFABRIC_ROOT/bin/fi_info}"]
        if lf.get("prefix"):
            candidates.append(f"{lf['prefix']}/bin/fi_info")
        if ctx.has("efa") and lf.get("source") in (None, "efa"):
            candidates.append("/opt/amazon/efa/bin/fi_info")
        return _first_executable(ctx, candidates, "fi_info")

    return ctx.once("fi_info", find)


@check("libfabric-version", "libfabric", "efa")
def libfabric_version(ctx: CheckContext) -> CheckResult:
    """`fi_info --version` ($LIBFABRIC_ROOT/bin/fi_info first) reports the pinned libfabric."""
    fi_info = _fi_info(ctx)
    if fi_info is None:
        return fail("fi_info not found", expected=ctx.version("libfabric") or "fi_info", found="missing")
    ran = ctx.run(f"{shlex.quote(fi_info)} --version")
    m = re.search(r"^libfabric:\s*(\S+)", ran.out, re.M)
    if not ran.ok or m is None:
        return fail(f"{fi_info} --version: {ran.why()}", expected=ctx.version("libfabric") or "libfabric")
    return compare(ctx.version("libfabric"), m.group(1), "libfabric", path=fi_info)


@check("libfabric-providers", "libfabric", "efa")
def libfabric_providers(ctx: CheckContext) -> CheckResult:
    """The providers the image needs are in libfabric: tcp for the distribution's, efa with the EFA installer.

    `fi_info -l` lists only providers that found a device, so a provider counts as present when it is listed
    or when it registered its parameters (`fi_info -e` shows FI_<PROVIDER>_* for every provider compiled in).
    """
    fi_info = _fi_info(ctx)
    if fi_info is None:
        return fail("fi_info not found", found="missing")
    listed_run = ctx.run(f"{shlex.quote(fi_info)} -l")
    listed = sorted(set(re.findall(r"^([a-z0-9_;]+):\s*$", listed_run.out, re.M)))
    params = ctx.run(f"{shlex.quote(fi_info)} -e")
    built = sorted({m.lower() for m in re.findall(r"^#\s*FI_([A-Z0-9]+)_", params.out, re.M)})
    have = {p for name in listed for p in name.split(";")} | set(built)
    want = []
    if ctx.components.get("libfabric", {}).get("source") == "distro":
        want.append("tcp")
    if ctx.has("efa"):
        want.append("efa")
    missing = [p for p in want if p not in have]
    found = f"listed: {','.join(listed) or '-'}"
    details: dict[str, Any] = {"listed": listed, "compiled_in": built, "path": fi_info}
    if missing:
        return fail(f"provider(s) missing: {', '.join(missing)}", ",".join(want), found, **details)
    if not want:
        return passed("(none required)", found, **details)
    unlisted = [p for p in want if p not in listed]
    reason = f"{', '.join(unlisted)} compiled in but not listed (no device here)" if unlisted else ""
    return passed(",".join(want), found, reason, **details)


@check("libfabric-efa", "efa", "libfabric")
def libfabric_efa(ctx: CheckContext) -> CheckResult:
    """`fi_info -p efa` finds the EFA devices when they are passed in (or --expect-efa)."""
    if not (ctx.efa_devices or ctx.expect_efa):
        why = "no EFA devices passed in" if ctx.scope == "container" else "no EFA devices expected"
        return skip(f"{why} (give --expect-efa on an EFA instance)", expected="efa provider")
    fi_info = _fi_info(ctx)
    if fi_info is None:
        return fail("fi_info not found", expected="efa provider", found="missing")
    ran = ctx.run(f"{shlex.quote(fi_info)} -p efa")
    domains = sorted(set(re.findall(r"^\s*domain:\s*(\S+)", ran.out, re.M)))
    if not ran.ok or not domains:
        return fail(f"fi_info -p efa: {ran.why()}", expected="efa provider", found="none")
    return passed("efa provider", f"{len(domains)} domain(s): {', '.join(domains[:4])}")


@check("efa-installer-version", "efa")
def efa_installer_version(ctx: CheckContext) -> CheckResult:
    """/opt/amazon/efa_installed_packages records the pinned EFA installer."""
    ran = ctx.run("cat /opt/amazon/efa_installed_packages")
    m = re.search(r"EFA installer version:\s*(\S+)", ran.out)
    if not ran.ok or m is None:
        return fail(f"no EFA installer record: {ran.why()}", expected=ctx.version("efa") or "", found="missing")
    return compare(ctx.version("efa"), m.group(1), "EFA installer")


# --------------------------------------------------------------------------------------------------------------
# Python, mpi4py, PyTorch


@check("python-version", "python")
def python_version(ctx: CheckContext) -> CheckResult:
    """The image's Python (the venv's when there is one) is the pinned version."""
    ran = ctx.run(f"{shlex.quote(ctx.python)} --version")
    m = re.search(r"Python\s+(\S+)", ran.out + ran.err)
    if not ran.ok or m is None:
        return fail(f"{ctx.python} --version: {ran.why()}", expected=ctx.version("python") or "python")
    return compare(ctx.version("python"), m.group(1), "Python", path=ctx.python)


@check("mpi4py-version", "mpi4py")
def mpi4py_version(ctx: CheckContext) -> CheckResult:
    """mpi4py imports and is the pinned version."""
    data, ran = ctx.python_json("import json, mpi4py; print(json.dumps({'version': mpi4py.__version__}))")
    if data is None:
        return fail(f"import mpi4py: {ran.why()}", expected=ctx.version("mpi4py") or "mpi4py")
    return compare(ctx.version("mpi4py"), str(data["version"]), "mpi4py")


_TORCH_PROBE = """
import json, torch
try:
    nccl = torch.cuda.nccl.version()
except Exception as exc:
    nccl = "error: %s" % exc
print(json.dumps({"version": torch.__version__, "nccl": nccl, "cuda": torch.version.cuda}))
"""


def _torch(ctx: CheckContext) -> tuple[Any, Ran]:
    return ctx.once("torch", lambda: ctx.python_json(_TORCH_PROBE, timeout_s=120))


@check("pytorch-version", "pytorch")
def pytorch_version(ctx: CheckContext) -> CheckResult:
    """torch imports and is the pinned release (local version labels such as +cu128 are ignored)."""
    data, ran = _torch(ctx)
    if data is None:
        return fail(f"import torch: {ran.why()}", expected=ctx.version("pytorch") or "torch")
    found = str(data["version"])
    expected = ctx.version("pytorch")
    base = re.match(r"\d+(\.\d+)*", found)
    return compare(expected, base.group(0) if base else found, "torch", full=found, cuda=data.get("cuda"))


# --------------------------------------------------------------------------------------------------------------
# NCCL


# Runs on the target with its Python (stdlib only): find libnccl.so.2 in the usual places, load it and ask
# ncclGetVersion (no GPU needed), and read the version macros of the nccl.h next to it.
_NCCL_PROBE = r"""
import ctypes, glob, json, os, re, subprocess, sys
dirs = []
def add(d):
    if d and d not in dirs:
        dirs.append(d)
for pattern in json.loads(sys.argv[1]):
    for d in sorted(glob.glob(pattern)):
        add(d)
for p in sys.path:
    add(os.path.join(p, "nvidia", "nccl", "lib"))
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        site = os.path.dirname(os.path.dirname(spec.origin))
        add(os.path.join(site, "nvidia", "nccl", "lib"))
        add(os.path.join(os.path.dirname(spec.origin), "lib"))
except Exception:
    pass
for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
    add(d)
found = [os.path.join(d, "libnccl.so.2") for d in dirs if os.path.isfile(os.path.join(d, "libnccl.so.2"))]
for ldconfig in ("ldconfig", "/sbin/ldconfig"):
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        continue
    for line in out.splitlines():
        if line.strip().startswith("libnccl.so.2 ") and "=>" in line:
            path = line.split("=>")[-1].strip()
            if path not in found:
                found.append(path)
    break
res = {"candidates": found}
if found:
    lib = found[0]
    res["lib"] = lib
    res["real"] = os.path.realpath(lib)
    try:
        handle = ctypes.CDLL(lib)
        code = ctypes.c_int(0)
        res["rc"] = handle.ncclGetVersion(ctypes.byref(code))
        res["code"] = code.value
    except Exception as exc:
        res["error"] = "%s: %s" % (type(exc).__name__, exc)
    libdir = os.path.dirname(lib)
    for hdr in (os.path.join(os.path.dirname(libdir), "include", "nccl.h"),
                os.path.join(os.path.dirname(os.path.dirname(libdir)), "include", "nccl.h"),
                "/usr/include/nccl.h"):
        if os.path.isfile(hdr):
            text = open(hdr, errors="replace").read()
            macros = dict(re.findall(r"#define\s+NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)", text))
            res["header"] = {"path": hdr, **macros}
            break
print(json.dumps(res))
"""


def nccl_code(version: str) -> int:
    """NCCL_VERSION_CODE of a version: X*10000 + Y*100 + Z from 2.9 on (X*1000 + Y*100 + Z before)."""
    x, y, z = (int(p) for p in [*version.split("."), "0", "0"][:3])
    return x * 10000 + y * 100 + z if (x, y) >= (2, 9) else x * 1000 + y * 100 + z


def code_to_version(code: int) -> str:
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _nccl(ctx: CheckContext) -> tuple[dict[str, Any] | None, Ran]:
    def probe() -> tuple[dict[str, Any] | None, Ran]:
        n = ctx.components.get("nccl", {})
        patterns = [f"{n['prefix']}/lib"] if n.get("prefix") else []
        venv = ctx.components.get("python", {}).get("venv")
        if venv:
            patterns.append(f"{venv}/lib/python*/site-packages/nvidia/nccl/lib")
        patterns.append("/opt/nccl/lib")
        return ctx.python_json(_NCCL_PROBE, json.dumps(patterns))

    return ctx.once("nccl", probe)


@check("nccl-runtime-version", "nccl")
def nccl_runtime_version(ctx: CheckContext) -> CheckResult:
    """The libnccl.so.2 the image would load reports the pinned version through ncclGetVersion (no GPU needed)."""
    pin = ctx.version("nccl")
    expected = f"{nccl_code(pin)} ({pin})" if pin else "(not pinned)"
    data, ran = _nccl(ctx)
    if data is None:
        return fail(f"could not run the NCCL probe with {ctx.python}: {ran.why()}", expected=expected)
    if "lib" not in data:
        return fail("libnccl.so.2 not found (NCCL prefix, site-packages/nvidia/nccl/lib, ldconfig)", expected, "")
    if "code" not in data or data.get("rc"):
        return fail(f"ncclGetVersion failed on {data['lib']}: {data.get('error') or data.get('rc')}", expected)
    code = int(data["code"])
    found = f"{code} ({code_to_version(code)})"
    details = {"lib": data["lib"], "real": data.get("real"), "candidates": data["candidates"]}
    if pin is None or code == nccl_code(pin):
        return passed(expected, found, f"from {data['lib']}", **details)
    return fail(f"{data['lib']} is NCCL {code_to_version(code)}, the lock pins {pin}", expected, found, **details)


@check("nccl-header-version", "nccl")
def nccl_header_version(ctx: CheckContext) -> CheckResult:
    """The nccl.h next to the library (../include/nccl.h) has the pinned NCCL_MAJOR/MINOR/PATCH."""
    pin = ctx.version("nccl")
    data, _ = _nccl(ctx)
    if data is None or "lib" not in data:
        return fail("libnccl.so.2 not found, so neither is its nccl.h", expected=pin or "nccl.h")
    hdr = data.get("header")
    if not hdr or not all(k in hdr for k in ("MAJOR", "MINOR", "PATCH")):
        return fail(f"no nccl.h with version macros next to {data['lib']}", expected=pin or "nccl.h", found="")
    found = f"{hdr['MAJOR']}.{hdr['MINOR']}.{hdr['PATCH']}"
    return compare(pin, found, "nccl.h", path=hdr["path"])


@check("torch-nccl-version", "nccl")
def torch_nccl_version(ctx: CheckContext) -> CheckResult:
    """torch.cuda.nccl.version() (the NCCL PyTorch was built with) is the pinned NCCL."""
    if not ctx.has("pytorch"):
        return skip("PyTorch is not in the recipe", expected=ctx.version("nccl") or "")
    data, ran = _torch(ctx)
    if data is None:
        return fail(f"import torch: {ran.why()}", expected=ctx.version("nccl") or "")
    value = data.get("nccl")
    if isinstance(value, list):
        found = ".".join(str(v) for v in value)
    elif isinstance(value, int):
        found = code_to_version(value)
    else:
        return fail(f"torch.cuda.nccl.version(): {value}", expected=ctx.version("nccl") or "")
    return compare(ctx.version("nccl"), found, "torch's NCCL")


@check("aws-ofi-nccl-plugin", "aws_ofi_nccl")
def aws_ofi_nccl_plugin(ctx: CheckContext) -> CheckResult:
    """The NCCL net plugin (libnccl-net*.so) is found and `ldd` resolves all its libraries.

    Searched, not assumed: the EFA installer moved it between lib/x86_64-linux-gnu, lib and lib64.
    A plugin with an unresolved dependency makes NCCL fall back to sockets without a word.
    """
    prefix = ctx.components["aws_ofi_nccl"].get("prefix")
    dirs = " ".join(shlex.quote(d) for d in dict.fromkeys([*(p for p in [prefix] if p), *PLUGIN_DIRS]))
    ran = ctx.run(
        f'for d in {dirs} $(echo "${{LD_LIBRARY_PATH:-}}" | tr : " "); do [ -d "$d" ] && '
        "find \"$d\" -maxdepth 3 -name 'libnccl-net*.so*' 2>/dev/null; done | sort -u"
    )
    libs = [line for line in ran.out.splitlines() if line.strip()]
    if not libs:
        return fail(f"no libnccl-net*.so under {prefix}, {', '.join(PLUGIN_DIRS)} or LD_LIBRARY_PATH",
                    expected="libnccl-net*.so", found="missing")  # fmt: skip
    broken = {}
    for lib in libs:
        ldd = ctx.run(f"ldd {shlex.quote(lib)}")
        missing = [line.split("=>")[0].strip() for line in ldd.out.splitlines() if "not found" in line]
        if missing or not ldd.ok:
            broken[lib] = missing or [ldd.why()]
    found = ", ".join(libs)
    if broken:
        text = "; ".join(f"{lib}: {', '.join(m)} not found" for lib, m in broken.items())
        return fail(f"unresolved libraries (NCCL would fall back to sockets): {text}", "resolves", found)
    return passed("libnccl-net*.so, all libraries resolve", found, libraries=libs)


@check("nccl-tests-binaries", "nccl_tests", scopes=CONTAINER)
def nccl_tests_binaries(ctx: CheckContext) -> CheckResult:
    """nccl-tests' binaries (all_reduce_perf, ...) are in the image and executable."""
    prefix = ctx.components["nccl_tests"].get("prefix", "/opt/nccl-tests")
    paths = " ".join(shlex.quote(f"{prefix}/{b}") for b in NCCL_TESTS_BINARIES)
    ran = ctx.run(f'for f in {paths}; do [ -x "$f" ] || echo "$f"; done')
    missing = ran.out.split()
    expected = ", ".join(NCCL_TESTS_BINARIES)
    if missing:
        return fail(f"missing or not executable: {', '.join(missing)}", expected, f"{len(missing)} missing")
    return passed(expected, f"in {prefix}")


@check("nccl-tests-libnccl", "nccl_tests", scopes=CONTAINER)
def nccl_tests_libnccl(ctx: CheckContext) -> CheckResult:
    """all_reduce_perf links libnccl from the recipe's NCCL prefix, and ldd finds every library."""
    prefix = ctx.components["nccl_tests"].get("prefix", "/opt/nccl-tests")
    nccl_prefix = ctx.components.get("nccl", {}).get("prefix")
    if nccl_prefix:
        want = f"{nccl_prefix}/lib/"
    else:
        data, _ = _nccl(ctx)
        if not data or "lib" not in data:
            return fail("cannot tell which NCCL is intended: libnccl.so.2 not found")
        want = data["lib"].rsplit("/", 1)[0] + "/"
    ran = ctx.run(f"ldd {shlex.quote(prefix)}/all_reduce_perf")
    if not ran.ok:
        return fail(f"ldd all_reduce_perf: {ran.why()}", expected=want)
    lines = ran.out.splitlines()
    missing = [line.split("=>")[0].strip() for line in lines if "not found" in line]
    nccl = next((line.split("=>")[1].split("(")[0].strip() for line in lines if "libnccl.so" in line and "=>" in line),
                None)  # fmt: skip
    if missing:
        return fail(f"not found: {', '.join(missing)}", expected=want, found=nccl or "")
    if nccl is None:
        return fail("all_reduce_perf does not link libnccl", expected=want, found="not linked")
    if not nccl.startswith(want):
        return fail(f"links {nccl}, not the NCCL in {want}", expected=want, found=nccl)
    return passed(want, nccl)


# --------------------------------------------------------------------------------------------------------------
# sshd and SageMaker


@check("sshd-config", "sshd", scopes=CONTAINER)
def sshd_config(ctx: CheckContext) -> CheckResult:
    """`sshd -T`: the manifest's ports, no passwords, root only with keys."""
    ports = sorted(int(p) for p in ctx.components["sshd"].get("ports", []))
    permit = ctx.permit_root_login or "prohibit-password"
    allowed = {"prohibit-password", "without-password"} if permit == "prohibit-password" else {permit}
    expected = f"ports {','.join(map(str, ports))}; passwordauthentication no; permitrootlogin {permit}"
    ran = ctx.run("/usr/sbin/sshd -T 2>&1 || sshd -T")
    if not ran.ok:
        return fail(f"sshd -T: {ran.why()}", expected=expected)
    conf: dict[str, list[str]] = {}
    for line in ran.out.splitlines():
        key, _, value = line.strip().partition(" ")
        conf.setdefault(key.lower(), []).append(value.strip())
    got_ports = sorted(int(p) for p in conf.get("port", []) if p.isdigit())
    pw = conf.get("passwordauthentication", ["?"])[0]
    root = conf.get("permitrootlogin", ["?"])[0]
    empty = conf.get("permitemptypasswords", ["no"])[0]
    found = f"ports {','.join(map(str, got_ports))}; passwordauthentication {pw}; permitrootlogin {root}"
    problems = []
    if got_ports != ports:
        problems.append(f"ports {got_ports}, the manifest says {ports}")
    if pw != "no":
        problems.append(f"passwordauthentication {pw}")
    if empty != "no":
        problems.append(f"permitemptypasswords {empty}")
    if root not in allowed:
        problems.append(f"permitrootlogin {root}")
    if problems:
        return fail("; ".join(problems), expected, found)
    return passed(expected, found)


def listening_ports(proc_net_tcp: str) -> set[int]:
    """TCP ports in LISTEN state (0A) from /proc/net/tcp and /proc/net/tcp6 text."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3] == "0A" and ":" in parts[1]:
            ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


@check("sshd-listening", "sshd", scopes=CONTAINER)
def sshd_listening(ctx: CheckContext) -> CheckResult:
    """Once the entrypoint ran, sshd listens on the manifest's ports."""
    ports = {int(p) for p in ctx.components["sshd"].get("ports", [])}
    expected = ",".join(map(str, sorted(ports)))
    # sshd binds after it daemonizes: give it a moment, but not long once it listens elsewhere (a wrong port).
    start = time.monotonic()
    listening: set[int] = set()
    while True:
        ran = ctx.run("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null")
        before, listening = listening, listening_ports(ran.out)
        waited = time.monotonic() - start
        if ports <= listening or waited > SSHD_WAIT_S or (listening and listening == before and waited > 1):
            break
        time.sleep(0.3)
    found = ",".join(map(str, sorted(listening))) or "nothing"
    if not ports <= listening:
        missing = ",".join(map(str, sorted(ports - listening)))
        log = ctx.run("tail -n 5 /var/log/imgbuild-sshd.log 2>/dev/null")
        why = f"; sshd log: {' | '.join(log.out.strip().splitlines())}" if log.out.strip() else ""
        return fail(f"nothing listens on {missing}{why}", expected, found)
    return passed(expected, found)


@check("sagemaker-contract", "sagemaker", scopes=CONTAINER)
def sagemaker_contract(ctx: CheckContext) -> CheckResult:
    """The SageMaker tree (/opt/ml/{code,model,input/config,input/data,output}) and `train` on PATH."""
    dirs = ["/opt/ml/code", "/opt/ml/model", "/opt/ml/input/config", "/opt/ml/input/data", "/opt/ml/output"]
    ran = ctx.run(
        f'for d in {" ".join(dirs)}; do [ -d "$d" ] || echo "missing $d"; done; '
        't="$(command -v train)"; if [ -z "$t" ]; then echo "missing train"; '
        'elif [ ! -x "$t" ]; then echo "not executable $t"; else echo "train $t"; fi'
    )
    problems = [line for line in ran.out.splitlines() if line.startswith(("missing", "not executable"))]
    train = next((line.split(" ", 1)[1] for line in ran.out.splitlines() if line.startswith("train ")), "")
    expected = "/opt/ml tree, train on PATH"
    if problems:
        return fail("; ".join(problems), expected, train or "no train")
    return passed(expected, f"train: {train}")


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


@check("gpu-torch-cuda", "platform")
def gpu_torch_cuda(ctx: CheckContext) -> CheckResult:
    """torch.cuda.is_available() with the GPUs passed in."""
    if not ctx.gpu:
        return skip(ctx.gpu_reason)
    if not ctx.has("pytorch"):
        return skip("PyTorch is not in the image")
    code = "import json, torch; print(json.dumps([torch.cuda.is_available(), torch.cuda.device_count()]))"
    data, ran = ctx.python_json(code, timeout_s=120)
    if data is None:
        return fail(f"import torch: {ran.why()}", expected="available")
    if not data[0]:
        return fail("torch.cuda.is_available() is False", expected="available", found="not available")
    return passed("available", f"{data[1]} device(s)")


_ALLREDUCE = """
import json, os, sys, tempfile, torch, torch.distributed as dist
store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
t = torch.full((1 << 20,), 2.0, device="cuda:0")
dist.all_reduce(t)
torch.cuda.synchronize()
value = float(t[0].item())
dist.destroy_process_group()
print(json.dumps({"value": value, "nccl": list(torch.cuda.nccl.version()) if hasattr(torch.cuda, "nccl") else None}))
"""


@check("gpu-nccl-allreduce", "platform")
def gpu_nccl_allreduce(ctx: CheckContext) -> CheckResult:
    """A one-GPU NCCL all_reduce through torch.distributed (world_size 1, nccl backend)."""
    if not ctx.gpu:
        return skip(ctx.gpu_reason)
    if not ctx.has("pytorch"):
        return skip("PyTorch is not in the image")
    data, ran = ctx.python_json(_ALLREDUCE, timeout_s=GPU_TIMEOUT_S)
    if data is None:
        return fail(f"all_reduce failed: {ran.why()}", expected="2.0")
    if data["value"] != 2.0:
        return fail(f"all_reduce of 2.0 over one rank gave {data['value']}", expected="2.0", found=str(data["value"]))
    return passed("2.0", "2.0", "nccl backend, world_size 1")
