"""libfabric: from the EFA installer (efa provider), the distribution (tcp, shm), or the base image."""

from __future__ import annotations

import re
import shlex
from typing import Any, Literal

from imgbuild.blocks._block import Block
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution, with_prefix
from imgbuild.blocks.efa import bundled, from_efa
from imgbuild.blocks.gaudi import check_base
from imgbuild.checks import CheckContext, check, compare, fail, first_executable, passed, skip
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import AbsPath, Strict, pin_validator


def libfabric_release(version: str) -> tuple[int, int, int]:
    """A libfabric version's release number: 2.6.0amzn1.0 -> (2, 6, 0) (AWS's `amznN` builds of one release)."""
    parts = [int(p) for p in re.findall(r"\d+", version.split("amzn")[0])[:3]]
    return (*parts, *[0] * (3 - len(parts)))  # type: ignore[return-value]


class Libfabric(Strict):
    """libfabric: from the EFA installer, the distribution (tcp/shm providers), or the base image."""

    source: Literal["efa", "distro", "base"]
    """efa: the EFA installer's (efa provider) | distro: the distribution's (tcp, shm) | base: the base image's."""
    version: str | None = None
    """Checked against what that source has (required for base)."""
    prefix: AbsPath | None = None
    """Where it lives (efa: /opt/amazon/efa; distro: /usr; base: the base image's prefix)."""
    _pin = pin_validator("version")


class LibfabricBlock(Block):
    name = "libfabric"
    options = Libfabric
    modes = {"efa": "provided", "distro": "packages", "base": "provided"}
    node_checks = ("fi_pingpong",)  # libfabric's own test program, between two nodes

    def resolve(self, lf: Libfabric, rs: Resolution) -> Pin:
        key = "components.libfabric"
        efa = rs.options("efa")
        if lf.source == "efa":
            pin = from_efa(rs, f"{key}.source", "libfabric")
            version = bundled(rs, efa.version, "libfabric") if efa else None
            if lf.version is not None and version is not None and lf.version != version:
                raise rs.fail(f"{key}.version", f"EFA {efa.version} bundles {version}")
            return pin.model_copy(
                update={"version": lf.version or version, "details": Details(prefix=lf.prefix or "/opt/amazon/efa")}
            )
        if lf.source == "distro":
            return rs.distro_pin(key, "libfabric", lf.version).model_copy(update={"details": Details(prefix="/usr")})
        if lf.version is None:
            raise rs.fail(f"{key}.version", "required when libfabric comes with the base image")
        check_base(rs, f"{key}.version", "libfabric", lf.version)
        return Pin(version=lf.version, source="base", origin="base image", details=Details(prefix=lf.prefix))

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="libfabric")
        if pin.source == "distro":
            c.runtime_packages |= {"libfabric1", "libfabric-bin"}
            if ctx.fabric_in_builder:  # a block compiles against it (the plugin): its headers and libfabric.so
                c.builder_packages.add("libfabric-dev")
        elif pin.source == "base" and pin.details.prefix:
            c.env["LIBFABRIC_ROOT"] = pin.details.prefix
            c.path.append(f"{pin.details.prefix}/bin")
            c.ld_library_path.append(f"{pin.details.prefix}/lib")
        c.offers["openmpi"] = [with_prefix("ofi", pin.details.prefix)]
        return c


BLOCK = LibfabricBlock()


def _fi_info(ctx: CheckContext) -> str | None:
    def find() -> str | None:
        lf = ctx.components.get("libfabric")
        candidates = ["${LIBFABRIC_ROOT:+$LIBFABRIC_ROOT/bin/fi_info}"]
        if lf is not None and lf.details.prefix:
            candidates.append(f"{lf.details.prefix}/bin/fi_info")
        if ctx.has("efa") and (lf is None or lf.source == "efa"):
            candidates.append(f"{ctx.prefix('efa')}/bin/fi_info")
        return first_executable(ctx, candidates, "fi_info")

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
    """The providers the image needs are in libfabric: tcp for the distribution's, efa with the EFA installer or the
    NCCL net plugin (aws-ofi-nccl runs on efa only, whichever libfabric it is built against).

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
    lf = ctx.components.get("libfabric")  # the EFA installer's images have no libfabric component
    if lf is not None and lf.source == "distro":
        want.append("tcp")
    if ctx.has("efa") or ctx.has("aws_ofi_nccl"):
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
