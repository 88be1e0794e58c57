"""hwloc: the Portable Hardware Locality library from the distribution (libhwloc15; libhwloc-dev in the builder).

Open MPI and the NCCL net plugin use it, where the image has it, to map processes and NICs to the machine's
topology: this block offers `--with-hwloc` to their configure when they build from source (Open MPI from its
source release, aws-ofi-nccl from its release), and neither names it. The package is in the compiler's default
paths, so the offer names no directory (`with_prefix`: a `--with-hwloc=/usr` breaks g++).
"""

from __future__ import annotations

import re
from typing import Literal

from imgbuild.blocks._block import Block
from imgbuild.blocks._core import Context, Contribution, Pin, Resolution, with_prefix
from imgbuild.checks import CheckContext, check, compare, fail
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import Strict, pin_validator

PREFIX = "/usr"  # where the distribution's package puts include/hwloc.h and the library
LIBRARY = "libhwloc.so.15"
PACKAGE = "libhwloc15"
# The builds that link it when the image has it: each block's configure takes what is offered to it.
CONSUMERS = ("openmpi", "aws_ofi_nccl")


class Hwloc(Strict):
    """hwloc from the distribution: the library at run time, its headers in the builder."""

    source: Literal["distro"] = "distro"
    """distro: the distribution's package."""
    version: str | None = None
    """Checked against what the distribution ships."""
    _pin = pin_validator("version")


class HwlocBlock(Block):
    name = "hwloc"
    options = Hwloc
    modes = {"distro": "packages"}

    def resolve(self, h: Hwloc, rs: Resolution) -> Pin:
        return rs.distro_pin("components.hwloc", "hwloc", h.version)

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="hwloc")
        c.builder_packages.add("libhwloc-dev")
        c.runtime_packages.add(PACKAGE)
        c.offers = {consumer: [with_prefix("hwloc", PREFIX)] for consumer in CONSUMERS}
        return c


BLOCK = HwlocBlock()


@check("hwloc-library", "hwloc")
def hwloc_library(ctx: CheckContext) -> CheckResult:
    """The loader finds libhwloc.so.15 (`ldconfig -p`), and its package is the pinned hwloc."""
    expected = ctx.version("hwloc") or LIBRARY
    ran = ctx.run(f"ldconfig -p | grep -F {LIBRARY}")
    paths = re.findall(r"=>\s*(\S+)", ran.out)
    if not paths:
        return fail(f"{LIBRARY} is not in the loader's cache (ldconfig -p)", expected=expected, found="missing")
    pkg = ctx.run(f"dpkg-query -W -f '${{Version}}' {PACKAGE}")
    found = re.match(r"(?:\d+:)?([0-9][0-9.]*)", pkg.out.strip()) if pkg.ok else None
    if found is None:
        return fail(f"{PACKAGE}'s version: {pkg.why()}", expected=expected, found=paths[0])
    return compare(ctx.version("hwloc"), found.group(1).rstrip("."), "hwloc", path=paths[0])
