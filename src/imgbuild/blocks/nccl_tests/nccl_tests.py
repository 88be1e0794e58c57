"""nccl_tests: NVIDIA's nccl-tests (all_reduce_perf, ...) built with MPI=1 against the image's NCCL and Open MPI."""

from __future__ import annotations

import posixpath
import shlex

import imgbuild.blocks._releases as releases
from imgbuild.blocks._block import Block, Downloads, Released
from imgbuild.blocks._core import Context, Contribution, FromTag, Installed, Pin, Resolution, tag_artifact
from imgbuild.blocks.nccl import nccl_probe
from imgbuild.blocks.openmpi import owns_libmpi
from imgbuild.checks import CONTAINER, CheckContext, check, fail, ldd_missing, passed
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import AbsPath, Strict, pin_validator

NCCL_TESTS_BINARIES = ("all_reduce_perf", "all_gather_perf", "broadcast_perf", "reduce_scatter_perf")
PREFIX = "/opt/nccl-tests"  # the default; nccltests.command runs all_reduce_perf from the manifest's prefix, else this


class NcclTests(Strict):
    """nccl-tests built with MPI=1 against the recipe's NCCL and MPI."""

    version: str
    """The release (e.g. 2.16.4)."""
    prefix: AbsPath = PREFIX
    """Where the `*_perf` binaries go (on PATH)."""
    _pin = pin_validator("version")


def source_url(version: str) -> str:
    """nccl-tests' release: GitHub's archive of its tag (the one place its URL is written)."""
    return f"https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v{version}.tar.gz"


def make_variables(ctx: Context) -> dict[str, str]:
    """nccl-tests' make variables for the image (the one place they are written): MPI=1 against its Open MPI, its
    CUDA and NCCL, nvcc's -gencode flags for the recipe's GPU architecture. The template renders them; the GPU lane
    (tests/test_gpu.py) builds with them on a GPU host, putting that host's homes in place of the image's."""
    wanted = {
        "MPI_HOME": ctx.prefix("openmpi"),
        "CUDA_HOME": ctx.cuda_home,
        "NCCL_HOME": ctx.prefix("nccl"),
        "NVCC_GENCODE": ctx.gencode,
    }
    if missing := [k for k, v in wanted.items() if not v]:
        raise ValueError(f"nccl-tests: the recipe gives no {', '.join(missing)}")  # resolve() refuses such a recipe
    return {"MPI": "1", **{k: str(v) for k, v in wanted.items()}}


def make_line(src: str, ctx: Context) -> str:
    """The builder's make command, its variables from `make_variables` (paths the schema checked; the -gencode
    flags, several words, in double quotes), one shell line continued once."""
    v = make_variables(ctx)
    return (
        f'make -C {src} -j"$(nproc)" MPI={v["MPI"]} MPI_HOME={v["MPI_HOME"]} \\\n'
        f'      CUDA_HOME={v["CUDA_HOME"]} NCCL_HOME={v["NCCL_HOME"]} NVCC_GENCODE="{v["NVCC_GENCODE"]}"'
    )


class NcclTestsBlock(Block, Downloads, Released):
    name = "nccl_tests"
    options = NcclTests
    modes = {"release": "fragment"}
    details = FromTag
    after = ("nccl", "openmpi")
    build_after = ("cuda", "efa", "openmpi", "nccl")
    template_globals = {"nccl_tests_source_url": source_url, "nccl_tests_make": make_line}
    node_checks = ("nccl-tests all_reduce_perf",)  # its all_reduce_perf across the nodes
    artifact = tag_artifact(source_url)

    def resolve(self, t: NcclTests, rs: Resolution) -> Pin:
        nccl, mpi = rs.pins.get("nccl"), rs.pins.get("openmpi")
        if nccl is None or mpi is None or rs.recipe.cuda is None:
            raise rs.fail("components.nccl_tests", "nccl-tests build against CUDA, the recipe's NCCL and Open MPI")
        commit = rs.tag_commit("nccl_tests", t.version, source_url(t.version))
        return Pin(
            version=t.version, source="release", origin="recipe", details=FromTag(prefix=t.prefix, commit=commit)
        )

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="nccl_tests")
        c.path.append(pin.typed(Installed).prefix)
        c.needs_fabric_in_builder = True
        return c

    def downloads(self, pin: Pin, ctx: Context) -> list[str]:
        return [source_url(str(pin.version))]

    def release_file(self) -> releases.ReleaseFile:
        return releases.tag_file("nccl_tests")


BLOCK = NcclTestsBlock()


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


def _resolved(ldd_output: str, soname: str) -> str | None:
    """Where ldd resolved a library whose name starts with `soname` ("not found" when it did not; None: not linked)."""
    for line in ldd_output.splitlines():
        name, arrow, rest = line.strip().partition("=>")
        if arrow and name.strip().startswith(soname):
            return rest.split("(")[0].strip() or "not found"
    return None


@check("nccl-tests-links", "nccl_tests", scopes=CONTAINER)
def nccl_tests_links(ctx: CheckContext) -> CheckResult:
    """Every *_perf links the image's one NCCL (libnccl.so.2 resolves into the nccl pin's lib/, not another copy) and
    its MPI (libmpi resolves to the openmpi pin's library, `openmpi.owns_libmpi`), and ldd finds every library."""
    prefix = ctx.details("nccl_tests").prefix
    nccl_prefix = ctx.prefix("nccl")
    if nccl_prefix:
        nccl_dir = f"{nccl_prefix}/lib"
    else:
        data, _ = nccl_probe(ctx)
        if not data or "lib" not in data:
            return fail("cannot tell which NCCL is intended: libnccl.so.2 not found")
        nccl_dir = data["lib"].rsplit("/", 1)[0]
    mpi = ctx.components.get("openmpi")
    expected = f"libnccl.so.2 in {nccl_dir}" + (f", libmpi of Open MPI {mpi.details.prefix}" if mpi else "")
    ran = ctx.run(
        f'for f in {shlex.quote(prefix)}/*_perf; do [ -x "$f" ] || continue; echo "=== $f"; ldd "$f" 2>&1; done; '
        f'echo "=== nccl $(readlink -f {shlex.quote(nccl_dir)})"'
    )
    blocks = [b.split("\n", 1) for b in ran.out.split("=== ")[1:]]
    outputs = {head.strip(): body for head, body in (b if len(b) == 2 else [b[0], ""] for b in blocks)}
    nccl_real = next((k[len("nccl ") :] for k in outputs if k.startswith("nccl ")), "")
    binaries = {k: v for k, v in outputs.items() if not k.startswith("nccl ")}
    if not binaries:
        return fail(f"no executable *_perf in {prefix}", expected, "none")
    linked = {b: (_resolved(out, "libnccl.so"), _resolved(out, "libmpi.so")) for b, out in binaries.items()}
    paths = sorted({p for pair in linked.values() for p in pair if p and p != "not found"})
    real = dict(zip(paths, ctx.run(f"readlink -f {shlex.join(paths)}").out.split(), strict=False)) if paths else {}
    problems = []
    for binary, (nccl, libmpi) in linked.items():
        name = binary.rsplit("/", 1)[-1]
        if missing := ldd_missing(binaries[binary]):
            problems.append(f"{name}: {', '.join(missing)} not found")
            continue
        if nccl is None:
            problems.append(f"{name} does not link libnccl")
        elif nccl_real and posixpath.dirname(real.get(nccl, nccl)) != nccl_real:
            problems.append(f"{name} links {real.get(nccl, nccl)}, not the NCCL in {nccl_dir}")
        if mpi is not None and libmpi is None:
            problems.append(f"{name} does not link libmpi (built without MPI=1)")
        elif mpi is not None and libmpi is not None and not owns_libmpi(mpi, real.get(libmpi, libmpi)):
            problems.append(f"{name} links {real.get(libmpi, libmpi)}, not Open MPI's ({mpi.details.prefix})")
    one = next(iter(linked.values()))
    found = ", ".join(real.get(p, p) for p in one if p)
    if problems:
        return fail("; ".join(problems), expected, found, binaries=sorted(binaries))
    return passed(expected, f"{len(binaries)} binaries: {found}", binaries=sorted(binaries))
