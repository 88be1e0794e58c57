"""What a build or a push shows while it runs: one line per event in a CI log, live lines on a terminal.

`BuildProgress` renders a BuildKit build (`builders.build` feeds it the vertices of BuildKit's plain stream: it is
a `builders.BuildObserver`); `PlainPushProgress` and `LivePushProgress` render a push (`publish.Publisher` feeds
them the engine's push records: each is a `publish.PushObserver`). `live_wanted` makes the one choice between the
two renderings for both. Rendering only: nothing here talks to the engine or decides what a record means, and no
floor of the pipeline imports it (the command line hands it down).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TaskID, TextColumn
from rich.spinner import Spinner
from rich.text import Text

from imgbuild.core.text import clean, truncate

__all__ = [
    "BuildProgress",
    "LivePushProgress",
    "PlainPushProgress",
    "live_wanted",
    "push_progress_for",
]


def live_wanted(console: Console) -> bool:
    """Live rendering on an interactive terminal; plain lines when not a TTY, on a dumb one, or when CI is set."""
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    return console.is_terminal and not console.is_dumb_terminal and not ci


# --------------------------------------------------------------------------------------------------------
# a build


@dataclass
class _Running:
    name: str
    started: float = field(default_factory=time.monotonic)
    latest: str = ""


_SHOWN_RUNNING = 6  # vertices of parallel stages shown at once on a terminal; the rest are counted
_NAME_WIDTH = 100  # a step's name in an end line (a RUN command can be a screenful)


def _is_internal(name: str) -> bool:
    """BuildKit's own bookkeeping (`[internal] load build context`, `load metadata for ...`): no start line."""
    return name.startswith("[internal]") or name.startswith("load ") or name.startswith("[auth]")


class BuildProgress:
    """Shows a BuildKit build as it runs (`builders.build` feeds it the vertices of BuildKit's graph: the
    Dockerfile's steps, `[builder 2/3] RUN ...`, and the builder's own work such as `exporting to image`).

    Two renderings. ``live`` (a TTY) keeps the running vertices on screen, several at once where parallel stages
    run, each with its elapsed time and latest output line, and prints a line when one ends: its name and its
    seconds, or "cached". ``plain`` (not a TTY, or CI is set) writes a line when a step starts and one when it
    ends (`[runtime 4/15] RUN ... 12.3s`, `... cached`), the step's output in between indented by four spaces; a
    step whose output resumes after another's is named again. Every escape sequence and control byte is removed.
    """

    def __init__(self, console: Console | None = None, *, live: bool, stream: TextIO | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = live
        self._stream = stream
        self._running: dict[str, _Running] = {}
        self._live: Live | None = None
        self._spinner = Spinner("dots")
        self._title = ""
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._last_writer: str | None = None  # the vertex whose line plain mode wrote last

    @classmethod
    def auto(cls, console: Console | None = None) -> BuildProgress:
        """Live rendering on an interactive terminal, plain lines otherwise or when CI is set."""
        console = console or Console(stderr=True)
        return cls(console, live=live_wanted(console))

    # -- stream used by the plain rendering ------------------------------------------------------------
    def _write(self, text: str) -> None:
        out = self._stream if self._stream is not None else self.console.file
        out.write(text + "\n")
        out.flush()

    # -- what the build says besides its vertices ------------------------------------------------------
    def say(self, text: str) -> None:
        """A line of the build's own (the downloads a --files folder gave, the bases a sources folder loaded)."""
        self.console.print(text)

    def push_observer(self) -> PlainPushProgress | LivePushProgress:
        """How the push of the build's inline cache (--cache-to) is shown: on this console, the same choice."""
        return push_progress_for(self.console)

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

    def vertex_started(self, vid: str, name: str) -> None:
        """BuildKit started a vertex (a step, or its own work)."""
        with self._lock:
            self._running[vid] = _Running(clean(name))
        if not self.live and not _is_internal(name):
            self._write(clean(name))
            self._last_writer = vid

    def vertex_output(self, vid: str, line: str) -> None:
        """One line a step printed."""
        cleaned = clean(line)
        if not cleaned.strip():
            return
        running = self._running.get(vid)
        if self.live:
            if running is not None:
                running.latest = cleaned
            return
        if self._last_writer != vid and running is not None:
            self._write(running.name)  # output of parallel steps interleaves: say whose this is
        self._last_writer = vid
        self._write(f"    {cleaned.lstrip()}")

    def vertex_status(self, vid: str, text: str) -> None:
        """The builder's own status of a vertex ("exporting layers 3.1s done"): shown live, not in plain logs."""
        running = self._running.get(vid)
        if self.live and running is not None:
            running.latest = clean(text)

    def vertex_done(self, vid: str, name: str, state: str, seconds: float) -> None:
        """A vertex ended: "done" (with its seconds), "cached", "error" or "canceled"."""
        with self._lock:
            self._running.pop(vid, None)
        if _is_internal(name) and state in ("done", "cached") and seconds < 1.0:
            return  # BuildKit's quick bookkeeping (load build definition, metadata ...): nothing to tell
        how = {"cached": "cached", "error": f"failed after {seconds:.1f}s", "canceled": "canceled"}.get(
            state, f"{seconds:.1f}s"
        )
        shown = truncate(clean(name), _NAME_WIDTH)
        if not self.live:
            self._write(f"{shown} {how}")
            self._last_writer = None
            return
        line = Text("  ")
        line.append(shown)
        line.append(f"  ({how})", style="red" if state == "error" else "dim")
        target = self._live.console if self._live is not None else self.console
        target.print(line, highlight=False, soft_wrap=False, overflow="ellipsis", no_wrap=True)

    def finish(self, ok: bool, summary: str) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()  # not under the lock: its refresh thread takes the lock in _render, and stop() joins it
        with self._lock:
            self._running.clear()
        if self.live:
            style = "green" if ok else "red"
            self.console.print(Text(summary, style=style), highlight=False)
        else:
            self._write(clean(summary))

    def _render(self) -> Group:
        width = max(self.console.width, 40)
        now = time.monotonic()
        with self._lock:
            running = list(self._running.values())
        if not running:
            text = Text(f"{self._title}  {now - self._started:.0f}s")
            text.no_wrap, text.overflow = True, "ellipsis"
            self._spinner.text = text
            return Group(self._spinner)
        rows: list[Any] = []
        for i, r in enumerate(running[:_SHOWN_RUNNING]):
            text = Text(truncate(r.name, min(70, width // 2)), style="bold" if i == 0 else "")
            text.append(f"  {now - r.started:.0f}s  ", style="cyan")
            rest = width - len(text) - 4
            if r.latest and rest > 10:
                text.append(truncate(r.latest, rest), style="dim")
            text.no_wrap, text.overflow = True, "ellipsis"
            if i == 0:
                self._spinner.text = text
                rows.append(self._spinner)
            else:
                rows.append(Text("  ") + text)
        if len(running) > _SHOWN_RUNNING:
            rows.append(Text(f"  and {len(running) - _SHOWN_RUNNING} more running", style="dim"))
        return Group(*rows)

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


# --------------------------------------------------------------------------------------------------------
# a push


class _Pushed(Protocol):
    """What a finished push reports (`publish.PushedRef`)."""

    @property
    def target(self) -> str: ...
    @property
    def digest(self) -> str: ...
    @property
    def status(self) -> str: ...


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


class PlainPushProgress:
    """One line per layer state change (no byte counters, no escape sequences): fit for a CI log."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream
        self._status: dict[str, str] = {}

    def _write(self, text: str) -> None:
        out = self._stream if self._stream is not None else sys.stderr
        out.write(text + "\n")
        out.flush()

    def start(self, target: str, attempt: int) -> None:
        self._status.clear()
        self._write(f"pushing {target}" + (f" (attempt {attempt})" if attempt > 1 else ""))

    def record(self, rec: dict[str, Any]) -> None:
        status = str(rec.get("status") or "").strip()
        layer = str(rec.get("id") or "")
        if not status or "aux" in rec:
            return
        if not layer:
            self._write(f"  {status}")
            return
        previous = self._status.get(layer, "")
        self._status[layer] = status
        if status in ("Preparing", "Waiting") or status == previous:
            return
        if status.startswith("Retrying in") and previous.startswith("Retrying in"):
            return
        if status == "Pushing":
            total = (rec.get("progressDetail") or {}).get("total")
            self._write(f"  {layer}: pushing" + (f" {_human(int(total))}" if total else ""))
            return
        self._write(f"  {layer}: {status}")

    def retry(self, target: str, attempt: int, attempts: int, error: str, delay_s: float) -> None:
        self._write(f"push of {target} failed (attempt {attempt}/{attempts}): {error}; retrying in {delay_s:g}s")

    def done(self, pushed: _Pushed) -> None:
        self._write(f"{pushed.status} {pushed.target}@{pushed.digest}")

    def failed(self, target: str, message: str) -> None:
        self._write(f"push of {target} failed: {message}")

    def close(self) -> None:
        pass


class LivePushProgress:
    """A rich progress bar per layer on an interactive terminal; summary lines stay, bars go."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bars: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def _ensure(self) -> Progress:
        if self._bars is None:
            self._bars = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                console=self.console,
                transient=True,
            )
            self._bars.start()
        return self._bars

    def _stop(self) -> None:
        if self._bars is not None:
            self._bars.stop()
        self._bars = None
        self._tasks.clear()

    def start(self, target: str, attempt: int) -> None:
        self._stop()
        self.console.print(
            f"pushing {target}" + (f" (attempt {attempt})" if attempt > 1 else ""),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        self._ensure()

    def record(self, rec: dict[str, Any]) -> None:
        layer = str(rec.get("id") or "")
        status = str(rec.get("status") or "").strip()
        if not layer or not status or self._bars is None:
            return
        detail = rec.get("progressDetail") or {}
        if layer not in self._tasks:
            self._tasks[layer] = self._bars.add_task(f"{layer} {status}", total=None)
        task = self._tasks[layer]
        if status == "Pushing" and detail.get("total"):
            self._bars.update(task, description=f"{layer} {status}", completed=detail.get("current", 0),
                              total=detail["total"])  # fmt: skip
        elif status in ("Pushed", "Layer already exists") or status.startswith("Mounted from"):
            total = self._bars.tasks[task].total or 1
            self._bars.update(task, description=f"{layer} {status}", completed=total, total=total)
        else:
            self._bars.update(task, description=f"{layer} {status}")

    def retry(self, target: str, attempt: int, attempts: int, error: str, delay_s: float) -> None:
        self._stop()
        self.console.print(f"push of {target} failed (attempt {attempt}/{attempts}): {error}; "
                           f"retrying in {delay_s:g}s", markup=False, highlight=False, soft_wrap=True)  # fmt: skip

    def done(self, pushed: _Pushed) -> None:
        self._stop()
        self.console.print(
            f"{pushed.status} {pushed.target}@{pushed.digest}", markup=False, highlight=False, soft_wrap=True
        )

    def failed(self, target: str, message: str) -> None:
        self._stop()

    def close(self) -> None:
        self._stop()


def push_progress_for(console: Console | None = None) -> PlainPushProgress | LivePushProgress:
    """Live bars on an interactive terminal; plain lines when not a TTY or when CI is set."""
    console = console or Console(stderr=True)
    if live_wanted(console):
        return LivePushProgress(console)
    return PlainPushProgress(console.file)
