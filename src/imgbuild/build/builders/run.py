"""The build: `build` runs the docker CLI (`process.CliProcess`) with the command line `argv.command` gives, in a
session of its own with `--progress=plain`; its plain stream (`stream.Stream`) goes to the build log and a
`BuildObserver`; it returns a `BuildOutcome` with per-step records. The image id comes from `--iidfile`, the digest
from buildx's `--metadata-file`. Ctrl-C and SIGTERM (`interrupts.terminable`) cancel the build (SIGINT to the CLI,
waited for, then killed) and any tag the build moved is put back (`tags.TagSnapshot`). BuildKit runs steps in its
own executor, never as engine containers, so no container is left to sweep.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from imgbuild.build.builders.argv import cli_env, command
from imgbuild.build.builders.cacheplan import Cache
from imgbuild.build.builders.choice import Builder
from imgbuild.build.builders.process import CANCEL_WAIT_S, CliProcess
from imgbuild.build.builders.stream import METADATA_RE, BuildObserver, Stream
from imgbuild.build.builders.tags import TagSnapshot
from imgbuild.core.errors import BaseImageMissing, BuildError, EngineError, Interrupted
from imgbuild.core.interrupts import sigint_deferred
from imgbuild.engine.client import BOOTSTRAP_HINT, create_log, inspect_image

if TYPE_CHECKING:
    import docker

__all__ = ["BuildOutcome", "StepRecord", "build", "image_platform"]


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
        self.stream = Stream(log, progress)
        self.held = TagSnapshot(client, tags)

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
                moved = self.held.restore()
                self._finish(False, f"build of {self.tags[0]} failed")
                raise self._failure(rc, moved)
            return self._outcome(_read(work / "iid"), _digest(work / "metadata.json"), cache, time.monotonic() - t0)

    def _process(self, argv: list[str]) -> int:
        """Run the CLI to its end, following its output; its exit code. Ctrl-C / SIGTERM cancel it (`_cancel`)."""
        cli = CliProcess(argv, cli_env(self.builder), self.stream.line)
        try:
            cli.start()
        except OSError as exc:
            self._finish(False, "build failed: the docker CLI cannot run")
            raise EngineError(f"cannot run the docker CLI {argv[0]}: {exc.strerror or exc}") from exc
        try:
            return cli.follow()
        except KeyboardInterrupt:
            self._cancel(cli)  # raises Interrupted
            raise
        finally:
            cli.kill_if_running()  # anything else escaping: never leave the CLI building

    def _cancel(self, cli: CliProcess) -> None:
        self.log.write("\n# imgbuild: interrupted; cancelling the build (SIGINT to the docker CLI)\n")
        self.log.flush()
        if self.progress:  # stops a live display; the steps BuildKit cancels are still shown ("... canceled")
            self.progress.finish(False, "build interrupted; cancelling it ...")
        with sigint_deferred("the build"):
            killed = cli.cancel(CANCEL_WAIT_S)
            moved = self.held.restore()
        how = f"killed after {CANCEL_WAIT_S:.0f}s" if killed else "stopped"
        self.log.write(f"# imgbuild: the docker CLI {how}; tags put back: {', '.join(moved) or 'none'}\n")
        self.log.flush()
        left = self.held.not_restored()
        if left:
            raise Interrupted(f"build cancelled; these tags could not be put back: {', '.join(left)}")
        raise Interrupted(f"build cancelled ({how}); no image tagged, no container left (log: {self.log_path})")

    def _finish(self, ok: bool, summary: str) -> None:
        if self.progress:
            self.progress.finish(ok, summary)

    def _outcome(self, image_id: str, digest: str | None, cache: Cache, duration: float) -> BuildOutcome:
        record = inspect_image(self.client, image_id) if image_id else None
        if record is not None and self.platform and (got := image_platform(record)) != self.platform:
            moved = self.held.restore()
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
        meta = METADATA_RE.match(vertex.name)
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


def image_platform(record: Mapping[str, Any]) -> str:
    """The OS/architecture the engine records for an image (`docker image inspect`'s Os and Architecture)."""
    return f"{record.get('Os') or 'linux'}/{record.get('Architecture') or 'unknown'}"


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
