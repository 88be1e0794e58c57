"""gdrcopy: GDRCopy's user-space library (libgdrapi), built from its release; the gdrdrv module is the host's.

Step 4 of AWS's EFA + NCCL guide: NCCL and aws-ofi-nccl use it for low-latency copies to and from GPU memory
(aws-ofi-nccl 1.21's GPU-initiated path needs >= 2.5; that rule is the plugin's).

Recipe options (`components.gdrcopy`):
    version   the release tag without its `v` (e.g. 2.5.1)
    prefix    /opt/gdrcopy: lib/libgdrapi.so* (on LD_LIBRARY_PATH), include/gdrapi.h
"""

from __future__ import annotations

import shlex

from imgbuild.checks import CheckContext, check, fail, passed
from imgbuild.components._core import Block, Context, Contribution, Pin, Resolution
from imgbuild.report import CheckResult
from imgbuild.schema import AbsPath, Strict, pin_validator


class GdrCopy(Strict):
    """GDRCopy's user-space library, built against the base image's CUDA."""

    version: str
    prefix: AbsPath = "/opt/gdrcopy"
    _pin = pin_validator("version")


def resolve(g: GdrCopy, rs: Resolution) -> Pin:
    if rs.r.cuda is None:
        raise rs.fail("components.gdrcopy", "GDRCopy builds against CUDA (an nvidia platform)")
    return Pin(version=g.version, source="release", origin="recipe", details={"prefix": g.prefix})


def contribute(pin: Pin, ctx: Context) -> Contribution:
    c = Contribution(name="gdrcopy")
    c.builder_packages |= {"curl", "ca-certificates", "build-essential"}
    c.ld_library_path.append(f"{pin.details['prefix']}/lib")
    return c


BLOCK = Block(
    name="gdrcopy",
    options=GdrCopy,
    modes={"release": "fragment"},
    resolve=resolve,
    contribute=contribute,
)


@check("gdrcopy-library", "gdrcopy")
def gdrcopy_library(ctx: CheckContext) -> CheckResult:
    """libgdrapi.so.2 is in the GDRCopy prefix and `ldd` resolves all its libraries."""
    prefix = ctx.components["gdrcopy"].get("prefix", "/opt/gdrcopy")
    lib = f"{prefix}/lib/libgdrapi.so.2"
    ldd = ctx.run(f"ldd {shlex.quote(lib)}")
    if not ldd.ok:
        return fail(f"ldd {lib}: {ldd.why()}", expected=lib, found="missing")
    missing = [line.split("=>")[0].strip() for line in ldd.out.splitlines() if "not found" in line]
    if missing:
        return fail(f"{lib}: {', '.join(missing)} not found", expected="resolves", found=lib)
    return passed(lib, "resolves")
