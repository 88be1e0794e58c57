"""nccl: NCCL, built from source for the target GPU, or the nvidia-nccl wheel (the one PyTorch loads)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

import imgbuild.blocks._releases as releases
from imgbuild import probes
from imgbuild.blocks._block import Block, Downloads, PythonSets, Released, Tracks
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution, Tracked
from imgbuild.blocks.python import require_venv, site_packages
from imgbuild.blocks.pytorch import PyTorchDetails, torch_probe
from imgbuild.checks import CONTAINER, CheckContext, Ran, check, compare, fail, passed, skip
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import AbsPath, Strict, pin_validator


class NCCL(Strict):
    """NCCL: built from source with the target GPU's gencode, or the nvidia-nccl wheel."""

    source: Literal["build", "wheel"]
    """build: compiled from NVIDIA's release for platform.gpu_arch only, into `prefix` | wheel: the nvidia-nccl-cuXX
    wheel pip-installed into the venv."""
    version: str | None = None
    """With PyTorch in the recipe leave it out: it is the one PyTorch pins (a different one is an error)."""
    package: str | None = Field(None, pattern=r"^nvidia-nccl-cu\d+$")
    """The wheel's name (wheel; default PyTorch's, else `nvidia-nccl-cu<CUDA major>`)."""
    prefix: AbsPath = "/opt/nccl"
    """Where a build installs."""
    _pin = pin_validator("version")


class NcclRow(releases.Row):
    """A series (2.30: the net-plugin API versions it looks for, newest first) or a release built from its tag."""

    net_plugin_api: tuple[int, ...] | None = None


class NcclFile(releases.ReleaseFile):
    component: Literal["nccl"]
    releases: tuple[NcclRow, ...]


def release_file() -> NcclFile:
    return releases.component_file("nccl", NcclFile)


def net_plugin_api(nccl: str) -> tuple[int, ...] | None:
    """The net-plugin API versions NCCL `nccl` looks for, newest first (None: its series is not in releases.yaml)."""
    rows = [r for r in releases.row_for(release_file().releases, nccl) if r.net_plugin_api is not None]
    return rows[0].net_plugin_api if rows else None


class NcclDetails(Details):
    """NCCL's pin: `prefix` is the NCCL others compile against and load (include/ and lib/): the build's, or the
    wheel's folder in the venv; `package` is the wheel."""

    package: str | None = None


def source_url(version: str) -> str:
    """NCCL's release: GitHub's archive of its tag `v<version>-1` (the one place its URL is written)."""
    return f"https://github.com/NVIDIA/nccl/archive/refs/tags/v{version}-1.tar.gz"


class NcclBlock(Block, Downloads, PythonSets, Released, Tracks):
    name = "nccl"
    options = NCCL
    modes = {"build": "fragment", "wheel": "fragment"}
    details = NcclDetails
    after = ("pytorch", "python")
    build_after = ("python",)
    tag = (4, "nccl")
    template_globals = {"nccl_source_url": source_url}

    def resolve(self, n: NCCL, rs: Resolution) -> Pin:
        pinned = rs.pins.get("pytorch")
        torch = pinned.typed(PyTorchDetails).wheel() if pinned is not None else None  # a pip-installed PyTorch's pins
        t = rs.options("pytorch")
        version = n.version
        origin = "recipe"
        if torch is not None:
            if version is not None and version != torch.nccl:
                raise rs.fail(
                    "components.nccl.version",
                    f"{version} is not the NCCL that PyTorch {t.version} pins ({torch.nccl_package}=={torch.nccl})",
                    hint="leave components.nccl.version out to take PyTorch's",
                )
            version = torch.nccl
            origin = f"= PyTorch {t.version}'s pin"
        if version is None:
            raise rs.fail("components.nccl.version", "required when PyTorch is not in the recipe")
        if n.source == "wheel":
            require_venv(rs)
            package = n.package
            if package is None:
                if torch is not None:
                    package = torch.nccl_package
                elif rs.recipe.cuda is not None:
                    package = f"nvidia-nccl-cu{rs.recipe.cuda.version.split('.')[0]}"
                else:
                    package = "nvidia-nccl-cu12"
            if torch is not None and package != torch.nccl_package:
                raise rs.fail(
                    "components.nccl.package", f"{package} is not the package PyTorch pins ({torch.nccl_package})"
                )
            venv_packages = site_packages(rs.pins["python"])
            details = NcclDetails(package=package, prefix=f"{venv_packages}/nvidia/nccl" if venv_packages else None)
        else:
            if rs.recipe.cuda is None:
                raise rs.fail("components.nccl.source", "'build' needs CUDA (an nvidia platform)")
            details = NcclDetails(prefix=n.prefix)
        return Pin(version=version, source=n.source, origin=origin, details=details)

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="nccl")
        if pin.source == "build":
            c.builder_packages |= {"curl", "ca-certificates", "build-essential"}
        if pin.details.prefix:
            # One NCCL: the loader finds the one PyTorch loads (its wheel's, through its RPATH) for everything else too.
            c.ld_library_path.append(f"{pin.details.prefix}/lib")
            c.env["NCCL_HOME"] = pin.details.prefix
        return c

    def requirements(self, pin: Pin, ctx: Context) -> dict[str, list[str]]:
        """The wheel (installed into the builder stage's venv, which the runtime stage copies)."""
        if pin.source != "wheel":
            return {}
        return {"nccl": [f"{pin.typed(NcclDetails).package}=={pin.version}"]}

    def downloads(self, pin: Pin, ctx: Context) -> list[str]:
        return [source_url(str(pin.version))] if pin.source == "build" else []

    def release_file(self) -> releases.ReleaseFile:
        return release_file()

    def track(self, pin: Pin, resolved: Any, files: Callable[[str], Any]) -> list[Tracked]:
        """`imgbuild outdated`: PyTorch's pin where a pip-installed PyTorch decides it, else the NCCL wheel's
        releases."""
        torch = resolved.pins.get("pytorch")
        if torch is not None and torch.source == "pip":
            return [Tracked("follows", "pytorch", fixed="it is PyTorch's pin")]
        cuda = resolved.recipe.cuda
        package = pin.typed(NcclDetails).package or f"nvidia-nccl-cu{cuda.version.split('.')[0] if cuda else '12'}"
        return [Tracked("index", package, ("components", "nccl", "version"))]


BLOCK = NcclBlock()


def nccl_code(version: str) -> int:
    """NCCL_VERSION_CODE of a version: X*10000 + Y*100 + Z from 2.9 on (X*1000 + Y*100 + Z before)."""
    x, y, z = (int(p) for p in [*version.split("."), "0", "0"][:3])
    return x * 10000 + y * 100 + z if (x, y) >= (2, 9) else x * 1000 + y * 100 + z


def code_to_version(code: int) -> str:
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def nccl_probe(ctx: CheckContext) -> tuple[dict[str, Any] | None, Ran]:
    def probe() -> tuple[dict[str, Any] | None, Ran]:
        n = ctx.details("nccl")
        patterns = [f"{n.prefix}/lib"] if n is not None and n.prefix else []
        venv = ctx.prefix("python")
        if venv:
            patterns.append(f"{venv}/lib/python*/site-packages/nvidia/nccl/lib")
        patterns.append("/opt/nccl/lib")
        return ctx.python_json(probes.text("nccl_lib.py"), json.dumps(patterns))

    return ctx.once("nccl", probe)


@check("nccl-runtime-version", "nccl")
def nccl_runtime_version(ctx: CheckContext) -> CheckResult:
    """The libnccl.so.2 the image would load reports the pinned version through ncclGetVersion (no GPU needed)."""
    pin = ctx.version("nccl")
    expected = f"{nccl_code(pin)} ({pin})" if pin else "(not pinned)"
    data, ran = nccl_probe(ctx)
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
    data, _ = nccl_probe(ctx)
    if data is None or "lib" not in data:
        return fail("libnccl.so.2 not found, so neither is its nccl.h", expected=pin or "nccl.h")
    hdr = data.get("header")
    if not hdr or not all(k in hdr for k in ("MAJOR", "MINOR", "PATCH")):
        return fail(f"no nccl.h with version macros next to {data['lib']}", expected=pin or "nccl.h", found="")
    found = f"{hdr['MAJOR']}.{hdr['MINOR']}.{hdr['PATCH']}"
    return compare(pin, found, "nccl.h", path=hdr["path"])


@check("torch-loaded-nccl", "nccl")
def torch_loaded_nccl(ctx: CheckContext) -> CheckResult:
    """The libnccl PyTorch actually loaded (from its own memory map) is the pinned NCCL, and the very file the
    image's loader finds for everything else (nccl-tests, the plugin): one NCCL."""
    if not ctx.has("pytorch"):
        return skip("PyTorch is not in the recipe", expected=ctx.version("nccl") or "")
    pin = ctx.version("nccl")
    expected = f"{nccl_code(pin)} ({pin})" if pin else "(not pinned)"
    data, ran = torch_probe(ctx)
    if data is None:
        return fail(f"import torch: {ran.why()}", expected=expected)
    loaded = data.get("loaded_nccl") or []
    if not loaded:
        return fail("importing torch loaded no libnccl.so", expected=expected, found="none")
    if "loaded_code" not in data or data.get("loaded_rc"):
        return fail(f"ncclGetVersion on {loaded[0]}: {data.get('loaded_error') or data.get('loaded_rc')}", expected)
    code = int(data["loaded_code"])
    found = f"{code} ({code_to_version(code)}) from {loaded[0]}"
    if len(loaded) > 1:
        return fail(f"torch loaded more than one libnccl: {', '.join(loaded)}", expected, found)
    if pin is not None and code != nccl_code(pin):
        return fail(f"torch loaded NCCL {code_to_version(code)}, the lock pins {pin}", expected, found)
    image, _ = nccl_probe(ctx)
    if image and image.get("real") and image["real"] != data.get("loaded_real"):
        return fail(
            f"torch loads {data.get('loaded_real')}, but the image's loader finds {image['real']}: two NCCLs",
            expected,
            found,
        )
    return passed(expected, found, loaded=loaded[0])


@check("one-nccl", "nccl", scopes=CONTAINER)
def one_nccl(ctx: CheckContext) -> CheckResult:
    """Every libnccl.so* in the image is one file (or a link to it): no second NCCL for anything to load."""
    ran = ctx.run(
        "find / -xdev \\( -path /proc -o -path /sys \\) -prune -o -name 'libnccl.so*' -print 2>/dev/null"
        ' | while read -r f; do printf "%s %s\\n" "$f" "$(readlink -f "$f")"; done',
        timeout_s=120,
    )
    pairs = [line.split(" ", 1) for line in ran.out.splitlines() if " " in line]
    real = sorted({r for _, r in pairs})
    if not pairs:
        return fail("no libnccl.so* in the image", expected="one libnccl", found="none")
    if len(real) > 1:
        return fail(f"{len(real)} different NCCL libraries: {', '.join(real)}", "one libnccl", ", ".join(real))
    return passed("one libnccl", real[0], files=[f for f, _ in pairs])


@check("torch-nccl-version", "nccl")
def torch_nccl_version(ctx: CheckContext) -> CheckResult:
    """torch.cuda.nccl.version() (the NCCL PyTorch was built with) is the pinned NCCL."""
    if not ctx.has("pytorch"):
        return skip("PyTorch is not in the recipe", expected=ctx.version("nccl") or "")
    data, ran = torch_probe(ctx)
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
