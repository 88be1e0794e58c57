"""How an image is built: BuildKit, driven through a docker CLI, and the build itself.

`select` picks the builder and says why. The candidates are the CLI that IMGBUILD_DOCKER_CLI names (only it), else
every `docker` on PATH in order, then /usr/bin/docker:

* a CLI whose `docker buildx version` works builds with `docker buildx build` (kind "buildx"); `--builder NAME` /
  IMGBUILD_BUILDER names a buildx builder (a remote BuildKit, buildx's Kubernetes driver ...), and
  `docker buildx inspect [NAME]` tells its driver;
* else a CLI older than 23.0 builds with `DOCKER_BUILDKIT=1 docker build` (kind "buildkit"), its own BuildKit
  client (Debian 12's docker.io 20.10);
* else the CLI is skipped: from 23.0 on, `docker build` refuses BuildKit without the buildx plugin.

Nothing usable is an `EngineError` (exit 8) naming what was tried and what to install. The engine is the CLI's own
(DOCKER_HOST, DOCKER_CONTEXT): the environment is passed through.

`build` runs the CLI in a session of its own with `--progress=plain`, reads BuildKit's plain stream into vertex
events (`#7 [runtime 2/5] RUN ...`, `#7 0.235 <output>`, `#7 CACHED`, `#7 DONE 11.1s`, `#7 ERROR: ...`; vertices of
parallel stages interleave), writes every line to the build log, feeds a `BuildObserver`, and returns a
`BuildOutcome` with per-step records. The image id comes from `--iidfile`, the digest from buildx's
`--metadata-file`. Ctrl-C and SIGTERM (`interrupts.terminable`) are forwarded to the CLI as SIGINT (BuildKit cancels
the solve and stops the running step), waited for, then killed; any tag the build moved is put back. BuildKit runs
steps in its own executor, never as engine containers, so no container is left to sweep.

`cache_plan` turns `--cache-from` / `--cache-to` into the builder's options: a registry cache where buildx has a
driver that exports one, the inline cache otherwise (the image itself carries its cache metadata and is pushed
as the --cache-to ref through docker-py: `push_inline_cache`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol, TextIO

from imgbuild.core.errors import BaseImageMissing, BuildError, EngineError, Interrupted, UsageError
from imgbuild.core.interrupts import sigint_deferred
from imgbuild.core.text import clean, truncate
from imgbuild.engine import BOOTSTRAP_HINT, ENGINE_ERRORS, create_log, inspect_image

if TYPE_CHECKING:
    import docker

    from imgbuild.publish import PushObserver

__all__ = [
    "BUILDER_ENV",
    "CLI_ENV",
    "BuildObserver",
    "BuildOutcome",
    "Builder",
    "Cache",
    "NoBuilder",
    "Skipped",
    "StepRecord",
    "build",
    "cache_plan",
    "command",
    "push_inline_cache",
    "select",
]

CLI_ENV = "IMGBUILD_DOCKER_CLI"
BUILDER_ENV = "IMGBUILD_BUILDER"
FALLBACK_CLI = "/usr/bin/docker"
BUILDX_MIN_CLASSIC = 23  # from Docker CLI 23.0 on, `docker build` needs the buildx plugin for BuildKit
PROBE_TIMEOUT_S = 30.0
CANCEL_WAIT_S = 20.0  # how long a cancelled CLI gets to stop its build before it is killed
LOG_TAIL_LINES = 30

INSTALL_HINT = (
    "install the buildx plugin (Docker's docker-buildx-plugin package, or the docker-buildx binary in "
    "~/.docker/cli-plugins/), or a docker CLI 20.10-22.x (e.g. Debian 12's docker.io, /usr/bin/docker); "
    f"{CLI_ENV} names the docker CLI to use"
)

Kind = Literal["buildx", "buildkit"]


# --------------------------------------------------------------------------------------------------------
# which builder


@dataclass(frozen=True)
class Skipped:
    """A docker CLI that cannot build with BuildKit, and why."""

    cli: str
    version: str | None
    reason: str


class NoBuilder(EngineError):
    """No docker CLI here can build with BuildKit (or none has buildx where a builder is named): exit 8, with the
    candidates tried and why each was skipped."""

    def __init__(self, message: str, *, hint: str | None = None, skipped: Sequence[Skipped] = ()) -> None:
        super().__init__(message, hint=hint)
        self.skipped = tuple(skipped)


@dataclass(frozen=True)
class Builder:
    """How images are built here: kind "buildx" (`docker buildx build`) or "buildkit" (`DOCKER_BUILDKIT=1 docker
    build`), through the CLI at `cli`; for buildx the builder's name (None: the CLI's current one) and driver."""

    kind: Kind
    cli: str
    cli_version: str
    name: str | None = None
    driver: str | None = None
    buildx_version: str | None = None
    why: str = ""
    skipped: tuple[Skipped, ...] = ()

    @property
    def registry_cache(self) -> bool:
        """Whether the builder can export a registry cache (`--cache-to type=registry`): buildx with a driver other
        than `docker` (docker-container, remote, kubernetes)."""
        return self.kind == "buildx" and self.driver not in (None, "docker")

    @property
    def engine_store(self) -> bool:
        """Whether the builder reads base images from and writes the image to the engine's own image store (kind
        buildkit, or buildx's docker driver); other drivers resolve FROM from registries and need `--load`."""
        return self.kind == "buildkit" or self.driver == "docker"

    def describe(self) -> str:
        """One line: what builds and through which CLI."""
        if self.kind == "buildx":
            name = self.name or "the current builder"
            return (
                f"docker buildx build (buildx {self.buildx_version or '?'}, builder {name}, driver "
                f"{self.driver or '?'}) through {self.cli} (docker CLI {self.cli_version})"
            )
        return f"DOCKER_BUILDKIT=1 docker build through {self.cli} (docker CLI {self.cli_version})"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cli": self.cli,
            "cli_version": self.cli_version,
            "buildx_version": self.buildx_version,
            "name": self.name,
            "driver": self.driver,
            "registry_cache": self.registry_cache,
            "engine_store": self.engine_store,
            "why": self.why,
            "skipped": [{"cli": s.cli, "version": s.version, "reason": s.reason} for s in self.skipped],
        }


def candidates(env: Mapping[str, str] | None = None) -> list[str]:
    """The docker CLIs `select` considers, in order: IMGBUILD_DOCKER_CLI alone when set, else every `docker` on PATH
    and then /usr/bin/docker (each file once, however many links lead to it)."""
    env = os.environ if env is None else env
    named = env.get(CLI_ENV, "").strip()
    if named:
        return [named if os.sep in named else (shutil.which(named, path=env.get("PATH")) or named)]
    found: list[str] = []
    seen: set[str] = set()
    paths = [os.path.join(d or ".", "docker") for d in env.get("PATH", os.defpath).split(os.pathsep)]
    for path in [*paths, FALLBACK_CLI]:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            found.append(path)
    return found


def _probe(argv: list[str], env: Mapping[str, str]) -> tuple[int, str]:
    """(exit code, stdout and stderr) of a short CLI call; 127 with the reason when it cannot run."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", env=dict(env), timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return 124, f"`{' '.join(argv[1:])}` did not answer within {PROBE_TIMEOUT_S:.0f}s"
    except OSError as exc:
        return 127, exc.strerror or str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


_VERSION_RE = re.compile(r"Docker version (\d+)\.(\d+)\.(\d+)\S*", re.I)


def _first_line(text: str) -> str:
    return truncate(clean(text.strip().splitlines()[0]) if text.strip() else "no output", 200)


def _inspect(cli: str, name: str | None, env: Mapping[str, str]) -> tuple[str | None, str | None, str]:
    """(builder name, driver, problem) from `docker buildx inspect [NAME]`."""
    rc, out = _probe([cli, "buildx", "inspect", *([name] if name else [])], env)
    if rc != 0:
        return None, None, _first_line(out)
    got_name = re.search(r"^Name:\s*(\S+)", out, re.M)
    driver = re.search(r"^Driver:\s*(\S+)", out, re.M)
    if driver is None:
        return None, None, f"`docker buildx inspect` named no driver: {_first_line(out)}"
    return (got_name.group(1) if got_name else name), driver.group(1), ""


def select(name: str | None = None, *, env: Mapping[str, str] | None = None) -> Builder:
    """The builder this machine builds with (see the module's docstring); `name` (--builder, else IMGBUILD_BUILDER)
    names a buildx builder. `EngineError` when no candidate can build with BuildKit, or when `name` is given and
    no candidate has buildx."""
    env = os.environ if env is None else env
    name = name or env.get(BUILDER_ENV, "").strip() or None
    option = f"--builder {name}" + (" (IMGBUILD_BUILDER)" if env.get(BUILDER_ENV, "").strip() == name else "")
    clis = candidates(env)
    skipped: list[Skipped] = []
    named_cli = bool(env.get(CLI_ENV, "").strip())
    for cli in clis:
        if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
            skipped.append(Skipped(cli, None, "not an executable file"))
            continue
        rc, out = _probe([cli, "--version"], env)
        m = _VERSION_RE.search(out) if rc == 0 else None
        if m is None:
            skipped.append(Skipped(cli, None, f"not a docker CLI (`docker --version`: {_first_line(out)})"))
            continue
        version = m.group(0).split()[-1].rstrip(",")
        major = int(m.group(1))
        rc, out = _probe([cli, "buildx", "version"], env)
        if rc == 0:
            buildx = " ".join(out.split()[1:2]) or _first_line(out)
            got_name, driver, problem = _inspect(cli, name, env)
            if problem:
                what = f"buildx builder {name}" if name else "its current buildx builder"
                skipped.append(Skipped(cli, version, f"buildx {buildx}: {what} does not answer: {problem}"))
                continue
            why = (
                "the CLI has the buildx plugin; "
                + (f"{option} names the builder" if name else "its current builder")
                + f", driver {driver}"
                + (": no registry cache export (inline cache instead)" if driver == "docker" else
                   ": registry cache export; images are loaded into the engine (--load)")
            )  # fmt: skip
            return Builder("buildx", cli, version, got_name, driver, buildx, why, tuple(skipped))
        no_buildx = f"no buildx plugin (`docker buildx version`: {_first_line(out)})"
        if name:
            skipped.append(Skipped(cli, version, f"{no_buildx}; {option} needs buildx"))
            continue
        if major < BUILDX_MIN_CLASSIC:
            why = (
                "no buildx plugin, and a docker CLI before 23.0 builds with its own BuildKit client; no registry "
                "cache export (inline cache instead)"
            )
            return Builder("buildkit", cli, version, why=why, skipped=tuple(skipped))
        skipped.append(
            Skipped(cli, version, f"{no_buildx}; from docker CLI 23.0 on, `docker build` needs buildx for BuildKit")
        )
    tried = (
        "; ".join(f"{s.cli}" + (f" ({s.version})" if s.version else "") + f": {s.reason}" for s in skipped) or "nothing"
    )
    where = f"{CLI_ENV}={env.get(CLI_ENV)}" if named_cli else "PATH and /usr/bin/docker"
    if not clis:
        raise NoBuilder(f"no docker CLI found ({where}): imgbuild builds through one", hint=INSTALL_HINT)
    if name:
        raise NoBuilder(
            f"{option} names a buildx builder, and no docker CLI here has buildx (tried {tried})",
            hint="install the buildx plugin (Docker's docker-buildx-plugin package, or the docker-buildx binary in "
            "~/.docker/cli-plugins/), or leave --builder / IMGBUILD_BUILDER out to build on the engine's BuildKit",
            skipped=skipped,
        )
    raise NoBuilder(f"no docker CLI here can build with BuildKit (tried {tried})", hint=INSTALL_HINT, skipped=skipped)


# --------------------------------------------------------------------------------------------------------
# the cache between machines


@dataclass(frozen=True)
class Cache:
    """What `--cache-from` / `--cache-to` become for one builder: `mode` "registry" (buildx exports and imports a
    registry cache), "inline" (the image carries its cache; --cache-to pushes it as `push_ref`) or "none"."""

    mode: Literal["none", "inline", "registry"]
    args: tuple[str, ...] = ()
    push_ref: str | None = None

    def describe(self) -> str:
        if self.mode == "registry":
            return "registry cache (buildx: type=registry, mode=max)"
        if self.mode == "inline":
            return "inline cache (cache metadata in the image" + (
                f"; pushed as {self.push_ref})" if self.push_ref else ")"
            )
        return "no cache between machines"


def cache_ref_problem(value: str, option: str) -> str | None:
    """Why `value` is no --cache-from / --cache-to reference (Docker's grammar; --cache-to takes a tag, no digest);
    None when it is one."""
    from imgbuild.core import validate

    try:
        validate.image_ref(value)
    except ValueError as exc:
        return str(exc)
    if option == "--cache-to" and "@" in value:
        return f"a cache is written under a tag, not a digest: {validate.shown(value)}"
    return None


def check_cache_ref(value: str, option: str) -> str:
    """`value` when it is a --cache-from / --cache-to reference (`cache_ref_problem`); `UsageError` (exit 2) naming
    the option otherwise."""
    problem = cache_ref_problem(value, option)
    if problem:
        raise UsageError(f"{option}: {problem}")
    return value


def cache_plan(builder: Builder, cache_from: Sequence[str] = (), cache_to: str | None = None) -> Cache:
    """The builder's options for the cache refs (checked with `check_cache_ref`)."""
    for ref in cache_from:
        check_cache_ref(ref, "--cache-from")
    if cache_to:
        check_cache_ref(cache_to, "--cache-to")
    if not cache_from and not cache_to:
        return Cache("none")
    args: list[str] = []
    if builder.registry_cache:
        for ref in cache_from:
            args += ["--cache-from", f"type=registry,ref={ref}"]
        if cache_to:
            # image-manifest: ECR takes a cache only as an image manifest (buildkit 0.12+)
            args += ["--cache-to", f"type=registry,ref={cache_to},mode=max,image-manifest=true,oci-mediatypes=true"]
        return Cache("registry", tuple(args))
    for ref in cache_from:
        args += ["--cache-from", ref]
    if cache_to:
        args += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    return Cache("inline", tuple(args), cache_to or None)


def push_inline_cache(client: docker.DockerClient, image_id: str, ref: str, *, progress: Any | None = None) -> str:
    """Push the built image (built with BUILDKIT_INLINE_CACHE=1) as `ref` through `publish.Publisher`: retries,
    `docker login` credentials, ECR's (an ECR host). The local tag `ref` is there only during the push (a tag
    already there is put back): a failed push leaves no half-pushed tag here. Returns the pushed digest; `PushError`
    when the push fails."""
    import docker.utils

    from imgbuild import publish
    from imgbuild.publish import ecr, registry

    repo, tag = docker.utils.parse_repository_tag(ref)
    host = repo.split("/")[0] if registry.strip_domain(repo) != repo else "docker.io"
    ecr_registry = ecr.EcrRegistry(host) if ecr.parse_host(host) else None
    publisher = publish.Publisher(
        client, registry.Destination(host), ecr=ecr_registry, immutable=False, progress=progress
    )
    target = f"{repo}:{tag or 'latest'}"
    try:
        pushed = publisher.push_ref(publish.Source(image_id, (target,)), target)
    finally:
        publisher.progress.close()
    return pushed.digest


# --------------------------------------------------------------------------------------------------------
# the command line


def command(
    builder: Builder,
    context_dir: Path,
    *,
    tags: Sequence[str],
    labels: Mapping[str, str],
    build_args: Mapping[str, str],
    nocache: bool,
    pull: bool,
    secrets: Mapping[str, Path],
    cache: Cache,
    iidfile: Path,
    metadata_file: Path | None,
    network: str | None = None,
    platform: str | None = None,
) -> list[str]:
    """The CLI's argument list for one build (no shell: values are never interpreted). `network`: the RUN steps'
    network mode ("none": an offline build); `platform`: the image's OS/architecture (`linux/arm64`: BuildKit runs
    its steps under QEMU on an x86 machine; None: the engine's own)."""
    argv = [builder.cli, *(["buildx", "build"] if builder.kind == "buildx" else ["build"])]
    if builder.kind == "buildx" and builder.name:
        argv += ["--builder", builder.name]
    argv += ["--progress=plain", "--iidfile", str(iidfile)]
    if builder.kind == "buildx" and metadata_file is not None:
        argv += ["--metadata-file", str(metadata_file)]
    if builder.kind == "buildx" and not builder.engine_store:
        argv.append("--load")
    for tag in tags:
        argv += ["-t", tag]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    if nocache:
        argv.append("--no-cache")
    if pull:
        argv.append("--pull")
    if network:
        argv += ["--network", network]
    if platform:
        argv += ["--platform", platform]
    for ident, src in secrets.items():
        argv += ["--secret", f"id={ident},src={src}"]
    argv += list(cache.args)
    argv += ["-f", str(context_dir / "Dockerfile"), str(context_dir)]
    return argv


def cli_env(builder: Builder, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The CLI's environment: ours (DOCKER_HOST, DOCKER_CONTEXT, DOCKER_CONFIG ... pass through), with BuildKit on
    for kind buildkit."""
    out = dict(os.environ if env is None else env)
    if builder.kind == "buildkit":
        out["DOCKER_BUILDKIT"] = "1"
    return out


# --------------------------------------------------------------------------------------------------------
# the plain progress stream


class BuildObserver(Protocol):
    """What a build reports as it runs (`ui.progress.BuildProgress`, or a test's own): the vertices of BuildKit's
    graph as they start, print, change status and end, the build's start and its end, and lines of its own. A
    context manager: leaving it stops any live display, whatever happened."""

    def start(self, title: str) -> None: ...
    def vertex_started(self, vid: str, name: str) -> None: ...
    def vertex_output(self, vid: str, line: str) -> None: ...
    def vertex_status(self, vid: str, text: str) -> None: ...
    def vertex_done(self, vid: str, name: str, state: str, seconds: float) -> None: ...
    def finish(self, ok: bool, summary: str) -> None: ...
    def say(self, text: str) -> None: ...
    def push_observer(self) -> PushObserver: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> None: ...


_VERTEX_RE = re.compile(r"^#(\d+) (.*)$")
_OUTPUT_RE = re.compile(r"^(\d+\.\d+)(?: (.*))?$")
_DONE_RE = re.compile(r"^DONE (\d+(?:\.\d+)?)s$")
_ERROR_RE = re.compile(r"^ERROR:? ?(.*)$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_STEP_RE = re.compile(r"^\[(?:(?P<stage>[^\]]*?) )?(?P<index>\d+)/(?P<total>\d+)\] (?P<instruction>.*)$", re.S)
_METADATA_RE = re.compile(r"^\[(?:[^\]]*)\] load metadata for (\S+)$|^load metadata for (\S+)$")


@dataclass
class Vertex:
    """One node of BuildKit's graph as the plain stream shows it: a Dockerfile step (`[stage i/N] RUN ...`) or the
    builder's own work (`[internal] load build context`, `exporting to image`)."""

    id: str
    name: str
    started: float = field(default_factory=time.monotonic)
    state: Literal["running", "done", "cached", "error", "canceled"] = "running"
    seconds: float | None = None
    error: str = ""
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))

    @property
    def step(self) -> re.Match[str] | None:
        return _STEP_RE.match(self.name)

    @property
    def instruction(self) -> str:
        m = self.step
        return m.group("instruction") if m else self.name

    @property
    def is_from(self) -> bool:
        return self.instruction.split(" ", 1)[0].upper() == "FROM"

    @property
    def elapsed(self) -> float:
        return self.seconds if self.seconds is not None else time.monotonic() - self.started


@dataclass(frozen=True)
class StepRecord:
    """A finished Dockerfile step: BuildKit's name for it (`[runtime 5/12] RUN ...`), its seconds, whether cached."""

    name: str
    seconds: float
    cached: bool


@dataclass(frozen=True)
class BuildOutcome:
    image_id: str
    tags: tuple[str, ...]
    log_path: Path
    steps_total: int  # Dockerfile steps BuildKit ran or took from its cache (ENV, LABEL ... are no steps there)
    steps_run: int  # steps that did work: neither FROM nor cached
    steps_cached: int
    duration_s: float
    steps: tuple[StepRecord, ...] = ()
    digest: str | None = None  # the image manifest's digest, where the builder wrote a metadata file (buildx)
    builder: str = ""
    cache: str = ""


class _Stream:
    """What BuildKit's plain output has told so far; feeds the log and the progress display."""

    def __init__(self, log: TextIO, progress: BuildObserver | None) -> None:
        self.log = log
        self.progress = progress
        self.vertices: dict[str, Vertex] = {}
        self.trailer: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)

    def line(self, raw: str) -> None:
        self.log.write(raw + "\n")
        self.log.flush()
        m = _VERTEX_RE.match(raw)
        if m is None:
            text = clean(raw)
            if text.strip() and text.strip() != "------":
                self.trailer.append(text)
            return
        vid, rest = m.group(1), m.group(2)
        vertex = self.vertices.get(vid)
        if vertex is None:
            vertex = self.vertices[vid] = Vertex(vid, clean(rest))
            if self.progress:
                self.progress.vertex_started(vid, vertex.name)
            return
        if clean(rest) == vertex.name or _DIGEST_RE.match(rest):
            return  # the header again (vertices interleave) or 20.10's digest line
        if out := _OUTPUT_RE.match(rest):
            output = out.group(2) or ""
            if clean(output).strip():
                vertex.tail.append(clean(output))
            if self.progress:
                self.progress.vertex_output(vid, output)
            return
        if done := _DONE_RE.match(rest):
            self._end(vertex, "done", float(done.group(1)))
        elif rest == "CACHED":
            self._end(vertex, "cached", 0.0)
        elif rest in ("CANCELED", "CANCELLED"):
            self._end(vertex, "canceled", None)
        elif err := _ERROR_RE.match(rest):
            vertex.error = clean(err.group(1)).strip()
            self._end(vertex, "error", None)
        elif self.progress:  # the builder's own status ("exporting layers 3.1s done", "transferring context")
            self.progress.vertex_status(vid, rest)

    def _end(self, vertex: Vertex, state: Literal["done", "cached", "error", "canceled"], secs: float | None) -> None:
        vertex.state = state
        vertex.seconds = secs if secs is not None else time.monotonic() - vertex.started
        if self.progress:
            self.progress.vertex_done(vertex.id, vertex.name, state, vertex.seconds)

    def steps(self) -> list[Vertex]:
        return [v for v in self.vertices.values() if v.step and v.state in ("done", "cached")]

    def failed(self) -> Vertex | None:
        return next((v for v in self.vertices.values() if v.state == "error"), None)

    def running(self) -> list[Vertex]:
        return [v for v in self.vertices.values() if v.state == "running"]


# --------------------------------------------------------------------------------------------------------
# the build


def build(
    builder: Builder,
    client: docker.DockerClient,
    context_dir: Path,
    *,
    tags: Sequence[str],
    labels: Mapping[str, str] | None = None,
    build_args: Mapping[str, str] | None = None,
    nocache: bool = False,
    pull: bool = False,
    secrets: Mapping[str, Path] | None = None,
    cache: Cache | None = None,
    log_path: Path,
    progress: BuildObserver | None = None,
    network: str | None = None,
    platform: str | None = None,
) -> BuildOutcome:
    """Build `context_dir/Dockerfile` with `builder`, tagged with every tag; the full output goes to the log
    (`engine.create_log`: a new file, never one already at log_path). `platform` (`linux/arm64`): the architecture
    to build for; the image the engine then holds must record it, else its tags are put back and it is a
    BuildError.

    Raises `BuildError` naming the failed step with its error and last output lines, `BaseImageMissing` when a
    base image cannot be had, `EngineError` when the CLI cannot be run or the engine fails, and `Interrupted` on
    Ctrl-C / SIGTERM, after cancelling the build and putting back every tag it moved."""
    if not tags:
        raise BuildError("a build needs at least one tag")
    context_dir = Path(context_dir)
    if not (context_dir / "Dockerfile").is_file():
        raise BuildError(f"no Dockerfile in the build context {context_dir}")
    cache = cache or Cache("none")
    log, log_path = create_log(Path(log_path))
    work = Path(tempfile.mkdtemp(prefix="imgbuild-build-"))
    try:
        with log:
            run = _Run(builder, client, log, log_path, progress, list(tags), platform)
            argv = command(
                builder, context_dir, tags=tags, labels=labels or {}, build_args=build_args or {}, nocache=nocache,
                pull=pull, secrets=secrets or {}, cache=cache, iidfile=work / "iid",
                metadata_file=work / "metadata.json", network=network, platform=platform,
            )  # fmt: skip
            return run.run(argv, work, cache)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Run:
    """One CLI process building one image."""

    def __init__(
        self,
        builder: Builder,
        client: docker.DockerClient,
        log: TextIO,
        log_path: Path,
        progress: BuildObserver | None,
        tags: list[str],
        platform: str | None = None,
    ) -> None:
        self.builder, self.client, self.log, self.log_path, self.progress = builder, client, log, log_path, progress
        self.tags = tags
        self.platform = platform
        self.stream = _Stream(log, progress)
        self.before = {tag: _image_id(client, tag) for tag in tags}

    def run(self, argv: list[str], work: Path, cache: Cache) -> BuildOutcome:
        t0 = time.monotonic()
        with contextlib.ExitStack() as stack:
            if self.progress is not None:
                stack.enter_context(self.progress)  # stops a live display whatever happens
                self.progress.start(self.tags[0])
            self.log.write(f"# imgbuild: {self.builder.describe()}\n# imgbuild: {cache.describe()}\n")
            self.log.write(f"# imgbuild: {' '.join(argv)}\n")
            self.log.flush()
            rc = self._process(argv)
            if rc != 0:
                moved = self._restore_tags()
                self._finish(False, f"build of {self.tags[0]} failed")
                raise self._failure(rc, moved)
            return self._outcome(_read(work / "iid"), _digest(work / "metadata.json"), cache, time.monotonic() - t0)

    def _process(self, argv: list[str]) -> int:
        """Run the CLI to its end, following its output; its exit code. Ctrl-C / SIGTERM cancel it (`_cancel`)."""
        try:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=cli_env(self.builder), start_new_session=True, preexec_fn=_cancel_when_orphaned,
            )  # fmt: skip
        except OSError as exc:
            self._finish(False, "build failed: the docker CLI cannot run")
            raise EngineError(f"cannot run the docker CLI {argv[0]}: {exc.strerror or exc}") from exc
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
        reader.start()
        try:
            rc = self._follow(proc, lines)
        except KeyboardInterrupt:
            self._cancel(proc, lines)  # raises Interrupted
            raise
        finally:
            if proc.poll() is None:  # anything else escaping: never leave the CLI building
                _kill(proc)
        reader.join(5)
        return rc

    def _follow(self, proc: subprocess.Popen[bytes], lines: queue.Queue[str | None]) -> int:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                return proc.wait()
            self.stream.line(line)

    def _cancel(self, proc: subprocess.Popen[bytes], lines: queue.Queue[str | None]) -> None:
        self.log.write("\n# imgbuild: interrupted; cancelling the build (SIGINT to the docker CLI)\n")
        self.log.flush()
        if self.progress:  # stops a live display; the steps BuildKit cancels are still shown ("... canceled")
            self.progress.finish(False, "build interrupted; cancelling it ...")
        with sigint_deferred("the build"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGINT)
            deadline = time.monotonic() + CANCEL_WAIT_S
            killed = False
            while True:
                try:
                    line = lines.get(timeout=max(0.05, min(0.5, deadline - time.monotonic())))
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                if line:
                    self.stream.line(line)
                if time.monotonic() >= deadline:
                    _kill(proc)
                    killed = True
                    break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            moved = self._restore_tags()
        how = f"killed after {CANCEL_WAIT_S:.0f}s" if killed else "stopped"
        self.log.write(f"# imgbuild: the docker CLI {how}; tags put back: {', '.join(moved) or 'none'}\n")
        self.log.flush()
        left = [tag for tag in self.tags if _image_id(self.client, tag) != self.before[tag]]
        if left:
            raise Interrupted(f"build cancelled; these tags could not be put back: {', '.join(left)}")
        raise Interrupted(f"build cancelled ({how}); no image tagged, no container left (log: {self.log_path})")

    def _restore_tags(self) -> list[str]:
        """Put every tag back where it was before the build (a failed or cancelled build may have moved one while
        exporting); returns those it moved back."""
        import docker.utils

        moved = []
        for tag in self.tags:
            with contextlib.suppress(*ENGINE_ERRORS, EngineError):
                now, was = _image_id(self.client, tag), self.before[tag]
                if now == was:
                    continue
                if was is None:
                    self.client.api.remove_image(tag)
                else:
                    repo, name = docker.utils.parse_repository_tag(tag)
                    self.client.api.tag(was, repo, tag=name or "latest", force=True)
                moved.append(tag)
        return moved

    def _finish(self, ok: bool, summary: str) -> None:
        if self.progress:
            self.progress.finish(ok, summary)

    def _outcome(self, image_id: str, digest: str | None, cache: Cache, duration: float) -> BuildOutcome:
        record = inspect_image(self.client, image_id) if image_id else None
        if record is not None and self.platform and (got := image_platform(record)) != self.platform:
            moved = self._restore_tags()
            self._finish(False, f"build of {self.tags[0]} made a {got} image")
            raise BuildError(
                f"the build of {self.tags[0]} for --platform {self.platform} made an image the engine records as "
                f"{got} ({image_id}); tags put back: {', '.join(moved) or 'none'}\nfull log: {self.log_path}",
                hint="a base image recorded with the wrong architecture does this: `docker image inspect` its "
                "Architecture, and bootstrap it again with `imgbuild base bootstrap NAME --platform PLATFORM`",
            )
        if record is None:
            self._finish(False, f"build of {self.tags[0]} failed")
            raise BuildError(
                f"the build of {self.tags[0]} finished, but the engine has no image "
                f"{image_id or '(the builder wrote no image id)'}"
                + ("" if self.builder.engine_store else " (--load should have put it there)")
                + f"\nfull log: {self.log_path}",
                hint="`imgbuild doctor` shows the builder; a builder must load its images into this engine",
            )
        steps = self.stream.steps()
        records = tuple(StepRecord(v.name, round(v.elapsed, 3), v.state == "cached") for v in steps)
        cached = sum(1 for v in steps if v.state == "cached")
        run = sum(1 for v in steps if v.state == "done" and not v.is_from)
        outcome = BuildOutcome(
            image_id=image_id, tags=tuple(self.tags), log_path=self.log_path, steps_total=len(steps),
            steps_run=run, steps_cached=cached, duration_s=duration, steps=records, digest=digest,
            builder=self.builder.describe(), cache=cache.describe(),
        )  # fmt: skip
        self.log.write(
            f"# imgbuild: built {image_id} in {duration:.1f}s ({run} of {len(steps)} steps run, {cached} cached)\n"
        )
        self.log.flush()
        self._finish(
            True,
            f"built {', '.join(self.tags)} ({image_id.removeprefix('sha256:')[:12]}) in {duration:.1f}s: "
            f"{run} of {len(steps)} steps run, {cached} cached",
        )
        return outcome

    def _failure(self, rc: int, moved: list[str]) -> BuildError:
        stream = self.stream
        vertex = stream.failed()
        trailer = [t for t in stream.trailer if t.strip()]
        summary = trailer[-1] if trailer else f"the docker CLI exited with code {rc}"
        self.log.write(f"# imgbuild: the build failed (docker CLI exit {rc})" + (
            f"; tags put back: {', '.join(moved)}\n" if moved else "\n"))  # fmt: skip
        self.log.flush()
        tag = self.tags[0]
        if vertex is None:
            details = self._details(trailer)
            if not any(v.step for v in stream.vertices.values()):
                return BuildError(f"build of {tag} failed before its first step: {summary}\n{details}")
            return BuildError(f"build of {tag} failed: {summary}\n{details}")
        error = vertex.error or summary
        meta = _METADATA_RE.match(vertex.name)
        if meta or vertex.is_from:
            image = (meta.group(1) or meta.group(2)) if meta else vertex.instruction.split()[-1]
            image = image.removeprefix("docker.io/library/")
            return BaseImageMissing(
                f"base image {image} is not in the engine and could not be pulled: {error}\n({vertex.name})\n"
                f"full log: {self.log_path}",
                hint=BOOTSTRAP_HINT.format(image=image),
            )
        return BuildError(f"build of {tag} failed at {vertex.name}\n{error}\n{self._details(list(vertex.tail))}")

    def _details(self, tail: list[str]) -> str:
        shown = "\n".join(f"  {line}" for line in tail)
        return f"--- last {len(tail)} lines ---\n{shown}\nfull log: {self.log_path}"


def _read_lines(pipe: IO[bytes] | None, lines: queue.Queue[str | None]) -> None:
    """The reader thread: every line of the CLI's output, then None at its end."""
    try:
        if pipe is not None:
            for raw in iter(pipe.readline, b""):
                lines.put(raw.decode("utf-8", errors="replace").rstrip("\n").rstrip("\r"))
    except (OSError, ValueError):
        pass
    finally:
        lines.put(None)


def _cancel_when_orphaned() -> None:
    """In the CLI's process, before it starts (Linux): SIGINT when imgbuild dies without cancelling it (SIGKILL, a
    crash), so that BuildKit cancels the build instead of finishing it for nobody."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGINT), 0, 0, 0)  # PR_SET_PDEATHSIG


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def image_platform(record: Mapping[str, Any]) -> str:
    """The OS/architecture the engine records for an image (`docker image inspect`'s Os and Architecture)."""
    return f"{record.get('Os') or 'linux'}/{record.get('Architecture') or 'unknown'}"


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    found = inspect_image(client, ref)
    return str(found["Id"]) if found else None


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text().strip()
    return ""


def _digest(path: Path) -> str | None:
    """`containerimage.digest` of buildx's metadata file (absent for kind buildkit)."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("containerimage.digest"), str):
            return str(data["containerimage.digest"])
    return None


@contextlib.contextmanager
def temp_secrets(secrets: Mapping[str, bytes]) -> Iterator[dict[str, Path]]:
    """Each secret's bytes in a file only this user reads, in a temporary folder outside any build context, removed
    afterwards whatever happens: {id: path} for `build(secrets=...)`."""
    from imgbuild.build import dockercontext

    folder = Path(tempfile.mkdtemp(prefix="imgbuild-secrets-"))
    try:
        yield {ident: dockercontext.write_secret(data, folder, f"{ident}.pem") for ident, data in secrets.items()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
