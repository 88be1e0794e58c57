"""Start-up benchmark (prints figures; asserts nothing): the wall time of the quick commands, each run N times
as a fresh process, with the floor under them (the interpreter alone, and the interpreter importing typer).
The CPU time (user + system) of each run is printed too: on a busy machine it moves much less than wall time.

    python benchmarks/startup_bench.py            # 15 runs of each
    python benchmarks/startup_bench.py --runs 40

`python -m imgbuild.cli` runs exactly what the `imgbuild` console script runs (`imgbuild.cli:main`), without a
launcher in front of it (a pyenv shim adds a shell and a second interpreter start). No engine, no network.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

FLOOR = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import typer'": [sys.executable, "-c", "import typer"],
}
COMMANDS = ["--version", "list", "show cpu", "render cpu"]


def timed_runs(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of `runs` runs of `argv`, after one untimed run that warms the file cache."""
    walls, cpus = [], []
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        elapsed = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-500:]}")
        if i:
            walls.append(elapsed)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command (default 15)")
    args = parser.parse_args()
    cases = dict(FLOOR)
    cases.update({f"imgbuild {c}": [sys.executable, "-m", "imgbuild.cli", *c.split()] for c in COMMANDS})
    print(f"{'command':32} {'median s':>9} {'min s':>7} {'max s':>7} {'median cpu s':>13}")
    for label, argv in cases.items():
        walls, cpus = timed_runs(argv, args.runs)
        print(f"{label:32} {statistics.median(walls):9.3f} {min(walls):7.3f} {max(walls):7.3f} "
              f"{statistics.median(cpus):13.3f}")  # fmt: skip
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.runs} runs each; python {sys.version.split()[0]}; CPUs: {os.cpu_count()}; load average {load:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
