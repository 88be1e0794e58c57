"""Build benchmark (prints figures; asserts nothing): cold build of cpu, rebuild after bumping a late component
(the sshd port), rebuild after bumping an early one (the OS package set, where Debian's Open MPI comes from),
each time with its ratio to the cold build, plus the image size.

    python benchmarks/build_bench.py            # needs a running engine and the base image (scripts/setup.sh)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from imgbuild import build, engine

VARIANTS = {
    "late: sshd port 3022 -> 3023": "extends: cpu\ncomponents:\n  sshd: {ports: [3023]}\n",
    "early: OS packages (+less)": "extends: cpu\nos:\n  packages: [ca-certificates, iproute2, procps, less]\n",
}


def timed(ref: str, **kwargs: object) -> tuple[float, build.BuildResult]:
    t0 = time.monotonic()
    result = build.build(ref, ca_bundle=build.ca_bundle_from(None), **kwargs)  # type: ignore[arg-type]
    return time.monotonic() - t0, result


def main() -> int:
    client = engine.connect()
    rows: list[tuple[str, float, int, int, int]] = []
    with tempfile.TemporaryDirectory(prefix="imgbuild-bench-") as tmp:
        cold, result = timed("cpu", nocache=True)
        size = client.images.get(result.image_id).attrs["Size"]
        rows.append(("cold build of cpu (--no-cache)", cold, result.steps_run, result.steps_total, size))
        warm, result = timed("cpu")
        rows.append(("rebuild, nothing changed", warm, result.steps_run, result.steps_total, size))
        made: list[str] = []
        for label, text in VARIANTS.items():
            path = Path(tmp) / f"bench-{len(made)}.yaml"
            path.write_text(text)
            seconds, result = timed(str(path))
            made.extend(result.refs)
            size_v = client.images.get(result.image_id).attrs["Size"]
            rows.append((f"rebuild after bumping {label}", seconds, result.steps_run, result.steps_total, size_v))
        for ref in made:
            client.images.remove(ref, noprune=False)
    print(f"{'case':48} {'seconds':>8} {'x cold':>7} {'steps run':>10} {'size MB':>8}")
    for label, seconds, run, total, size_b in rows:
        print(f"{label:48} {seconds:8.1f} {seconds / cold:7.2f} {f'{run}/{total}':>10} {size_b / 1e6:8.0f}")
    print(f"engine: {os.environ.get('DOCKER_HOST', 'local socket')}; CPUs: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
