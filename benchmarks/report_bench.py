"""`imgbuild cluster report` benchmark (prints figures; asserts nothing): MB/s of parse + judge + terminal render
for logs of several shapes and sizes. Linear time shows as MB/s that stays about the same as the size grows; a
pattern that backtracks shows as MB/s that falls with each size (before issue 15, 0.3 MB of a log exported as one
JSON line took 5.7 s and 30 kB of spaces after 'Using network' 8.9 s).

    python benchmarks/report_bench.py                 # 0.3, 1 and 3 MB of each shape
    python benchmarks/report_bench.py --sizes 1 10    # MB
    python benchmarks/report_bench.py --shape json-one-line --runs 3

Each figure is the best of --runs (default 1) of the whole command through typer's CliRunner on a log from
tests/data/upstream/nccl-tests, reshaped, after one untimed run (imports). No engine, no network. The CPU time
is printed too, and MB per CPU second: on a busy machine they move much less than wall time.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from imgbuild.cli.cluster import app

LOG = (
    Path(__file__).resolve().parents[1]
    / "tests/data/upstream/nccl-tests/slurm-pcluster_2x-g7e.8xlarge_nccl-2.29.2_ofi-1.18.0_efa.log"
).read_text()
LINES = LOG.splitlines(keepends=True)
ROW = next(line for line in LINES if line.lstrip().startswith("1073741824 "))  # the 1 GiB result row
HEADER = next(line for line in LINES if "#wrong" in line and "size" in line)


def _repeat(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


# name -> (what it is, how to make `size` bytes of it)
SHAPES: dict[str, tuple[str, Callable[[int], str]]] = {
    "log": ("a real log repeated: many short lines, many tables", lambda n: _repeat(LOG, n)),
    "rows": ("one table of n rows", lambda n: LOG[: LOG.index("  1073741824")] + _repeat(ROW, n)),
    "headers": ("table headers only: a table (and a criterion) per line", lambda n: _repeat(HEADER, n)),
    "json-one-line": ("the log exported as one JSON line", lambda n: json.dumps({"log": _repeat(LOG, n)})),
    "spaces-after-network": (
        "'Using network' then a run of spaces on one line",
        lambda n: "h:1:1 [0] NCCL INFO Using network" + " " * n + "y",
    ),
    "ofi-repeated": (
        "'NET/OFI' phrases on one line, none failing",
        lambda n: _repeat("h:1:1 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.18.0 ", n),
    ),
    "dlerror-repeated": (
        "'NET/Plugin : dlerror=' on one line, never 'No plugin found'",
        lambda n: _repeat("NCCL INFO NET/Plugin : dlerror=libnccl-net.so ", n),
    ),
}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.3, 1, 3], help="log sizes in MB")
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="only these shapes")
    parser.add_argument("--runs", type=int, default=1, help="runs of each; the best is shown")
    args = parser.parse_args()
    runner = CliRunner()
    runner.invoke(app, ["report"], input=LOG)  # imports and first use of rich, pydantic's validators: not timed
    print(f"{'shape':22} {'MB':>6} {'wall s':>8} {'cpu s':>8} {'MB/s':>8} {'MB/cpu s':>9}  exit")
    for name in args.shape or SHAPES:
        what, make = SHAPES[name]
        for mb in args.sizes:
            text = make(int(mb * 1e6))
            best: tuple[float, float, int] | None = None
            for _ in range(args.runs):
                wall, cpu = time.perf_counter(), _cpu()
                result = runner.invoke(app, ["report"], input=text)
                took = (time.perf_counter() - wall, _cpu() - cpu, result.exit_code)
                best = took if best is None or took[0] < best[0] else best
            assert best is not None
            size = len(text) / 1e6
            wall_s, cpu_s, code = best
            rate = f"{size / cpu_s:9.2f}" if cpu_s > 0 else f"{'-':>9}"
            print(f"{name:22} {size:6.2f} {wall_s:8.2f} {cpu_s:8.2f} {size / wall_s:8.2f} {rate}  {code}")
        print(f"{'':22} ({what})")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
