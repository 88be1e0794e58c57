"""BuildKit's plain progress stream, read: `Stream.line` takes each line the CLI prints with `--progress=plain`
(`#7 [runtime 2/5] RUN ...`, `#7 0.235 <output>`, `#7 CACHED`, `#7 DONE 11.1s`, `#7 ERROR: ...`; vertices of
parallel stages interleave), writes it to the build log, keeps each vertex's state and last lines, and tells a
`BuildObserver` what happened.
"""

from __future__ import annotations

import collections
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TextIO

from imgbuild.core.text import clean

if TYPE_CHECKING:
    from imgbuild.publish.push import PushObserver

__all__ = ["LOG_TAIL_LINES", "METADATA_RE", "BuildObserver", "Stream", "Vertex"]

LOG_TAIL_LINES = 30


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
METADATA_RE = re.compile(r"^\[(?:[^\]]*)\] load metadata for (\S+)$|^load metadata for (\S+)$")


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


class Stream:
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
