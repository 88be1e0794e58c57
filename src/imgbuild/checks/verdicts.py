"""What a check returns: `passed`, `fail`, `skip`, `compare` (a version read against its pin), and `ldd_missing`
(ldd's output read)."""

from __future__ import annotations

from typing import Any

from imgbuild.checks.results import CheckResult, Status


def _result(status: Status, expected: str, found: str, reason: str, details: dict[str, Any] | None) -> CheckResult:
    return CheckResult(name="", status=status, expected=expected, found=found, reason=reason, details=details or {})


def passed(expected: str = "", found: str = "", reason: str = "", **details: Any) -> CheckResult:
    return _result("pass", expected, found, reason, details)


def fail(reason: str, expected: str = "", found: str = "", **details: Any) -> CheckResult:
    return _result("fail", expected, found, reason, details)


def skip(reason: str, expected: str = "", **details: Any) -> CheckResult:
    return _result("skip", expected, "", reason, details)


def compare(expected: str | None, found: str | None, what: str, **details: Any) -> CheckResult:
    """pass when found matches the pin (a pin 1.2 matches 1.2.x / 1.2amzn...), or when nothing is pinned."""
    if found is None:
        return fail(f"could not read the {what}", expected=expected or "(any)", **details)
    if expected is None:
        return passed("(not pinned)", found, "no version pinned: recorded what is there", **details)
    if _matches(expected, found):
        return passed(expected, found, **details)
    return fail(f"{what} {found} is not the pinned {expected}", expected=expected, found=found, **details)


def _matches(expected: str, found: str) -> bool:
    return found == expected or (found.startswith(expected) and not found[len(expected)].isdigit())


def ldd_missing(output: str) -> list[str]:
    """The libraries ldd could not find, from its output: the NAME of each `NAME => not found` line."""
    return [line.split("=>")[0].strip() for line in output.splitlines() if "not found" in line]
