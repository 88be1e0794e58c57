"""Verification results shared by single-container, host, multi-node and SageMaker checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class CheckResult:
    """One check: what was expected, what was found, and pass / fail / skip (with the reason)."""

    name: str
    status: Status
    expected: str = ""
    found: str = ""
    reason: str = ""
    component: str = ""
    node: str = ""
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def failures(results: list[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.status == "fail"]
