"""Start-up benchmark (prints figures; asserts nothing): the wall time of the quick commands, each run N times
as a fresh process, with the floor under them (the interpreter alone, importing typer, and a one-command typer
app parsing an argument), and that app again doing the least `show` and `render` can do with the libraries they
are built on (PyYAML, pydantic, rich; PyYAML, pydantic, Jinja2): those two rows are the part of the quick commands'
ratio to the floor that comes from the libraries, not from imgbuild.
The CPU time (user + system) of each run is printed too, and its ratio to the one-argument app's: on a busy machine
it moves much less than wall time.

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


def _indented(code: str) -> str:
    """`code` as the body of the one-argument app's command."""
    return "\n".join(f"    {line}" if line else "" for line in code.strip("\n").splitlines())


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
# The same app whose command does the least `show` / `render` can do with the libraries they are built on, and
# nothing of imgbuild: parse a small YAML mapping, validate it with a pydantic model that has a Field, and print it
# as a rich table (show) or through a Jinja2 template (render). What these cost above the typer floor is a floor
# under the quick commands' ratio to it that no change inside imgbuild moves.
SHOW_LIBRARIES = """
import yaml
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table
class Pin(BaseModel):
    version: str = Field(min_length=1)
pins = {k: Pin.model_validate(v) for k, v in yaml.safe_load("nccl: {version: '2.27.5'}").items()}
table = Table("component", "version", box=None)
for name, pin in pins.items():
    table.add_row(name, pin.version)
Console().print(table)
"""
RENDER_LIBRARIES = """
import jinja2
import yaml
from pydantic import BaseModel, Field
class Pin(BaseModel):
    version: str = Field(min_length=1)
pins = {k: Pin.model_validate(v) for k, v in yaml.safe_load("nccl: {version: '2.27.5'}").items()}
print(jinja2.Environment().from_string("{% for n, p in pins.items() %}LABEL {{ n }}={{ p.version }}{% endfor %}")
      .render(pins=pins))
"""
FLOOR = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import typer'": [sys.executable, "-c", "import typer"],
    "typer app: show ARG": [sys.executable, "-c", ONE_ARGUMENT_APP, "show", "cpu"],
    "  + show's libraries": [
        sys.executable, "-c", ONE_ARGUMENT_APP.replace("    print(name)", _indented(SHOW_LIBRARIES)), "show", "cpu"
    ],
    "  + render's libraries": [
        sys.executable, "-c", ONE_ARGUMENT_APP.replace("    print(name)", _indented(RENDER_LIBRARIES)), "show", "cpu"
    ],
}  # fmt: skip
FLOOR_CASE = "typer app: show ARG"  # what "x floor cpu" divides by
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
    print(f"{'command':32} {'median s':>9} {'min s':>7} {'max s':>7} {'median cpu s':>13} {'x floor cpu':>12}")
    floor = None
    for label, argv in cases.items():
        walls, cpus = timed_runs(argv, runs, env)
        cpu = statistics.median(cpus)
        floor = cpu if label == FLOOR_CASE else floor
        ratio = f"{cpu / floor:12.2f}" if floor else f"{'-':>12}"
        print(f"{label:32} {statistics.median(walls):9.3f} {min(walls):7.3f} {max(walls):7.3f} {cpu:13.3f} {ratio}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cache = "no bytecode cache" if env.get("PYTHONDONTWRITEBYTECODE") else "bytecode cached"
    print(f"{runs} runs each, {cache}; python {sys.version.split()[0]}; CPUs: {os.cpu_count()}; load {load:.2f}")


if __name__ == "__main__":
    sys.exit(main())
