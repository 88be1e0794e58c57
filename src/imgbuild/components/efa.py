"""efa: the AWS EFA installer (libfabric with the efa provider, Open MPI, and since about 1.39 aws-ofi-nccl).

Recipe options (`components.efa`):
    version   the installer release, e.g. 1.43.2 (compat.EFA says which OS releases it supports and what it bundles)
    source    installer (default): downloaded in the builder, checked, run in the runtime stage;
              base: the base image already has it (Gaudi's images)
    sha256    check the tarball by this digest instead of AWS's GPG signature
    mpi       openmpi4 (default) | openmpi5: which Open MPI the installer puts in /opt/amazon
    minimal   --minimal: libfabric only, no Open MPI
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from imgbuild import compat
from imgbuild.checks import CheckContext, check, compare, fail
from imgbuild.components._core import Block, Context, Contribution, Pin, Resolution
from imgbuild.report import CheckResult
from imgbuild.schema import Strict, pin_validator


class Efa(Strict):
    """AWS EFA installer: libfabric with the efa provider, Open MPI, and (since about 1.39) aws-ofi-nccl.

    source: `installer` downloads and runs it (checked by sha256 when given, else by its GPG signature
    against AWS's key fingerprint); `base` records the one the base image already has.
    """

    version: str
    source: Literal["installer", "base"] = "installer"
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    mpi: Literal["openmpi4", "openmpi5"] = "openmpi4"
    minimal: bool = False
    _pin = pin_validator("version")


def resolve(e: Efa, rs: Resolution) -> Pin:
    release = compat.EFA.get(e.version)
    if release is None:
        rs.warnings.append(
            f"EFA installer {e.version} is not in the shipped table: OS support and the bundled "
            "plugin version are unchecked"
        )
    elif rs.os_id not in release.os:
        raise rs.fail(
            "components.efa.version / os",
            f"EFA installer {e.version} supports {', '.join(release.os)}, not {rs.os_id}",
        )
    if e.source == "base":
        gaudi_opts = rs.options("gaudi")
        gaudi = compat.GAUDI.get(gaudi_opts.version) if gaudi_opts else None
        if gaudi is not None and gaudi.efa != e.version:
            raise rs.fail(
                "components.efa.version", f"Gaudi {gaudi_opts.version}'s image has EFA {gaudi.efa}, got {e.version}"
            )
    details = {"mpi": e.mpi, "check": "sha256" if e.sha256 else "signature"}
    if e.sha256:
        details["sha256"] = e.sha256
    else:
        details["key_fingerprint"] = compat.EFA_KEY_FINGERPRINT
    return Pin(version=e.version, source=e.source, origin="recipe", details=details)


def contribute(pin: Pin, ctx: Context) -> Contribution:
    c = Contribution(name="efa")
    if pin.source == "installer":
        c.builder_packages |= {"curl", "ca-certificates", "gnupg"}
        mpi_bin = "/opt/amazon/openmpi5/bin" if pin.details.get("mpi") == "openmpi5" else "/opt/amazon/openmpi/bin"
        c.path += [mpi_bin, "/opt/amazon/efa/bin"]
        c.ld_library_path += ["/opt/amazon/efa/lib"]
        if not ctx.resolved.recipe.components.efa.minimal:
            # nccl-tests (and whatever else links -lmpi) carry no rpath to the installer's Open MPI.
            c.ld_library_path.append(mpi_bin.removesuffix("/bin") + "/lib")
    return c


def facts(pin: Pin, out: dict[str, object]) -> None:
    out.setdefault("libfabric_prefix", "/opt/amazon/efa")  # unless a libfabric block says otherwise


def efa_flags(resolved: object) -> str:
    """The EFA installer's command line inside a container build."""
    r = resolved.recipe  # type: ignore[attr-defined]
    e = r.components.efa
    flags = [*compat.EFA_CONTAINER_FLAGS, f"--mpi={e.mpi}"]
    if e.minimal:
        flags.append("--minimal")
    flags += ngc_flags(e.version, r.base.image, resolved.pins.get("aws_ofi_nccl"))  # type: ignore[attr-defined]
    return " ".join(flags)


def ngc_flags(version: str, base_image: str, plugin: Pin | None) -> list[str]:
    """THE rule for the installer's NGC detection (compat.EFA_NGC_DETECTION): from 1.48 on an nvidia/cuda base,
    `--disable-build-ngc` (else rdma-core is skipped and libfabric1-aws's dependencies fail, whatever the plugin's
    source) and, when the image uses the installer's plugin, `--disable-ngc` (else the plugin is skipped)."""
    if compat.Version(version) < compat.Version(compat.EFA_NGC_DETECTION) or not compat.ngc_base(base_image):
        return []
    return ["--disable-build-ngc", *(["--disable-ngc"] if plugin is not None and plugin.source == "efa" else [])]


BLOCK = Block(
    name="efa",
    options=Efa,
    modes={"installer": "fragment", "base": "provided"},
    resolve=resolve,
    contribute=contribute,
    facts=facts,
    tag=(6, "efa"),
    template_globals={"efa_flags": efa_flags},
)


@check("efa-installer-version", "efa")
def efa_installer_version(ctx: CheckContext) -> CheckResult:
    """/opt/amazon/efa_installed_packages records the pinned EFA installer."""
    ran = ctx.run("cat /opt/amazon/efa_installed_packages")
    m = re.search(r"EFA installer version:\s*(\S+)", ran.out)
    if not ran.ok or m is None:
        return fail(f"no EFA installer record: {ran.why()}", expected=ctx.version("efa") or "", found="missing")
    return compare(ctx.version("efa"), m.group(1), "EFA installer")
