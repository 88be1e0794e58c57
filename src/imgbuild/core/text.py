"""Text fit for a log line or a one-line message: `clean` takes out what a terminal would interpret (escape
sequences, carriage returns, control bytes), `truncate` cuts to a width. Used by the build's log reader, the
engine's messages and the UI alike."""

from __future__ import annotations

import re

__all__ = ["clean", "truncate"]

_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
_CTRL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(line: str) -> str:
    """A log line fit for a plain CI log: no escape sequences, no carriage returns, no control bytes."""
    line = _ANSI_RE.sub("", line)
    if "\r" in line:
        parts = [p for p in line.split("\r") if p.strip()]
        line = parts[-1] if parts else ""
    return _CTRL_RE.sub("", line).rstrip()


def truncate(text: str, width: int) -> str:
    """`text` cut to `width` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
