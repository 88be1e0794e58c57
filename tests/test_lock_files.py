"""Lock files are written atomically through a temporary file no one can predict: parallel `imgbuild lock` runs of
one recipe all succeed and leave a valid lock, a symlink planted at a predictable name is never followed, and the
lock has a plain file's mode."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO
from imgbuild.cli import app
from imgbuild.pin import lock
from imgbuild.spec import recipe


@pytest.fixture
def cpu_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    shutil.copy(REPO / "recipes" / "cpu.yaml", folder / "cpu.yaml")
    return folder / "cpu.yaml"


def test_parallel_lock_runs_all_succeed_and_leave_a_valid_lock(cpu_copy: Path) -> None:
    """N real `imgbuild lock` processes of one recipe at once (each also rewrites the lock a few times)."""
    script = f"for i in 1 2 3; do {sys.executable} -m imgbuild.cli lock {cpu_copy} --offline || exit $?; done"
    procs = [
        subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(6)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(outputs)
    assert lock.read(recipe.load(str(cpu_copy))) is not None  # valid, fresh, not edited
    assert sorted(p.name for p in cpu_copy.parent.iterdir()) == ["cpu.lock.json", "cpu.yaml"]  # no temp left


PREDICTABLE = ["cpu.lock.json.tmp", ".cpu.lock.json.tmp", "cpu.lock.json~", "cpu.lock.json.new", ".cpu.lock.json"]


def test_planted_symlinks_are_not_followed(cpu_copy: Path, tmp_path: Path) -> None:
    folder = cpu_copy.parent
    victims = {}
    for name in [*PREDICTABLE, "cpu.lock.json"]:
        victim = tmp_path / f"victim-{name.strip('.')}"
        victim.write_text("precious\n")
        (folder / name).symlink_to(victim)
        victims[name] = victim
    result = CliRunner().invoke(app, ["lock", str(cpu_copy), "--offline"])
    assert result.exit_code == 0, result.output
    assert all(v.read_text() == "precious\n" for v in victims.values())
    written = folder / "cpu.lock.json"
    assert not written.is_symlink() and written.is_file()  # the planted link was replaced, not written through
    assert lock.read(recipe.load(str(cpu_copy))) is not None
    assert all((folder / name).is_symlink() for name in PREDICTABLE)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_the_lock_has_a_plain_files_mode(cpu_copy: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        result = CliRunner().invoke(app, ["lock", str(cpu_copy), "--offline"])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((cpu_copy.parent / "cpu.lock.json").stat().st_mode) == mode


def test_an_unwritable_folder_is_a_lock_error_not_a_crash(cpu_copy: Path) -> None:
    if os.geteuid() == 0:
        # root writes anywhere: make the lock's path a folder instead
        (cpu_copy.parent / "cpu.lock.json").mkdir()
    else:
        cpu_copy.parent.chmod(0o555)
    try:
        result = CliRunner().invoke(app, ["lock", str(cpu_copy), "--offline"])
    finally:
        cpu_copy.parent.chmod(0o755)
    assert result.exit_code == 4, result.output
    assert "cannot write the lock" in result.output
    assert [p.name for p in cpu_copy.parent.iterdir() if p.name.endswith(".tmp")] == []
