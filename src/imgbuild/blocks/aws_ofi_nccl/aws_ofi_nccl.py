"""aws_ofi_nccl: the NCCL net plugin for libfabric / EFA (without it NCCL falls back to sockets).

Its pin rule checks the plugin release against the NCCL it was tested with (its releases.yaml). A release
build needs libfabric: the EFA installer's (components.efa) or components.libfabric's (Debian's, with the efa
provider), whichever the image has; the plugin's tested libfabric is checked against it
(blocks/aws_ofi_nccl/releases.yaml).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

import imgbuild.blocks._releases as releases
from imgbuild import probes
from imgbuild.blocks._block import Block, Downloads, Released, Tracks
from imgbuild.blocks._core import Artifact, Context, Contribution, Details, Pin, Resolution, Tracked
from imgbuild.blocks._releases import Text
from imgbuild.blocks.efa import bundled, efa_file
from imgbuild.blocks.libfabric import libfabric_release
from imgbuild.blocks.nccl import net_plugin_api
from imgbuild.checks import CheckContext, check, fail, ldd_missing, passed, skip
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import AbsPath, Strict, pin_validator

PLUGIN_DIRS = ("/opt/amazon/ofi-nccl", "/opt/aws-ofi-nccl")


class PluginRow(releases.Row):
    """An aws-ofi-nccl release (1.21.1) or series (1.21): the newest NCCL and libfabric its release notes say it was
    tested with, the GDRCopy its GPU-initiated path needs, and a release's tag and commit."""

    tested_nccl: Text | None = None
    tested_libfabric: Text | None = None
    gdrcopy_min: Text | None = None
    tag: Text | None = None
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None = None


class PluginNotes(BaseModel):
    """What an aws-ofi-nccl archive's own RELEASENOTES.md says of its release, read at `imgbuild lock`
    (imgbuild.pin.artifacts): the newest NCCL and libfabric it was tested with (None: the notes name none).
    `read_from` names the archive. The lock records it in the plugin pin's details; a lock without one took these
    from releases.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    tested_nccl: str | None = None
    tested_libfabric: str | None = None
    read_from: Text


class PluginFile(releases.ReleaseFile):
    component: Literal["aws_ofi_nccl"]
    releases: tuple[PluginRow, ...] = Field(min_length=1)
    oldest_nccl: Text


def plugin_file() -> PluginFile:
    return releases.component_file("aws_ofi_nccl", PluginFile)


def plugin_fact(version: str, field: Literal["tested_nccl", "tested_libfabric", "gdrcopy_min"]) -> str | None:
    """An aws-ofi-nccl release's value of `field`: the release's own row's, else its series' (major.minor) row's."""
    for row in releases.row_for(plugin_file().releases, version):
        if getattr(row, field) is not None:
            value: str = getattr(row, field)
            return value
    return None


def plugin_series() -> list[str]:
    """The plugin rows that say which NCCL they were tested with (for a message naming what is known)."""
    return [r.version for r in plugin_file().releases if r.tested_nccl is not None]


def plugin_releases() -> set[str]:
    """Every aws-ofi-nccl release (X.Y.Z) a release file names: its own rows and the EFA installers' bundles."""
    own = {r.version for r in plugin_file().releases if r.version.count(".") == 2}
    return own | {e.aws_ofi_nccl for e in efa_file().releases if e.aws_ofi_nccl}


# The release notes' sentences on what a release was tested with: "The 1.21.1 release series has been tested with
# [NCCL v2.31.2-1](...) while maintaining backward compatibility with older NCCL versions ([NCCL v2.17.1]...)" (1.19
# on), "supports [NCCL v2.29.2-1]" (up to 1.18); "This release has been tested with [Libfabric v2.6.0amzn1.0]" (1.19
# on), "it is currently tested with versions up to [Libfabric v2.3.1amzn1.0]" (1.16-1.17).
_SECTION = re.compile(r"^# v(?P<version>\d+\.\d+\.\d+)(?:-aws)?\b.*$", re.MULTILINE)
_NCCL = re.compile(r"NCCL v?(\d+\.\d+\.\d+)(?:-\d+)?")
_LIBFABRIC = re.compile(r"tested with (?:versions up to )?\[Libfabric v?(\d[^\]\s]*)\]", re.IGNORECASE)


def release_notes(text: str, version: str) -> dict[str, str]:
    """What RELEASENOTES.md's section for `version` says it was tested with (tested_nccl, tested_libfabric: the
    newest named; absent where it names none); ValueError when the notes have no section for it."""
    heads = list(_SECTION.finditer(text))
    for i, head in enumerate(heads):
        if head["version"] != version:
            continue
        body = text[head.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        out: dict[str, str] = {}
        tested = body.split("backward compatibility", 1)[0]  # the oldest NCCL it still supports comes after
        nccl = [m.group(1) for m in _NCCL.finditer(tested)]
        if nccl:
            out["tested_nccl"] = max(nccl, key=lambda v: tuple(int(x) for x in v.split(".")))
        libfabric = _LIBFABRIC.search(body)
        if libfabric:
            out["tested_libfabric"] = libfabric.group(1)
        return out
    raise ValueError(f"its RELEASENOTES.md has no section for v{version}")


def notes_of(scan: Any, version: str, target: Any) -> PluginNotes:
    """What an archive's RELEASENOTES.md (its top folder's) says release `version` was tested with."""
    if not scan.kept:
        raise ValueError(f"{scan.read_from} holds no RELEASENOTES.md")
    text = next(iter(scan.kept.values())).decode("utf-8", "replace")
    return PluginNotes(**release_notes(text, version), read_from=scan.read_from)


def recorded_notes(pin: Pin) -> PluginNotes | None:
    """The release notes a lock's plugin pin records (None: it took releases.yaml's rows)."""
    notes = getattr(pin.details, "notes", None)
    return notes if isinstance(notes, PluginNotes) else None


def plugin_notes(rs: Resolution, version: str, url: str) -> PluginNotes | None:
    """What aws-ofi-nccl `version`'s archive at `url` says in its release notes, where `imgbuild lock` read it."""
    read = rs.artifact("aws_ofi_nccl", version, url)
    return read if isinstance(read, PluginNotes) else None


def plugin_tested(
    rs: Resolution, version: str, what: Literal["tested_nccl", "tested_libfabric"], url: str | None
) -> str | None:
    """THE newest NCCL or libfabric aws-ofi-nccl `version` was tested with: its archive's RELEASENOTES.md where
    it was read (`url`: the archive a release build downloads) and names one, else releases.yaml's rows."""
    notes = plugin_notes(rs, version, url) if url is not None else None
    read: str | None = getattr(notes, what) if notes is not None else None
    return read if read is not None else plugin_fact(version, what)


ARTIFACT = Artifact(
    what="tested versions",
    archive="its archive",
    keep=lambda name: name.count("/") == 1 and name.endswith("/RELEASENOTES.md"),
    parse=notes_of,
    recorded=recorded_notes,
    listed=lambda version: {what: plugin_fact(version, what) for what in ("tested_nccl", "tested_libfabric")},
)


def plugin_tag(version: str) -> str:
    """Git tag of an aws-ofi-nccl release: `vX.Y.Z-aws` up to 1.13.2, plain `vX.Y.Z` from 1.14.0 (its tags)."""
    return f"v{version}-aws" if Version(version) < Version("1.14.0") else f"v{version}"


class AwsOfiNccl(Strict):
    """aws-ofi-nccl, the NCCL net plugin for libfabric/EFA: bundled with the EFA installer, or a release."""

    source: Literal["efa", "release"]
    """efa: the one the EFA installer bundles (/opt/amazon/ofi-nccl) | release: built from its release."""
    version: str | None = None
    """efa: checked against the bundle (the installer tarball's, where `imgbuild lock` read it, else
    blocks/efa/releases.yaml's row); release: required."""
    prefix: AbsPath = "/opt/aws-ofi-nccl"
    """Where a release build installs."""
    archive: Literal["release", "tag"] | None = None
    """release (default): the release tarball (`make dist`'s, with configure) | tag: GitHub's archive of the release's
    tag (no configure: autogen.sh runs first). source: release only."""
    _pin = pin_validator("version")


class PluginDetails(Details):
    """The plugin's pin: where it is, its release tag (release builds), the newest NCCL it was tested with, which
    archive of the release it builds from (`archive`: left out of the lock when it is the release tarball, so the
    locks of recipes that do not set it read as they did), and what that archive's own RELEASENOTES.md said where
    `imgbuild lock` read it (`notes`: left out when it was not read; the tested versions then are
    blocks/aws_ofi_nccl/releases.yaml's)."""

    prefix: str
    tag: str | None = None
    tested_nccl: str
    archive: Literal["release", "tag"] = "release"
    notes: PluginNotes | None = None

    @model_serializer(mode="wrap")
    def _defaults_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("archive") == "release":
            del data["archive"]
        if data.get("notes") is None:
            data.pop("notes", None)
        return data


def _libfabric_built_against(rs: Resolution) -> tuple[str | None, str, str]:
    """The libfabric a release build compiles against (what `configure_args`' `with_arg("libfabric")` names):
    components.libfabric's where the recipe has it (its prefix; Debian's is /usr), else the EFA installer's (the
    block that provides it). (its version, what it is, the recipe key that sets it); a recipe with neither is
    refused naming both keys."""
    lf, efa = rs.pins.get("libfabric"), rs.options("efa")
    if lf is not None and lf.source != "efa":
        return lf.version, f"components.libfabric (source: {lf.source}, {lf.origin})", "components.libfabric"
    if efa is not None:
        libfabric = bundled(rs, efa.version, "libfabric")
        return libfabric, f"EFA installer {efa.version}", "components.efa.version"
    raise rs.fail(
        "components.aws_ofi_nccl.source",
        "source: release builds against libfabric: add components.efa (the EFA installer's) or components.libfabric "
        "(e.g. {source: distro}, where the distribution's libfabric has the efa provider)",
    )


def _libfabric_rule(version: str, built_against: tuple[str | None, str, str], rs: Resolution, url: str) -> None:
    """A plugin built from its release runs on the libfabric it was built against (`_libfabric_built_against`):
    refused when that libfabric is newer than any the release was tested with (blocks/aws_ofi_nccl/releases.yaml); a
    warning when either is unknown."""
    libfabric, what, lf_key = built_against
    tested = plugin_tested(rs, version, "tested_libfabric", url)
    if libfabric is None or tested is None:
        unknown = f"{what}'s libfabric" if libfabric is None else "its tested libfabric"
        rs.warnings.append(
            f"aws-ofi-nccl {version} is built against the libfabric of {what}, but {unknown} is not in "
            f"{releases.file_name('efa' if libfabric is None else 'aws_ofi_nccl')}: unchecked"
        )
        return
    if libfabric_release(libfabric) > libfabric_release(tested):
        raise rs.fail(
            f"components.aws_ofi_nccl.version / {lf_key}",
            f"aws-ofi-nccl {version} was tested with libfabric up to {tested}; {what} brings libfabric {libfabric}",
            hint="use source: efa (the installer's own plugin, tested with its libfabric) or a newer plugin release",
        )


def _gdrcopy_rule(version: str, rs: Resolution) -> None:
    """Plugin releases whose GPU-initiated path needs a minimum GDRCopy (releases.yaml, gdrcopy_min)."""
    needed = plugin_fact(version, "gdrcopy_min")
    if needed is None:
        return
    gdr = rs.options("gdrcopy")
    if gdr is None:
        rs.warnings.append(f"aws-ofi-nccl {version} uses GDRCopy >= {needed} when present: add components.gdrcopy")
    elif Version(gdr.version) < Version(needed):
        raise rs.fail(
            "components.gdrcopy.version / components.aws_ofi_nccl.version",
            f"aws-ofi-nccl {version} needs GDRCopy >= {needed}, got {gdr.version}",
        )


def release_url(version: str) -> str:
    """The plugin's release tarball (`make dist`'s, configure included: not GitHub's archive of the tag), the one
    place its URL is written."""
    tag = plugin_tag(version)
    return f"https://github.com/aws/aws-ofi-nccl/releases/download/{tag}/aws-ofi-nccl-{tag[1:]}.tar.gz"


def tag_archive_url(version: str) -> str:
    """GitHub's archive of the release's tag (`archive: tag`): the tree as tagged, no configure (saved as
    aws-ofi-nccl-X.Y.Z.tar.gz, `download_name`; unpacks to aws-ofi-nccl-X.Y.Z/ as the release tarball does)."""
    return f"https://github.com/aws/aws-ofi-nccl/archive/refs/tags/{plugin_tag(version)}.tar.gz"


def source_url(pin: Pin) -> str:
    """The archive a release build downloads: the release tarball, or the tag's archive (`archive: tag`)."""
    version = str(pin.version)
    return tag_archive_url(version) if pin.typed(PluginDetails).archive == "tag" else release_url(version)


def prepare(pin: Pin) -> list[str]:
    """What runs in the unpacked tree before ./configure, the same for either archive: where there is no configure
    (the tag's archive), autogen.sh makes it, with the version in .release_version first (from 1.21,
    m4/get_version.sh asks git for the version otherwise, and an archive has no .git)."""
    return [f"if [ ! -e configure ]; then echo {shlex.quote(str(pin.version))} >.release_version && ./autogen.sh; fi"]


# The first release whose configure takes --with-gdrcopy (m4/check_pkg_gdrcopy.m4, in v1.18.0 and later). Without it
# the plugin's HAVE_GDRCOPY is 0 unless gdrapi.h is in the compiler's default paths, which GDRCopy's prefix is not.
GDRCOPY_OPTION = "1.18"


def wants_gdrcopy(pin: Pin, ctx: Context) -> bool:
    """Whether the release build must enable GDRCopy: the image has it and the release's configure takes
    --with-gdrcopy."""
    return ctx.has("gdrcopy") and Version(str(pin.version)) >= Version(GDRCOPY_OPTION)


# configure's header (configure.ac: AC_CONFIG_HEADERS([include/config.h])), where m4/check_pkg_gdrcopy.m4 defines
# HAVE_GDRCOPY 1 when it found gdrapi.h and gdr_pin_buffer_v2, else 0.
CONFIG_HEADER = "include/config.h"


def configure_checks(pin: Pin, ctx: Context) -> list[str]:
    """Commands run in the tree after ./configure that fail the build when configure left out what the image has:
    GDRCopy (`wants_gdrcopy`) with HAVE_GDRCOPY not 1, which configure reports with no error (gdrapi.h not found
    where it looked) and the plugin would be built without its GDRCopy path."""
    if not wants_gdrcopy(pin, ctx):
        return []
    why = (
        f"imgbuild: aws-ofi-nccl {pin.version}: configure did not enable GDRCopy (HAVE_GDRCOPY is not 1 in "
        f"{CONFIG_HEADER}; the image has GDRCopy under {ctx.prefix('gdrcopy')}: was --with-gdrcopy passed? see "
        "config.log)"
    )
    return [f"if ! grep -qx '#define HAVE_GDRCOPY 1' {CONFIG_HEADER}; then echo {shlex.quote(why)} >&2; exit 1; fi"]


def configure_args(pin: Pin, ctx: Context) -> list[str]:
    """The release build's configure arguments for what it builds against (`Context.with_arg`: no `--with-X=/usr`):
    libfabric (EFA's or components.libfabric's), CUDA, Open MPI, GDRCopy where the image has it and the release's
    configure takes it (`wants_gdrcopy`; `configure_checks` makes sure configure enabled it), then what other blocks
    offer the plugin (`Contribution.offers`)."""
    gdrcopy = ctx.with_arg("gdrcopy") if wants_gdrcopy(pin, ctx) else []
    return [
        *ctx.with_arg("libfabric"),
        *ctx.with_arg("cuda"),
        *ctx.with_arg("mpi", "openmpi"),
        *gdrcopy,
        "--enable-platform-aws",
        *ctx.configure_args("aws_ofi_nccl"),
    ]


class AwsOfiNcclBlock(Block, Downloads, Released, Tracks):
    name = "aws_ofi_nccl"
    options = AwsOfiNccl
    modes = {"efa": "provided", "release": "fragment"}
    details = PluginDetails
    after = ("nccl", "libfabric")
    build_after = ("cuda", "efa", "openmpi", "gdrcopy", "nccl")
    tag = (5, "ofi")
    template_globals = {
        "aws_ofi_nccl_url": source_url,
        "aws_ofi_nccl_prepare": prepare,
        "aws_ofi_nccl_configure_args": configure_args,
        "aws_ofi_nccl_configure_checks": configure_checks,
    }
    artifact = ARTIFACT

    def resolve(self, p: AwsOfiNccl, rs: Resolution) -> Pin:
        key = "components.aws_ofi_nccl"
        nccl = rs.pins.get("nccl")
        efa = rs.options("efa")
        if nccl is None or nccl.version is None:
            raise rs.fail(key, "the NCCL plugin needs components.nccl")
        if p.source == "efa" and p.archive is not None:
            raise rs.fail(f"{key}.archive", "applies to source: release (the EFA installer bundles its own build)")
        if p.source == "efa":
            if efa is None:
                raise rs.fail(
                    f"{key}.source", "source: efa (the plugin the EFA installer bundles) needs components.efa"
                )
            in_efa = bundled(rs, efa.version, "aws_ofi_nccl")
            if in_efa is None:
                raise rs.fail(
                    f"{key}.source",
                    f"the aws-ofi-nccl version bundled with EFA installer {efa.version} is not in "
                    f"{releases.file_name('efa')}, so it can't be checked against NCCL",
                    hint="use source: release with a version, or an EFA installer whose bundle is known",
                )
            if p.version is not None and p.version != in_efa:
                raise rs.fail(f"{key}.version", f"EFA {efa.version} bundles {in_efa}, got {p.version}")
            version, origin = in_efa, f"bundled with EFA installer {efa.version}"
            prefix, tag = "/opt/amazon/ofi-nccl", None
        else:
            if p.version is None:
                raise rs.fail(f"{key}.version", "required for source: release")
            version, origin = p.version, "recipe"
            prefix, tag = p.prefix, plugin_tag(p.version)
        # a release build's archive, whose RELEASENOTES.md `imgbuild lock` reads where it can
        url = (
            (tag_archive_url(version) if p.archive == "tag" else release_url(version))
            if p.source == "release"
            else None
        )
        tested = plugin_tested(rs, version, "tested_nccl", url)
        if tested is None:
            raise rs.fail(
                f"{key}.version",
                f"aws-ofi-nccl {version} is not in {releases.file_name('aws_ofi_nccl')} "
                f"(known: {', '.join(plugin_series())})",
                hint=f"add its row to {releases.file_name('aws_ofi_nccl')} with the NCCL its RELEASENOTES.md names",
            )
        nv = Version(nccl.version)
        if nv > Version(tested):
            raise rs.fail(
                f"{key}.version / components.nccl",
                f"aws-ofi-nccl {version} was tested with NCCL up to {tested}; NCCL {nccl.version} is newer",
                hint="use a newer aws-ofi-nccl release",
            )
        oldest = plugin_file().oldest_nccl
        if nv < Version(oldest):
            raise rs.fail(
                f"{key}.version / components.nccl",
                f"aws-ofi-nccl {version} supports NCCL {oldest} and later, got {nccl.version}",
            )
        if url is not None:
            _libfabric_rule(version, _libfabric_built_against(rs), rs, url)
        _gdrcopy_rule(version, rs)
        notes = plugin_notes(rs, version, url) if url is not None else None
        details = PluginDetails(prefix=prefix, tag=tag, tested_nccl=tested, archive=p.archive or "release", notes=notes)
        return Pin(version=version, source=p.source, origin=origin, details=details)

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="aws_ofi_nccl")
        prefix = pin.details.prefix
        if pin.source == "release":
            c.builder_packages |= {"curl", "ca-certificates", "build-essential"}
            if pin.typed(PluginDetails).archive == "tag":  # autogen.sh makes configure (`prepare`)
                c.builder_packages |= {"autoconf", "automake", "libtool"}
            c.ld_library_path.append(f"{prefix}/lib")
            c.needs_fabric_in_builder = True
        else:
            # The EFA installer's plugin moved between lib/<triplet> (<= 1.43: lib/x86_64-linux-gnu on x86, the
            # architecture's own triplet elsewhere) and lib/ (1.44+).
            c.ld_library_path += [f"{prefix}/lib", f"{prefix}/lib/{ctx.multiarch}"]
        if Version(pin.version or "0") >= Version("1.15"):
            c.env["NCCL_NET_PLUGIN"] = "ofi"
        return c

    def downloads(self, pin: Pin, ctx: Context) -> list[str]:
        return [source_url(pin)] if pin.source == "release" else []

    def release_file(self) -> releases.ReleaseFile:
        return plugin_file()

    def track(self, pin: Pin, resolved: Any, files: Callable[[str], Any]) -> list[Tracked] | None:
        """`imgbuild outdated`: a release build against every release the release files name (its own rows and the EFA
        installers' bundles); the installer's own plugin follows the installer."""
        if pin.source != "release":
            return None
        return [
            Tracked(
                "table", "aws_ofi_nccl", ("components", "aws_ofi_nccl", "version"), tuple(sorted(plugin_releases()))
            )
        ]


BLOCK = AwsOfiNcclBlock()


def plugin_libraries(ctx: CheckContext) -> list[str]:
    """Every libnccl-net*.so NCCL could open: under the plugin's prefix, the EFA installer's and the release's
    folders, and LD_LIBRARY_PATH (once per verification)."""

    def find() -> list[str]:
        prefix = ctx.prefix("aws_ofi_nccl")
        dirs = " ".join(shlex.quote(d) for d in dict.fromkeys([*(p for p in [prefix] if p), *PLUGIN_DIRS]))
        ran = ctx.run(
            f'for d in {dirs} $(echo "${{LD_LIBRARY_PATH:-}}" | tr : " "); do [ -d "$d" ] && '
            "find \"$d\" -maxdepth 3 -name 'libnccl-net*.so*' 2>/dev/null; done | sort -u"
        )
        return [line for line in ran.out.splitlines() if line.strip()]

    result: list[str] = ctx.once("aws-ofi-nccl-libraries", find)
    return result


def _no_plugin(ctx: CheckContext, expected: str) -> CheckResult:
    where = ", ".join(dict.fromkeys([*(p for p in [ctx.prefix("aws_ofi_nccl")] if p), *PLUGIN_DIRS]))
    return fail(f"no libnccl-net*.so under {where} or LD_LIBRARY_PATH", expected=expected, found="missing")


@check("aws-ofi-nccl-plugin", "aws_ofi_nccl")
def aws_ofi_nccl_plugin(ctx: CheckContext) -> CheckResult:
    """The NCCL net plugin (every libnccl-net*.so) is found and `ldd` resolves all its libraries.

    Searched, not assumed: the EFA installer moved it between lib/x86_64-linux-gnu, lib and lib64.
    A plugin with an unresolved dependency makes NCCL fall back to sockets without a word.
    """
    libs = plugin_libraries(ctx)
    if not libs:
        return _no_plugin(ctx, "libnccl-net*.so")
    broken = {}
    for lib in libs:
        ldd = ctx.run(f"ldd {shlex.quote(lib)}")
        missing = ldd_missing(ldd.out)
        if missing or not ldd.ok:
            broken[lib] = missing or [ldd.why()]
    found = ", ".join(libs)
    if broken:
        text = "; ".join(f"{lib}: {', '.join(m)} not found" for lib, m in broken.items())
        return fail(f"unresolved libraries (NCCL would fall back to sockets): {text}", "resolves", found)
    return passed("libnccl-net*.so, all libraries resolve", found, libraries=libs)


NET_PLUGIN_SYMBOL = "ncclNetPlugin_v"  # + the API version: what NCCL dlsym()s in a net plugin
_API = re.compile(re.escape(NET_PLUGIN_SYMBOL) + r"(\d+)")


def _versions(numbers: Sequence[int]) -> str:
    return ", ".join(f"v{n}" for n in sorted(numbers)) or "none"


@check("aws-ofi-nccl-api", "aws_ofi_nccl")
def aws_ofi_nccl_api(ctx: CheckContext) -> CheckResult:
    """Every libnccl-net*.so exports a `ncclNetPlugin_vN` that the image's NCCL looks for (nccl's releases.yaml),
    read from the libraries' ELF dynamic symbol tables (probes/elfsyms.py: no binutils needed, nothing loaded).

    NCCL tries its versions newest first and uses the first the plugin exports: found is that one. A plugin with none
    of them is not loaded at all, and NCCL falls back to its internal network.
    """
    nccl = ctx.version("nccl")
    wanted = net_plugin_api(nccl) if nccl else None
    if wanted is None:
        why = "the image pins no NCCL version" if not nccl else f"NCCL {nccl}'s series is not in the shipped table"
        return skip(f"{why} ({releases.file_name('nccl')}): the net-plugin API versions it loads are not known")
    expected = f"one of {_versions(wanted)} (what NCCL {nccl} looks for)"
    libs = plugin_libraries(ctx)
    if not libs:
        return _no_plugin(ctx, expected)
    request = json.dumps({"paths": libs, "prefixes": [NET_PLUGIN_SYMBOL]})
    data, ran = ctx.python_json(probes.text("elfsyms.py"), request)
    if data is None:
        return fail(f"could not read the plugin's symbols with {ctx.python}: {ran.why()}", expected)
    used: dict[str, int] = {}
    exported: dict[str, list[int]] = {}
    bad = []
    for lib in libs:
        entry = data.get(lib) or {"error": "not read"}
        if "error" in entry:
            bad.append(f"{lib}: {entry['error']}")
            continue
        numbers = [int(m.group(1)) for s in entry["symbols"] if (m := _API.fullmatch(s))]
        exported[lib] = sorted(numbers)
        common = [v for v in wanted if v in numbers]
        if common:
            used[lib] = common[0]
        else:
            bad.append(f"{lib} exports {_versions(numbers)}")
    if bad:
        return fail(
            f"{'; '.join(bad)}: NCCL {nccl} looks for {_versions(wanted)}, so it would not load the plugin",
            expected,
            "; ".join(bad),
            exported=exported,
        )
    found = "; ".join(f"{lib}: {NET_PLUGIN_SYMBOL}{v} (exports {_versions(exported[lib])})" for lib, v in used.items())
    return passed(expected, found, exported=exported)
