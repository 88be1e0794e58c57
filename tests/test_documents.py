"""Every document imgbuild writes is valid for its format whatever the text inside: the JUnit XML of verify, cluster
report and cluster test (one writer, checks.results.junit_xml), and the JSON of the commands' --json, with hostile
text in every field that reaches one: NUL (a C string's end, as MPI's library version prints it), other control
characters, escape sequences, invalid UTF-8, `]]>`, a 1 MB line."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import UPSTREAM
from imgbuild.checks.results import CheckResult, junit_xml
from imgbuild.core.text import xml_safe

HOSTILE = {
    "nul": "Open MPI v5.0.7\x00\x00garbage",
    "controls": "\x01\x02\x07\x08\x0b\x0c\x1b[31mred\x1b[0m\x7f",
    "surrogates": b"caf\xc3\xa9 \xff\xfe".decode("utf-8", "surrogateescape"),
    "cdata-end": "]]><![CDATA[ <x/> & &amp; \"'",
    "nonchars": "\ufffe\uffff",
    "long": "y" * 1_000_000,
}


@pytest.mark.parametrize("field", ["name", "expected", "found", "reason", "node", "component"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_junit_xml_parses_whatever_a_check_found(field: str, kind: str) -> None:
    value = HOSTILE[kind]
    results = [
        CheckResult(**{"name": "probe", "status": status, field: value})  # type: ignore[arg-type]
        for status in ("pass", "fail", "skip")
    ]
    text = junit_xml(f"suite {value}", value, results, classname="imgbuild.t", failure_type="F",
                     properties=[("p", value)])  # fmt: skip
    root = ET.fromstring(text.encode("utf-8"))
    cases = root.findall(".//testcase")
    assert len(cases) == 3
    kept = xml_safe(value)  # what the reader gets back: the text, each character XML cannot hold escaped
    where = {
        "name": cases[0].get("name", ""),
        "node": cases[0].get("name", ""),
        "component": cases[0].get("classname", ""),
        **dict.fromkeys(("expected", "found", "reason"), cases[1].findtext("failure") or ""),
    }
    assert kept in where[field]
    assert root.find(".//property").get("value") == kept  # type: ignore[union-attr]
    if kind == "nul":
        assert "\\x00\\x00garbage" in kept  # visible, not dropped: a reader sees what the check saw


def _hostile_log(tmp_path: Path) -> Path:
    """A real nccl-tests log with NUL, escape sequences, invalid UTF-8 and `]]>` in the lines the report quotes."""
    raw = (UPSTREAM / "nccl-tests" / "slurm-pcluster_2x-g7e.8xlarge_nccl-2.29.2_ofi-1.18.0_efa.log").read_bytes()
    raw = raw.replace(b"NCCL version 2.29.2", b"NCCL version 2.29.2\x00\x1b[31m]]>\xff\xfe", 1)
    raw = raw.replace(b"Using network Libfabric", b"Using network Lib\x00fab\x01ric\xff]]>", 1)
    path = tmp_path / "hostile.log"
    path.write_bytes(raw)
    return path


def test_cluster_report_writes_parseable_junit_and_json_from_a_hostile_log(tmp_path: Path) -> None:
    """Through the CLI as users run it: every document parses with the standard parsers, stdout's JSON too."""
    log = _hostile_log(tmp_path)
    junit, data = tmp_path / "r.xml", tmp_path / "r.json"
    ran = subprocess.run(
        [sys.executable, "-m", "imgbuild", "cluster", "report", str(log), "--junit", str(junit), "--json", str(data)],
        capture_output=True, check=False,
    )  # fmt: skip
    assert ran.returncode in (0, 11), ran.stderr.decode(errors="replace")
    root = ET.parse(junit).getroot()
    network = next(c for c in root.iter("testcase") if c.get("name") == "network")
    assert "\\x00" in ET.tostring(network, encoding="unicode")  # the NUL shown, not dropped
    json.loads(data.read_text(encoding="utf-8"))
    stdout = subprocess.run(
        [sys.executable, "-m", "imgbuild", "cluster", "report", str(log), "--json", "-"], capture_output=True,
        check=False,
    )  # fmt: skip
    assert json.loads(stdout.stdout.decode("utf-8"))["source"] == str(log)


def test_verify_json_and_junit_parse_whatever_the_checks_found() -> None:
    """verify's --json and --junit (one writer each, for verify, verify --nodes and cluster test) from results whose
    every field holds hostile text and whose details hold nan and inf (a log's unreadable bandwidth)."""
    from imgbuild import verify

    details = {"busbw": float("nan"), "peak": float("inf"), "low": float("-inf"), "text": HOSTILE["surrogates"]}
    results = [
        CheckResult(name=f"multinode: {value}", status=status, expected=value, found=value, reason=value,  # type: ignore[arg-type]
                    node=value, details=details)
        for value in HOSTILE.values()
        for status in ("pass", "fail", "skip")
    ]  # fmt: skip
    report = verify.VerifyReport(
        HOSTILE["nul"], HOSTILE["controls"], HOSTILE["surrogates"], "container", HOSTILE["cdata-end"], results, {}
    )
    data = json.loads(verify.report_json(report))
    assert data["results"][0]["details"]["busbw"] == "NaN" and data["results"][0]["details"]["low"] == "-Infinity"
    assert data["image"] == HOSTILE["controls"]
    root = ET.fromstring(verify.junit_xml(report).encode("utf-8"))
    assert len(root.findall(".//testcase")) == len(results)
