"""How `imgbuild push` reads a failed push and retries it: a push error message is sorted three ways (`classify`):

* transient (registry 5xx, connection reset/refused, EOF, timeouts): retried with exponential backoff
  (`Retry`: 4 tries, 1, 2, 4 s between them), then a `PushError` naming registry, ref and last error;
* authentication ("unauthorized", "no basic auth credentials", "denied"): a `PushError` at once, with a hint
  about ``docker login`` or AWS credentials;
* everything else: a `PushError` at once;

and "exists" (an immutable repository's refusal to overwrite a tag), which the push answers by comparing digests.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["transient", "auth", "exists", "fatal"]

_EXISTS = re.compile(
    r"tag invalid|ImageTagAlreadyExists|already exists in the .* repository|cannot be overwritten", re.I
)
_AUTH = re.compile(
    r"unauthori[sz]ed|no basic auth credentials|\bdenied\b|authentication required|authorization token has expired"
    r"|incorrect username or password|\b401\b",
    re.I,
)
_TRANSIENT = re.compile(
    r"received unexpected HTTP status: 5\d\d|\b5\d\d (?:Internal Server Error|Bad Gateway|Service Unavailable"
    r"|Gateway Timeout)|connection reset|connection refused|broken pipe|\bEOF\b|i/o timeout|TLS handshake timeout"
    r"|timeout exceeded|request canceled|server closed idle connection|toomanyrequests|too many requests"
    r"|no route to host|network is unreachable|temporary failure in name resolution",
    re.I,
)


def classify(message: str) -> Kind:
    """Which of the retry policies a push error message falls under."""
    if _EXISTS.search(message):
        return "exists"
    if _AUTH.search(message):
        return "auth"
    if _TRANSIENT.search(message):
        return "transient"
    return "fatal"


@dataclass(frozen=True)
class Retry:
    """Bounded retries with exponential backoff: `attempts` tries, `delay_s` * `factor`**n between them."""

    attempts: int = 4
    delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 60.0
    sleep: Callable[[float], None] = time.sleep

    def delay(self, failed_attempt: int) -> float:
        return float(min(self.delay_s * self.factor ** (failed_attempt - 1), self.max_delay_s))
