"""mpi4py: MPI for Python, from the distribution's package or pip (compiled against the image's Open MPI)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Literal

from imgbuild.blocks._block import Block, PythonDists, PythonSets, Tracks
from imgbuild.blocks._core import Context, Contribution, Pin, Resolution, Tracked, builder_base, slug
from imgbuild.blocks.python import require_venv
from imgbuild.checks import CheckContext, check, compare, fail
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import Strict, pin_validator


class MPI4Py(Strict):
    """mpi4py: the distribution's package, or pip (built against the image's MPI)."""

    source: Literal["distro", "pip"] = "distro"
    """distro: python3-mpi4py | pip: `pip install --no-binary mpi4py mpi4py==VERSION` into the venv, built with the
    image's mpicc (never a prebuilt wheel made for another MPI), from the sdist the lock hashes, with
    --no-build-isolation against its build requirements (setuptools, Cython), hashed too."""
    version: str | None = None
    """Checked against the distribution's (distro); required for pip."""
    _pin = pin_validator("version")


# What building mpi4py's sdist needs in the venv (pip): its pyproject's build backend, setuptools (it asks >= 42;
# 70.1 is the first with bdist_wheel of its own, without the `wheel` package: the venv's own setuptools, Debian 12's
# 66, would satisfy >= 42 and fail with "invalid command 'bdist_wheel'"), and Cython >= 3
# (conf/requirements-build-cython.txt: mpi4py 4's sdist carries MPI.pyx, no generated MPI.c). `build`, also in its
# build-system table, is only its backend's fallback when setuptools cannot be imported, so it is left out.
BUILD_REQUIREMENTS = ["setuptools>=70.1", "cython>=3.0.0"]


def mpicc(ctx: Context) -> str:
    """The MPI compiler wrapper pip builds mpi4py with."""
    mpi = ctx.need("openmpi")
    return "mpicc" if mpi.source == "distro" else f"{mpi.details.prefix}/bin/mpicc"


def wheel_cache_id(ctx: Context) -> str:
    """The cache id of the pip wheel cache mpi4py's build writes to: one per MPI it can be compiled against (the
    builder stage's base image, the Open MPI pin, mpicc), so that a wheel built for one MPI is never installed for
    another. Readable part: the MPI; a digest of all three keeps bases apart."""
    mpi, efa = ctx.need("openmpi"), ctx.pin("efa")
    what = f"openmpi-{mpi.source}-{mpi.version or (efa.version if efa and mpi.source == 'efa' else mpi.origin)}"
    key = "\n".join([builder_base(ctx.resolved), mpi.model_dump_json(), mpicc(ctx)])
    return f"imgbuild-pip-wheels-mpi4py-{slug(what)}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


class Mpi4pyBlock(Block, PythonSets, PythonDists, Tracks):
    name = "mpi4py"
    options = MPI4Py
    modes = {"distro": "packages", "pip": "fragment"}
    after = ("python", "openmpi")
    build_after = ("python", "openmpi")
    template_globals = {"mpi4py_mpicc": mpicc, "mpi4py_wheel_cache_id": wheel_cache_id}

    def resolve(self, mp: MPI4Py, rs: Resolution) -> Pin:
        if rs.options("python") is None:
            raise rs.fail("components.mpi4py", "mpi4py needs components.python")
        if mp.source == "distro":
            return rs.distro_pin("components.mpi4py", "mpi4py", mp.version)
        require_venv(rs)
        if mp.version is None:
            raise rs.fail("components.mpi4py.version", "required for pip")
        if "openmpi" not in rs.pins:
            raise rs.fail(
                "components.mpi4py.source", "'pip' compiles mpi4py against the image's MPI: add components.openmpi"
            )
        return Pin(version=mp.version, source="pip", origin="recipe")

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="mpi4py")
        if pin.source == "distro":
            c.runtime_packages.add("python3-mpi4py")
            return c
        c.builder_packages |= {"build-essential", "python3-dev"}
        mpi = ctx.need("openmpi")
        if mpi.source == "distro":
            c.builder_packages.add("libopenmpi-dev")
        c.needs_fabric_in_builder = mpi.source == "efa"
        return c

    def requirements(self, pin: Pin, ctx: Context) -> dict[str, list[str]]:
        """pip: the build requirements, then mpi4py from its sdist (`--no-binary`: its record is the sdist's hash),
        built with --no-build-isolation against them."""
        if pin.source != "pip":
            return {}
        return {"mpi4py/build": list(BUILD_REQUIREMENTS), "mpi4py": ["--no-binary=mpi4py", f"mpi4py=={pin.version}"]}

    # Debian's python3-mpi4py is built against Debian's Open MPI: a requirement set never installs another over it
    def python_dists(self, pin: Pin) -> Mapping[str, str]:
        return {"mpi4py": pin.version} if pin.source == "distro" and pin.version else {}

    def track(self, pin: Pin, resolved: Any, files: Callable[[str], Any]) -> list[Tracked] | None:
        """`imgbuild outdated`: a pip-installed mpi4py's releases on the package index (a distribution's: its table)."""
        return [Tracked("index", "mpi4py", ("components", "mpi4py", "version"))] if pin.source == "pip" else None


BLOCK = Mpi4pyBlock()


@check("mpi4py-version", "mpi4py")
def mpi4py_version(ctx: CheckContext) -> CheckResult:
    """mpi4py imports and is the pinned version."""
    data, ran = ctx.python_json("import json, mpi4py; print(json.dumps({'version': mpi4py.__version__}))")
    if data is None:
        return fail(f"import mpi4py: {ran.why()}", expected=ctx.version("mpi4py") or "mpi4py")
    return compare(ctx.version("mpi4py"), str(data["version"]), "mpi4py")
