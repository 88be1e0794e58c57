"""Verification results shared by single-container, host, multi-node and SageMaker checks, and their JUnit XML
(`junit_xml`, for `imgbuild verify` and `imgbuild cluster report`)."""

from __future__ import annotations

from collections.abc import Sequence
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


def junit_xml(
    suite: str,
    target: str,
    results: Sequence[CheckResult],
    *,
    classname: str,
    failure_type: str,
    properties: Sequence[tuple[str, str]] = (),
    time_s: float | None = None,
) -> str:
    """JUnit XML for one run of checks, as CI systems read it: `<testsuites name=SUITE>` holding one
    `<testsuite name="SUITE TARGET">` with `properties` (in their order) and one testcase per result, named
    `NAME [NODE]` when it ran on a node, of class `CLASSNAME.COMPONENT` (`CLASSNAME.image` without a component).
    fail -> `<failure type=FAILURE_TYPE>`, skip -> `<skipped>` with the reason, pass -> the evidence in
    `<system-out>`. `time_s` defaults to the sum of the results' durations. Every text is `xml_safe`: what a check
    found (a C string's NUL, invalid UTF-8) cannot make the document unreadable."""
    import xml.etree.ElementTree as ET

    from imgbuild.core.text import xml_safe as x

    counts = {s: sum(1 for r in results if r.status == s) for s in ("fail", "skip")}
    total = sum(r.duration_s for r in results) if time_s is None else time_s
    suites = ET.Element("testsuites", name=x(suite))
    tests = ET.SubElement(
        suites,
        "testsuite",
        name=x(f"{suite} {target}"),
        tests=str(len(results)),
        failures=str(counts["fail"]),
        errors="0",
        skipped=str(counts["skip"]),
        time=f"{total:.3f}",
    )
    props = ET.SubElement(tests, "properties")
    for key, value in properties:
        ET.SubElement(props, "property", name=x(key), value=x(value))
    for r in results:
        name = f"{r.name} [{r.node}]" if r.node else r.name
        case = ET.SubElement(
            tests,
            "testcase",
            classname=x(f"{classname}.{r.component or 'image'}"),
            name=x(name),
            time=f"{r.duration_s:.3f}",
        )
        text = x(f"expected: {r.expected}\nfound: {r.found}\n{r.reason}".strip())
        message = x(r.reason)
        if r.status == "fail":
            ET.SubElement(case, "failure", message=message or "failed", type=failure_type).text = text
        elif r.status == "skip":
            ET.SubElement(case, "skipped", message=message or "skipped")
        else:
            ET.SubElement(case, "system-out").text = text
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
