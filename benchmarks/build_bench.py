"""Build benchmark, classic builder vs BuildKit (prints figures; asserts nothing).

For each recipe (cpu, pytorch), on one engine, in one run:

- BuildKit (this checkout's `imgbuild build`): cold build (the engine's build cache pruned, cache mounts included,
  and --no-cache), warm rebuild, late bump (the sshd port), early bump (an OS package: every layer after the OS
  packages runs again, and the pip cache mount must serve every wheel), and a rebuild from a registry cache after
  the engine's build cache and the image are gone (`--cache-to` then `--cache-from`);
- classic (the same cases with the last classic-builder release of imgbuild, checked out with `git worktree` from
  --classic-rev and run with its own code: docker-py's classic builder, PIP_NO_CACHE_DIR);

each with its ratio to that builder's cold build, the steps run, and the bytes pip fetched from the package index
(its "Downloading X (N MB)" lines) against the wheels it took from its cache ("Using cached"), read off the build's
own log. For pytorch, in the same run and on the same engine and builder (the docker CLI and BuildKit `imgbuild
build` picks), a plain baseline: a Dockerfile FROM the recipe's base that installs python3-venv and then runs `pip
install --no-cache-dir torch==X numpy==Y` (the lock's versions) in one RUN, no cache mount, built --no-cache after the
build cache is pruned; every pytorch row gets its ratio to it. `--record FILE` writes the table as Markdown with the
machine, the engine and the issue's goals (cold <= 1.0x plain, early bump <= 0.3x cold, rebuild from the registry
cache <= 0.25x cold), each said met or missed.

Then, with --torch-pair OLD,NEW (two torch releases whose CUDA wheels are pinned alike), what a push re-sends for
that torch patch bump, before (classic layout: one venv layer) and after (the CUDA wheels and torch in layers of
their own): build OLD, push it, build NEW, push it to the same repository, and measure the bytes the registry
stored for the second push.

It prunes the engine's whole build cache and removes the images it builds, so it refuses to run unless --own-engine
says the engine at DOCKER_HOST is its own (the second engine of scripts/dockerd2.sh is one:
`DOCKER_HOST=unix:///run/imgbuild-docker2.sock`), and it needs a local registry (scripts/registry.sh start).

    source scripts/ca-env.sh
    DOCKER_HOST=unix:///run/imgbuild-docker2.sock python benchmarks/build_bench.py --own-engine \\
        --recipe cpu --recipe pytorch --torch-pair 2.9.0,2.9.1
    DOCKER_HOST=unix:///run/imgbuild-docker2.sock python benchmarks/build_bench.py --own-engine \\
        --recipe pytorch --only buildkit --record benchmarks/results/$(date +%F).md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker

from imgbuild import engine

CLASSIC_REV = "22c2ce1"  # the last commit whose builds ran on the classic builder (issue 15)
REPO = Path(__file__).resolve().parent.parent
REGISTRY_DATA = Path(
    os.environ.get("REGISTRY_DIR", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "imgbuild/registry")
)
LATE = "components:\n  sshd: {ports: [3023]}\n"
EARLY = "os:\n  packages: [ca-certificates, iproute2, procps, less]\n"
_PIP_FILE = re.compile(r"(Downloading|Using cached) (\S+) \(([\d.]+) (kB|MB|GB)\)")
# `pip download` into the wheelhouse of the pip cache mount: a wheel already there is not fetched again.
_PIP_HAVE = re.compile(r"File was already downloaded (\S+)")
# uv's: "Downloading torch (858.1MiB)" for a file it fetches (it names no small ones, nor what its cache held).
_UV_FILE = re.compile(r"\bDownloading (\S+) \(([\d.]+)(KiB|MiB|GiB)\)")
_UNIT = {"kB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_BUILT = re.compile(r"^built (sha256:[0-9a-f]{64})", re.M)
# BuildKit's plain progress: "#7 [2/3] RUN ..." opens a step, "#7 CACHED" says it was not run.
_STEP = re.compile(r"^#(\d+) \[[^\]]*?(\d+)/(\d+)\]", re.M)
_CACHED = re.compile(r"^#(\d+) CACHED", re.M)
GOALS = (
    ("cold", "plain", 1.0, "cold build <= 1.0x the plain pip baseline"),
    ("early bump (OS package)", "cold", 0.3, "early bump <= 0.3x cold"),
    ("after prune: rebuild --cache-from", "cold", 0.25, "rebuild from the registry cache <= 0.25x cold"),
)
_LOG = re.compile(r"log: (\S+)\s*$", re.M)


@dataclass
class Row:
    recipe: str
    builder: str
    case: str
    seconds: float
    steps: str
    fetched_mb: float
    cache_hits: int
    notes: list[str] = field(default_factory=list)


@dataclass
class Built:
    image_id: str
    seconds: float
    log: str
    output: str


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def pip_bytes(log: str) -> tuple[float, int, int]:
    """(MB pip or uv downloaded, files pip took from its cache, files downloaded) from a build log."""
    fetched = 0.0
    files = 0
    hits = len(_PIP_HAVE.findall(log))
    for how, _name, size, unit in _PIP_FILE.findall(log):
        if how == "Downloading":
            fetched += float(size) * _UNIT[unit] / 1e6
            files += 1
        else:
            hits += 1
    for _name, size, unit in _UV_FILE.findall(log):
        fetched += float(size) * _UNIT[unit] / 1e6
        files += 1
    return fetched, hits, files


def steps_of(output: str, log: str) -> str:
    m = re.search(r"(\d+) of (\d+) steps run", output)
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    return "?"


class Runner:
    """Runs `imgbuild build` of one implementation (this checkout, or a worktree of the classic release)."""

    def __init__(self, name: str, src: Path, workdir: Path) -> None:
        self.name = name
        self.src = src
        self.workdir = workdir

    def lock(self, ref: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(self.src), "CI": "true", "TMPDIR": str(self.workdir)}
        proc = subprocess.run(
            [sys.executable, "-m", "imgbuild", "lock", ref], capture_output=True, text=True, env=env, cwd=self.workdir
        )
        if proc.returncode != 0:
            raise SystemExit(f"{self.name}: imgbuild lock {ref} failed:\n{proc.stderr[-3000:]}")

    def build(self, ref: str, *args: str) -> Built:
        # TMPDIR: the build contexts go in the benchmark's own folder, away from anything watching /tmp.
        env = {**os.environ, "PYTHONPATH": str(self.src), "CI": "true", "TMPDIR": str(self.workdir)}
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "imgbuild", "build", ref, *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.workdir,
        )
        seconds = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{self.name}: imgbuild build {ref} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
        built, log = _BUILT.search(proc.stdout), _LOG.search(proc.stdout)
        if not built or not log:
            raise SystemExit(f"{self.name}: cannot read the image id and log from:\n{proc.stdout}")
        return Built(built.group(1), seconds, Path(log.group(1)).read_text(errors="replace"), proc.stdout)


def variant(folder: Path, recipe: str, name: str, body: str, runner: Runner) -> str:
    """A child recipe of `recipe` with `body`, locked by the runner's `imgbuild lock` from a copy of the parent's
    lock, so that it keeps every version the parent pins (a fresh lock would take the index's newest closure)."""
    path = folder / f"{recipe}-{name}.yaml"
    path.write_text(f"extends: {recipe}\n{body}")
    parent_lock = runner.src.parent / "recipes" / f"{recipe}.lock.json"
    if parent_lock.is_file():  # the classic release predates locks
        shutil.copyfile(parent_lock, folder / f"{recipe}-{name}.lock.json")
        runner.lock(str(path))
    return str(path)


def prune(client: docker.DockerClient) -> None:
    """The engine's whole build cache, cache mounts included. Pruning some 20 GB takes longer than docker-py's
    60 s request time-out on this machine, so this request gets 15 minutes."""
    before = client.api.timeout
    client.api.timeout = 900
    try:
        client.api.prune_builds(all=True)
    finally:
        client.api.timeout = before


def remove_images(client: docker.DockerClient, image_ids: list[str]) -> None:
    for image_id in dict.fromkeys(image_ids):
        with contextlib.suppress(docker.errors.NotFound):
            client.images.remove(image_id, force=True)


def cases(
    client: docker.DockerClient, runner: Runner, recipe: str, folder: Path, registry: str | None, *, buildkit: bool
) -> list[Row]:
    rows: list[Row] = []
    made: list[str] = []

    def row(case: str, b: Built, *notes: str) -> None:
        fetched, cached, files = pip_bytes(b.log)
        made.append(b.image_id)
        rows.append(Row(recipe, runner.name, case, b.seconds, steps_of(b.output, b.log), fetched, cached, [*notes]))
        if files:
            rows[-1].notes.append(f"{files} files downloaded")
        print(
            f"  {recipe} {runner.name} {case}: {b.seconds:.1f}s, {rows[-1].steps} steps, {fetched:.0f} MB", flush=True
        )

    if buildkit:
        prune(client)  # cache mounts too: the pip cache starts empty
    cold = runner.build(recipe, "--no-cache")
    row("cold", cold)
    row("warm rebuild", runner.build(recipe))
    row("late bump (sshd port)", runner.build(variant(folder, recipe, "late", LATE, runner)))
    row("early bump (OS package)", runner.build(variant(folder, recipe, "early", EARLY, runner)))
    if buildkit and registry:
        ref = f"{registry}/imgbuild-bench-cache/{recipe}:{int(time.time())}"
        row("export the registry cache (--cache-to)", runner.build(recipe, "--cache-to", ref))
        remove_images(client, made)
        prune(client)
        row("after prune: rebuild --cache-from", runner.build(recipe, "--cache-from", ref))
    remove_images(client, made)
    return rows


def torch_pair(client: docker.DockerClient, runner: Runner, folder: Path, registry: str, pair: tuple[str, str]) -> str:
    """Build and push torch OLD then NEW (the pytorch recipe with components.pytorch.version), to one repository;
    say what the second push stored."""
    repo = f"{registry}/imgbuild-bench-pair-{runner.name}"
    sizes = []
    made = []
    for version in pair:
        ref = variant(
            folder, "pytorch", f"torch-{version}", f"components:\n  pytorch: {{version: {version}}}\n", runner
        )
        b = runner.build(ref)
        made.append(b.image_id)
        tag = f"{repo}:torch-{version}"
        client.images.get(b.image_id).tag(tag)
        before = _du(REGISTRY_DATA)
        pushed = already = 0
        for rec in client.api.push(tag, stream=True, decode=True):
            if "error" in rec:
                raise SystemExit(f"push {tag}: {rec['error']}")
            status = str(rec.get("status", ""))
            pushed += status == "Pushed"
            already += status == "Layer already exists"
        sizes.append((version, _du(REGISTRY_DATA) - before, pushed, already))
        client.images.remove(tag)
    remove_images(client, made)
    (v_old, b_old, p_old, _), (v_new, b_new, p_new, a_new) = sizes
    return (
        f"{runner.name}: push of torch {v_old} stored {b_old / 1e6:.0f} MB ({p_old} layers); the bump to {v_new} "
        f"stored {b_new / 1e6:.0f} MB more ({p_new} layers pushed, {a_new} already there)"
    )


PLAIN = """FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates python3-venv \\
 && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
RUN --mount=type=secret,id=ca,target=/run/secrets/ca.pem \\
    PIP_CERT=/run/secrets/ca.pem /opt/venv/bin/pip install --no-cache-dir torch=={torch} numpy=={numpy}
"""


def plain_baseline(client: docker.DockerClient, folder: Path, recipe: str) -> Row:
    """The recipe's torch and numpy installed the plain way (see the module's docstring), built cold by the builder
    `imgbuild build` uses, on the same engine."""
    from imgbuild import build
    from imgbuild.build.builders import argv, cacheplan, choice
    from imgbuild.pin import lock

    _, resolved = lock.for_ref(recipe)
    pin = resolved.pins["pytorch"]
    numpy = getattr(pin.details, "numpy", None)
    if not numpy:
        raise SystemExit(f"{recipe}: its lock pins no numpy for torch {pin.version}")
    context = folder / f"plain-{recipe}"
    context.mkdir()
    (context / "Dockerfile").write_text(PLAIN.format(base=resolved.base_ref, torch=pin.version, numpy=numpy))
    builder = choice.select()
    ca = build.ca_bundle_from(None)
    if ca is None:
        raise SystemExit("the plain baseline's pip needs the CA bundle: source scripts/ca-env.sh (IMGBUILD_CA_BUNDLE)")
    tag = f"imgbuild-bench-plain/{recipe}:{int(time.time())}"
    command = argv.command(
        builder, context, tags=[tag], labels={}, build_args={}, nocache=True, pull=False, secrets={"ca": ca},
        cache=cacheplan.cache_plan(builder), iidfile=context / "iid", metadata_file=None,
    )  # fmt: skip
    prune(client)
    t0 = time.monotonic()
    proc = subprocess.run(command, env=argv.cli_env(builder), capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"plain baseline build failed ({proc.returncode}):\n{log[-3000:]}")
    steps = {m.group(1) for m in _STEP.finditer(log)}
    cached = {m.group(1) for m in _CACHED.finditer(log)} & steps
    fetched, hits, files = pip_bytes(log)
    remove_images(client, [(context / "iid").read_text().strip()])
    notes = [f"pip install torch=={pin.version} numpy=={numpy}", f"{files} files downloaded"]
    return Row(recipe, "plain", "plain pip baseline (cold)", seconds, f"{len(steps) - len(cached)}/{len(steps)}",
               fetched, hits, notes)  # fmt: skip


def machine() -> str:
    """CPU model and count, memory, kernel."""
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:", 1)[1].split()[0])
        mem = f"{kb / 2**20:.0f} GiB"
    return f"{os.cpu_count()} CPUs ({model}), {mem} memory, Linux {platform.release()}"


def ratio(value: float, to: float | None) -> str:
    return f"{value / to:.2f}" if to else "-"


def record(path: Path, rows: list[Row], notes: list[str], client: docker.DockerClient) -> None:
    """The run as Markdown: machine, engine, one table, the goals met or missed."""
    from imgbuild.build.builders import choice

    version = client.version()
    cold = {(r.recipe, r.builder): r.seconds for r in rows if r.case == "cold"}
    plain = {r.recipe: r.seconds for r in rows if r.builder == "plain"}
    lines = [
        f"# Build benchmark, {datetime.date.today().isoformat()}",
        "",
        f"`benchmarks/build_bench.py {' '.join(sys.argv[1:])}`, one run, every case on one engine.",
        "",
        f"- machine: {machine()}",
        f"- engine: Docker {version.get('Version')} (API {version.get('ApiVersion')}) at "
        f"{os.environ.get('DOCKER_HOST', 'the local socket')}, storage driver {client.info().get('Driver')}",
        f"- builder: {choice.select().describe()}",
        "",
        "| recipe | builder | case | seconds | x cold | x plain | steps run | index MB | cache hits | notes |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]

    def x_cold(r: Row) -> str:
        return ratio(r.seconds, cold.get((r.recipe, r.builder)))

    for r in rows:
        lines.append(
            f"| {r.recipe} | {r.builder} | {r.case} | {r.seconds:.1f} | {x_cold(r)}"
            f" | {ratio(r.seconds, plain.get(r.recipe))} | {r.steps} | {r.fetched_mb:.0f} | {r.cache_hits} | "
            f"{'; '.join(r.notes)} |"
        )
    lines += ["", "## Goals", ""]
    for recipe in sorted(plain):
        by_case = {r.case: r.seconds for r in rows if r.recipe == recipe and r.builder == "buildkit"}
        for case, against, limit, what in GOALS:
            value = by_case.get(case)
            base = plain.get(recipe) if against == "plain" else by_case.get("cold")
            if value is None or not base:
                lines.append(f"- {recipe}: {what}: not measured in this run")
                continue
            got = value / base
            lines.append(f"- {recipe}: {what}: {got:.2f}x, {'met' if got <= limit else 'MISSED'}")
    lines += [*(["", *[f"- {n}" for n in notes]] if notes else []), ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    print(f"record: {path}")


def classic_checkout(rev: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev], check=True, capture_output=True
    )
    return where / "src"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", action="append", choices=["cpu", "pytorch"], help="default: cpu and pytorch")
    parser.add_argument("--classic-rev", default=CLASSIC_REV, help="the classic-builder release to compare with")
    parser.add_argument("--only", choices=["buildkit", "classic"], help="one builder (default: both, in one run)")
    parser.add_argument("--registry", default="127.0.0.1:5000", help="a registry the engine pushes to over HTTP")
    parser.add_argument("--torch-pair", help="OLD,NEW: torch releases with the same CUDA wheel pins (e.g. 2.9.0,2.9.1)")
    parser.add_argument("--pair-only", action="store_true", help="only --torch-pair (prunes nothing: any engine)")
    parser.add_argument("--own-engine", action="store_true", help="the engine at DOCKER_HOST may have its cache pruned")
    parser.add_argument("--no-plain", action="store_true", help="no plain pip baseline for pytorch")
    parser.add_argument("--record", type=Path, help="write the run as Markdown here (benchmarks/results/DATE.md)")
    args = parser.parse_args()
    if not args.own_engine and not args.pair_only:
        parser.error("this prunes the engine's build cache: pass --own-engine (e.g. with scripts/dockerd2.sh's engine)")
    recipes = args.recipe or ["cpu", "pytorch"]
    client = engine.connect()
    rows: list[Row] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="imgbuild-bench-") as tmp:
        folder = Path(tmp)
        runners = [] if args.only == "classic" else [(Runner("buildkit", REPO / "src", folder), True)]
        classic_src = None
        if args.only != "buildkit":
            classic_src = classic_checkout(args.classic_rev, folder / "classic")
            runners.append((Runner("classic", classic_src, folder), False))
        try:
            for recipe in [] if args.pair_only else recipes:
                if recipe == "pytorch" and not args.no_plain:
                    rows.append(plain_baseline(client, folder, recipe))
                    print(f"  plain baseline: {rows[-1].seconds:.1f}s, {rows[-1].fetched_mb:.0f} MB", flush=True)
                for runner, buildkit in runners:
                    rows += cases(client, runner, recipe, folder, args.registry, buildkit=buildkit)
            if args.torch_pair:
                pair = tuple(args.torch_pair.split(","))
                assert len(pair) == 2, "--torch-pair OLD,NEW"
                for runner, _ in runners:
                    notes.append(torch_pair(client, runner, folder, args.registry, (pair[0], pair[1])))
        finally:
            if classic_src is not None:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder / "classic")], check=False
                )
                shutil.rmtree(folder / "classic", ignore_errors=True)
    cold = {(r.recipe, r.builder): r.seconds for r in rows if r.case == "cold"}
    plain = {r.recipe: r.seconds for r in rows if r.builder == "plain"}
    if rows:
        print(
            f"{'recipe':8} {'builder':9} {'case':40} {'seconds':>8} {'x cold':>7} {'x plain':>7} {'steps run':>10} "
            f"{'index MB':>9} {'cache hits':>10}  notes"
        )
    for r in rows:
        x_cold = ratio(r.seconds, cold.get((r.recipe, r.builder)))
        print(
            f"{r.recipe:8} {r.builder:9} {r.case:40} {r.seconds:8.1f} {x_cold:>7} "
            f"{ratio(r.seconds, plain.get(r.recipe)):>7} {r.steps:>10} {r.fetched_mb:9.0f} {r.cache_hits:10d}  "
            f"{'; '.join(r.notes)}"
        )
    for note in notes:
        print(note)
    print(f"engine: {os.environ.get('DOCKER_HOST', 'local socket')}; machine: {machine()}")
    if args.record:
        record(args.record, rows, notes, client)
    return 0


if __name__ == "__main__":
    sys.exit(main())
