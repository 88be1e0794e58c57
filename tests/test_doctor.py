"""Tests of imgbuild.build.doctor: against a live engine, an unreachable one, and a stub client."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from imgbuild.build import doctor
from imgbuild.build.doctor import Check, failed, render_table, run_checks
from imgbuild.core.errors import DoctorError


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


# --- the builder: real docker CLIs ------------------------------------------------------------------------

NEW_CLI, OLD_CLI = "/usr/local/bin/docker", "/usr/bin/docker"


def _cli_major(path: str) -> int | None:
    if not os.access(path, os.X_OK):
        return None
    m = re.search(r"version (\d+)\.", subprocess.run([path, "--version"], capture_output=True, text=True).stdout)
    return int(m.group(1)) if m else None


def _need_both_clis() -> None:
    """Debian's docker CLI 20.10 at /usr/bin, a docker CLI 23+ without buildx at /usr/local/bin (this machine's)."""
    new, old = _cli_major(NEW_CLI), _cli_major(OLD_CLI)
    has_buildx = new is not None and subprocess.run([NEW_CLI, "buildx", "version"], capture_output=True).returncode == 0
    if new is None or new < 23 or has_buildx or old is None or old >= 23:
        msg = f"needs docker CLI 20.10 at {OLD_CLI} and a CLI >= 23 without buildx at {NEW_CLI}"
        if os.environ.get("CI") and old is None:
            pytest.fail(msg)
        pytest.skip(msg)


def _env(**extra: str) -> dict[str, str]:
    drop = ("IMGBUILD_DOCKER_CLI", "IMGBUILD_BUILDER")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def test_builder_row_says_which_builder_and_why_and_what_was_skipped():
    from imgbuild.build import builders

    _need_both_clis()
    env = _env(PATH="/usr/local/bin:/usr/bin")
    checks = run_checks(base_images={}, runtimes_needed={}, client_factory=lambda: _StubClient({"runc": {}}),
                        builder_select=lambda: builders.select(env=env))  # fmt: skip
    by_name = _by_name(checks)
    row = by_name["builder"]
    assert row.status == "ok"
    assert row.detail.startswith(f"DOCKER_BUILDKIT=1 docker build through {OLD_CLI} (docker CLI 20.10")
    assert "no buildx plugin, and a docker CLI before 23.0 builds with its own BuildKit client" in row.detail
    assert row.data is not None and row.data["kind"] == "buildkit" and row.data["cli"] == OLD_CLI
    skipped = by_name[f"docker CLI {NEW_CLI}"]
    assert skipped.status == "info" and "no buildx plugin" in skipped.detail and "needs buildx" in skipped.detail
    assert failed(checks, None) == []
    data = doctor.to_json(checks, [], ["cpu"])
    assert data["builder"]["kind"] == "buildkit" and data["builder"]["skipped"][0]["cli"] == NEW_CLI
    assert data["builder"]["registry_cache"] is False and data["builder"]["engine_store"] is True


def test_no_builder_fails_doctor_like_a_missing_engine():
    from imgbuild.build import builders

    _need_both_clis()
    env = _env(IMGBUILD_DOCKER_CLI=NEW_CLI)
    checks = run_checks(base_images={}, runtimes_needed={}, client_factory=lambda: _StubClient({"runc": {}}),
                        builder_select=lambda: builders.select(env=env))  # fmt: skip
    row = _by_name(checks)["builder"]
    assert row.status == "missing" and "no docker CLI here can build with BuildKit" in row.detail
    assert "docker-buildx-plugin" in row.detail  # what to install
    assert failed(checks, set()) == [row] and failed(checks, {"cpu"}) == [row]
    data = doctor.to_json(checks, [row], ["cpu"])
    assert data["builder"]["kind"] is None and "tried" in data["builder"]["error"]
    assert data["builder"]["skipped"][0]["cli"] == NEW_CLI and "buildx" in data["builder"]["hint"]


def test_doctor_json_has_the_builder_and_fails_without_one():
    _need_both_clis()
    base = [sys.executable, "-m", "imgbuild", "doctor", "cpu", "--json"]
    ok = subprocess.run(base, capture_output=True, text=True, env=_env(PATH="/usr/local/bin:/usr/bin"), check=False)
    builder = json.loads(ok.stdout)["builder"]
    assert (builder["kind"], builder["cli"]) == ("buildkit", OLD_CLI), ok.stdout
    assert [s["cli"] for s in builder["skipped"]] == [NEW_CLI]

    bad = subprocess.run(base, capture_output=True, text=True, env=_env(IMGBUILD_DOCKER_CLI=NEW_CLI), check=False)
    assert bad.returncode == DoctorError.exit_code, bad.stderr
    data = json.loads(bad.stdout)
    assert "builder" in data["failed"] and data["builder"]["kind"] is None
    assert "builder (no docker CLI here can build with BuildKit" in bad.stderr

    named = subprocess.run([*base, "--builder", "team"], capture_output=True, text=True,
                           env=_env(PATH="/usr/local/bin:/usr/bin"), check=False)  # fmt: skip
    assert named.returncode == DoctorError.exit_code
    assert "--builder team names a buildx builder" in json.loads(named.stdout)["builder"]["error"]


# --- the host's NVIDIA driver against the images' CUDA (blocks.cuda.driver), and IMEX channels -------------------

# /proc/driver/nvidia/version as hosts print it: the proprietary module's line, then the open module's (arm64's too).
PROC_PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.144.03  Mon Dec 30 17:44:08 UTC 2024\n"
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
    "(dvs-builder@U22-I3-B17-02-5)  Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 11.4.0 (Ubuntu)\n"
)


def test_the_driver_is_read_as_nvidia_smi_and_the_kernel_module_print_it():
    from imgbuild.blocks.cuda import driver

    assert driver.parse("580.95.05\n580.95.05\n") == ("580.95.05", "nvidia-smi")  # one line per GPU
    assert driver.parse(PROC_PROPRIETARY) == ("550.144.03", driver.PROC_VERSION)
    assert driver.parse(PROC_OPEN) == ("580.95.05", driver.PROC_VERSION)
    assert driver.parse("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.135  Fri Jan 10 2025") == (
        "550.135", driver.PROC_VERSION
    )  # fmt: skip
    smi_failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    assert driver.parse(smi_failed) is None and driver.parse("") is None


def test_the_driver_a_cuda_needs_is_nvidias_minor_version_table():
    from imgbuild.blocks.cuda import driver, driver_floors, release_file

    assert driver_floors() == {11: "450.80.02", 12: "525.60.13", 13: "580"}
    assert all(row.source for row in release_file().releases)
    smi = ("580.95.05", "nvidia-smi")
    ok = driver.judge(smi, "13.0.1")
    assert (ok.status, ok.needs) == ("ok", "580")
    assert driver.judge(("580.65.06", "nvidia-smi"), "13.2").status == "ok"  # any 580 runs every 13.x
    assert driver.judge(("525.60.13", "nvidia-smi"), "12.8.1").status == "ok"  # the exact floor
    assert driver.judge(("525.60.11", "nvidia-smi"), "12.8.1").status == "behind"
    behind = driver.judge(("550.144.03", driver.PROC_VERSION), "13.0.1")
    assert (behind.status, behind.needs, behind.source) == ("behind", "580", driver.PROC_VERSION)
    assert "upgrade the host's NVIDIA driver to 580 or newer" in behind.advice
    assert "to 580 or newer, or use an image built for CUDA 12.x, which this driver runs;" in behind.advice
    assert "data-centre GPUs only" in behind.advice and "cuda-compat-13-" in behind.advice
    ancient = driver.judge(("418.39", "nvidia-smi"), "12.8")
    assert ancient.status == "behind"
    assert "to 525.60.13 or newer (no CUDA major release in the table runs on this driver);" in ancient.advice
    none = driver.judge(None, "13.0.1")
    assert (none.status, none.driver) == ("no driver", None) and ">= 580" in none.advice
    assert driver.judge(smi, "10.2").status == "unknown"
    assert driver.judge(smi, None).status == "unknown"


def test_image_cuda_is_the_cuda_pin_else_torchs_wheel():
    from imgbuild import recipe
    from imgbuild.blocks.cuda import driver
    from imgbuild.pin.lock import lock_or_fresh

    def cuda_of(name: str) -> str | None:
        return driver.image_cuda(lock_or_fresh(recipe.load(name).concrete())[0].pins)

    assert cuda_of("h100") == "13.2.2"  # the base image's CUDA (its lock's cuda pin)
    assert cuda_of("pytorch") == "12.8"  # no cuda pin: the CUDA its torch wheel is built for
    assert cuda_of("cpu") is None and cuda_of("gaudi-1.15") is None


def _driver_row(checks: list[Check]) -> Check:
    return _by_name(checks)[doctor.DRIVER_CHECK]


def test_driver_row_ok_behind_and_none():
    stub = lambda: _StubClient({"runc": {}})  # noqa: E731
    cudas = {"13.0.1": ["h100", "b200"], "12.8.1": ["a100"]}
    behind = run_checks(base_images={}, runtimes_needed={}, client_factory=stub, cuda_needed=cudas,
                        read_driver=lambda: PROC_PROPRIETARY)  # fmt: skip
    row = _driver_row(behind)
    assert (row.status, row.needed_by) == ("missing", ("b200", "h100"))
    assert row.detail.startswith("NVIDIA driver 550.144.03 (/proc/driver/nvidia/version): b200, h100 (CUDA 13.0.1)")
    assert [c.name for c in failed(behind, {"a100"})] == [] and [c.name for c in failed(behind, {"h100"})] == [row.name]
    data = doctor.to_json(behind, failed(behind, None), ["a100", "b200", "h100"])["driver"]
    assert (data["status"], data["version"], data["source"]) == ("behind", "550.144.03", "/proc/driver/nvidia/version")
    by_cuda = {i["cuda"]: i for i in data["images"]}
    assert (by_cuda["13.0.1"]["status"], by_cuda["13.0.1"]["needs"], by_cuda["13.0.1"]["recipes"]) == (
        "behind", "580", ["b200", "h100"]
    )  # fmt: skip
    assert (by_cuda["12.8.1"]["status"], by_cuda["12.8.1"]["needs"]) == ("ok", "525.60.13")

    ok = _driver_row(run_checks(base_images={}, runtimes_needed={}, client_factory=stub, cuda_needed=cudas,
                                read_driver=lambda: "580.95.05\n"))  # fmt: skip
    assert ok.status == "ok" and ok.detail.startswith("NVIDIA driver 580.95.05 (nvidia-smi): runs CUDA 12.8.1 (a100")
    none = _driver_row(run_checks(base_images={}, runtimes_needed={}, client_factory=stub, cuda_needed=cudas,
                                  read_driver=lambda: ""))  # fmt: skip
    assert none.status == "info" and none.needed_by == ()
    assert none.detail.startswith("no NVIDIA driver here") and "CUDA 13.0.1 (b200, h100) needs >= 580" in none.detail
    assert none.data is not None and none.data["status"] == "no driver"


def _fake_nvidia_smi(folder: Any, version: str) -> str:
    """A bin folder whose nvidia-smi answers the driver query as a GPU host's does (this machine has no GPU)."""
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' {version} {version}\n")
    smi.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


def test_doctor_reports_the_driver_finding(tmp_path):
    """`imgbuild doctor --json` as users run it: here (no GPU) no driver, cleanly; on a host whose nvidia-smi says
    550.x, h100's CUDA 13 is behind (exit 13, what to do) while a100's CUDA 12.8 runs."""
    sock = str(tmp_path / "no-engine.sock")
    here = json.loads(_doctor("h100", "a100", "--json", sock=sock).stdout)
    if here["driver"]["version"] is None:  # this machine: no GPU, no driver
        assert here["driver"]["status"] == "no driver"
        row = {c["name"]: c for c in here["checks"]}["host driver"]
        assert row["status"] == "info" and "host driver" not in here["failed"]
    env = {**os.environ, "PATH": _fake_nvidia_smi(tmp_path / "bin", "550.144.03")}
    dropped = ("COLUMNS", "NO_COLOR", "DOCKER_TLS_VERIFY", "DOCKER_CONTEXT")
    env = {k: v for k, v in env.items() if k not in dropped}
    env.update(DOCKER_HOST=f"unix://{sock}", FORCE_COLOR="0")
    proc = subprocess.run([sys.executable, "-m", "imgbuild", "doctor", "h100", "a100", "--json"],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert proc.returncode == DoctorError.exit_code, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["driver"]["status"], data["driver"]["version"], data["driver"]["source"]) == (
        "behind", "550.144.03", "nvidia-smi"
    )  # fmt: skip
    assert "host driver" in data["failed"]
    assert {i["cuda"]: i["status"] for i in data["driver"]["images"]} == {"13.2.2": "behind", "12.8.1": "ok"}
    assert "host driver (NVIDIA driver 550.144.03 (nvidia-smi): h100 (CUDA 13.2.2)" in proc.stderr
    assert "upgrade the host's NVIDIA driver to 580 or newer" in proc.stderr


def test_imex_row_says_what_nvlink_across_nodes_needs(monkeypatch):
    stub = lambda: _StubClient({"runc": {}})  # noqa: E731
    monkeypatch.setattr(doctor.glob, "glob", lambda pattern: [])
    row = _by_name(run_checks(base_images={}, runtimes_needed={}, client_factory=stub, imex_needed=["gb200"],
                              read_driver=lambda: ""))["imex channels"]  # fmt: skip
    assert (row.status, row.needed_by) == ("info", ("gb200",))  # made per job: never a failure of doctor
    assert "/dev/nvidia-caps-imex-channels/channelN" in row.detail and "insufficient permission" in row.detail
    assert "Slurm (AWS PCS) a job prolog" in row.detail and "ComputeDomain" in row.detail
    channels = ["/dev/nvidia-caps-imex-channels/channel0"]
    monkeypatch.setattr(doctor.glob, "glob", lambda pattern: channels if "imex" in pattern else [])
    row = _by_name(run_checks(base_images={}, runtimes_needed={}, client_factory=stub, read_driver=lambda: ""))[
        "imex channels"
    ]
    assert row.status == "info" and row.detail.startswith("1 IMEX channel(s): /dev/nvidia-caps-imex-channels/channel0")


def _smi_printing(folder: Any, script: str) -> dict[str, str]:
    """The environment of a host whose nvidia-smi runs `script` (sh), an engine that does not answer."""
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "DOCKER_CONTEXT")}
    return {**env, "PATH": f"{folder}:{os.environ['PATH']}", "DOCKER_HOST": f"unix://{folder}/no.sock"}


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("printf '580.\\377\\376.04\\n'", "printed '580.\ufffd\ufffd.04', which holds no driver version"),
        (f"printf '{'5' * 5000}\\n'", "(5000 characters)', which holds no driver version"),
        ("printf '\\000\\033[31m580\\n'", "which holds no driver version"),
    ],
    ids=["invalid-utf8", "5000-digits", "control-bytes"],
)
def test_doctor_reports_whatever_nvidia_smi_prints_as_a_finding(tmp_path, script: str, words: str) -> None:
    """Whatever the host's nvidia-smi prints, `doctor --json` writes its JSON (exit 13 here: no engine) with the
    driver as a finding (unknown, saying what it printed, shortened), never "no driver" and never exit 1."""
    env = _smi_printing(tmp_path / "bin", script)
    proc = subprocess.run([sys.executable, "-m", "imgbuild", "doctor", "h100", "--json"],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert proc.returncode == DoctorError.exit_code, proc.stderr
    data = json.loads(proc.stdout)
    assert data["driver"]["status"] == "unknown" and words in data["driver"]["printed"], data["driver"]
    assert {i["status"] for i in data["driver"]["images"]} == {"unknown"}
    assert len(proc.stdout) < 20_000


def test_a_slow_nvidia_smi_is_ended_and_reported(tmp_path, monkeypatch) -> None:
    """nvidia-smi that does not answer: ended with its shell when the wait is over (nothing left running), and the
    driver finding says so instead of "no driver"."""
    from imgbuild.blocks.cuda import driver

    pidfile = tmp_path / "smi.pid"
    env = _smi_printing(tmp_path / "bin", f"echo $$ > {pidfile}\nexec sleep 300")
    monkeypatch.setenv("PATH", env["PATH"])
    printed = driver.read_here(timeout_s=1)
    assert printed == driver.NO_ANSWER.format(seconds="1")
    stat = Path(f"/proc/{int(pidfile.read_text())}/stat")

    def running() -> bool:  # gone, or a zombie its new parent has not reaped yet: not running either way
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError):
            return False

    deadline = time.monotonic() + 5  # SIGKILL is delivered at once; its exit finishes a moment later
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running()
    finding = driver.judge(driver.parse(printed), "13.2.2", printed)
    assert finding.status == "unknown" and "within 1 s: it was ended" in finding.advice
