"""What a verification reports (`VerifyReport`: the results, where they were taken, each phase's time) and the files
it writes: `--json` (`report_json`) and JUnit XML (`junit_xml`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from imgbuild.checks.results import CheckResult, failures


@dataclass
class VerifyReport:
    """The results of one verification, with where they were taken and how long each phase took."""

    target: str
    image: str | None
    recipe: str | None
    where: str  # "container", "local://", "ssh://user@host"
    note: str
    results: list[CheckResult]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> list[CheckResult]:
        return failures(self.results)

    @property
    def ok(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for r in self.results if r.status == s) for s in ("pass", "fail", "skip")}

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "image": self.image,
            "recipe": self.recipe,
            "where": self.where,
            "note": self.note,
            "ok": self.ok,
            "summary": self.counts(),
            "timings": self.timings,
            "results": [r.to_json() for r in self.results],
        }


def report_json(report: VerifyReport) -> str:
    """The report as `--json` writes it: strict JSON (RFC 8259) whatever a check found. A non-finite number (a log's
    nan or inf) is the string "NaN", "Infinity" or "-Infinity", as `cluster report` writes it; text is \\u-escaped
    outside ASCII, so invalid UTF-8 a program printed (read as lone surrogates) stays valid too."""
    return json.dumps(_finite(report.to_json()), indent=2, sort_keys=True, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """`value` with every float that JSON cannot hold (nan, inf) as the string JavaScript's JSON would print."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {key: _finite(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def junit_xml(report: VerifyReport) -> str:
    """JUnit XML: one testcase per check, <failure> / <skipped> with the reason, expected and found."""
    from imgbuild.checks.results import junit_xml as junit_suite

    where = (("image", report.image), ("recipe", report.recipe), ("where", report.where))
    properties = [(key, str(text or "")) for key, text in where]
    properties += [(f"timing.{key}", str(seconds)) for key, seconds in sorted(report.timings.items())]
    return junit_suite(
        "imgbuild verify",
        report.target,
        report.results,
        classname="imgbuild.verify",
        failure_type="VerifyFailure",
        properties=properties,
        time_s=report.timings.get("total_s"),
    )
