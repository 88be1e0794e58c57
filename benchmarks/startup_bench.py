"""Start-up benchmark (prints figures; asserts nothing): the wall time of the quick commands, each run N times
as a fresh process, with the floor under them (the interpreter alone, importing typer, and a one-command typer
app parsing an argument).
The CPU time (user + system) of each run is printed too: on a busy machine it moves much less than wall time.

    python benchmarks/startup_bench.py            # 15 runs of each
    python benchmarks/startup_bench.py --runs 40

`python -m imgbuild.cli` runs exactly what the `imgbuild` console script runs (`imgbuild.cli:main`), without a
launcher in front of it (a pyenv shim adds a shell and a second interpreter start). No engine, no network.
Bytecode is cached as for an installed package, in a temporary PYTHONPYCACHEPREFIX (the untimed first run writes
it), even where PYTHONDONTWRITEBYTECODE is set: compiling every module from source each time would add about
0.1 s to each command. `--no-bytecode-cache` measures that case.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

# A typer app of one command taking one argument: since typer 0.29, parsing any parameter builds a pydantic
# TypeAdapter for it (pydantic imported, schemas built), so this, not `import typer`, is the floor under every
# imgbuild command that takes an argument.
ONE_ARGUMENT_APP = """
import typer
app = typer.Typer()
@app.command()
def show(name: str, json: bool = False) -> None:
    print(name)
@app.command()
def other() -> None: ...
app()
"""
FLOOR = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import typer'": [sys.executable, "-c", "import typer"],
    "typer app: show ARG": [sys.executable, "-c", ONE_ARGUMENT_APP, "show", "cpu"],
}
COMMANDS = ["--version", "list", "show cpu", "render cpu"]


def timed_runs(argv: list[str], runs: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds) of `runs` runs of `argv`, after one untimed run that warms the file cache."""
    walls, cpus = [], []
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, env=env)
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
    parser.add_argument("--no-bytecode-cache", action="store_true", help="compile every module from source each run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="imgbuild-startup-pyc-") as pyc:
        env = dict(os.environ)
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = pyc
        report(args.runs, env)
    return 0


def report(runs: int, env: dict[str, str]) -> None:
    """Time every case and print the table."""
    cases = dict(FLOOR)
    cases.update({f"imgbuild {c}": [sys.executable, "-m", "imgbuild.cli", *c.split()] for c in COMMANDS})
    print(f"{'command':32} {'median s':>9} {'min s':>7} {'max s':>7} {'median cpu s':>13}")
    for label, argv in cases.items():
        walls, cpus = timed_runs(argv, runs, env)
        print(f"{label:32} {statistics.median(walls):9.3f} {min(walls):7.3f} {max(walls):7.3f} "
              f"{statistics.median(cpus):13.3f}")  # fmt: skip
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cache = "no bytecode cache" if env.get("PYTHONDONTWRITEBYTECODE") else "bytecode cached"
    print(f"{runs} runs each, {cache}; python {sys.version.split()[0]}; CPUs: {os.cpu_count()}; load {load:.2f}")


if __name__ == "__main__":
    sys.exit(main())
