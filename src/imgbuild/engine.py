"""The thin edge that talks to the Docker engine: connect, check base images, build one image.

Everything here speaks the classic (non-BuildKit) build API through docker-py's low-level client, so the
JSON stream is parsed by hand: ``stream`` records carry the log ("Step 3/12 : RUN ..."), the ``aux``
record carries the image id, and ``error``/``errorDetail`` records mean the build failed even though the
HTTP request itself succeeded.

Docker failures never escape as raw tracebacks: they become `EngineError` (engine unreachable or refused
a request), `BuildError` (the build failed), `BaseImageMissing` or `Interrupted` (Ctrl-C).
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import os
import re
import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import docker
import docker.errors
import requests
import requests.exceptions
from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from imgbuild.errors import BaseImageMissing, BuildError, EngineError, Interrupted
from imgbuild.interrupts import sigint_deferred

__all__ = [
    "BuildOutcome",
    "Progress",
    "build_image",
    "connect",
    "ensure_base_images",
    "from_images",
]

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
SETUP_HINT = "run `scripts/setup.sh` to install and start an engine, or `imgbuild doctor` to see what is missing"
BOOTSTRAP_HINT = "imgbuild base bootstrap {image}  (builds it from a Debian/Ubuntu archive)"

LOG_TAIL_LINES = 30
CLEANUP_POLL_S = 10.0

_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING_IN_RE = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})\s*$")
_LAYER_ID_RE = re.compile(r"^ ---> ([0-9a-f]{12,64})\s*$")
_USING_CACHE = " ---> Using cache"
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
_CTRL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

# Engine errors raised by docker-py and by requests when the socket goes away.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    requests.exceptions.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.Timeout,
)


# --------------------------------------------------------------------------------------------------------
# connect


def _engine_host() -> str:
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else f"the default socket {DEFAULT_SOCKET} (DOCKER_HOST is unset)"


def connect() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, pinged once."""
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, *_TRANSPORT_ERRORS, OSError) as exc:
        raise EngineError(
            f"cannot reach the Docker engine at {_engine_host()}: {_reason(exc)}", hint=SETUP_HINT
        ) from exc
    return client


def _reason(exc: BaseException) -> str:
    if isinstance(exc, docker.errors.APIError):
        text = exc.explanation or str(exc)
        return str(text).strip()
    text = str(exc).strip() or type(exc).__name__
    # requests/urllib3 nest reprs several levels deep; keep the innermost, most specific part.
    m = re.search(r"\[Errno \d+\] [^'\"()]+", text)
    if m:
        return m.group(0).strip()
    m = re.search(r"(\w+Error)\((\d+), '([^']+)'\)", text)
    if m:
        return f"{m.group(1)}: [Errno {m.group(2)}] {m.group(3)}"
    return _truncate(text, 400)


# --------------------------------------------------------------------------------------------------------
# base images


def from_images(dockerfile_text: str) -> list[str]:
    """The external images a Dockerfile's FROM lines name, in order, without duplicates.

    Skips ``scratch`` and references to earlier stages (``FROM builder``). Global ``ARG NAME=default``
    lines before the first FROM are substituted (``$NAME`` / ``${NAME}``); an image that still holds a
    variable afterwards cannot be checked and is left out.
    """
    images: list[str] = []
    stages: set[str] = set()
    global_args: dict[str, str] = {}
    seen_from = False
    for line in _logical_lines(dockerfile_text):
        words = line.split()
        if not words:
            continue
        keyword = words[0].upper()
        if keyword == "ARG" and not seen_from:
            for item in words[1:]:
                name, eq, value = item.partition("=")
                if eq:
                    global_args[name] = _unquote(value)
            continue
        if keyword != "FROM":
            continue
        seen_from = True
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            continue
        image = _substitute(args[0], global_args)
        stage = args[2].lower() if len(args) >= 3 and args[1].upper() == "AS" else None
        external = image.lower() not in stages and image.lower() != "scratch" and "$" not in image
        if external and image not in images:
            images.append(image)
        if stage:
            stages.add(stage)
    return images


def _logical_lines(text: str) -> Iterator[str]:
    """Dockerfile lines with comments dropped and backslash continuations joined."""
    buf = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        if buf.strip():
            yield buf.strip()
        buf = ""
    if buf.strip():
        yield buf.strip()


def _unquote(value: str) -> str:
    try:
        parts = shlex.split(value)
    except ValueError:
        return value
    return parts[0] if len(parts) == 1 else value


def _substitute(word: str, env: dict[str, str]) -> str:
    """Expand ``$NAME``, ``${NAME}`` and ``${NAME:-default}`` from env; unknown names stay as written."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        return m.group(2) if m.group(2) is not None else m.group(0)

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", repl, word)


def ensure_base_images(client: docker.DockerClient, images: list[str], *, pull: bool) -> None:
    """Make sure every image is in the engine, pulling it when allowed.

    Raises `BaseImageMissing` for the first one that is absent and cannot be pulled, `EngineError` when
    the engine itself fails.
    """
    for image in images:
        if image.lower() == "scratch":
            continue
        if _image_present(client, image):
            continue
        reason: str | None = "pulling is disabled"
        if pull:
            reason = _try_pull(client, image)
            if reason is None and _image_present(client, image):
                continue
            reason = reason or "the pull finished but the image is still not in the engine"
        raise BaseImageMissing(
            f"base image {image} is not in the engine and could not be pulled: {reason}",
            hint=BOOTSTRAP_HINT.format(image=image),
        )


def _image_present(client: docker.DockerClient, image: str) -> bool:
    try:
        client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.NotFound:
        return False
    except docker.errors.APIError as exc:
        if exc.status_code == 400:  # invalid reference format
            raise BaseImageMissing(
                f"base image {image} is not a valid image reference: {_reason(exc)}",
                hint=BOOTSTRAP_HINT.format(image=image),
            ) from exc
        raise EngineError(f"the engine failed to look up image {image}: {_reason(exc)}") from exc
    except (*_TRANSPORT_ERRORS, docker.errors.DockerException) as exc:
        raise EngineError(
            f"lost the Docker engine at {_engine_host()} while looking up {image}: {_reason(exc)}",
            hint=SETUP_HINT,
        ) from exc
    return True


def _try_pull(client: docker.DockerClient, image: str) -> str | None:
    """Pull one image; None on success, else the reason it failed."""
    repo, tag = docker.utils.parse_repository_tag(image)
    if tag is None:
        tag = "latest"
    try:
        for record in client.api.pull(repo, tag=tag, stream=True, decode=True):
            if isinstance(record, dict) and ("error" in record or "errorDetail" in record):
                detail = record.get("errorDetail") or {}
                return str(detail.get("message") or record.get("error") or "unknown pull error").strip()
    except docker.errors.APIError as exc:
        return _reason(exc)
    except (*_TRANSPORT_ERRORS, docker.errors.DockerException) as exc:
        return _reason(exc)
    return None


# --------------------------------------------------------------------------------------------------------
# progress


def _clean(line: str) -> str:
    """A log line fit for a plain CI log: no escape sequences, no carriage returns, no control bytes."""
    line = _ANSI_RE.sub("", line)
    if "\r" in line:
        parts = [p for p in line.split("\r") if p.strip()]
        line = parts[-1] if parts else ""
    return _CTRL_RE.sub("", line).rstrip()


def _is_noise(line: str) -> bool:
    """Builder bookkeeping lines that add nothing to a human-readable log."""
    return (
        not line.strip()
        or bool(_LAYER_ID_RE.match(line))
        or bool(_RUNNING_IN_RE.match(line))
        or line.startswith("Removing intermediate container")
        or line.startswith(" ---> Removed intermediate container")
    )


@dataclass
class _StepState:
    index: int = 0
    total: int = 0
    instruction: str = ""
    started: float = field(default_factory=time.monotonic)
    cached: bool = False
    latest: str = ""


class Progress:
    """Shows a build as it runs.

    Two renderings: ``live`` (a TTY) keeps one status line updated in place, "step i/N  <instruction>
    <elapsed>s  <latest log line>", and prints one line per finished step; ``plain`` (not a TTY, or CI is
    set) writes one line per step ("[step 3/12] RUN apt-get ...") followed by its log lines indented by
    four spaces, with every escape sequence and control character removed.
    """

    def __init__(self, console: Console | None = None, *, live: bool, stream: TextIO | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = live
        self._stream = stream
        self._step = _StepState()
        self._live: Live | None = None
        self._spinner = Spinner("dots")
        self._title = ""
        self._started = time.monotonic()
        self._lock = threading.Lock()

    @classmethod
    def auto(cls, console: Console | None = None) -> Progress:
        """Live rendering on an interactive terminal, plain lines otherwise or when CI is set."""
        console = console or Console(stderr=True)
        ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
        live = console.is_terminal and not console.is_dumb_terminal and not ci
        return cls(console, live=live)

    # -- stream used by the plain rendering ------------------------------------------------------------
    def _write(self, text: str) -> None:
        out = self._stream if self._stream is not None else self.console.file
        out.write(text + "\n")
        out.flush()

    # -- events ----------------------------------------------------------------------------------------
    def start(self, title: str) -> None:
        self._title = title
        self._started = time.monotonic()
        if self.live:
            self._live = Live(
                console=self.console,
                get_renderable=self._render,
                refresh_per_second=4,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        else:
            self._write(f"building {title}")

    def step(self, index: int, total: int, instruction: str) -> None:
        with self._lock:
            self._finish_step()
            self._step = _StepState(index=index, total=total, instruction=instruction)
        if not self.live:
            self._write(f"[step {index}/{total}] {_clean(instruction)}")

    def log(self, line: str) -> None:
        cleaned = _clean(line)
        if line.startswith(_USING_CACHE):
            self._step.cached = True
        if _is_noise(cleaned):
            return
        if self.live:
            self._step.latest = cleaned
        else:
            self._write(f"    {cleaned.lstrip()}")

    def finish(self, ok: bool, summary: str) -> None:
        with self._lock:
            if ok:
                self._finish_step()
            if self._live is not None:
                self._live.stop()
                self._live = None
            self._step = _StepState()
        if self.live:
            style = "green" if ok else "red"
            self.console.print(Text(summary, style=style), highlight=False)
        else:
            self._write(_clean(summary))

    def _finish_step(self) -> None:
        st = self._step
        if not self.live or st.index == 0:
            return
        how = "cached" if st.cached else f"{time.monotonic() - st.started:.1f}s"
        line = Text(f"  step {st.index}/{st.total}  ", style="dim")
        line.append(_truncate(_clean(st.instruction), 90))
        line.append(f"  ({how})", style="dim")
        if self._live is not None:
            self._live.console.print(line, highlight=False)
        else:
            self.console.print(line, highlight=False)

    def _render(self) -> Group:
        st = self._step
        width = max(self.console.width, 40)
        if st.index == 0:
            text = Text(f"{self._title}  preparing  {time.monotonic() - self._started:.0f}s")
        else:
            text = Text(f"step {st.index}/{st.total}  ", style="bold")
            text.append(_truncate(_clean(st.instruction), min(60, width // 2)))
            text.append(f"  {time.monotonic() - st.started:.0f}s  ", style="cyan")
            rest = width - len(text) - 4
            if st.latest and rest > 10:
                text.append(_truncate(st.latest, rest), style="dim")
        text.no_wrap = True
        text.overflow = "ellipsis"
        self._spinner.text = text
        return Group(self._spinner)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


# --------------------------------------------------------------------------------------------------------
# build


@dataclass(frozen=True)
class BuildOutcome:
    image_id: str
    tags: tuple[str, ...]
    log_path: Path
    steps_total: int
    steps_run: int  # steps that did work: neither FROM nor "Using cache"
    duration_s: float


class _StreamState:
    """What the JSON stream of one build has told us so far."""

    def __init__(self, log: TextIO, progress: Progress | None) -> None:
        self.log = log
        self.progress = progress
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.partial = ""
        self.step_index = 0
        self.steps_total = 0
        self.instruction = ""
        self.steps: dict[int, str] = {}
        self.cached: set[int] = set()
        self.image_id: str | None = None
        self.error: str | None = None
        self.container_ids: set[str] = set()  # " ---> Running in <id>"
        self.layer_ids: set[str] = set()  # " ---> <id>": images builder containers start from

    def record(self, rec: Any) -> None:
        if not isinstance(rec, dict):
            self._text(f"{rec}\n")
            return
        if "stream" in rec:
            self._text(str(rec["stream"]))
        if "aux" in rec and isinstance(rec["aux"], dict) and rec["aux"].get("ID"):
            self.image_id = str(rec["aux"]["ID"])
        if "status" in rec and "progress" not in rec:
            ident = f"{rec['id']}: " if rec.get("id") else ""
            self._text(f"{ident}{rec['status']}\n")
        if "error" in rec or "errorDetail" in rec:
            detail = rec.get("errorDetail") or {}
            message = str(detail.get("message") or rec.get("error") or "unknown build error").strip()
            self.error = message
            self._text(f"ERROR: {message}\n")

    def _text(self, chunk: str) -> None:
        self.log.write(chunk)
        self.log.flush()
        data = self.partial + chunk
        lines = data.split("\n")
        self.partial = lines.pop()
        for line in lines:
            self._line(line)

    def flush(self) -> None:
        if self.partial:
            self.log.write("\n")
            self.log.flush()
            line, self.partial = self.partial, ""
            self._line(line)

    def _line(self, line: str) -> None:
        line = line.rstrip("\r")
        m = _STEP_RE.match(line)
        if m:
            self.step_index, self.steps_total = int(m.group(1)), int(m.group(2))
            self.instruction = m.group(3).strip()
            self.steps[self.step_index] = self.instruction
            if self.progress:
                self.progress.step(self.step_index, self.steps_total, self.instruction)
            self.tail.append(_clean(line))
            return
        if line.startswith(_USING_CACHE):
            self.cached.add(self.step_index)
        elif m_run := _RUNNING_IN_RE.match(line):
            self.container_ids.add(m_run.group(1))
        elif m_layer := _LAYER_ID_RE.match(line):
            self.layer_ids.add(m_layer.group(1))
        cleaned = _clean(line)
        if cleaned:
            self.tail.append(cleaned)
        if self.progress:
            self.progress.log(line)

    def steps_run(self) -> int:
        froms = sum(1 for instr in self.steps.values() if instr.upper().startswith("FROM"))
        return max(len(self.steps) - froms - len(self.cached), 0)


def build_image(
    client: docker.DockerClient,
    context_dir: Path,
    *,
    tags: list[str],
    labels: dict[str, str],
    buildargs: dict[str, str],
    nocache: bool,
    pull: bool,
    log_path: Path,
    progress: Progress | None = None,
) -> BuildOutcome:
    """Build ``context_dir/Dockerfile`` with the classic builder, tag it with every tag, log to log_path.

    Raises `BuildError` naming the failing step with the last log lines, `BaseImageMissing` when the FROM
    step fails, `EngineError` when the engine cannot be talked to, and `Interrupted` on Ctrl-C, after
    closing the build request (which makes the engine cancel the build) and removing every container
    the build left.
    """
    if not tags:
        raise BuildError("build_image needs at least one tag")
    context_dir = Path(context_dir)
    if not (context_dir / "Dockerfile").is_file():
        raise BuildError(f"no Dockerfile in the build context {context_dir}")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    before = _container_ids(client)
    engine_start = _engine_time(client)
    t0 = time.monotonic()

    # Catch the streaming HTTP response of the build so that Ctrl-C can close it: closing the connection
    # is what makes the engine cancel a classic build.
    responses: list[requests.Response] = []
    builder_thread = threading.get_ident()

    def _capture(resp: requests.Response, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() == builder_thread and "/build" in (resp.url or ""):
            responses.append(resp)

    with contextlib.ExitStack() as stack:
        log = stack.enter_context(log_path.open("w", encoding="utf-8", errors="replace"))
        if progress is not None:
            stack.enter_context(progress)  # stops a live display whatever happens
        log.write(f"# imgbuild: building {', '.join(tags)} from {context_dir}\n")
        log.flush()
        state = _StreamState(log, progress)
        if progress:
            progress.start(tags[0])
        ok = False
        try:
            client.api.hooks["response"].append(_capture)
            try:
                stream = client.api.build(
                    path=str(context_dir),
                    dockerfile="Dockerfile",
                    decode=True,
                    rm=True,
                    forcerm=True,
                    tag=tags[0],
                    labels=labels,
                    buildargs=buildargs,
                    nocache=nocache,
                    pull=pull,
                )
            finally:
                with contextlib.suppress(ValueError):
                    client.api.hooks["response"].remove(_capture)
            for rec in stream:
                state.record(rec)
            state.flush()
            ok = state.error is None and state.image_id is not None
        except KeyboardInterrupt:
            state.flush()
            log.write("\n# imgbuild: interrupted (Ctrl-C); cancelling the build\n")
            log.flush()
            if progress:
                progress.finish(False, "build interrupted; cancelling and removing its containers ...")
            left = _cancel(client, responses, before, engine_start, state)
            log.write(f"# imgbuild: containers left behind: {', '.join(left) or 'none'}\n")
            if left:
                raise Interrupted("build cancelled; could not remove these containers: " + ", ".join(left)) from None
            raise Interrupted("build cancelled; no containers left behind") from None
        except docker.errors.APIError as exc:
            state.flush()
            state.error = _reason(exc)
            log.write(f"ERROR: {state.error}\n")
        except (*_TRANSPORT_ERRORS, docker.errors.DockerException) as exc:
            state.flush()
            log.write(f"ERROR: lost the engine: {_reason(exc)}\n")
            if progress:
                progress.finish(False, "build failed: lost the Docker engine")
            raise EngineError(
                f"lost the Docker engine at {_engine_host()} during the build of {tags[0]}: {_reason(exc)}"
                f"\nfull log: {log_path}",
                hint=SETUP_HINT,
            ) from exc
        except OSError as exc:  # reading the build context
            if progress:
                progress.finish(False, "build failed")
            raise BuildError(f"cannot read the build context {context_dir}: {exc}") from exc

        if not ok:
            if progress:
                progress.finish(False, f"build of {tags[0]} failed")
            # forcerm removes the failed step's container; sweep anything a half-dead engine left anyway.
            _sweep(client, before, engine_start, state, deadline=time.monotonic(), quiet_s=0.0)
            raise _failure(state, log_path, tags[0])

        image_id = state.image_id or ""
        for extra in tags[1:]:
            repo, tag = docker.utils.parse_repository_tag(extra)
            try:
                client.api.tag(image_id, repo, tag=tag)
            except (docker.errors.APIError, *_TRANSPORT_ERRORS) as exc:
                if progress:
                    progress.finish(False, f"built {image_id[:19]} but could not tag it {extra}")
                raise EngineError(f"built {image_id} but could not tag it {extra}: {_reason(exc)}") from exc
        duration = time.monotonic() - t0
        outcome = BuildOutcome(
            image_id=image_id,
            tags=tuple(tags),
            log_path=log_path,
            steps_total=state.steps_total,
            steps_run=state.steps_run(),
            duration_s=duration,
        )
        log.write(
            f"# imgbuild: built {image_id} in {duration:.1f}s "
            f"({outcome.steps_run} of {outcome.steps_total} steps run)\n"
        )
        if progress:
            progress.finish(
                True,
                f"built {', '.join(tags)} ({image_id[7:19]}) in {duration:.1f}s, "
                f"{outcome.steps_run}/{outcome.steps_total} steps run",
            )
        return outcome


def _failure(state: _StreamState, log_path: Path, tag: str) -> BuildError:
    error = state.error or "the engine reported no image id and no error"
    tail = "\n".join(f"  {line}" for line in state.tail)
    details = f"--- last {len(state.tail)} log lines ---\n{tail}\nfull log: {log_path}"
    instr_words = state.instruction.split()
    if state.step_index and instr_words and instr_words[0].upper() == "FROM":
        args = [w for w in instr_words[1:] if not w.startswith("--")]
        image = args[0] if args else "?"
        return BaseImageMissing(
            f"base image {image} is not in the engine and could not be pulled: {error}\n"
            f"(Step {state.step_index}/{state.steps_total} : {state.instruction})\n{details}",
            hint=BOOTSTRAP_HINT.format(image=image),
        )
    if not state.step_index:
        return BuildError(f"build of {tag} failed before its first step: {error}\n{details}")
    return BuildError(
        f"build of {tag} failed at Step {state.step_index}/{state.steps_total} : {state.instruction}\n"
        f"{error}\n{details}"
    )


# --------------------------------------------------------------------------------------------------------
# containers a build leaves behind


def _container_ids(client: docker.DockerClient) -> set[str]:
    try:
        return {c["Id"] for c in client.api.containers(all=True)}
    except (docker.errors.APIError, *_TRANSPORT_ERRORS, docker.errors.DockerException) as exc:
        raise EngineError(
            f"cannot list containers on the Docker engine at {_engine_host()}: {_reason(exc)}",
            hint=SETUP_HINT,
        ) from exc


def _engine_time(client: docker.DockerClient) -> float:
    """The engine's clock now (Unix seconds); containers' Created times are on that clock."""
    with contextlib.suppress(Exception):
        raw = str(client.api.info().get("SystemTime", ""))
        m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", raw)
        if m:
            frac = (m.group(2) or "0")[:6].ljust(6, "0")
            tz = "+00:00" if m.group(3) == "Z" else m.group(3)
            return _dt.datetime.fromisoformat(f"{m.group(1)}.{frac}{tz}").timestamp()
    return time.time()


def _build_containers(
    client: docker.DockerClient, before: set[str], engine_start: float, state: _StreamState
) -> list[str]:
    """Containers this build created: new since the build started, not there before, and either named
    in the stream ("Running in <id>") or started from an image the stream named (" ---> <id>")."""
    found = []
    for c in client.api.containers(all=True):
        cid = str(c.get("Id", ""))
        if cid in before or int(c.get("Created", 0)) < int(engine_start) - 1:
            continue
        image_id = str(c.get("ImageID", "")).removeprefix("sha256:")
        named = any(cid.startswith(short) for short in state.container_ids)
        from_ours = any(image_id.startswith(short) for short in state.layer_ids)
        if named or from_ours:
            found.append(cid)
    return found


def _sweep(
    client: docker.DockerClient,
    before: set[str],
    engine_start: float,
    state: _StreamState,
    *,
    deadline: float,
    quiet_s: float = 2.0,
) -> list[str]:
    """Remove this build's containers until none has shown up for quiet_s or the deadline passes.

    Returns the ids still present at the end.
    """
    last_seen = time.monotonic()
    left: list[str] = []
    while True:
        try:
            left = _build_containers(client, before, engine_start, state)
        except (docker.errors.APIError, *_TRANSPORT_ERRORS, docker.errors.DockerException):
            left = []
        for cid in left:
            with contextlib.suppress(docker.errors.APIError, *_TRANSPORT_ERRORS):
                client.api.remove_container(cid, force=True, v=True)
        now = time.monotonic()
        if left:
            last_seen = now
        elif now - last_seen >= quiet_s:
            return []
        if now >= deadline:
            try:
                return _build_containers(client, before, engine_start, state)
            except (docker.errors.APIError, *_TRANSPORT_ERRORS, docker.errors.DockerException):
                return left
        time.sleep(0.25)


def _cancel(
    client: docker.DockerClient,
    responses: list[requests.Response],
    before: set[str],
    engine_start: float,
    state: _StreamState,
) -> list[str]:
    """Close the build's HTTP response (the engine cancels the build) and remove its containers."""
    with sigint_deferred("the build's containers"):
        for resp in responses:
            with contextlib.suppress(Exception):
                conn = getattr(resp.raw, "_connection", None) or getattr(resp.raw, "connection", None)
                resp.close()
                if conn is not None:
                    conn.close()
        return _sweep(client, before, engine_start, state, deadline=time.monotonic() + CLEANUP_POLL_S)
