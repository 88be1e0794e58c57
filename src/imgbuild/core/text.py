"""Text fit for a log line or a one-line message: `clean` takes out what a terminal would interpret (escape
sequences, carriage returns, control bytes), `truncate` cuts to a width, `xml_safe` keeps to the characters XML
1.0 allows. Used by the build's log reader, the engine's messages, the UI and the JUnit writer alike."""

from __future__ import annotations

import re

__all__ = ["clean", "truncate", "xml_safe"]

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


# What XML 1.0 forbids in a document (its `Char` production): control characters but tab, newline and carriage
# return, surrogates (what invalid UTF-8 becomes under surrogateescape), U+FFFE and U+FFFF. No escape makes them
# legal (`&#0;` is not well-formed either).
_NOT_XML_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """`text` with each character XML 1.0 cannot hold written as a visible escape (`\\x00`, `\\udcff`), so that a
    document holding whatever a program printed (a NUL-terminated version string, invalid UTF-8, escape sequences)
    still parses."""
    return _NOT_XML_RE.sub(lambda m: ascii(m.group())[1:-1], text)
