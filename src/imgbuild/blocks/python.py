"""python: the image's Python and the virtual environment pip packages go into.

Recipe options (`components.python`):
    source    distro (default): the distribution's python3 | base: the base image's
    venv      /opt/venv (default): a venv with --system-site-packages (it sees the distribution's mpi4py);
              null for none
    version   checked against what that source has (required for base)
"""

from __future__ import annotations

import re
import shlex
from typing import Literal

from imgbuild.blocks._core import Block, Context, Contribution, Details, Pin, Resolution
from imgbuild.checks import CheckContext, check, compare, fail
from imgbuild.checks.results import CheckResult
from imgbuild.spec.schema import AbsPath, Strict, pin_validator


class Python(Strict):
    """Python and the virtual environment pip packages go into (`--system-site-packages`)."""

    source: Literal["distro", "base"] = "distro"
    venv: AbsPath | None = "/opt/venv"
    version: str | None = None
    _pin = pin_validator("version")


class PythonDetails(Details):
    """The python pin: `prefix` is the virtual environment pip installs into (None: the system's Python)."""

    @property
    def venv(self) -> str | None:
        return self.prefix


def site_packages(pin: Pin) -> str | None:
    """Where pip puts packages in the venv (the nvidia-* wheels' libraries and headers live below it)."""
    return f"{pin.details.prefix}/lib/python{pin.version}/site-packages" if pin.details.prefix and pin.version else None


def resolve(py: Python, rs: Resolution) -> Pin:
    if py.source == "distro":
        pin = rs.distro_pin("components.python", "python", py.version)
    else:
        if py.version is None:
            raise rs.fail("components.python.version", "required when Python comes with the base image")
        pin = Pin(version=py.version, source="base", origin="base image")
    return pin.model_copy(update={"details": PythonDetails(prefix=py.venv)})


def contribute(pin: Pin, ctx: Context) -> Contribution:
    c = Contribution(name="python")
    c.runtime_packages |= {"python3"} if pin.source == "distro" else set()
    c.env["PYTHONUNBUFFERED"] = "1"  # training logs reach SageMaker / CloudWatch as they are written
    venv = pin.typed(PythonDetails).venv
    if venv:
        c.builder_packages |= {"python3-venv", "ca-certificates"}
        c.runtime_packages.add("python3-venv")
        c.path.append(f"{venv}/bin")
    return c


BLOCK = Block(
    name="python",
    options=Python,
    modes={"distro": "packages", "base": "provided"},
    resolve=resolve,
    contribute=contribute,
    details=PythonDetails,
)


@check("python-version", "python")
def python_version(ctx: CheckContext) -> CheckResult:
    """The image's Python (the venv's when there is one) is the pinned version."""
    ran = ctx.run(f"{shlex.quote(ctx.python)} --version")
    m = re.search(r"Python\s+(\S+)", ran.out + ran.err)
    if not ran.ok or m is None:
        return fail(f"{ctx.python} --version: {ran.why()}", expected=ctx.version("python") or "python")
    return compare(ctx.version("python"), m.group(1), "Python", path=ctx.python)
