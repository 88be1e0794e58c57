"""The ECR scan gate (`imgbuild push --scan-gate LEVEL`): read the scan of the pushed digest, judge its findings.

ECR repositories are created with scan on push (`ecr.ensure_repository`); this module reads what that scan found.
`ScanGate.run` polls ``DescribeImageScanFindings`` for the pushed *digest* (never a tag) until the scan has a
verdict or `timeout_s` has passed, then `judge` sorts the findings:

* **blocking**: severity at or above the gate's level (INFORMATIONAL < LOW < MEDIUM < HIGH < CRITICAL) and not in
  the allow list;
* **allowed**: in the allow list (``--allow ID``, or an allow file: one ID per line with a ``# why`` comment), or
  suppressed in Amazon Inspector;
* below the level: counted, not listed.

Both response shapes are read: basic scanning's ``findings`` (``name``, ``severity``, ``uri`` and the
``package_name``/``package_version`` attributes) and enhanced scanning's ``enhancedFindings`` (Amazon Inspector:
``packageVulnerabilityDetails.vulnerabilityId``, ``vulnerablePackages``, ``severity``; CLOSED findings are left
out). A finding without a rating (basic scanning's UNDEFINED, Inspector's UNTRIAGED) is rated from its CVSS base
score when it carries one (the CVSS v3 bands: 9.0 CRITICAL, 7.0 HIGH, 4.0 MEDIUM, 0.1 LOW); without any score it
blocks at every level: an unknown severity is not known to be below the threshold.

No verdict is never a pass: a scan that FAILED, an UNSUPPORTED_IMAGE, SCAN_ELIGIBILITY_EXPIRED,
FINDINGS_UNAVAILABLE, LIMIT_EXCEEDED, IMAGE_ARCHIVED, an unknown status, or one still running at the timeout is a
failed gate with ECR's reason. Basic scanning's status COMPLETE and enhanced scanning's ACTIVE (the initial scan
is done, continuous scanning goes on) are verdicts; IN_PROGRESS and PENDING are waited for. When ECR has no scan
of the digest (a repository without scan on push), one basic scan is started (``StartImageScan``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import botocore.exceptions

from imgbuild.core import files
from imgbuild.core.errors import ScanGateError, UsageError

__all__ = [
    "LEVELS",
    "AllowEntry",
    "AllowList",
    "Finding",
    "GateReport",
    "ScanGate",
    "ScanGateFailed",
    "parse_findings",
    "rate",
]

LEVELS = ("INFORMATIONAL", "LOW", "MEDIUM", "HIGH", "CRITICAL")
UNRATED = "UNDEFINED"  # what a finding without a rating (UNDEFINED, UNTRIAGED) or a score is judged as
_RANK = {name: i for i, name in enumerate(LEVELS)}
_NOT_RATED = frozenset({"", "UNDEFINED", "UNTRIAGED"})

VERDICT = frozenset({"COMPLETE", "ACTIVE"})  # basic scanning's finished scan; enhanced scanning's scanned image
WAITING = frozenset({"IN_PROGRESS", "PENDING"})

SCAN_HINT = (
    "the role needs ecr:DescribeImageScanFindings, ecr:StartImageScan (a repository without scan on push) and "
    "ecr:BatchDeleteImage (a tag is taken back when the gate fails)"
)

# CVE-2024-1234, GHSA-xxxx-xxxx-xxxx, ALAS2-2024-1234, DSA-5555-1, RHSA-2024:1234, PYSEC-2024-1 ...
# An allow file lists a few IDs, each with its reason: a larger file is refused before it is read.
MAX_ALLOW_FILE_BYTES = 1 << 20
_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-:_.][A-Za-z0-9]+)+\Z")

Sleep = Callable[[float], None]
Clock = Callable[[], float]


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


# --------------------------------------------------------------------------------------------------------
# findings


@dataclass(frozen=True)
class Finding:
    """One vulnerability in one package, as the gate judges it."""

    id: str  # CVE-2024-1234 (basic: `name`; enhanced: packageVulnerabilityDetails.vulnerabilityId)
    severity: str  # what the scanner said (HIGH, UNDEFINED, UNTRIAGED ...)
    rated: str  # what the gate judges: one of LEVELS, or UNDEFINED (no rating and no score)
    package: str
    version: str
    uri: str
    score: float | None = None
    status: str = "ACTIVE"  # enhanced findings: ACTIVE | SUPPRESSED (| CLOSED, left out)

    def line(self) -> str:
        rated = self.severity if self.rated == self.severity else f"{self.severity} (CVSS {self.score} -> {self.rated})"
        package = f"{self.package} {self.version}".strip() or "-"
        return f"{self.id}  {rated}  {package}  {self.uri or '-'}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "rated": self.rated, "package": self.package,
                "version": self.version, "uri": self.uri, "score": self.score, "status": self.status}  # fmt: skip


def rate(severity: str, score: float | None) -> str:
    """The level a finding is judged at: its own rating, else its CVSS base score's band, else UNDEFINED."""
    severity = severity.upper()
    if severity in _RANK:
        return severity
    if score is None or score <= 0:
        return UNRATED if score is None else "INFORMATIONAL"
    if score >= 9.0:
        return "CRITICAL"
    if score >= 7.0:
        return "HIGH"
    if score >= 4.0:
        return "MEDIUM"
    return "LOW"


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _basic(raw: dict[str, Any]) -> Finding:
    attrs = {str(a.get("key", "")): str(a.get("value", "")) for a in raw.get("attributes") or []}
    score = _float(attrs.get("CVSS3_SCORE")) if "CVSS3_SCORE" in attrs else _float(attrs.get("CVSS2_SCORE"))
    severity = str(raw.get("severity") or UNRATED)
    return Finding(
        id=str(raw.get("name") or "unnamed"),
        severity=severity,
        rated=rate(severity, score),
        package=attrs.get("package_name", ""),
        version=attrs.get("package_version", ""),
        uri=str(raw.get("uri") or ""),
        score=score,
    )


def _enhanced(raw: dict[str, Any]) -> list[Finding]:
    details = raw.get("packageVulnerabilityDetails") or {}
    vid = str(details.get("vulnerabilityId") or raw.get("title") or raw.get("findingArn") or "unnamed")
    score = _float(raw.get("score"))
    if score is None:
        scores = [_float(c.get("baseScore")) for c in details.get("cvss") or []]
        score = max((s for s in scores if s is not None), default=None)
    severity = str(raw.get("severity") or details.get("vendorSeverity") or UNRATED)
    uri = str(details.get("sourceUrl") or next(iter(details.get("referenceUrls") or []), "")
              or (raw.get("remediation") or {}).get("recommendation", {}).get("url") or "")  # fmt: skip
    packages = details.get("vulnerablePackages") or [{}]
    return [
        Finding(
            id=vid,
            severity=severity,
            rated=rate(severity, score),
            package=str(p.get("name") or ""),
            version=str(p.get("version") or ""),
            uri=uri,
            score=score,
            status=str(raw.get("status") or "ACTIVE").upper(),
        )
        for p in packages
    ]


def parse_findings(scan_findings: dict[str, Any]) -> list[Finding]:
    """``imageScanFindings`` of a DescribeImageScanFindings page -> findings (basic and enhanced shapes)."""
    found = [_basic(f) for f in scan_findings.get("findings") or []]
    for raw in scan_findings.get("enhancedFindings") or []:
        found.extend(f for f in _enhanced(raw) if f.status != "CLOSED")
    return found


# --------------------------------------------------------------------------------------------------------
# the allow list


@dataclass(frozen=True)
class AllowEntry:
    id: str
    reason: str
    where: str  # FILE:LINE, or --allow


@dataclass(frozen=True)
class AllowList:
    entries: tuple[AllowEntry, ...] = ()

    def get(self, vid: str) -> AllowEntry | None:
        key = vid.upper()
        return next((e for e in self.entries if e.id.upper() == key), None)

    @classmethod
    def build(cls, ids: Iterable[str] = (), files: Iterable[Path] = ()) -> AllowList:
        """``--allow`` IDs and allow files; a malformed ID or file is a usage error (exit 2) naming it."""
        entries = [AllowEntry(check_id(i, "--allow"), "allowed on the command line", "--allow") for i in ids]
        for path in files:
            entries.extend(read_allow_file(path))
        return cls(tuple(entries))


def check_id(value: str, where: str) -> str:
    value = value.strip()
    if not _ID_RE.match(value):
        raise UsageError(f"{where}: {value!r} is not a vulnerability ID (CVE-2024-1234, GHSA-..., ALAS2-...)")
    return value


def read_allow_file(path: Path) -> list[AllowEntry]:
    """One ID per line with a ``# why`` comment after it; blank lines and lines that are only a comment are skipped.
    An entry without its reason is refused: an allowed finding says why."""
    try:
        text = files.read_text_bounded(Path(path), MAX_ALLOW_FILE_BYTES)
    except files.Refused as exc:
        raise UsageError(f"cannot read the allow file: {exc}") from None
    entries: list[AllowEntry] = []
    for n, line in enumerate(text.splitlines(), 1):
        body, _, comment = line.partition("#")
        if not body.strip():
            continue
        where = f"{path}:{n}"
        if len(body.split()) != 1:
            raise UsageError(f"{where}: one vulnerability ID per line, then `# why`; found {body.strip()!r}")
        if not comment.strip():
            raise UsageError(f"{where}: {body.strip()} has no reason", hint="write why after it: CVE-... # why")
        entries.append(AllowEntry(check_id(body, where), comment.strip(), where))
    return entries


# --------------------------------------------------------------------------------------------------------
# the verdict


Verdict = Literal["passed", "blocked", "no verdict"]


@dataclass
class GateReport:
    repository: str
    digest: str
    level: str
    scan_status: str = ""
    scan_description: str = ""
    scan_type: str = ""  # basic | enhanced | "" (no findings either way)
    blocking: tuple[Finding, ...] = ()
    allowed: tuple[tuple[Finding, str], ...] = ()  # the finding and why it is allowed
    below: int = 0
    error: str | None = None  # why there is no verdict
    removed: tuple[str, ...] = ()  # tags taken back from the registry after a failed gate
    kept: tuple[str, ...] = ()  # tags left there (published before this run, or could not be removed)

    @property
    def verdict(self) -> Verdict:
        if self.error is not None:
            return "no verdict"
        return "blocked" if self.blocking else "passed"

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"

    def summary(self) -> str:
        where = f"{self.repository}@{self.digest}"
        if self.error is not None:
            return f"scan gate: no verdict for {where}: {self.error}"
        tail = f"{len(self.allowed)} allowed, {self.below} below {self.level}"
        if self.blocking:
            found = f"{len(self.blocking)} finding(s) at or above {self.level}"
            return f"scan gate {self.level}: {found} in {where} ({tail})"
        return f"scan gate {self.level}: passed for {where} ({tail})"

    def lines(self) -> list[str]:
        out = [self.summary()]
        out += [f"  blocking: {f.line()}" for f in self.blocking]
        out += [f"  allowed:  {f.line()}  ({why})" for f, why in self.allowed]
        out += [f"  tag removed from the registry: {t}" for t in self.removed]
        out += [f"  tag left in the registry: {t}" for t in self.kept]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "level": self.level,
            "repository": self.repository,
            "digest": self.digest,
            "scan_status": self.scan_status,
            "scan_description": self.scan_description,
            "scan_type": self.scan_type,
            "error": self.error,
            "blocking": [f.to_json() for f in self.blocking],
            "allowed": [{**f.to_json(), "reason": why} for f, why in self.allowed],
            "below_level": self.below,
            "removed_tags": list(self.removed),
            "kept_tags": list(self.kept),
        }


class ScanGateFailed(ScanGateError):
    """The gate did not pass: findings at or above the level, or no verdict. Carries the report and what was
    pushed (the CLI prints both before exiting 17)."""

    def __init__(self, report: GateReport, result: Any = None, *, hint: str | None = None) -> None:
        super().__init__(report.summary(), hint=hint)
        self.report = report
        self.result = result


# --------------------------------------------------------------------------------------------------------
# waiting for the scan


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "ClientError"))


def _message(exc: Exception) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', 'ClientError')}: {err.get('Message', str(exc))}"
    return f"{type(exc).__name__}: {exc}"


@dataclass
class ScanGate:
    """`level` and the allow list; `run` waits at most `timeout_s` for the scan, asking every `poll_s`."""

    level: str
    allow: AllowList = field(default_factory=AllowList)
    timeout_s: float = 1800.0
    poll_s: float = 10.0
    sleep: Sleep | None = None
    clock: Clock | None = None

    def __post_init__(self) -> None:
        self.level = self.level.upper()
        if self.level not in _RANK:
            raise UsageError(f"--scan-gate {self.level}: expected one of {', '.join(LEVELS)}")

    def judge(self, report: GateReport, findings: Iterable[Finding]) -> GateReport:
        blocking: list[Finding] = []
        allowed: list[tuple[Finding, str]] = []
        below = 0
        for f in findings:
            entry = self.allow.get(f.id)
            if entry is not None:
                allowed.append((f, f"{entry.reason} [{entry.where}]"))
            elif f.status == "SUPPRESSED":
                allowed.append((f, "suppressed in Amazon Inspector"))
            elif f.rated == UNRATED or _RANK[f.rated] >= _RANK[self.level]:
                blocking.append(f)
            else:
                below += 1
        order = {**_RANK, UNRATED: -1}  # worst first, the unrated after the rated
        blocking.sort(key=lambda f: (-order[f.rated], f.id, f.package))
        report.blocking, report.allowed, report.below = tuple(blocking), tuple(allowed), below
        return report

    def run(self, client: Any, repository: str, digest: str, *, registry_id: str | None = None) -> GateReport:
        """Wait for the scan of `digest` in `repository`, then judge it. Never raises for the scan's own outcome:
        a missing verdict is `report.error`; AWS refusing the calls is one too (named, with the permissions)."""
        report = GateReport(repository, digest, self.level)
        sleep, clock = self.sleep or _sleep, self.clock or time.monotonic
        ids = {"registryId": registry_id} if registry_id else {}
        request = {"repositoryName": repository, "imageId": {"imageDigest": digest}, **ids}
        deadline = clock() + self.timeout_s
        started = False
        start_problem = ""
        while True:
            try:
                page = client.describe_image_scan_findings(**request, maxResults=1000)
            except botocore.exceptions.ClientError as exc:
                if _code(exc) != "ScanNotFoundException":
                    report.error = f"cannot read the scan: {_message(exc)}"
                    return report
                if not started:  # no scan on push here (or not registered yet): ask for one basic scan
                    started = True
                    start_problem = self._start(client, request)
                    if start_problem.startswith("UnsupportedImageTypeException"):
                        report.scan_status, report.error = "UNSUPPORTED_IMAGE", f"ECR cannot scan it: {start_problem}"
                        return report
                status, description = "NOT_FOUND", "ECR has no scan of this digest yet"
            except botocore.exceptions.BotoCoreError as exc:
                report.error = f"cannot read the scan: {_message(exc)}"
                return report
            else:
                scan = page.get("imageScanStatus") or {}
                status, description = str(scan.get("status") or "UNKNOWN"), str(scan.get("description") or "")
                if status in VERDICT:
                    report.scan_status, report.scan_description = status, description
                    try:
                        findings = self._findings(client, request, page)
                    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                        report.error = f"cannot read the findings: {_message(exc)}"
                        return report
                    report.scan_type = self._type(page)
                    return self.judge(report, findings)
                if status not in WAITING:
                    report.scan_status, report.scan_description = status, description
                    report.error = f"the scan ended {status}" + (f": {description}" if description else "")
                    return report
            report.scan_status, report.scan_description = status, description
            if clock() + self.poll_s > deadline:
                last = f"{status}" + (f": {description}" if description else "")
                extra = f"; StartImageScan said {start_problem}" if start_problem else ""
                report.error = f"no verdict within {self.timeout_s:g} s (last status {last}){extra}"
                return report
            sleep(self.poll_s)

    @staticmethod
    def _start(client: Any, request: dict[str, Any]) -> str:
        """StartImageScan once; "" when it started or one is already running today (LimitExceededException)."""
        try:
            client.start_image_scan(**request)
        except botocore.exceptions.ClientError as exc:
            return "" if _code(exc) == "LimitExceededException" else _message(exc)
        except botocore.exceptions.BotoCoreError as exc:
            return _message(exc)
        return ""

    @staticmethod
    def _findings(client: Any, request: dict[str, Any], page: dict[str, Any]) -> list[Finding]:
        findings = parse_findings(page.get("imageScanFindings") or {})
        token = page.get("nextToken")
        while token:
            page = client.describe_image_scan_findings(**request, maxResults=1000, nextToken=token)
            findings += parse_findings(page.get("imageScanFindings") or {})
            token = page.get("nextToken")
        return findings

    @staticmethod
    def _type(page: dict[str, Any]) -> str:
        found = page.get("imageScanFindings") or {}
        if found.get("enhancedFindings"):
            return "enhanced"
        if found.get("findings"):
            return "basic"
        return "enhanced" if page.get("imageScanStatus", {}).get("status") == "ACTIVE" else "basic"


def remove_tag(client: Any, repository: str, tag: str, *, registry_id: str | None = None) -> str | None:
    """Take `tag` back from the registry (``BatchDeleteImage``: the image goes with it when it has no other tag).
    None when done, else why not."""
    ids = {"registryId": registry_id} if registry_id else {}
    try:
        out = client.batch_delete_image(repositoryName=repository, imageIds=[{"imageTag": tag}], **ids)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        return _message(exc)
    failures = out.get("failures") or []
    if failures:
        f = failures[0]
        if f.get("failureCode") == "ImageNotFound":
            return None
        return f"{f.get('failureCode', 'failure')}: {f.get('failureReason', '')}".strip()
    return None
