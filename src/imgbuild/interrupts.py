"""Ctrl-C during cleanup: a second interrupt must not cut short the removal of what a command started."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def sigint_deferred(what: str) -> Iterator[None]:
    """Ignore further Ctrl-C while `what` is being removed (a few seconds), saying so once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        pressed.append(signum)
        if len(pressed) == 1:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"imgbuild: still removing {what}, one moment ...\n")

    previous: Callable[..., Any] | int | None = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
