"""aws_ofi_nccl: the NCCL net plugin for libfabric / EFA (without it NCCL falls back to sockets).

Recipe options (`components.aws_ofi_nccl`):
    source    efa: the one the EFA installer bundles (/opt/amazon/ofi-nccl) | release: built from its release
    version   efa: checked against the bundle (compat.EFA); release: required
    prefix    /opt/aws-ofi-nccl (release)
Its pin rule checks the plugin series against the NCCL it was tested with (compat.PLUGIN_TESTED_NCCL).
"""

from __future__ import annotations

import shlex
from typing import Literal

from packaging.version import Version

from imgbuild.blocks._core import Block, Context, Contribution, Details, Pin, Resolution
from imgbuild.checks import CheckContext, check, fail, ldd_missing, passed
from imgbuild.checks.results import CheckResult
from imgbuild.spec import compat
from imgbuild.spec.schema import AbsPath, Strict, pin_validator

PLUGIN_DIRS = ("/opt/amazon/ofi-nccl", "/opt/aws-ofi-nccl")


class AwsOfiNccl(Strict):
    """aws-ofi-nccl, the NCCL net plugin for libfabric/EFA: bundled with the EFA installer, or a release."""

    source: Literal["efa", "release"]
    version: str | None = None
    prefix: AbsPath = "/opt/aws-ofi-nccl"
    _pin = pin_validator("version")


class PluginDetails(Details):
    """The plugin's pin: where it is, its release tag (release builds) and the newest NCCL it was tested with."""

    prefix: str
    tag: str | None = None
    tested_nccl: str


def _mm(version: str) -> str:
    return ".".join(version.split(".")[:2])


def resolve(p: AwsOfiNccl, rs: Resolution) -> Pin:
    key = "components.aws_ofi_nccl"
    nccl = rs.pins.get("nccl")
    efa = rs.options("efa")
    if nccl is None or nccl.version is None:
        raise rs.fail(key, "the NCCL plugin needs components.nccl")
    if efa is None:
        raise rs.fail(key, "aws-ofi-nccl needs libfabric from components.efa")
    if p.source == "efa":
        release = compat.EFA.get(efa.version)
        bundled = release.plugin if release else None
        if bundled is None:
            raise rs.fail(
                f"{key}.source",
                f"the aws-ofi-nccl version bundled with EFA installer {efa.version} is not in the "
                "shipped table, so it can't be checked against NCCL",
                hint="use source: release with a version, or an EFA installer whose bundle is known",
            )
        if p.version is not None and p.version != bundled:
            raise rs.fail(f"{key}.version", f"EFA {efa.version} bundles {bundled}, got {p.version}")
        version, origin = bundled, f"bundled with EFA installer {efa.version}"
        prefix, tag = "/opt/amazon/ofi-nccl", None
    else:
        if p.version is None:
            raise rs.fail(f"{key}.version", "required for source: release")
        version, origin = p.version, "recipe"
        prefix, tag = p.prefix, compat.plugin_tag(p.version)
    tested = compat.for_release(compat.PLUGIN_TESTED_NCCL, version)
    if tested is None:
        raise rs.fail(
            f"{key}.version",
            f"aws-ofi-nccl {version} is not in the shipped table "
            f"(known series: {', '.join(compat.PLUGIN_TESTED_NCCL)})",
        )
    nv = Version(nccl.version)
    if nv > Version(tested):
        raise rs.fail(
            f"{key}.version / components.nccl",
            f"aws-ofi-nccl {version} was tested with NCCL up to {tested}; NCCL {nccl.version} is newer",
            hint="use a newer aws-ofi-nccl release",
        )
    if nv < Version(compat.PLUGIN_OLDEST_NCCL):
        raise rs.fail(
            f"{key}.version / components.nccl",
            f"aws-ofi-nccl {version} supports NCCL {compat.PLUGIN_OLDEST_NCCL} and later, got {nccl.version}",
        )
    if p.source == "release":
        _libfabric_rule(version, efa.version, rs)
    _gdrcopy_rule(version, rs)
    details = PluginDetails(prefix=prefix, tag=tag, tested_nccl=tested)
    return Pin(version=version, source=p.source, origin=origin, details=details)


def _libfabric_rule(version: str, efa_version: str, rs: Resolution) -> None:
    """A plugin built from its release runs on the EFA installer's libfabric: refused when that libfabric is newer
    than any the release was tested with (compat.PLUGIN_TESTED_LIBFABRIC); a warning when either is unknown."""
    release = compat.EFA.get(efa_version)
    efa_libfabric = release.libfabric if release else None
    tested = compat.for_release(compat.PLUGIN_TESTED_LIBFABRIC, version)
    if efa_libfabric is None or tested is None:
        unknown = f"EFA installer {efa_version}'s libfabric" if efa_libfabric is None else "its tested libfabric"
        rs.warnings.append(
            f"aws-ofi-nccl {version} is built against the EFA installer's libfabric, but {unknown} is not in the "
            "shipped tables: unchecked"
        )
        return
    if compat.libfabric_release(efa_libfabric) > compat.libfabric_release(tested):
        raise rs.fail(
            "components.aws_ofi_nccl.version / components.efa.version",
            f"aws-ofi-nccl {version} was tested with libfabric up to {tested}; EFA installer {efa_version} "
            f"brings libfabric {efa_libfabric}",
            hint="use source: efa (the installer's own plugin, tested with its libfabric) or a newer plugin release",
        )


def _gdrcopy_rule(version: str, rs: Resolution) -> None:
    """Plugin series whose GPU-initiated path needs a minimum GDRCopy (compat.GDRCOPY_MIN_FOR_PLUGIN)."""
    needed = compat.GDRCOPY_MIN_FOR_PLUGIN.get(_mm(version))
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
    tag = compat.plugin_tag(version)
    return f"https://github.com/aws/aws-ofi-nccl/releases/download/{tag}/aws-ofi-nccl-{tag[1:]}.tar.gz"


def downloads(pin: Pin, ctx: Context) -> list[str]:
    return [release_url(str(pin.version))] if pin.source == "release" else []


# The first release whose configure takes --with-gdrcopy (m4/check_pkg_gdrcopy.m4, in v1.18.0 and later). Without it
# the plugin's HAVE_GDRCOPY is 0 unless gdrapi.h is in the compiler's default paths, which GDRCopy's prefix is not.
GDRCOPY_OPTION = "1.18"


def configure_args(pin: Pin, ctx: Context) -> list[str]:
    """The release build's configure arguments for what it builds against (`Context.with_arg`: no `--with-X=/usr`):
    libfabric (EFA's), CUDA, Open MPI, GDRCopy where the image has it and the release's configure takes it, then
    what other blocks offer the plugin (`Contribution.offers`)."""
    gdrcopy = ctx.with_arg("gdrcopy") if Version(str(pin.version)) >= Version(GDRCOPY_OPTION) else []
    return [
        *ctx.with_arg("libfabric"),
        *ctx.with_arg("cuda"),
        *ctx.with_arg("mpi", "openmpi"),
        *gdrcopy,
        "--enable-platform-aws",
        *ctx.configure_args("aws_ofi_nccl"),
    ]


def contribute(pin: Pin, ctx: Context) -> Contribution:
    c = Contribution(name="aws_ofi_nccl")
    prefix = pin.details.prefix
    if pin.source == "release":
        c.builder_packages |= {"curl", "ca-certificates", "build-essential"}
        c.ld_library_path.append(f"{prefix}/lib")
        c.needs_fabric_in_builder = True
    else:
        # The EFA installer's plugin moved between lib/<triplet> (<= 1.43: lib/x86_64-linux-gnu on x86, the
        # architecture's own triplet elsewhere) and lib/ (1.44+).
        c.ld_library_path += [f"{prefix}/lib", f"{prefix}/lib/{ctx.multiarch}"]
    if Version(pin.version or "0") >= Version("1.15"):
        c.env["NCCL_NET_PLUGIN"] = "ofi"
    return c


BLOCK = Block(
    name="aws_ofi_nccl",
    options=AwsOfiNccl,
    modes={"efa": "provided", "release": "fragment"},
    resolve=resolve,
    contribute=contribute,
    details=PluginDetails,
    after=("nccl",),
    build_after=("efa", "openmpi", "gdrcopy", "nccl"),
    tag=(5, "ofi"),
    downloads=downloads,
    template_globals={"aws_ofi_nccl_release_url": release_url, "aws_ofi_nccl_configure_args": configure_args},
)


@check("aws-ofi-nccl-plugin", "aws_ofi_nccl")
def aws_ofi_nccl_plugin(ctx: CheckContext) -> CheckResult:
    """The NCCL net plugin (libnccl-net*.so) is found and `ldd` resolves all its libraries.

    Searched, not assumed: the EFA installer moved it between lib/x86_64-linux-gnu, lib and lib64.
    A plugin with an unresolved dependency makes NCCL fall back to sockets without a word.
    """
    prefix = ctx.prefix("aws_ofi_nccl")
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
        missing = ldd_missing(ldd.out)
        if missing or not ldd.ok:
            broken[lib] = missing or [ldd.why()]
    found = ", ".join(libs)
    if broken:
        text = "; ".join(f"{lib}: {', '.join(m)} not found" for lib, m in broken.items())
        return fail(f"unresolved libraries (NCCL would fall back to sockets): {text}", "resolves", found)
    return passed("libnccl-net*.so, all libraries resolve", found, libraries=libs)
