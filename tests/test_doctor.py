"""Tests of imgbuild.doctor: against a live engine, an unreachable one, and a stub client."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console

from imgbuild import doctor
from imgbuild.doctor import Check, failed, render_table, run_checks
from imgbuild.errors import DoctorError


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


# An absent name with a known suite (no official ubuntu image has -slim tags), and one only a pull can fetch.
ABSENT_BOOTSTRAPPABLE = "ubuntu:18.04-slim"
ABSENT_PULL_ONLY = "imgbuild-test/doctor-absent:does-not-exist"


# --- live engine -----------------------------------------------------------------------------------------


@pytest.mark.docker
def test_engine_ok_reports_version(docker_client):
    import docker

    checks = run_checks(base_images={}, runtimes_needed={}, client_factory=docker.from_env)
    engine = _by_name(checks)["engine"]
    assert engine.status == "ok"
    assert docker_client.version()["Version"] in engine.detail
    assert "API " in engine.detail and "storage driver" in engine.detail
    assert _by_name(checks)["disk"].status in ("ok", "warn", "info")
    assert failed(checks, None) == []


@pytest.mark.docker
def test_missing_base_images_have_hints(docker_client):
    import docker

    for name in (ABSENT_BOOTSTRAPPABLE, ABSENT_PULL_ONLY):
        try:
            docker_client.images.get(name)
            pytest.skip(f"{name} unexpectedly exists in this engine")
        except docker.errors.ImageNotFound:
            pass
    checks = run_checks(
        base_images={ABSENT_BOOTSTRAPPABLE: ["a100", "h100"], ABSENT_PULL_ONLY: ["gaudi-1.15"]},
        runtimes_needed={},
        client_factory=docker.from_env,
    )
    by_name = _by_name(checks)
    boot = by_name[f"base image {ABSENT_BOOTSTRAPPABLE}"]
    assert boot.status == "missing"
    assert boot.detail == f"imgbuild base bootstrap {ABSENT_BOOTSTRAPPABLE}"
    assert boot.needed_by == ("a100", "h100")
    pull = by_name[f"base image {ABSENT_PULL_ONLY}"]
    assert (pull.status, pull.detail) == ("missing", f"docker pull {ABSENT_PULL_ONLY}")

    assert failed(checks, {"cpu"}) == []
    assert [c.name for c in failed(checks, {"a100"})] == [boot.name]
    assert {c.name for c in failed(checks, None)} >= {boot.name, pull.name}


@pytest.mark.docker
def test_present_base_image_is_ok(docker_client):
    import docker

    images = [t for img in docker_client.images.list() for t in img.tags]
    if not images:
        pytest.skip("the engine has no tagged image")
    checks = run_checks(base_images={images[0]: ["cpu"]}, runtimes_needed={}, client_factory=docker.from_env)
    check = _by_name(checks)[f"base image {images[0]}"]
    assert check.status == "ok" and "MB" in check.detail
    assert failed(checks, {"cpu"}) == []


# --- unreachable engine ----------------------------------------------------------------------------------


def test_unreachable_engine_fails_cleanly(monkeypatch):
    import docker

    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    checks = run_checks(
        base_images={"debian:bookworm-slim": ["cpu"]},
        runtimes_needed={"nvidia": ["a100"]},
        client_factory=docker.from_env,
    )
    by_name = _by_name(checks)
    engine = by_name["engine"]
    assert engine.status == "missing"
    assert "tcp://127.0.0.1:1" in engine.detail
    # Everything else is still reported, and only the engine fails.
    assert by_name["base image debian:bookworm-slim"].status == "warn"
    assert by_name["runtime nvidia"].status == "warn"
    assert "device efa" in by_name and "debootstrap" in by_name
    assert failed(checks, {"cpu"}) == [engine]
    assert failed(checks, set()) == [engine]


def test_client_factory_raising_anything_is_one_failing_check():
    def boom() -> Any:
        raise RuntimeError("socket exploded")

    checks = run_checks(base_images={}, runtimes_needed={}, client_factory=boom)
    assert [c for c in checks if c.status == "missing"] == [checks[0]]
    assert checks[0].name == "engine" and "socket exploded" in checks[0].detail


# --- stub engine: runtimes, devices, table -----------------------------------------------------------------


class _StubImages:
    def __init__(self, present: dict[str, Any]) -> None:
        self.present = present

    def get(self, name: str) -> Any:
        if name in self.present:
            return self.present[name]
        import docker.errors

        raise docker.errors.ImageNotFound(f"No such image: {name}")


class _StubImage:
    short_id = "sha256:0123456789"
    attrs = {"Size": 75_000_000}


class _StubClient:
    def __init__(self, runtimes: dict[str, Any], present: dict[str, Any] | None = None) -> None:
        self._runtimes = runtimes
        self.images = _StubImages(present or {})

    def version(self) -> dict[str, str]:
        return {"Version": "99.0.0", "ApiVersion": "1.99"}

    def info(self) -> dict[str, Any]:
        return {
            "Driver": "overlay2",
            "Runtimes": self._runtimes,
            "DefaultRuntime": "runc",
            "DockerRootDir": "/nonexistent/docker",
            "NCPU": 8,
            "MemTotal": 8 * 1024**3,
        }

    def close(self) -> None:
        pass


def test_runtimes_and_devices(monkeypatch):
    monkeypatch.setattr(
        doctor.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidia1"] if "nvidia" in pattern else []
    )
    checks = run_checks(
        base_images={"debian:bookworm-slim": ["cpu"]},
        runtimes_needed={"nvidia": ["a100", "h100"], "habana": ["gaudi-1.15"]},
        client_factory=lambda: _StubClient({"runc": {}, "nvidia": {}}, {"debian:bookworm-slim": _StubImage()}),
    )
    by_name = _by_name(checks)
    assert by_name["engine"].status == "ok" and "99.0.0" in by_name["engine"].detail
    assert by_name["disk"].status == "info"
    assert by_name["base image debian:bookworm-slim"].status == "ok"
    assert by_name["runtime nvidia"].status == "ok"
    habana = by_name["runtime habana"]
    assert (habana.status, habana.needed_by) == ("missing", ("gaudi-1.15",))
    assert by_name["device nvidia-gpu"].status == "ok" and "2 NVIDIA GPUs" in by_name["device nvidia-gpu"].detail
    assert by_name["device gaudi"].status == "missing"
    assert by_name["device efa"].status == "info"  # nobody said they need it
    assert {c.name for c in failed(checks, {"a100"})} == set()
    assert {c.name for c in failed(checks, {"gaudi-1.15"})} == {"runtime habana", "device gaudi"}


def test_devices_needed_override(monkeypatch):
    monkeypatch.setattr(doctor.glob, "glob", lambda pattern: [])
    checks = run_checks(
        base_images={},
        runtimes_needed={"nvidia": ["a100"]},
        client_factory=lambda: _StubClient({"runc": {}}),
        devices_needed={"efa": ["h100-efa"], "nvidia-gpu": []},
    )
    by_name = _by_name(checks)
    assert by_name["device efa"].status == "missing" and by_name["device efa"].needed_by == ("h100-efa",)
    assert by_name["device nvidia-gpu"].status == "info"
    assert by_name["runtime nvidia"].status == "missing"


def test_failed_selection():
    checks = [
        Check("engine", "ok", "fine"),
        Check("base image a", "missing", "x", ("r1",)),
        Check("base image b", "missing", "x", ("r2",)),
        Check("runtime x", "warn", "?", ("r1",)),
        Check("device y", "info", "none"),
        Check("orphan", "missing", "needed by nobody"),
    ]
    assert [c.name for c in failed(checks, {"r1"})] == ["base image a"]
    assert [c.name for c in failed(checks, {"r3"})] == []
    assert [c.name for c in failed(checks, None)] == ["base image a", "base image b"]
    assert [c.name for c in failed([Check("engine", "missing", "down")], set())] == ["engine"]


def test_render_table():
    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None)
    render_table(
        [
            Check("engine", "ok", "Docker 20.10"),
            Check("base image debian:bookworm-slim", "missing", "hint", ("a", "b")),
        ],
        console,
    )
    text = out.getvalue()
    for word in ("check", "status", "detail", "needed by", "engine", "Docker 20.10", "missing", "a, b"):
        assert word in text


# --- `imgbuild doctor` as users run it --------------------------------------------------------------------


def _doctor(*args: str, sock: str) -> subprocess.CompletedProcess[str]:
    dropped = ("COLUMNS", "NO_COLOR", "DOCKER_TLS_VERIFY", "DOCKER_CONTEXT")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(DOCKER_HOST=f"unix://{sock}", FORCE_COLOR="0")
    return subprocess.run(
        [sys.executable, "-m", "imgbuild", "doctor", *args], capture_output=True, text=True, env=env, check=False
    )


def test_doctor_json_has_the_table_findings_and_its_exit_code(tmp_path):
    sock = str(tmp_path / "no-engine.sock")
    proc = _doctor("cpu", "--json", sock=sock)
    assert proc.returncode == DoctorError.exit_code, proc.stderr
    data = json.loads(proc.stdout)
    assert data["recipes"] == ["cpu"] and data["ok"] is False and data["failed"] == ["engine"]
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["engine"]["status"] == "missing" and sock in checks["engine"]["detail"]
    assert checks["base image debian:bookworm-slim"] == {
        "name": "base image debian:bookworm-slim",
        "status": "warn",
        "detail": "unknown: the engine cannot be reached",
        "needed_by": ["cpu"],
    }
    assert "missing for all: engine" in proc.stderr

    table = _doctor("cpu", sock=sock)
    assert table.returncode == DoctorError.exit_code
    rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines() if line.count("│") > 2}
    assert set(rows) - {"check"} == set(checks), table.stdout
    for name, check in checks.items():
        assert check["status"] in rows[name] and check["detail"] in rows[name], f"{name}:\n{table.stdout}"


def test_engine_check_hint_is_for_an_installed_user(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")

    def refuse() -> Any:
        raise ConnectionRefusedError("Connection refused")

    engine = _by_name(run_checks(base_images={}, runtimes_needed={}, client_factory=refuse))["engine"]
    assert "install and start a Docker engine" in engine.detail and "DOCKER_HOST" in engine.detail
    assert engine.detail.count("scripts/setup.sh") == 1
    assert re.search(r"from a checkout[^;)]*scripts/setup\.sh", engine.detail), engine.detail
