"""arm64 under emulation benchmark (prints figures; asserts nothing): the cpu recipe's build and verify for
linux/arm64 (QEMU through binfmt_misc on an x86 machine) next to the native linux/amd64 ones, in one run.

For each architecture, through the product's own code paths (`imgbuild build cpu --platform P` and `imgbuild verify
cpu --platform P --nodes 2`):

- build: with --no-cache (every step runs; the engine's pip and apt cache mounts stay, as on a CI machine that built
  once), or without it with --warm (what a rebuild from the layer cache costs);
- verify: one container's checks (versions, ncclGetVersion, sshd, keys...) plus the 2-rank MPI run across two
  containers, each phase's time from the report.

The images are built under the tags `imgbuild build` gives them (`imgbuild/cpu:lock-<12 hex>` and `-arm64`), as a
user's build would; nothing is pruned. Needs scripts/setup.sh's QEMU set-up and the arm64 base.

    source scripts/ca-env.sh
    python benchmarks/arm64_bench.py            # cold builds (--no-cache), then verify --nodes 2
    python benchmarks/arm64_bench.py --warm     # rebuilds from the layer cache
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from imgbuild import build, verify
from imgbuild.core import platforms
from imgbuild.engine import rootfs
from imgbuild.pin import lock


@dataclass
class Row:
    arch: str
    build_s: float
    steps: str
    verify_s: float
    phases: str
    checks: str


def run(arch: str, *, nocache: bool, nodes: int) -> Row:
    """Build and verify the cpu image of `arch`; the figures."""
    t0 = time.monotonic()
    built = build.build(*lock.for_ref("cpu"), arch=arch, nocache=nocache, ca_bundle=build.ca_bundle_from(None))
    build_s = time.monotonic() - t0
    t0 = time.monotonic()
    report = verify.verify("cpu", arch=arch, nodes=nodes)
    verify_s = time.monotonic() - t0
    counts = report.counts()
    if report.failed:
        print(f"  {arch}: failed checks: {', '.join(r.name for r in report.failed)}", file=sys.stderr)
    phases = ", ".join(
        f"{k.removesuffix('_s').replace('_', ' ')} {v:.0f}s"
        for k, v in report.timings.items()
        if k in ("container_start_s", "checks_s", "multinode_s")
    )
    return Row(
        arch,
        build_s,
        f"{built.steps_run}/{built.steps_total} run",
        verify_s,
        phases,
        f"{counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", action="store_true", help="rebuild from the layer cache instead of --no-cache")
    parser.add_argument("--nodes", type=int, default=2, help="containers of the MPI run in verify (default 2)")
    args = parser.parse_args()
    if problem := rootfs.emulation_problem("arm64"):
        raise SystemExit(f"{problem}; {rootfs.emulation_hint('arm64')}")
    rows = []
    for arch in ("amd64", "arm64"):
        print(f"building and verifying cpu for {platforms.docker_platform(arch)} ...", file=sys.stderr, flush=True)
        rows.append(run(arch, nocache=not args.warm, nodes=args.nodes))
    native = rows[0]
    print(f"{'platform':12} {'build':>9} {'x':>5} {'steps':>10} {'verify':>9} {'x':>5}  verify phases; checks")
    for r in rows:
        print(f"{platforms.docker_platform(r.arch):12} {r.build_s / 60:7.1f}mn {r.build_s / native.build_s:5.1f} "
              f"{r.steps:>10} {r.verify_s / 60:7.1f}mn {r.verify_s / native.verify_s:5.1f}  {r.phases}; "
              f"{r.checks}")  # fmt: skip
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    how = "layer cache (--warm)" if args.warm else "--no-cache (cache mounts kept)"
    print(f"builds: {how}; verify --nodes {args.nodes}; CPUs: {os.cpu_count()}; load {load:.2f}; "
          f"arm64 through {rootfs.BINFMT_DIR / 'qemu-aarch64'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
