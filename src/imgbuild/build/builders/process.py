"""The docker CLI building, as a process: started in a session of its own, its output read line by line on a
thread and handed, in order, to the caller's thread (`CliProcess.follow`), and stopped the way BuildKit can clean
up: `CliProcess.cancel` forwards SIGINT (BuildKit cancels the solve and stops the running step), reads on until the
CLI ends, and kills it after `CANCEL_WAIT_S`. A CLI whose imgbuild died without cancelling it (SIGKILL, a crash)
gets SIGINT from the kernel, so that BuildKit does not finish the build for nobody.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO

__all__ = ["CANCEL_WAIT_S", "CliProcess"]

CANCEL_WAIT_S = 20.0  # how long a cancelled CLI gets to stop its build before it is killed


class CliProcess:
    """One docker CLI process; every line it prints goes to `on_line`, on the thread that calls `follow` or
    `cancel`."""

    def __init__(self, argv: list[str], env: Mapping[str, str], on_line: Callable[[str], None]) -> None:
        self.argv, self.env, self.on_line = argv, dict(env), on_line
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        """Start the CLI and the thread that reads its output; OSError when the CLI cannot run."""
        self._proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, start_new_session=True, preexec_fn=_cancel_when_orphaned,
        )  # fmt: skip
        self._reader = threading.Thread(target=_read_lines, args=(self._proc.stdout, self._lines), daemon=True)
        self._reader.start()

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("the docker CLI was not started")
        return self._proc

    def follow(self) -> int:
        """Hand every line to `on_line` until the CLI ends; its exit code."""
        proc = self._started()
        while True:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                rc = proc.wait()
                break
            self.on_line(line)
        if self._reader is not None:
            self._reader.join(5)
        return rc

    def cancel(self, wait_s: float) -> bool:
        """SIGINT to the CLI's session, then its lines handed on until it ends, or killed once `wait_s` have
        passed; whether it had to be killed. Run it under `interrupts.sigint_deferred`."""
        proc = self._started()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + wait_s
        killed = False
        while True:
            try:
                line = self._lines.get(timeout=max(0.05, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                self.on_line(line)
            if time.monotonic() >= deadline:
                _kill(proc)
                killed = True
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        return killed

    def kill_if_running(self) -> None:
        """Never leave the CLI building: its whole session killed if it still runs."""
        if self._proc is not None and self._proc.poll() is None:
            _kill(self._proc)


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
