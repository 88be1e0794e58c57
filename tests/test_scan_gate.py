"""`imgbuild push --scan-gate LEVEL`: ECR's scan of the pushed digest, judged against a level and an allow list.

moto answers ECR's tokens, repositories, images and BatchDeleteImage, but its DescribeImageScanFindings is a fixed
fake (one HIGH "CVE-9999-9999" in "moto_fake", and only after StartImageScan: no scan on push) that cannot step
from IN_PROGRESS to COMPLETE. So DescribeImageScanFindings and StartImageScan are answered here from a script
(`ScriptedScans`, a before-call hook on the real botocore client, as botocore's Stubber does, for those two
operations only), with responses recorded in the shapes of the ECR API reference (DescribeImageScanFindings,
ImageScanFinding, EnhancedImageScanFinding) and checked against botocore's ECR output shape before they are
returned: a response the real API could not give fails the test. No real AWS, no Docker engine.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import boto3
import botocore.awsrequest
import botocore.validate
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from imgbuild import publish
from imgbuild.core.errors import PushError, UsageError
from imgbuild.publish import command as publish_command
from imgbuild.publish import ecr, scan
from imgbuild.publish.registry import RemoteManifest, parse_registry
from test_publish import IMAGE_ID, FakeAPI, FakeRegistryAPI, Sleeps, cpu, flat, ok_stream

ACCOUNT = "123456789012"
REGION = "us-east-1"
HOST = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"
REPO = "team/imgbuild/cpu"
LOCK_REF = "imgbuild/cpu:lock-0123456789ab"
READABLE_REF = "imgbuild/cpu:nccl2.27.5-ompi4.1.4"
DIGEST = "sha256:" + "d" * 64
WHEN = dt.datetime(2025, 3, 4, 12, 0, tzinfo=dt.timezone.utc)
ALLOW_FILE = Path(__file__).resolve().parents[1] / ".github" / "ecr-scan-allow.txt"


# ---------------------------------------------------------------------------------------------------------
# recorded responses (shapes from the ECR API reference; values made up)


def basic_finding(name: str, severity: str, package: str, version: str, score: str | None = "7.5") -> dict[str, Any]:
    attributes = [{"key": "package_version", "value": version}, {"key": "package_name", "value": package}]
    if score is not None:
        attributes += [{"key": "CVSS2_VECTOR", "value": "AV:N/AC:L/Au:N/C:P/I:P/A:P"},
                       {"key": "CVSS2_SCORE", "value": score}]  # fmt: skip
    return {
        "name": name,
        "description": f"{name} in {package}",
        "uri": f"https://security-tracker.debian.org/tracker/{name}",
        "severity": severity,
        "attributes": attributes,
    }


BASIC_FINDINGS = [
    basic_finding("CVE-2024-0001", "CRITICAL", "openssl", "3.0.11-1~deb12u2", "9.8"),
    basic_finding("CVE-2024-0002", "HIGH", "libexpat1", "2.5.0-1", "7.5"),
    basic_finding("CVE-2024-0003", "MEDIUM", "perl-base", "5.36.0-7+deb12u1", "5.0"),
    basic_finding("CVE-2024-0004", "LOW", "tar", "1.34+dfsg-1.2+deb12u1", "2.1"),
    basic_finding("CVE-2024-0005", "INFORMATIONAL", "coreutils", "9.1-1", None),
    basic_finding("CVE-2024-0006", "UNDEFINED", "login", "1:4.13+dfsg1-1", None),  # no rating, no score
    basic_finding("CVE-2024-0007", "UNDEFINED", "zlib1g", "1:1.2.13.dfsg-1", "7.2"),  # no rating, CVSS 7.2
]


def basic(status: str = "COMPLETE", findings: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A DescribeImageScanFindings answer for a registry with basic scanning."""
    answer: dict[str, Any] = {
        "registryId": ACCOUNT,
        "repositoryName": REPO,
        "imageId": {"imageDigest": DIGEST, "imageTag": "lock-0123456789ab"},
        "imageScanStatus": {
            "status": status,
            "description": {
                "COMPLETE": "The scan was completed successfully.",
                "IN_PROGRESS": "",
                "FAILED": "UnsupportedImageError: The operating system and/or package manager are not supported.",
            }.get(status, ""),
        },
    }
    if status == "COMPLETE":
        found = BASIC_FINDINGS if findings is None else findings
        counts: dict[str, int] = {}
        for f in found:
            counts[f["severity"]] = counts.get(f["severity"], 0) + 1
        answer["imageScanFindings"] = {
            "imageScanCompletedAt": WHEN,
            "vulnerabilitySourceUpdatedAt": WHEN,
            "findings": found,
            "findingSeverityCounts": counts,
        }
    answer.update(extra)
    return answer


def enhanced_finding(vid: str, severity: str, packages: list[tuple[str, str]], *, score: float | None = 8.1,
                     status: str = "ACTIVE") -> dict[str, Any]:  # fmt: skip
    details: dict[str, Any] = {
        "referenceUrls": [f"https://www.cve.org/CVERecord?id={vid}"],
        "relatedVulnerabilities": [],
        "source": "NVD",
        "sourceUrl": f"https://nvd.nist.gov/vuln/detail/{vid}",
        "vendorCreatedAt": WHEN,
        "vendorSeverity": severity,
        "vendorUpdatedAt": WHEN,
        "vulnerabilityId": vid,
        "vulnerablePackages": [
            {
                "arch": "X86_64",
                "epoch": 0,
                "name": name,
                "packageManager": "OS",
                "release": "1",
                "sourceLayerHash": "sha256:" + "1" * 64,
                "version": version,
                "fixedInVersion": "NotAvailable",
            }
            for name, version in packages
        ],
    }
    if score is not None:
        details["cvss"] = [{"baseScore": score, "scoringVector": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:N/A:N",
                            "source": "NVD", "version": "3.1"}]  # fmt: skip
    finding: dict[str, Any] = {
        "awsAccountId": ACCOUNT,
        "description": f"{vid} description",
        "findingArn": f"arn:aws:inspector2:{REGION}:{ACCOUNT}:finding/{hashlib.md5(vid.encode()).hexdigest()}",
        "firstObservedAt": WHEN,
        "lastObservedAt": WHEN,
        "packageVulnerabilityDetails": details,
        "remediation": {"recommendation": {"text": "None Provided"}},
        "resources": [
            {
                "details": {
                    "awsEcrContainerImage": {
                        "architecture": "amd64",
                        "imageHash": DIGEST,
                        "imageTags": ["lock-0123456789ab"],
                        "platform": "DEBIAN_12",
                        "pushedAt": WHEN,
                        "registry": ACCOUNT,
                        "repositoryName": REPO,
                    }
                },
                "id": f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/{REPO}/{DIGEST}",
                "type": "AWS_ECR_CONTAINER_IMAGE",
            }
        ],
        "severity": severity,
        "status": status,
        "title": f"{vid} - {', '.join(n for n, _ in packages)}",
        "type": "PACKAGE_VULNERABILITY",
        "updatedAt": WHEN,
        "fixAvailable": "NO",
        "exploitAvailable": "NO",
    }
    if score is not None:
        finding["score"] = score
    return finding


ENHANCED_FINDINGS = [
    enhanced_finding(
        "CVE-2025-1001", "CRITICAL", [("libssl3", "3.0.15-1~deb12u1"), ("openssl", "3.0.15-1~deb12u1")], score=9.1
    ),
    enhanced_finding("GHSA-aaaa-bbbb-cccc", "HIGH", [("urllib3", "2.2.1")], score=7.5),
    enhanced_finding("CVE-2025-1003", "MEDIUM", [("libc6", "2.36-9+deb12u9")], score=5.3),
    enhanced_finding("CVE-2025-1004", "UNTRIAGED", [("curl", "7.88.1-10+deb12u8")], score=None),
    enhanced_finding("CVE-2025-1005", "HIGH", [("sudo", "1.9.13p3-1")], status="SUPPRESSED"),
    enhanced_finding("CVE-2025-1006", "CRITICAL", [("bash", "5.2.15-2")], status="CLOSED"),
]


def enhanced(status: str = "ACTIVE", findings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A DescribeImageScanFindings answer for a registry with enhanced scanning (Amazon Inspector)."""
    answer: dict[str, Any] = {
        "registryId": ACCOUNT,
        "repositoryName": REPO,
        "imageId": {"imageDigest": DIGEST, "imageTag": "lock-0123456789ab"},
        "imageScanStatus": {
            "status": status,
            "description": {"ACTIVE": "Continuous scan is selected for image.", "PENDING": ""}.get(status, ""),
        },
    }
    if status == "ACTIVE":
        found = ENHANCED_FINDINGS if findings is None else findings
        answer["imageScanFindings"] = {
            "enhancedFindings": found,
            "findingSeverityCounts": {"CRITICAL": 2, "HIGH": 2, "MEDIUM": 1, "UNTRIAGED": 1},
        }
    return answer


# ---------------------------------------------------------------------------------------------------------
# the scripted scanner


class ScriptedScans:
    """DescribeImageScanFindings and StartImageScan answered from a script on a real botocore ECR client.

    Each entry is a response (checked against botocore's output shape first) or an error code (a 400 with that
    code); the last describe entry repeats. `calls` records (operation, request body)."""

    def __init__(self, client: Any, describe: list[Any], start: list[Any] | None = None) -> None:
        self.client = client
        self.queues: dict[str, list[Any]] = {"DescribeImageScanFindings": list(describe),
                                             "StartImageScan": list(start or [None])}  # fmt: skip
        self.calls: list[tuple[str, dict[str, Any]]] = []
        for op in self.queues:
            client.meta.events.register(f"before-call.ecr.{op}", self._answer)

    def _answer(self, model: Any, params: dict[str, Any], **_: Any) -> tuple[Any, dict[str, Any]]:
        body = params.get("body") or b"{}"
        self.calls.append((model.name, json.loads(body)))
        queue = self.queues[model.name]
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, str):
            error = {
                "Error": {"Code": item, "Message": f"{item} (scripted)"},
                "ResponseMetadata": {"HTTPStatusCode": 400},
            }
            return botocore.awsrequest.AWSResponse("https://ecr", 400, {}, None), error
        if item is None:  # StartImageScan's answer
            item = {"registryId": ACCOUNT, "repositoryName": REPO, "imageId": {"imageDigest": DIGEST},
                    "imageScanStatus": {"status": "IN_PROGRESS"}}  # fmt: skip
        botocore.validate.validate_parameters(item, model.output_shape)  # the real API's shape, or the test fails
        return botocore.awsrequest.AWSResponse("https://ecr", 200, {}, None), copy.deepcopy(item)

    def ops(self) -> list[str]:
        return [op for op, _ in self.calls]


class Clock:
    """A monotonic clock that sleeping moves forward."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield boto3.Session(region_name=REGION)


def gate(level: str = "HIGH", *, allow: scan.AllowList | None = None, timeout_s: float = 60, poll_s: float = 5,
         clock: Clock | None = None) -> scan.ScanGate:  # fmt: skip
    clock = clock or Clock()
    return scan.ScanGate(level, allow or scan.AllowList(), timeout_s=timeout_s, poll_s=poll_s, sleep=clock.sleep,
                         clock=clock)  # fmt: skip


def ids(findings: Any) -> list[str]:
    return [f.id for f in findings]


# ---------------------------------------------------------------------------------------------------------
# reading findings


def test_basic_findings_parsed() -> None:
    found = scan.parse_findings(basic()["imageScanFindings"])
    first = found[0]
    assert (first.id, first.severity, first.rated, first.package, first.version, first.uri, first.score) == (
        "CVE-2024-0001", "CRITICAL", "CRITICAL", "openssl", "3.0.11-1~deb12u2",
        "https://security-tracker.debian.org/tracker/CVE-2024-0001", 9.8,
    )  # fmt: skip
    by_id = {f.id: f for f in found}
    assert by_id["CVE-2024-0006"].rated == "UNDEFINED", "no rating and no score: unknown"
    assert by_id["CVE-2024-0007"].rated == "HIGH", "UNDEFINED with CVSS 7.2: rated from the score"
    assert "UNDEFINED (CVSS 7.2 -> HIGH)" in by_id["CVE-2024-0007"].line()


def test_enhanced_findings_parsed() -> None:
    found = scan.parse_findings(enhanced()["imageScanFindings"])
    assert "CVE-2025-1006" not in ids(found), "a CLOSED finding is gone from the image"
    crit = [f for f in found if f.id == "CVE-2025-1001"]
    assert [(f.package, f.version) for f in crit] == [("libssl3", "3.0.15-1~deb12u1"), ("openssl", "3.0.15-1~deb12u1")]
    assert {(f.severity, f.rated, f.score, f.uri) for f in crit} == {
        ("CRITICAL", "CRITICAL", 9.1, "https://nvd.nist.gov/vuln/detail/CVE-2025-1001")
    }
    untriaged = next(f for f in found if f.id == "CVE-2025-1004")
    assert (untriaged.severity, untriaged.rated) == ("UNTRIAGED", "UNDEFINED")
    assert next(f for f in found if f.id == "CVE-2025-1005").status == "SUPPRESSED"


@pytest.mark.parametrize(
    ("severity", "score", "rated"),
    [("high", None, "HIGH"), ("UNDEFINED", 9.0, "CRITICAL"), ("UNDEFINED", 8.9, "HIGH"), ("UNTRIAGED", 4.0, "MEDIUM"),
     ("UNDEFINED", 0.1, "LOW"), ("UNDEFINED", 0.0, "INFORMATIONAL"), ("UNDEFINED", None, "UNDEFINED"),
     ("", None, "UNDEFINED")],
)  # fmt: skip
def test_rate(severity: str, score: float | None, rated: str) -> None:
    assert scan.rate(severity, score) == rated


# ---------------------------------------------------------------------------------------------------------
# the level and the allow list


@pytest.mark.parametrize(
    ("level", "blocking"),
    [
        ("CRITICAL", ["CVE-2024-0001", "CVE-2024-0006"]),
        ("HIGH", ["CVE-2024-0001", "CVE-2024-0002", "CVE-2024-0007", "CVE-2024-0006"]),
        ("MEDIUM", ["CVE-2024-0001", "CVE-2024-0002", "CVE-2024-0007", "CVE-2024-0003", "CVE-2024-0006"]),
        (
            "INFORMATIONAL",
            [
                "CVE-2024-0001",
                "CVE-2024-0002",
                "CVE-2024-0007",
                "CVE-2024-0003",
                "CVE-2024-0004",
                "CVE-2024-0005",
                "CVE-2024-0006",
            ],
        ),
    ],
)
def test_level_threshold(level: str, blocking: list[str]) -> None:
    """At or above the level blocks, worst first; an unrated finding without a score blocks at every level."""
    found = scan.parse_findings(basic()["imageScanFindings"])
    report = gate(level).judge(scan.GateReport(REPO, DIGEST, level), found)
    assert sorted(ids(report.blocking)) == sorted(blocking)
    assert report.blocking[0].rated == "CRITICAL" and report.blocking[-1].rated == "UNDEFINED"
    assert report.below == len(found) - len(blocking) and report.verdict == "blocked"


def test_allow_list_from_option_and_file(tmp_path: Path) -> None:
    allow_file = tmp_path / "allow.txt"
    allow_file.write_text(
        "# accepted findings\n\ncve-2024-0001  # openssl: not reachable, TLS is off in the image\n"
        "CVE-2024-0006 # login: no interactive logins in training containers\n"
    )
    allow = scan.AllowList.build(["CVE-2024-0002"], [allow_file])
    found = scan.parse_findings(basic()["imageScanFindings"])
    report = gate("HIGH", allow=allow).judge(scan.GateReport(REPO, DIGEST, "HIGH"), found)
    assert ids(report.blocking) == ["CVE-2024-0007"]
    reasons = {f.id: why for f, why in report.allowed}
    assert reasons == {
        "CVE-2024-0001": f"openssl: not reachable, TLS is off in the image [{allow_file}:3]",
        "CVE-2024-0002": "allowed on the command line [--allow]",
        "CVE-2024-0006": f"login: no interactive logins in training containers [{allow_file}:4]",
    }
    lines = report.lines()
    assert any(line.startswith("  allowed:  CVE-2024-0001  CRITICAL  openssl 3.0.11-1~deb12u2") for line in lines)


def test_suppressed_enhanced_finding_is_allowed() -> None:
    found = scan.parse_findings(enhanced()["imageScanFindings"])
    report = gate("HIGH").judge(scan.GateReport(REPO, DIGEST, "HIGH"), found)
    assert ids(report.blocking) == ["CVE-2025-1001", "CVE-2025-1001", "GHSA-aaaa-bbbb-cccc", "CVE-2025-1004"]
    assert [(f.id, why) for f, why in report.allowed] == [("CVE-2025-1005", "suppressed in Amazon Inspector")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("CVE-2024-0001\n", "has no reason"),
        ("CVE-2024-0001 #   \n", "has no reason"),
        ("CVE-2024-0001 CVE-2024-0002 # two\n", "one vulnerability ID per line"),
        ("rm -rf # no\n", "one vulnerability ID per line"),
        ("CVE-2024-0001; # x\n", "not a vulnerability ID"),
    ],
)
def test_allow_file_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "allow.txt"
    path.write_text("# header\n" + text)
    with pytest.raises(UsageError) as info:
        scan.AllowList.build((), [path])
    assert message in str(info.value) and f"{path}:2" in info.value.message


def test_allow_file_missing(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the allow file"):
        scan.AllowList.build((), [tmp_path / "nope.txt"])


def test_shipped_allow_file_is_valid_and_commented() -> None:
    assert ALLOW_FILE.is_file()
    assert scan.AllowList.build((), [ALLOW_FILE]).entries == (), "shipped empty: every entry is a decision"
    assert ALLOW_FILE.read_text().startswith("#")


# ---------------------------------------------------------------------------------------------------------
# waiting for the scan


def test_basic_scan_waited_for_then_judged(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    script = ScriptedScans(client, ["ScanNotFoundException", basic("IN_PROGRESS"), basic("IN_PROGRESS"), basic()],
                           start=["LimitExceededException"])  # fmt: skip
    clock = Clock()
    report = gate("CRITICAL", clock=clock).run(client, REPO, DIGEST, registry_id=ACCOUNT)
    assert report.verdict == "blocked" and report.scan_status == "COMPLETE" and report.scan_type == "basic"
    assert ids(report.blocking) == ["CVE-2024-0001", "CVE-2024-0006"]
    assert clock.sleeps == [5, 5, 5]
    assert script.ops() == ["DescribeImageScanFindings", "StartImageScan", "DescribeImageScanFindings",
                            "DescribeImageScanFindings", "DescribeImageScanFindings"]  # fmt: skip
    request = script.calls[0][1]
    assert request["imageId"] == {"imageDigest": DIGEST}, "the pushed digest, never a tag"
    assert request["repositoryName"] == REPO and request["registryId"] == ACCOUNT


def test_enhanced_scan_pending_then_active(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    ScriptedScans(client, [enhanced("PENDING"), enhanced()])
    report = gate("CRITICAL").run(client, REPO, DIGEST)
    assert report.scan_status == "ACTIVE" and report.scan_type == "enhanced"
    assert ids(report.blocking) == ["CVE-2025-1001", "CVE-2025-1001", "CVE-2025-1004"]
    assert "libssl3" in report.lines()[1] and "openssl" in report.lines()[2]


def test_clean_scan_passes(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    ScriptedScans(client, [basic(findings=[BASIC_FINDINGS[2], BASIC_FINDINGS[3]])])
    report = gate("HIGH").run(client, REPO, DIGEST)
    assert report.passed and report.below == 2 and report.blocking == ()
    assert report.summary().startswith("scan gate HIGH: passed")


def test_findings_read_across_pages(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    page1 = basic(findings=BASIC_FINDINGS[:2], nextToken="page-2")
    page2 = basic(findings=BASIC_FINDINGS[2:3])
    script = ScriptedScans(client, [page1, page2])
    report = gate("MEDIUM").run(client, REPO, DIGEST)
    assert ids(report.blocking) == ["CVE-2024-0001", "CVE-2024-0002", "CVE-2024-0003"]
    assert script.calls[1][1]["nextToken"] == "page-2"


@pytest.mark.parametrize(
    ("answer", "status", "words"),
    [
        (basic("FAILED"), "FAILED", "the scan ended FAILED: UnsupportedImageError"),
        (basic("UNSUPPORTED_IMAGE"), "UNSUPPORTED_IMAGE", "the scan ended UNSUPPORTED_IMAGE"),
        (enhanced("SCAN_ELIGIBILITY_EXPIRED"), "SCAN_ELIGIBILITY_EXPIRED", "ended SCAN_ELIGIBILITY_EXPIRED"),
        (enhanced("FINDINGS_UNAVAILABLE"), "FINDINGS_UNAVAILABLE", "ended FINDINGS_UNAVAILABLE"),
    ],
)
def test_scan_without_a_verdict_never_passes(aws: boto3.Session, answer: dict[str, Any], status: str,
                                             words: str) -> None:  # fmt: skip
    client = aws.client("ecr")
    ScriptedScans(client, [answer])
    report = gate("CRITICAL").run(client, REPO, DIGEST)
    assert report.verdict == "no verdict" and not report.passed and report.scan_status == status
    assert report.error is not None and words in report.error


def test_timeout_is_no_verdict(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    script = ScriptedScans(client, [basic("IN_PROGRESS")])
    clock = Clock()
    report = gate("HIGH", timeout_s=30, poll_s=10, clock=clock).run(client, REPO, DIGEST)
    assert report.verdict == "no verdict" and report.error == "no verdict within 30 s (last status IN_PROGRESS)"
    assert clock.sleeps == [10, 10, 10] and len(script.calls) == 4


def test_unsupported_image_when_starting_a_scan(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    ScriptedScans(client, ["ScanNotFoundException"], start=["UnsupportedImageTypeException"])
    report = gate("HIGH").run(client, REPO, DIGEST)
    assert report.scan_status == "UNSUPPORTED_IMAGE" and "UnsupportedImageTypeException" in (report.error or "")


def test_no_scan_ever_names_what_start_said(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    ScriptedScans(client, ["ScanNotFoundException"], start=["ValidationException"])
    report = gate("HIGH", timeout_s=10, poll_s=5).run(client, REPO, DIGEST)
    assert report.error is not None and "last status NOT_FOUND" in report.error
    assert "StartImageScan said ValidationException" in report.error


def test_access_denied_is_no_verdict(aws: boto3.Session) -> None:
    client = aws.client("ecr")
    ScriptedScans(client, ["AccessDeniedException"])
    report = gate("HIGH").run(client, REPO, DIGEST)
    assert report.verdict == "no verdict" and "AccessDeniedException" in (report.error or "")


def test_bad_level() -> None:
    with pytest.raises(UsageError, match="expected one of INFORMATIONAL, LOW, MEDIUM, HIGH, CRITICAL"):
        scan.ScanGate("SEVERE")


# ---------------------------------------------------------------------------------------------------------
# the publisher: content-addressed tag, gate, then the readable tags


class EcrEngine(FakeAPI):
    """A scripted engine whose pushes land in moto's ECR (put_image), so tags can be looked up and removed there."""

    def __init__(self, client: Any) -> None:
        super().__init__()
        self.ecr = client
        self.digest = DIGEST

    def push(self, repository: str, tag: str | None = None, **kwargs: Any) -> Any:
        super().push(repository, tag, **kwargs)  # records it, checks it was tagged first
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                               "config": {"digest": IMAGE_ID, "size": 1234,
                                          "mediaType": "application/vnd.docker.container.image.v1+json"},
                               "layers": []})  # fmt: skip
        name = repository.split("/", 1)[1]
        out = self.ecr.put_image(repositoryName=name, imageManifest=manifest, imageTag=tag)
        self.digest = out["image"]["imageId"]["imageDigest"]
        return iter(ok_stream(tag or "", self.digest))

    def close(self) -> None:
        pass


class EngineClient:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api

    def close(self) -> None:
        pass


def remote_tags(client: Any) -> list[str]:
    images = client.describe_images(repositoryName=REPO)["imageDetails"]
    return sorted(t for i in images for t in i.get("imageTags", []))


def ecr_publisher(aws: boto3.Session, g: scan.ScanGate) -> tuple[publish.Publisher, EcrEngine, ecr.EcrRegistry]:
    registry = ecr.EcrRegistry(HOST, session=aws)
    engine = EcrEngine(registry.client)
    pub = publish.Publisher(EngineClient(engine), parse_registry(f"{HOST}/team"), ecr=registry,  # type: ignore[arg-type]
                            retry=publish.Retry(sleep=Sleeps()), gate=g, immutable=False)  # fmt: skip
    return pub, engine, registry


def source() -> publish.Source:  # the readable tag first: the gate still starts with the lock- tag
    return publish.Source(IMAGE_ID, (READABLE_REF, LOCK_REF), (), "cpu")


def test_gate_passes_then_readable_tags_pushed(aws: boto3.Session) -> None:
    pub, engine, registry = ecr_publisher(aws, gate("HIGH"))
    script = ScriptedScans(registry.client, [basic("IN_PROGRESS"), basic(findings=BASIC_FINDINGS[2:4])])
    result = pub.publish(source())
    assert [p[1] for p in engine.pushes] == ["lock-0123456789ab", "nccl2.27.5-ompi4.1.4"]
    assert script.calls[0][1]["imageId"] == {"imageDigest": engine.digest}
    assert result.scan is not None and result.scan.passed
    data = result.to_json()
    assert data["scan"]["verdict"] == "passed" and data["scan"]["below_level"] == 2
    assert [r["target"].rsplit(":", 1)[1] for r in data["refs"]] == ["lock-0123456789ab", "nccl2.27.5-ompi4.1.4"]
    assert remote_tags(registry.client) == ["lock-0123456789ab", "nccl2.27.5-ompi4.1.4"]


def test_failed_gate_pushes_no_readable_tag_and_takes_back_its_own(aws: boto3.Session) -> None:
    pub, engine, registry = ecr_publisher(aws, gate("HIGH"))
    ScriptedScans(registry.client, [basic()])
    with pytest.raises(scan.ScanGateFailed) as info:
        pub.publish(source())
    assert info.value.exit_code == 17
    assert [p[1] for p in engine.pushes] == ["lock-0123456789ab"], "the readable tag is never pushed"
    assert remote_tags(registry.client) == [], "the tag this run pushed is taken back"
    report = info.value.report
    assert report.removed == (f"{HOST}/{REPO}:lock-0123456789ab",) and report.kept == ()
    assert info.value.result.refs[0].status == "pushed" and info.value.result.scan is report
    assert info.value.hint and "--allow" in info.value.hint
    assert [leftover for leftover in engine.tags if leftover.startswith(HOST)] == [], "local temporary tags removed"


def test_failed_gate_leaves_a_tag_published_before(aws: boto3.Session) -> None:
    """The lock tag was published by an earlier run (the same image): not this run's to take back."""
    registry = ecr.EcrRegistry(HOST, session=aws)
    registry.repository(REPO)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"})
    registry.client.put_image(repositoryName=REPO, imageManifest=manifest, imageTag="lock-0123456789ab")
    engine = EcrEngine(registry.client)
    pub = publish.Publisher(EngineClient(engine), parse_registry(f"{HOST}/team"), ecr=registry,  # type: ignore[arg-type]
                            retry=publish.Retry(sleep=Sleeps()), gate=gate("HIGH"))  # fmt: skip
    pub._api = FakeRegistryAPI(RemoteManifest(DIGEST, "application/json", IMAGE_ID))  # type: ignore[assignment]
    ScriptedScans(registry.client, [basic()])
    with pytest.raises(scan.ScanGateFailed) as info:
        pub.publish(source())
    assert engine.pushes == [] and remote_tags(registry.client) == ["lock-0123456789ab"]
    assert info.value.report.kept == (f"{HOST}/{REPO}:lock-0123456789ab (published before this run)",)


def test_no_verdict_also_takes_the_tag_back(aws: boto3.Session) -> None:
    pub, engine, registry = ecr_publisher(aws, gate("HIGH"))
    ScriptedScans(registry.client, [basic("FAILED")])
    with pytest.raises(scan.ScanGateFailed) as info:
        pub.publish(source())
    assert info.value.report.verdict == "no verdict" and "UnsupportedImageError" in info.value.message
    assert remote_tags(registry.client) == [] and len(engine.pushes) == 1


def test_gate_on_another_registry_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="needs Amazon ECR"):
        publish.publish(cpu(), "127.0.0.1:5000/team", gate=gate("HIGH"))


def test_gate_needs_ecr_in_the_publisher() -> None:
    pub = publish.Publisher(EngineClient(FakeAPI()), parse_registry("127.0.0.1:5000"), gate=gate("HIGH"),  # type: ignore[arg-type]
                            retry=publish.Retry(sleep=Sleeps()))  # fmt: skip
    with pytest.raises(PushError, match="needs Amazon ECR"):
        pub.publish(publish.Source(IMAGE_ID, (LOCK_REF,), (), "cpu"))


# ---------------------------------------------------------------------------------------------------------
# through `imgbuild push`


@pytest.fixture
def cli_ecr(aws: boto3.Session, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`imgbuild push` against moto's ECR and a scripted engine; the scan answers are set per test."""
    state: dict[str, Any] = {"describe": [basic()]}

    class Registry(ecr.EcrRegistry):
        def __init__(self, host: str | None = None, **kwargs: Any) -> None:
            super().__init__(host, **kwargs)
            state["registry"] = self
            state["script"] = ScriptedScans(self.client, state["describe"])

    def connect() -> EngineClient:
        engine = EcrEngine(boto3.client("ecr", region_name=REGION))
        state["engine"] = engine
        return EngineClient(engine)

    monkeypatch.setattr(ecr, "EcrRegistry", Registry)
    monkeypatch.setattr(publish_command, "connect", connect)
    return state


def push_cli(*args: str) -> Any:
    from imgbuild.cli import app

    return CliRunner().invoke(app, ["push", LOCK_REF, "--registry", f"{HOST}/team", "--mutable", *args])


def test_cli_failed_gate_exits_17_listing_findings(cli_ecr: dict[str, Any]) -> None:
    result = push_cli("--scan-gate", "high", "--allow", "CVE-2024-0002", "--allow-file", str(ALLOW_FILE))
    assert result.exit_code == 17, result.output
    out = result.stdout
    assert f"pushed: {HOST}/{REPO}:lock-0123456789ab" in out and "nccl2.21.5" not in out
    assert "scan gate HIGH: 3 finding(s) at or above HIGH" in out
    assert ("  blocking: CVE-2024-0001  CRITICAL  openssl 3.0.11-1~deb12u2  "
            "https://security-tracker.debian.org/tracker/CVE-2024-0001") in out  # fmt: skip
    assert "  blocking: CVE-2024-0007  UNDEFINED (CVSS 7.2 -> HIGH)  zlib1g 1:1.2.13.dfsg-1" in out
    assert "  blocking: CVE-2024-0006  UNDEFINED  login" in out
    assert "  allowed:  CVE-2024-0002  HIGH  libexpat1 2.5.0-1" in out and "allowed on the command line" in out
    assert f"tag removed from the registry: {HOST}/{REPO}:lock-0123456789ab" in out
    assert "imgbuild: error: scan gate HIGH" in result.stderr and "hint:" in result.stderr
    assert [p[1] for p in cli_ecr["engine"].pushes] == ["lock-0123456789ab"]


def test_cli_failed_gate_json(cli_ecr: dict[str, Any]) -> None:
    result = push_cli("--scan-gate", "CRITICAL", "--json")
    assert result.exit_code == 17, result.output
    data = json.loads(result.stdout)
    assert data["scan"]["verdict"] == "blocked" and data["scan"]["level"] == "CRITICAL"
    assert [(f["id"], f["severity"], f["package"], f["version"]) for f in data["scan"]["blocking"]] == [
        ("CVE-2024-0001", "CRITICAL", "openssl", "3.0.11-1~deb12u2"), ("CVE-2024-0006", "UNDEFINED", "login",
                                                                       "1:4.13+dfsg1-1")]  # fmt: skip
    assert data["scan"]["removed_tags"] == [f"{HOST}/{REPO}:lock-0123456789ab"]


def test_cli_passing_gate_pushes_every_tag(cli_ecr: dict[str, Any]) -> None:
    cli_ecr["describe"][:] = [basic("IN_PROGRESS"), enhanced(findings=ENHANCED_FINDINGS[2:3])]
    monkey_sleeps: list[float] = []
    scan_sleep = scan._sleep
    try:
        scan._sleep = monkey_sleeps.append  # type: ignore[assignment]
        result = push_cli("--scan-gate", "HIGH")
    finally:
        scan._sleep = scan_sleep  # type: ignore[assignment]
    assert result.exit_code == 0, result.output
    assert [p[1] for p in cli_ecr["engine"].pushes] == ["lock-0123456789ab", "nccl2.27.5-ompi4.1.4"]
    assert "scan gate HIGH: passed" in result.stdout and monkey_sleeps == [10.0]


def test_cli_scan_gate_on_another_registry_is_a_clear_error() -> None:
    from imgbuild.cli import app

    result = CliRunner().invoke(app, ["push", LOCK_REF, "--registry", "127.0.0.1:5000/team", "--scan-gate", "HIGH"])
    assert result.exit_code == 2, result.output
    assert "needsamazonecr" in flat(result.stderr) and "novulnerabilityscanner" in flat(result.stderr)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--scan-gate", "SEVERE"], "expectedoneofinformational,low,medium,high,critical"),
        (["--allow", "CVE-2024-0001"], "gowith--scan-gate"),
        (["--scan-gate", "HIGH", "--allow", "not an id"], "notavulnerabilityid"),
    ],
)
def test_cli_usage_errors(args: list[str], words: str) -> None:
    from imgbuild.cli import app

    result = CliRunner().invoke(app, ["push", LOCK_REF, "--registry", f"{HOST}/team", *args])
    assert result.exit_code == 2, result.output
    assert words in flat(result.output)


def test_cli_help_documents_the_gate() -> None:
    from imgbuild.cli import app

    result = CliRunner().invoke(app, ["push", "--help"], env={"COLUMNS": "200"})
    text = flat(result.stdout)
    assert "--scan-gate" in text and "exit17" in text and "--allow-file" in text


def test_publish_workflow_gates_on_high_with_the_allow_file() -> None:
    import yaml

    workflow = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "publish.yml"
    job = yaml.safe_load(workflow.read_text())["jobs"]["publish"]
    push = next(s for s in job["steps"] if s.get("name") == "push to ECR")
    assert "--scan-gate HIGH --allow-file .github/ecr-scan-allow.txt" in push["run"]
    assert 'exit "${rc}"' in push["run"], "the summary is written, then the gate's exit code fails the job"
