"""efa: the AWS EFA installer (libfabric with the efa provider, Open MPI, and since about 1.39 aws-ofi-nccl)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

import imgbuild.blocks._releases as releases
from imgbuild.blocks._block import Block, Downloads, Released
from imgbuild.blocks._core import Artifact, Context, Contribution, Details, Pin, Resolution, with_prefix
from imgbuild.blocks._releases import Text
from imgbuild.blocks.gaudi import check_base
from imgbuild.checks import CheckContext, check, compare, fail
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import Strict, pin_validator


class EfaRow(releases.Row):
    """An EFA installer release: what it bundles (None: not known) and the OS releases it installs on."""

    aws_ofi_nccl: Text | None = None
    libfabric: Text | None = None
    openmpi4: Text | None = None
    openmpi5: Text | None = None
    os: tuple[Text, ...] = Field(min_length=1)


class EfaBundle(BaseModel):
    """What an EFA installer tarball itself says it bundles, read at `imgbuild lock` from the package files it holds
    (imgbuild.pin.artifacts): None where the tarball holds no such package. `read_from` names the tarball (its file
    name, and `--files` or the URL it was downloaded from). The lock records it in the efa pin's details; a lock
    without one took the bundle from releases.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    aws_ofi_nccl: str | None = None
    libfabric: str | None = None
    openmpi4: str | None = None
    openmpi5: str | None = None
    read_from: Text


BUNDLED = ("aws_ofi_nccl", "libfabric", "openmpi4", "openmpi5")
Bundled = Literal["aws_ofi_nccl", "libfabric", "openmpi4", "openmpi5"]


class EfaFile(releases.ReleaseFile):
    component: Literal["efa"]
    releases: tuple[EfaRow, ...] = Field(min_length=1)
    key_fingerprint: Annotated[str, Field(pattern=r"^[0-9A-F]{40}$")]
    container_flags: tuple[Text, ...] = Field(min_length=1)
    ngc_detection_from: Text
    ngc_bases: tuple[Text, ...] = Field(min_length=1)  # image names; one ending in "/" is a prefix


def efa_file() -> EfaFile:
    return releases.component_file("efa", EfaFile)


def efa_release(version: str) -> EfaRow | None:
    return releases.by_version(efa_file().releases).get(version)


class Efa(Strict):
    """AWS EFA installer: libfabric with the efa provider, Open MPI, and (since about 1.39) aws-ofi-nccl."""

    version: str
    """The installer release, e.g. 1.43.2 (its releases.yaml says which OS releases it supports and what it bundles)."""
    source: Literal["installer", "base"] = "installer"
    """installer: downloaded in the builder, checked (by `sha256` when given, else by its GPG signature against AWS's
    key fingerprint), run in the runtime stage | base: the base image already has it (Gaudi's images)."""
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    """Check the tarball by this digest instead of AWS's GPG signature."""
    mpi: Literal["openmpi4", "openmpi5"] = "openmpi4"
    """Which Open MPI the installer puts in /opt/amazon."""
    minimal: bool = False
    """`--minimal`: libfabric only, no Open MPI."""
    _pin = pin_validator("version")


class EfaDetails(Details):
    """The installer's pin: which Open MPI it installs, whether it is minimal, how its download is checked.
    `prefix` is where its libfabric lives."""

    prefix: str | None = "/opt/amazon/efa"
    mpi: Literal["openmpi4", "openmpi5"]
    minimal: bool = False
    check: Literal["sha256", "signature"]
    sha256: str | None = None
    key_fingerprint: str | None = None
    # What the installer tarball itself says it bundles, where `imgbuild lock` read it (EfaBundle); left out
    # of the lock when it was not read (the bundle then is releases.yaml's row), so such locks read as before.
    bundle: EfaBundle | None = None

    @model_serializer(mode="wrap")
    def _unread_bundle_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("bundle") is None:
            data.pop("bundle", None)
        return data

    @property
    def mpi_prefix(self) -> str:
        """Where the installer puts its Open MPI."""
        return "/opt/amazon/openmpi5" if self.mpi == "openmpi5" else "/opt/amazon/openmpi"


INSTALLER_HOST = "https://efa-installer.amazonaws.com"


def installer_urls(version: str) -> dict[str, str]:
    """The installer's tarball, its detached GPG signature and AWS's signing key (the one place their URLs are
    written)."""
    tarball = f"{INSTALLER_HOST}/aws-efa-installer-{version}.tar.gz"
    return {"tarball": tarball, "signature": f"{tarball}.sig", "key": f"{INSTALLER_HOST}/aws-efa-installer.key"}


def efa_flags(pin: Pin, ctx: Context) -> str:
    """The EFA installer's command line inside a container build (from the pins: the installer's, the base
    image's and the plugin's)."""
    d = pin.typed(EfaDetails)
    flags = [*efa_file().container_flags, f"--mpi={d.mpi}"]
    if d.minimal:
        flags.append("--minimal")
    flags += ngc_flags(str(pin.version), ctx.details("base").image, ctx.pin("aws_ofi_nccl"))
    return " ".join(flags)


def ngc_flags(version: str, base_image: str, plugin: Pin | None) -> list[str]:
    """THE rule for the installer's NGC detection (releases.yaml's ngc_detection_from): from 1.48 on an NGC base,
    `--disable-build-ngc` (else rdma-core is skipped and libfabric1-aws's dependencies fail, whatever the plugin's
    source) and, when the image uses the installer's plugin, `--disable-ngc` (else the plugin is skipped)."""
    listed = efa_file()
    if Version(version) < Version(listed.ngc_detection_from) or not ngc_base(base_image):
        return []
    return ["--disable-build-ngc", *(["--disable-ngc"] if plugin is not None and plugin.source == "efa" else [])]


def ngc_base(image: str) -> bool:
    """Whether the EFA installer (1.48+) takes a base image of this name (no tag) for an NGC build image."""
    return any(image == b or (b.endswith("/") and image.startswith(b)) for b in efa_file().ngc_bases)


# The packages whose versions the bundle records, by the names the installer's .deb and .rpm files carry.
PACKAGES: dict[str, Bundled] = {
    "libfabric1-aws": "libfabric",  # .deb
    "libfabric-aws": "libfabric",  # .rpm
    "libnccl-ofi": "aws_ofi_nccl",
    "aws-ofi-nccl": "aws_ofi_nccl",
    "openmpi40-aws": "openmpi4",
    "openmpi50-aws": "openmpi5",
}
_NAMES = "|".join(sorted(map(re.escape, PACKAGES), key=len, reverse=True))
# DEBS/<OS>/<machine>/[sub/]<name>_<version>[-<revision>]_<debarch>.deb
_DEB = re.compile(
    rf"(?:\./)?[^/]+/DEBS/(?P<os>[A-Z0-9]+)/(?P<machine>[^/]+)/(?:[^/]+/)*(?P<pkg>{_NAMES})_(?P<version>\d[^_]*?)"
    r"(?:-\d+)?_[^_/]+\.deb"
)
# RPMS/<OS>/<machine>/[sub/]<name>-<version>-<release>.rpm (the version starts with a digit: -devel is another name)
_RPM = re.compile(
    rf"(?:\./)?[^/]+/RPMS/(?P<os>[A-Z0-9]+)/(?P<machine>[^/]+)/(?:[^/]+/)*(?P<pkg>{_NAMES})-(?P<version>\d[^-/]*)"
    r"-[^-/]+\.rpm"
)


def os_folder(os_id: str) -> str:
    """The installer's folder name of an OS release: ubuntu22.04 -> UBUNTU2204, debian12 -> DEBIAN12."""
    return os_id.upper().replace(".", "")


def bundled_in(names: Iterable[str], os_id: str, machines: Sequence[str]) -> dict[str, str]:
    """The bundled versions (EfaBundle's fields) that the tarball's member `names` hold for `os_id` on `machines`;
    ValueError saying why when the tarball has no folder for them or its machines disagree."""
    found: dict[str, dict[str, set[str]]] = {}  # os folder -> field -> versions
    for name in names:
        m = _DEB.fullmatch(name) or _RPM.fullmatch(name)
        if m is None or m["machine"] not in machines:
            continue
        found.setdefault(m["os"], {}).setdefault(PACKAGES[m["pkg"]], set()).add(m["version"])
    folder = os_folder(os_id)
    if folder not in found:
        listed = ", ".join(sorted(found)) or "none"
        raise ValueError(f"it holds no {'/'.join(machines)} packages for {os_id} ({folder}; it has: {listed})")
    out: dict[str, str] = {}
    for what, versions in sorted(found[folder].items()):
        if len(versions) > 1:
            raise ValueError(f"its {folder} folders hold {what} {' and '.join(sorted(versions))}")
        out[what] = versions.pop()
    return out


def bundle_of(scan: Any, version: str, target: Any) -> EfaBundle:
    """What an installer tarball's package files say it bundles for the target's OS release and machines."""
    try:
        found = bundled_in(scan.names, target.os_id, target.machines)
    except ValueError as exc:
        raise ValueError(f"{scan.read_from}: {exc}") from None
    return EfaBundle(**found, read_from=scan.read_from)


def recorded_bundle(pin: Pin) -> EfaBundle | None:
    """The bundle a lock's efa pin records (None: it took releases.yaml's row)."""
    bundle = getattr(pin.details, "bundle", None)
    return bundle if isinstance(bundle, EfaBundle) else None


def listed_bundle(version: str) -> dict[str, str | None]:
    row = efa_release(version)
    return {what: getattr(row, what, None) for what in BUNDLED}


def bundle(rs: Resolution, version: str) -> EfaBundle | None:
    """What EFA installer `version`'s tarball says it bundles, where `imgbuild lock` read it (None: not read)."""
    read = rs.artifact("efa", version)
    return read if isinstance(read, EfaBundle) else None


def bundled(rs: Resolution, version: str, what: Bundled) -> str | None:
    """THE version of `what` that EFA installer `version` bundles: its tarball's where it was read and holds one,
    else releases.yaml's row (None: neither says)."""
    read = bundle(rs, version)
    found: str | None = getattr(read, what) if read is not None else None
    row = efa_release(version)
    return found if found is not None else (getattr(row, what) if row is not None else None)


def from_efa(rs: Resolution, key: str, component: str) -> Pin:
    """A pin for something the EFA installer brings (needs a non-minimal components.efa)."""
    e = rs.options("efa")
    if e is None or e.minimal:
        raise rs.fail(key, f"{component} from the EFA installer needs components.efa (not minimal)")
    return Pin(version=None, source="efa", origin=f"EFA installer {e.version}")


ARTIFACT = Artifact(
    what="bundle",
    archive="the installer tarball",
    parse=bundle_of,
    recorded=recorded_bundle,
    url=lambda version: installer_urls(version)["tarball"],
    listed=listed_bundle,
)


class EfaBlock(Block, Downloads, Released):
    name = "efa"
    options = Efa
    modes = {"installer": "fragment", "base": "provided"}
    details = EfaDetails
    provides = ("libfabric",)
    tag = (6, "efa")
    template_globals = {"efa_flags": efa_flags, "efa_installer_urls": installer_urls}
    artifact = ARTIFACT

    def resolve(self, e: Efa, rs: Resolution) -> Pin:
        # A base image's installer that the Gaudi table records was run by Habana on that release's OS: not unchecked.
        vouched = e.source == "base" and check_base(rs, "components.efa.version", "efa", e.version)
        release = efa_release(e.version)
        read = bundle(rs, e.version) if e.source == "installer" else None
        if release is None:
            if not vouched:
                unchecked = "OS support is" if read is not None else "OS support and the bundled plugin version are"
                where = releases.file_name("efa")
                rs.warnings.append(f"EFA installer {e.version} is not in {where}: {unchecked} unchecked")
        elif rs.os_id not in release.os:
            raise rs.fail(
                "components.efa.version / os",
                f"EFA installer {e.version} supports {', '.join(release.os)}, not {rs.os_id}",
            )
        details = EfaDetails(
            mpi=e.mpi,
            minimal=e.minimal,
            check="sha256" if e.sha256 else "signature",
            sha256=e.sha256,
            key_fingerprint=None if e.sha256 else efa_file().key_fingerprint,
            bundle=read,
        )
        return Pin(version=e.version, source=e.source, origin="recipe", details=details)

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="efa")
        if pin.source == "installer":
            c.builder_packages |= {"curl", "ca-certificates", "gnupg"}
            d = pin.typed(EfaDetails)
            c.path += [f"{d.mpi_prefix}/bin", f"{d.prefix}/bin"]
            c.ld_library_path += [f"{d.prefix}/lib"]
            if not d.minimal:
                # nccl-tests (and whatever else links -lmpi) carry no rpath to the installer's Open MPI.
                c.ld_library_path.append(f"{d.mpi_prefix}/lib")
            if not ctx.has("libfabric"):  # the installer's libfabric stands in for the block (Block.provides)
                c.offers["openmpi"] = [with_prefix("ofi", d.prefix)]
        return c

    def downloads(self, pin: Pin, ctx: Context) -> list[str]:
        """The tarball, and with a signature check the signature and the key (checked by sha256 too where the lock
        has one; the key's fingerprint is checked whatever the lock says)."""
        if pin.source != "installer":
            return []
        urls = installer_urls(str(pin.version))
        signed = pin.typed(EfaDetails).check == "signature"
        return [urls["tarball"], *([urls["signature"], urls["key"]] if signed else [])]

    def release_file(self) -> releases.ReleaseFile:
        return efa_file()


BLOCK = EfaBlock()


@check("efa-installer-version", "efa")
def efa_installer_version(ctx: CheckContext) -> CheckResult:
    """/opt/amazon/efa_installed_packages records the pinned EFA installer."""
    ran = ctx.run("cat /opt/amazon/efa_installed_packages")
    m = re.search(r"EFA installer version:\s*(\S+)", ran.out)
    if not ran.ok or m is None:
        return fail(f"no EFA installer record: {ran.why()}", expected=ctx.version("efa") or "", found="missing")
    return compare(ctx.version("efa"), m.group(1), "EFA installer")
