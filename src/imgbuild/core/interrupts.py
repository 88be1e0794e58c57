"""Ctrl-C and SIGTERM: a command that starts containers, tags or folders removes them when it is stopped either way.

Ctrl-C raises KeyboardInterrupt (Python's own SIGINT handler). SIGTERM (what `timeout`, `docker stop`, systemd and a
cancelled CI job send) is turned into `SigtermInterrupt`, a KeyboardInterrupt, in `terminable` commands (build, push,
verify, sbom, and those that run long writing files: sources fetch, lock, lock --upgrade, outdated), so it takes the
very cleanup path Ctrl-C takes (containers and tags removed, a half-fetched folder removed, a recipe an upgrade edited
put back, no temporary file left); the command then ends with `errors.Terminated` (exit 143, 128 + SIGTERM) where
Ctrl-C gives `errors.Interrupted` (130). While what a command started is being removed, further interrupts wait
(`sigint_deferred`).
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from imgbuild.core.errors import Interrupted, Terminated

F = TypeVar("F", bound=Callable[..., Any])


class SigtermInterrupt(KeyboardInterrupt):
    """SIGTERM arrived: raised where Ctrl-C's KeyboardInterrupt would be, so that every cleanup path runs."""


class _State:
    """SIGTERMs the running `terminable` command received, and whether one was raised as `Terminated`."""

    received = 0
    raised = False


def terminated() -> bool:
    """Whether the running `terminable` command received SIGTERM."""
    return _State.received > 0


def _raise_terminated() -> None:
    _State.raised = True
    raise SigtermInterrupt()


def _on_sigterm(signum: int, frame: Any) -> None:
    _State.received += 1
    if not _State.raised:  # the first one stops the command; later ones must not cut its cleanup short
        _raise_terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `SigtermInterrupt` in the main thread while this is active (the previous handler is put back)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.received, _State.raised = 0, False
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def terminable(fn: F) -> F:
    """A command that SIGTERM stops like Ctrl-C: the same cleanup, then `errors.Terminated` (exit 143) instead of
    `errors.Interrupted` (130). Put it under `console.handled`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with sigterm_as_interrupt():
            try:
                return fn(*args, **kwargs)
            except SigtermInterrupt:  # before the command started anything that needs removing
                raise Terminated("terminated (SIGTERM)") from None
            except Interrupted as exc:
                if terminated() and not isinstance(exc, Terminated):
                    raise Terminated(f"terminated (SIGTERM): {exc.message}", hint=exc.hint) from None
                raise

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def sigint_deferred(what: str) -> Iterator[None]:
    """Hold further Ctrl-C (and, in a `terminable` command, SIGTERM) while `what` is being removed (a few seconds),
    saying so once. A SIGTERM held here that was the command's first is raised as `SigtermInterrupt` afterwards, unless
    the command is already ending on an exception."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        pressed.append(signum)
        if signum == signal.SIGTERM:
            _State.received += 1
        if len(pressed) == 1:
            with contextlib.suppress(Exception):
                sys.stderr.write(f"imgbuild: still removing {what}, one moment ...\n")

    held = [signal.SIGINT] + ([signal.SIGTERM] if signal.getsignal(signal.SIGTERM) is _on_sigterm else [])
    previous = {sig: signal.getsignal(sig) for sig in held}
    for sig in held:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
    if signal.SIGTERM in pressed and not _State.raised and sys.exc_info()[0] is None:
        _raise_terminated()
