"""The thin edge that talks to the Docker engine: connect, look up and check images, build one image.

Everything here speaks the classic (non-BuildKit) build API through docker-py's low-level client, so the
JSON stream is parsed by hand: ``stream`` records carry the log ("Step 3/12 : RUN ..."), the ``aux``
record carries the image id, and ``error``/``errorDetail`` records mean the build failed even though the
HTTP request itself succeeded.

Docker failures never escape as raw tracebacks: they become `EngineError` (engine unreachable or refused
a request), `BuildError` (the build failed), `BaseImageMissing` or `Interrupted` (Ctrl-C). `engine_error` is
the one translator from a docker-py / requests failure to an `EngineError`, for this module and every other
that calls the engine; `inspect_image` is the one image lookup ("no such image" is None, not an error).

One module of about 600 lines: a build's stream parsing, its failure report and the sweep of the containers a
cancelled build leaves are one conversation with the build API, sharing one private `_StreamState`.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import docker
import docker.errors
import requests
import requests.exceptions

from imgbuild.errors import BaseImageMissing, BuildError, EngineError, Interrupted
from imgbuild.interrupts import sigint_deferred
from imgbuild.progress import BuildProgress, clean, truncate

__all__ = [
    "ENGINE_ERRORS",
    "BuildOutcome",
    "build_image",
    "connect",
    "create_log",
    "engine_error",
    "ensure_base_images",
    "inspect_image",
    "reason",
]

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
SETUP_HINT = (
    "install and start a Docker engine on this machine (e.g. `sudo systemctl start docker`), or set DOCKER_HOST to "
    "one that answers (ssh://USER@HOST, tcp://HOST:2376 with DOCKER_TLS_VERIFY=1); `imgbuild doctor` shows what "
    "is missing (from a checkout of imgbuild, `scripts/setup.sh` installs and starts one)"
)
BOOTSTRAP_HINT = "imgbuild base bootstrap {image}  (builds it from a Debian/Ubuntu archive)"

LOG_TAIL_LINES = 30
LOG_NAME_TRIES = 100  # <recipe>-<second>.log, then -2 ... -100: builds of one recipe started in one second
CLEANUP_POLL_S = 10.0

_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING_IN_RE = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})\s*$")
_LAYER_ID_RE = re.compile(r"^ ---> ([0-9a-f]{12,64})\s*$")
_USING_CACHE = " ---> Using cache"

# What a call to the engine raises: docker-py's errors (APIError when the engine answered with an error) and
# requests' when the connection to the engine fails or breaks (the socket went away, a timeout).
ENGINE_ERRORS: tuple[type[BaseException], ...] = (docker.errors.DockerException, requests.exceptions.RequestException)
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*ENGINE_ERRORS, OSError)  # docker.from_env reads cert files


# --------------------------------------------------------------------------------------------------------
# connect


def _engine_host() -> str:
    host = os.environ.get("DOCKER_HOST")
    return f"DOCKER_HOST={host}" if host else f"the default socket {DEFAULT_SOCKET} (DOCKER_HOST is unset)"


# How docker-py says DOCKER_HOST is no address it can use (docker.utils.parse_host, and urllib3 parsing the URL made
# of it); urllib's own ValueError ("Port could not be cast to integer value", "Invalid IPv6 URL") comes unwrapped.
_MALFORMED_HOST = (
    "Invalid bind address",
    "Failed to parse:",
    "protocol is not implemented",
    "only supported on Windows",
)
DOCKER_HOST_FORMS = "unix:///PATH/docker.sock, tcp://HOST:PORT (PORT 1-65535, an IPv6 HOST in [ ]) or ssh://[USER@]HOST"


def connect() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, pinged once.

    A DOCKER_HOST that is no engine address (`tcp://:abc`, a port out of range, an unknown scheme) is an
    `EngineError` naming the variable and the forms it takes; an engine that does not answer, one with the
    setup hint."""
    host = os.environ.get("DOCKER_HOST")
    try:
        client = docker.from_env()
        client.ping()
    except ValueError as exc:  # urllib parsing DOCKER_HOST; without DOCKER_HOST it is no address problem: a bug
        if not host:
            raise
        raise _malformed_host(host, exc) from exc
    except _CONNECT_ERRORS as exc:
        if host and any(marker in str(exc) for marker in _MALFORMED_HOST):
            raise _malformed_host(host, exc) from exc
        raise EngineError(
            f"cannot reach the Docker engine at {_engine_host()}: {reason(exc)}", hint=SETUP_HINT
        ) from exc
    return client


def _malformed_host(host: str, exc: BaseException) -> EngineError:
    return EngineError(
        f"DOCKER_HOST={truncate(repr(host), 200)} is not the address of a Docker engine ({reason(exc)}); "
        f"expected {DOCKER_HOST_FORMS}",
        hint="fix or unset DOCKER_HOST (unset: the local engine at " + DEFAULT_SOCKET + ")",
    )


def engine_error(exc: BaseException, doing: str, *, note: str = "") -> EngineError:
    """The `EngineError` for an engine call that failed while `doing` ("looking up image x", "pushing y").

    The engine answered with an error: "the Docker engine failed while <doing>: <its explanation>". The
    connection failed or broke: "lost the Docker engine at <DOCKER_HOST> while <doing>: <errno text>", with the
    setup hint. `note` goes on a line of its own after the message (where the full log is, say).
    """
    if isinstance(exc, docker.errors.APIError):
        message, hint = f"the Docker engine failed while {doing}: {reason(exc)}", None
    else:
        message, hint = f"lost the Docker engine at {_engine_host()} while {doing}: {reason(exc)}", SETUP_HINT
    return EngineError(f"{message}\n{note}" if note else message, hint=hint)


def reason(exc: BaseException) -> str:
    """A failure of docker-py or requests in one line: the engine's explanation, or the innermost errno text."""
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
    return truncate(text, 400)


# --------------------------------------------------------------------------------------------------------
# images


def inspect_image(client: docker.DockerClient, ref: str) -> dict[str, Any] | None:
    """`docker image inspect REF`: the engine's record of the image (Id, RepoTags, RepoDigests, Config...).

    None when the engine has no such image (404), or when REF is not a valid reference (400: it names no
    image). Any other failure is an `EngineError` (`engine_error`).
    """
    try:
        return dict(client.api.inspect_image(ref))
    except docker.errors.NotFound:
        return None
    except docker.errors.APIError as exc:
        if exc.status_code == 400:
            return None
        raise engine_error(exc, f"looking up image {ref}") from exc
    except ENGINE_ERRORS as exc:
        raise engine_error(exc, f"looking up image {ref}") from exc


def ensure_base_images(client: docker.DockerClient, images: list[str], *, pull: bool) -> None:
    """Make sure every image is in the engine, pulling it when allowed.

    Raises `BaseImageMissing` for the first one that is absent and cannot be pulled, `EngineError` when
    the engine itself fails.
    """
    for image in images:
        if image.lower() == "scratch":
            continue
        if inspect_image(client, image) is not None:
            continue
        why: str | None = "pulling is disabled"
        if pull:
            why = _try_pull(client, image)
            if why is None and inspect_image(client, image) is not None:
                continue
            why = why or "the pull finished but the image is still not in the engine"
        raise BaseImageMissing(
            f"base image {image} is not in the engine and could not be pulled: {why}",
            hint=BOOTSTRAP_HINT.format(image=image),
        )


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
    except ENGINE_ERRORS as exc:
        return reason(exc)
    return None


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

    def __init__(self, log: TextIO, progress: BuildProgress | None) -> None:
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
            self.tail.append(clean(line))
            return
        if line.startswith(_USING_CACHE):
            self.cached.add(self.step_index)
            if self.progress:
                self.progress.cached()
        elif m_run := _RUNNING_IN_RE.match(line):
            self.container_ids.add(m_run.group(1))
        elif m_layer := _LAYER_ID_RE.match(line):
            self.layer_ids.add(m_layer.group(1))
        cleaned = clean(line)
        if cleaned:
            self.tail.append(cleaned)
        if self.progress and not _is_noise(cleaned):
            self.progress.log(line)

    def steps_run(self) -> int:
        froms = sum(1 for instr in self.steps.values() if instr.upper().startswith("FROM"))
        return max(len(self.steps) - froms - len(self.cached), 0)


def _is_noise(line: str) -> bool:
    """Builder bookkeeping lines that add nothing to a human-readable log."""
    return (
        not line.strip()
        or bool(_LAYER_ID_RE.match(line))
        or bool(_RUNNING_IN_RE.match(line))
        or line.startswith("Removing intermediate container")
        or line.startswith(" ---> Removed intermediate container")
    )


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
    progress: BuildProgress | None = None,
) -> BuildOutcome:
    """Build ``context_dir/Dockerfile`` with the classic builder, tag it with every tag, log to log_path.

    Raises `BuildError` naming the failing step with the last log lines, `BaseImageMissing` when the FROM
    step fails, `EngineError` when the engine cannot be talked to, and `Interrupted` on Ctrl-C, after
    closing the build request (which makes the engine cancel the build) and removing every container
    the build left. The log is made by `create_log`: never over a file or link already at log_path (then
    `<name>-2.log` ...); the outcome's log_path says where it went.
    """
    if not tags:
        raise BuildError("build_image needs at least one tag")
    context_dir = Path(context_dir)
    if not (context_dir / "Dockerfile").is_file():
        raise BuildError(f"no Dockerfile in the build context {context_dir}")
    log, log_path = create_log(Path(log_path))
    with log:
        return _build(client, context_dir, tags, labels, buildargs, nocache, pull, log, log_path, progress)


def create_log(path: Path) -> tuple[TextIO, Path]:
    """A new build log at `path`, created exclusively (O_EXCL, O_NOFOLLOW): a file or symlink already there, whether
    another build of the recipe in the same second or a link planted to redirect the log, is never opened; the log
    is then `<name>-2.log`, `-3` ... instead. Returns the open log and its path; `BuildError` naming the path when it
    cannot be made."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, LOG_NAME_TRIES + 1):
            candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                fd = os.open(candidate, flags, 0o644)
            except FileExistsError:
                continue
            return open(fd, "w", encoding="utf-8", errors="replace"), candidate  # the caller closes it
    except OSError as exc:
        raise BuildError(f"cannot create the build log {path}: {exc.strerror or exc}") from exc
    raise BuildError(f"cannot create the build log {path}: it and {LOG_NAME_TRIES - 1} numbered names exist")


def _build(
    client: docker.DockerClient,
    context_dir: Path,
    tags: list[str],
    labels: dict[str, str],
    buildargs: dict[str, str],
    nocache: bool,
    pull: bool,
    log: TextIO,
    log_path: Path,
    progress: BuildProgress | None,
) -> BuildOutcome:
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
            state.error = reason(exc)
            log.write(f"ERROR: {state.error}\n")
        except ENGINE_ERRORS as exc:
            state.flush()
            log.write(f"ERROR: lost the engine: {reason(exc)}\n")
            if progress:
                progress.finish(False, "build failed: lost the Docker engine")
            raise engine_error(exc, f"building {tags[0]}", note=f"full log: {log_path}") from exc
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
            except ENGINE_ERRORS as exc:
                if progress:
                    progress.finish(False, f"built {image_id[:19]} but could not tag it {extra}")
                raise engine_error(exc, f"tagging the new image {image_id} as {extra}") from exc
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
    except ENGINE_ERRORS as exc:
        raise engine_error(exc, "listing containers") from exc


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
        except ENGINE_ERRORS:
            left = []
        for cid in left:
            with contextlib.suppress(*ENGINE_ERRORS):
                client.api.remove_container(cid, force=True, v=True)
        now = time.monotonic()
        if left:
            last_seen = now
        elif now - last_seen >= quiet_s:
            return []
        if now >= deadline:
            try:
                return _build_containers(client, before, engine_start, state)
            except ENGINE_ERRORS:
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
