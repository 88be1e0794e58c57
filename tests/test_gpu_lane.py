"""scripts/gpu-lane.sh on a machine without a GPU: the pack installs and the lane runs as far as the GPU step, where
every GPU test fails saying so (the runner is what `docs/development.md` tells developers to run on a GPU host)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "gpu-lane.sh"
GPU_TESTS = 5  # tests/test_gpu.py's tests


def lane(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )  # fmt: skip


def test_usage_errors_name_what_is_wrong(tmp_path: Path) -> None:
    ran = lane()
    assert ran.returncode == 2 and "usage: gpu-lane.sh pack|run [DIR]" in ran.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    ran = lane("pack", str(tmp_path / "full"))
    assert ran.returncode == 1 and f"{tmp_path / 'full'} is not empty" in ran.stderr
    ran = lane("pack", str(tmp_path / "new"), env={"GPU_LANE_HAVE": str(tmp_path / "nope")})
    assert ran.returncode == 1 and f"GPU_LANE_HAVE={tmp_path / 'nope'}: no such file" in ran.stderr
    assert not (tmp_path / "new").exists()
    ran = lane("run", str(tmp_path / "full"))
    assert ran.returncode == 1 and "is no pack (no wheels/ or files/)" in ran.stderr


def test_a_failed_pack_or_run_leaves_nothing_behind(tmp_path: Path) -> None:
    """A pack that fails (here its Python does) removes the folder it made, or what it put in an empty one it was
    given, and its temporary folder; a run that fails (a pack without imgbuild's wheel) removes its venv."""
    scratch = tmp_path / "scratch"  # TMPDIR: where mktemp makes their temporary folders
    scratch.mkdir()
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\necho 'no Python here' >&2\nexit 3\n")
    failing.chmod(0o755)
    given = tmp_path / "given"
    given.mkdir()
    for folder in (tmp_path / "new", given):
        ran = lane("pack", str(folder), env={"PYTHON": str(failing), "TMPDIR": str(scratch)})
        assert ran.returncode != 0 and "no Python here" in ran.stderr, ran.stderr
        assert not list(scratch.iterdir())
    assert not (tmp_path / "new").exists() and given.is_dir() and not list(given.iterdir())

    pack = tmp_path / "pack"
    for sub in ("wheels", "files"):
        (pack / sub).mkdir(parents=True)
    ran = lane("run", str(pack), env={"TMPDIR": str(scratch), "OUT": str(tmp_path / "out")}, timeout=300)
    assert ran.returncode != 0 and "a virtual environment over this host's packages" in ran.stdout, ran.stderr
    assert not list(scratch.iterdir())


def test_the_have_list_names_distributions() -> None:
    names = [line for line in (REPO / "scripts" / "gpu-lane.have").read_text().splitlines() if line[:1] != "#"]
    assert "torch" in names and "numpy" in names and "imgbuild" not in names
    assert all(name and " " not in name for name in names)


@pytest.mark.network
def test_the_runner_goes_as_far_as_the_gpu_step_on_a_cpu_machine(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has an NVIDIA driver: run the lane itself (scripts/gpu-lane.sh run)")
    pack = tmp_path / "pack"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    # for this machine's Python, and everything packed (this Python's environment is not the GPU machine's)
    ran = lane("pack", str(pack), env={"GPU_LANE_PYTHON_VERSION": version, "GPU_LANE_HAVE": "none",
                                       "GPU_LANE_BUDGET_MIB": "400"}, timeout=600)  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    wheels = sorted(p.name for p in (pack / "wheels").iterdir())
    assert any(w.startswith("imgbuild-") for w in wheels) and any(w.startswith("pytest_testinfra-") for w in wheels)
    assert (pack / "files" / "nccl-tests-2.19.6.tar.gz").is_file()

    out = tmp_path / "out"
    ran = lane("run", str(pack), env={"OUT": str(out)}, timeout=600)
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert "imgbuild from " in ran.stdout and "/venv/lib/" in ran.stdout.split("imgbuild from ", 1)[1].split()[0]
    suite = ET.parse(out / "gpu-lane.xml").getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == GPU_TESTS, [c.get("name") for c in cases]
    for case in cases:
        problem = case.find("error") if case.find("error") is not None else case.find("failure")
        assert problem is not None, case.get("name")
        assert "the gpu lane needs an NVIDIA GPU and its driver: nvidia-smi is not on PATH" in (
            problem.get("message") or ""
        ) + (problem.text or "")
    assert (out / "gpu-lane.log").read_text().count("nvidia-smi is not on PATH") >= GPU_TESTS
