"""Image benchmark for the cpu and pytorch recipes (prints figures; asserts only what must hold): build time,
image size, rebuild after a late bump (the sshd port; the PyTorch layer must come from the cache, checked on the
build's step log), `imgbuild verify` time, and the 2-node DDP time per launcher (`verify --nodes 2`'s trainings).

    python benchmarks/image_bench.py                        # cached builds (what the engine's cache has)
    python benchmarks/image_bench.py --cold cpu --cold pytorch  # from scratch (pytorch: ~4 GB of wheels)

Needs a running engine and the base image (scripts/setup.sh); downloads trust IMGBUILD_CA_BUNDLE.

A cold build is `--no-cache` (BuildKit keeps its cache mounts, so pip takes the wheels it already has from the
pip cache); after one the recipe is built once more (reported as "heal") before the late bump is measured. On
the classic builder a --no-cache build spoiled the cache of every later build; on BuildKit the heal row shows
whether anything of that is left.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import docker

from imgbuild import build, engine, verify
from imgbuild.engine.containers import Containers
from imgbuild.image.manifest import MANIFEST_PATH, Manifest
from imgbuild.pin import lock
from imgbuild.verify import multinode

RECIPES = ("cpu", "pytorch")
# The layer that must not be rebuilt (downloaded again) by a late bump: the largest download of each recipe.
HEAVY_STEP = {"cpu": re.compile(r"pip install .*nvidia-nccl"), "pytorch": re.compile(r"pip install .*torch==")}


def timed_build(ref: str, *, nocache: bool = False) -> tuple[float, build.BuildResult]:
    t0 = time.monotonic()
    result = build.build(*lock.for_ref(ref), nocache=nocache, ca_bundle=build.ca_bundle_from(None))
    return time.monotonic() - t0, result


def cached_steps(result: build.BuildResult) -> dict[str, bool]:
    """Each step's name (BuildKit's `[runtime 5/12] RUN ...`) -> whether it came from the cache (the build's own
    step records)."""
    return {step.name: step.cached for step in result.steps}


def manifest_of(client: docker.DockerClient, image: str) -> Manifest:
    containers = Containers(client)
    try:
        raw = containers.read_image_file(image, MANIFEST_PATH)
    finally:
        containers.remove_all()
    if raw is None:
        raise SystemExit(f"{image} has no {MANIFEST_PATH}")
    return Manifest.parse(raw, image)


def bench(name: str, cold: bool, tmp: Path) -> dict[str, str]:
    client = engine.connect()
    row: dict[str, str] = {"recipe": name}
    seconds, result = timed_build(name, nocache=cold)
    row["build"] = f"{seconds:.1f} s ({'cold, --no-cache' if cold else 'cached'}; {result.steps_run}/" + (
        f"{result.steps_total} steps run)"
    )
    if cold:
        seconds, healed = timed_build(name)
        row["heal"] = f"{seconds:.1f} s (the build after --no-cache; {healed.steps_run}/{healed.steps_total} steps run)"
    image = result.refs[0]
    row["size"] = f"{client.images.get(result.image_id).attrs['Size'] / 1e9:.2f} GB"

    # A late bump: the sshd port. Only the layers after the sshd one run again.
    child = tmp / f"bench-{name}-sshd.yaml"
    child.write_text(f"extends: {name}\ncomponents:\n  sshd: {{ports: [3023]}}\n")
    seconds, bumped = timed_build(str(child))
    steps = cached_steps(bumped)
    heavy = [s for s in steps if HEAVY_STEP[name].search(s)]
    if len(heavy) != 1:
        raise SystemExit(f"{name}: no single step matching {HEAVY_STEP[name].pattern} in {bumped.log_path}")
    cached = "cached" if steps[heavy[0]] else "REBUILT: the engine's cache missed it"
    ran = f"{bumped.steps_run}/{bumped.steps_total} steps run"
    row["late bump"] = f"{seconds:.1f} s ({ran}; '{heavy[0][:40]}' {cached})"
    if not steps[heavy[0]]:
        row["error"] = f"the late bump rebuilt '{heavy[0]}' (log {bumped.log_path})"
    for ref in bumped.refs:
        client.images.remove(ref, noprune=False)

    t0 = time.monotonic()
    report = verify.verify(image)
    row["verify"] = f"{time.monotonic() - t0:.1f} s ({report.counts()['pass']} passed, {len(report.failed)} failed)"

    results = multinode.run_multinode(image, manifest_of(client, image), 2, client=client)
    t = next(r for r in results if r.name == "multinode: timings").details
    bad = [r.name for r in results if r.status == "fail"]
    if "ddp_mpirun_s" in t:
        row["2-node DDP"] = f"mpirun {t['ddp_mpirun_s']:.1f} s, torchrun {t['ddp_torchrun_s']:.1f} s"
    else:
        row["2-node DDP"] = f"no PyTorch (mpirun allreduce {t.get('mpirun_s', 0):.1f} s)"
    row["verify --nodes 2 part"] = f"{t['total_s']:.1f} s" + (f" FAILED: {', '.join(bad)}" if bad else "")
    client.close()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="append", choices=RECIPES, default=None,
                        help="recipes to build with --no-cache first (default: none)")  # fmt: skip
    args = parser.parse_args()
    cold = set(args.cold or [])
    errors = []
    with tempfile.TemporaryDirectory(prefix="imgbuild-bench-") as tmp:
        for name in RECIPES:
            row = bench(name, name in cold, Path(tmp))
            print(row.pop("recipe"), flush=True)
            for key, value in row.items():
                print(f"  {key:22} {value}", flush=True)
            errors += [f"{name}: {row['error']}"] if "error" in row else []
    print(f"engine: {os.environ.get('DOCKER_HOST', 'local socket')}; CPUs: {os.cpu_count()}")
    for e in errors:
        print(f"FAILED: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
