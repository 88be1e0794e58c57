"""nccl_tests: NVIDIA's nccl-tests (all_reduce_perf, ...) built with MPI=1 against the image's NCCL and Open MPI.

Recipe options (`components.nccl_tests`):
    version   the release (e.g. 2.16.4)
    prefix    /opt/nccl-tests: where the *_perf binaries go (on PATH)
"""

from __future__ import annotations

import shlex

from imgbuild.blocks._core import Block, Context, Contribution, Installed, Pin, Resolution
from imgbuild.blocks.nccl import nccl_probe
from imgbuild.checks import CONTAINER, CheckContext, check, fail, ldd_missing, passed
from imgbuild.checks.results import CheckResult
from imgbuild.spec.schema import AbsPath, Strict, pin_validator

NCCL_TESTS_BINARIES = ("all_reduce_perf", "all_gather_perf", "broadcast_perf", "reduce_scatter_perf")
PREFIX = "/opt/nccl-tests"  # the default; nccltests.command runs all_reduce_perf from the manifest's prefix, else this


class NcclTests(Strict):
    """nccl-tests built with MPI=1 against the recipe's NCCL and MPI."""

    version: str
    prefix: AbsPath = PREFIX
    _pin = pin_validator("version")


def resolve(t: NcclTests, rs: Resolution) -> Pin:
    nccl, mpi = rs.pins.get("nccl"), rs.pins.get("openmpi")
    if nccl is None or mpi is None or rs.recipe.cuda is None:
        raise rs.fail("components.nccl_tests", "nccl-tests build against CUDA, the recipe's NCCL and Open MPI")
    return Pin(version=t.version, source="release", origin="recipe", details=Installed(prefix=t.prefix))


def source_url(version: str) -> str:
    """nccl-tests' release: GitHub's archive of its tag (the one place its URL is written)."""
    return f"https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v{version}.tar.gz"


def downloads(pin: Pin, ctx: Context) -> list[str]:
    return [source_url(str(pin.version))]


def contribute(pin: Pin, ctx: Context) -> Contribution:
    c = Contribution(name="nccl_tests")
    c.path.append(pin.typed(Installed).prefix)
    c.needs_fabric_in_builder = True
    return c


BLOCK = Block(
    name="nccl_tests",
    options=NcclTests,
    modes={"release": "fragment"},
    resolve=resolve,
    contribute=contribute,
    details=Installed,
    after=("nccl", "openmpi"),
    build_after=("efa", "openmpi", "nccl"),
    downloads=downloads,
    template_globals={"nccl_tests_source_url": source_url},
)


@check("nccl-tests-binaries", "nccl_tests", scopes=CONTAINER)
def nccl_tests_binaries(ctx: CheckContext) -> CheckResult:
    """nccl-tests' binaries (all_reduce_perf, ...) are in the image and executable."""
    prefix = ctx.details("nccl_tests").prefix
    paths = " ".join(shlex.quote(f"{prefix}/{b}") for b in NCCL_TESTS_BINARIES)
    ran = ctx.run(f'for f in {paths}; do [ -x "$f" ] || echo "$f"; done')
    missing = ran.out.split()
    expected = ", ".join(NCCL_TESTS_BINARIES)
    if missing:
        return fail(f"missing or not executable: {', '.join(missing)}", expected, f"{len(missing)} missing")
    return passed(expected, f"in {prefix}")


@check("nccl-tests-libnccl", "nccl_tests", scopes=CONTAINER)
def nccl_tests_libnccl(ctx: CheckContext) -> CheckResult:
    """all_reduce_perf links libnccl from the recipe's NCCL prefix, and ldd finds every library."""
    prefix = ctx.details("nccl_tests").prefix
    nccl_prefix = ctx.prefix("nccl")
    if nccl_prefix:
        want = f"{nccl_prefix}/lib/"
    else:
        data, _ = nccl_probe(ctx)
        if not data or "lib" not in data:
            return fail("cannot tell which NCCL is intended: libnccl.so.2 not found")
        want = data["lib"].rsplit("/", 1)[0] + "/"
    ran = ctx.run(f"ldd {shlex.quote(prefix)}/all_reduce_perf")
    if not ran.ok:
        return fail(f"ldd all_reduce_perf: {ran.why()}", expected=want)
    lines = ran.out.splitlines()
    missing = ldd_missing(ran.out)
    nccl = next((line.split("=>")[1].split("(")[0].strip() for line in lines if "libnccl.so" in line and "=>" in line),
                None)  # fmt: skip
    if missing:
        return fail(f"not found: {', '.join(missing)}", expected=want, found=nccl or "")
    if nccl is None:
        return fail("all_reduce_perf does not link libnccl", expected=want, found="not linked")
    if not nccl.startswith(want):
        return fail(f"links {nccl}, not the NCCL in {want}", expected=want, found=nccl)
    return passed(want, nccl)
