"""python: the image's Python and the virtual environment pip packages go into.

With a venv, an image that installs requirement sets gets uv too (the set `python/uv`, hashed in the lock like the
others): pip installs it in the builder stage, apart from the venv (UV_DIR, never copied to the runtime stage), and
uv installs every other hashed set (imgbuild.image.dockerfile.pip_install), the runtime stage's through a bind mount of
UV_DIR from the builder stage, so uv is in no layer of the image.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Literal

from imgbuild.blocks._block import Block, PythonSets
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution
from imgbuild.checks import CheckContext, check, compare, fail
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import AbsPath, Strict, pin_validator


class Python(Strict):
    """Python and the virtual environment pip packages go into (`--system-site-packages`)."""

    source: Literal["distro", "base"] = "distro"
    """distro: the distribution's python3 | base: the base image's."""
    venv: AbsPath | None = "/opt/venv"
    """A venv with --system-site-packages (it sees the distribution's mpi4py) that pip packages go into; null for
    none."""
    version: str | None = None
    """Checked against what that source has (required for base)."""
    _pin = pin_validator("version")


# uv, the installer of the image's requirement sets (see the module's docstring): its set, where pip puts it in the
# builder stage (pip --target: the binary is UV_DIR/bin/uv) and where the runtime stage's RUNs mount it (the same
# path; BuildKit leaves an empty mountpoint folder there, as it does for the requirements files' /tmp folder), and
# its download and wheel cache (a cache mount).
UV_SET = "python/uv"
UV_REQUIREMENT = "uv>=0.8"  # the lock pins the version (and keeps it while it resolves): every option used is in 0.8
UV_DIR = "/tmp/imgbuild-uv"
UV_BIN = f"{UV_DIR}/bin/uv"
UV_CACHE_DIR = "/root/.cache/uv"
UV_CACHE_ID = "imgbuild-uv"


class PythonDetails(Details):
    """The python pin: `prefix` is the virtual environment pip installs into (None: the system's Python)."""

    @property
    def venv(self) -> str | None:
        return self.prefix


def site_packages(pin: Pin) -> str | None:
    """Where pip puts packages in the venv (the nvidia-* wheels' libraries and headers live below it)."""
    return f"{pin.details.prefix}/lib/python{pin.version}/site-packages" if pin.details.prefix and pin.version else None


def requirements(pin: Pin, ctx: Context) -> dict[str, list[str]]:
    """uv (UV_SET), when the image has a venv and another block installs a requirement set: the builder stage's pip
    installs it apart from the venv (`requirements_apart`), and it installs the other sets."""
    if not pin.typed(PythonDetails).venv:
        return {}
    others = [name for name in ctx.requirement_blocks if name != BLOCK.name]
    return {UV_SET: [UV_REQUIREMENT]} if others else {}


def uv_installs(ctx: Context) -> bool:
    """Whether the image installs its hashed requirement sets with uv: the python block declares UV_SET and the
    resolution has lock content (without it, pip installs every set unhashed and uv is not installed at all)."""
    pin = ctx.resolved.pins.get(BLOCK.name)
    return ctx.content is not None and pin is not None and UV_SET in requirements(pin, ctx)


def require_venv(rs: Resolution) -> None:
    """Blocks that pip-install need the python block with its virtual environment."""
    py = rs.options("python")
    if py is None or py.venv is None:
        raise rs.fail("components.python", "pip-installed components need components.python (with a venv)")


class PythonBlock(Block, PythonSets):
    name = "python"
    options = Python
    modes = {"distro": "packages", "base": "provided"}
    details = PythonDetails
    requirements_apart = (UV_SET,)  # installed with pip --target UV_DIR in the builder stage, outside the venv
    template_globals = {"uv_installs": uv_installs, "uv_dir": lambda: UV_DIR}
    under_os_packages = True  # the venv, before PyTorch's wheels go into it

    def resolve(self, py: Python, rs: Resolution) -> Pin:
        if py.source == "distro":
            pin = rs.distro_pin("components.python", "python", py.version)
        else:
            if py.version is None:
                raise rs.fail("components.python.version", "required when Python comes with the base image")
            pin = Pin(version=py.version, source="base", origin="base image")
        return pin.model_copy(update={"details": PythonDetails(prefix=py.venv)})

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="python")
        c.runtime_packages |= {"python3"} if pin.source == "distro" else set()
        c.env["PYTHONUNBUFFERED"] = "1"  # training logs reach SageMaker / CloudWatch as they are written
        venv = pin.typed(PythonDetails).venv
        if venv:
            c.builder_packages |= {"python3-venv", "ca-certificates"}
            c.runtime_packages.add("python3-venv")
            c.path.append(f"{venv}/bin")
        return c

    def requirements(self, pin: Pin, ctx: Context) -> Mapping[str, list[str]]:
        return requirements(pin, ctx)


BLOCK = PythonBlock()


@check("python-version", "python")
def python_version(ctx: CheckContext) -> CheckResult:
    """The image's Python (the venv's when there is one) is the pinned version."""
    ran = ctx.run(f"{shlex.quote(ctx.python)} --version")
    m = re.search(r"Python\s+(\S+)", ran.out + ran.err)
    if not ran.ok or m is None:
        return fail(f"{ctx.python} --version: {ran.why()}", expected=ctx.version("python") or "python")
    return compare(ctx.version("python"), m.group(1), "Python", path=ctx.python)
