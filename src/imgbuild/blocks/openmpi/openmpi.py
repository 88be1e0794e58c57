"""openmpi: Open MPI from the EFA installer, the distribution, the base image, or built from a source release.

mpirun starts its remote daemons over ssh, so every mode brings the ssh client.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Literal

import imgbuild.blocks._releases as releases
from imgbuild.blocks._block import Block, Downloads, Released
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution
from imgbuild.blocks.efa import from_efa
from imgbuild.blocks.gaudi import check_base
from imgbuild.checks import CheckContext, check, compare, fail, first_executable
from imgbuild.checks.context import PinView
from imgbuild.checks.results import CheckResult
from imgbuild.core import platforms
from imgbuild.core.distro import DISTRO
from imgbuild.core.fields import AbsPath, Strict, pin_validator

# The distribution's Open MPI lives in its multiarch directory: one pin for every architecture, each image's own path.


DISTRO_PREFIX = f"/usr/lib/{platforms.MULTIARCH}/openmpi"


class OpenMPI(Strict):
    """Open MPI: from the EFA installer, the distribution, the base image, or built from a source release."""

    source: Literal["efa", "distro", "base", "source"]
    """efa: the EFA installer's | distro: the distribution's | base: the base image's | source: built from a source
    release."""
    version: str | None = None
    """Checked against what that source has (required for base and source)."""
    prefix: AbsPath | None = None
    """Where it lives (efa: /opt/amazon/openmpi or openmpi5; source: /opt/openmpi; base: the base's)."""
    _pin = pin_validator("version")


def owns_libmpi(pin: PinView, path: str) -> bool:
    """Whether `path` (a real path) is this Open MPI's libmpi: the distribution's is in its multiarch library folder,
    the prefix's parent (the prefix holds only its plugins); another's is under its prefix (lib or lib64)."""
    prefix = (pin.details.prefix or "").rstrip("/") if pin.details is not None else ""
    if not prefix:
        return False
    if pin.source == "distro":
        return posixpath.dirname(path) == posixpath.dirname(prefix)
    return path.startswith(prefix + "/")


def source_url(version: str) -> str:
    """Open MPI's source release tarball (the one place its URL is written)."""
    series = ".".join(version.split(".")[:2])
    return f"https://download.open-mpi.org/release/open-mpi/v{series}/openmpi-{version}.tar.bz2"


class OpenmpiBlock(Block, Downloads, Released):
    name = "openmpi"
    options = OpenMPI
    modes = {"efa": "provided", "distro": "packages", "base": "provided", "source": "fragment"}
    tag = (7, "ompi")
    template_globals = {"openmpi_source_url": source_url}
    node_checks = ("mpi4py gather",)  # every rank runs the pinned Open MPI

    def resolve(self, m: OpenMPI, rs: Resolution) -> Pin:
        key = "components.openmpi"
        if m.source == "efa":
            pin = from_efa(rs, f"{key}.source", "Open MPI")
            efa = rs.options("efa")
            prefix = m.prefix or ("/opt/amazon/openmpi5" if efa.mpi == "openmpi5" else "/opt/amazon/openmpi")
            return pin.model_copy(update={"version": m.version, "details": Details(prefix=prefix)})
        if m.source == "distro":
            return rs.distro_pin(key, "openmpi", m.version).model_copy(
                update={"details": Details(prefix=DISTRO_PREFIX)}
            )
        if m.version is None:
            raise rs.fail(f"{key}.version", f"required when Open MPI comes from '{m.source}'")
        if m.source == "base":
            check_base(rs, f"{key}.version", "openmpi", m.version)
        where = m.prefix or ("/opt/openmpi" if m.source == "source" else None)
        return Pin(version=m.version, source=m.source, origin="recipe", details=Details(prefix=where))

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="openmpi")
        if pin.source == "distro":
            c.runtime_packages |= {"openmpi-bin"}
            distro = DISTRO.get(f"{ctx.resolved.recipe.os.family}{ctx.resolved.recipe.os.version}")
            c.stub_packages |= dict(distro.openmpi_stubs) if distro else {}
        elif pin.source == "source":
            c.builder_packages |= {"curl", "ca-certificates", "build-essential", "bzip2"}
            c.path.append(f"{pin.details.prefix}/bin")
            c.ld_library_path.append(f"{pin.details.prefix}/lib")
        elif pin.source == "base" and pin.details.prefix:
            c.env["MPI_ROOT"] = pin.details.prefix
            c.path.append(f"{pin.details.prefix}/bin")
        c.runtime_packages.add("openssh-client")  # mpirun starts remote daemons over ssh
        # Containers run as root: the mpirun lines people copy from guides then run unchanged (AWS's DL containers).
        c.env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        return c

    def downloads(self, pin: Pin, ctx: Context) -> list[str]:
        return [source_url(str(pin.version))] if pin.source == "source" else []

    def release_file(self) -> releases.ReleaseFile:
        """Open MPI's releases built from source (their downloads' checksums)."""
        return releases.component_file("openmpi", releases.ReleaseFile)


BLOCK = OpenmpiBlock()


@check("openmpi-version", "openmpi")
def openmpi_version(ctx: CheckContext) -> CheckResult:
    """`mpirun --version` reports the pinned Open MPI."""
    # The distribution's Open MPI keeps its libraries under its prefix and mpirun on PATH (/usr/bin).
    prefix = ctx.prefix("openmpi") if ctx.components["openmpi"].source != "distro" else None
    if prefix:  # the recipe says where Open MPI is (MPI_ROOT): it must be there, not merely some mpirun on PATH
        ran = ctx.run(f"test -x {shlex.quote(prefix)}/bin/mpirun")
        if not ran.ok:
            return fail(f"{prefix}/bin/mpirun does not exist", expected=f"{prefix}/bin/mpirun", found="missing")
    mpirun = first_executable(ctx, [f"{prefix}/bin/mpirun"] if prefix else [], "mpirun")
    if mpirun is None:
        return fail("mpirun not found", expected=ctx.version("openmpi") or "mpirun", found="missing")
    ran = ctx.run(f"{shlex.quote(mpirun)} --version")
    m = re.search(r"\(Open MPI\)\s+(\S+)", ran.out + ran.err)
    if not ran.ok or m is None:
        return fail(f"{mpirun} --version: {ran.why()}", expected=ctx.version("openmpi") or "Open MPI")
    return compare(ctx.version("openmpi"), m.group(1), "Open MPI", path=mpirun)
