"""Lock files are written atomically through a temporary file no one can predict: parallel `imgbuild lock` runs of
one recipe all succeed and leave a valid lock, a symlink planted at a predictable name is never followed, and the
lock has a plain file's mode. The copies of the cpu recipe have no lock: they lock against the local index
(conftest's `cpu_wheels`)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO
from imgbuild import recipe
from imgbuild.cli import app
from imgbuild.core.errors import LockError
from imgbuild.pin import lock
from localindex import Index


@pytest.fixture
def cpu_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    shutil.copy(REPO / "recipes" / "cpu.yaml", folder / "cpu.yaml")
    return folder / "cpu.yaml"


def test_parallel_lock_runs_all_succeed_and_leave_a_valid_lock(cpu_copy: Path, cpu_wheels: Index) -> None:
    """N real `imgbuild lock` processes of one recipe at once, more than this machine has cores (each also rewrites
    the lock once more, reading the lock the others write meanwhile)."""
    script = f"for i in 1 2; do {sys.executable} -m imgbuild.cli lock {cpu_copy} || exit $?; done"
    procs = [
        subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(max(4, (os.cpu_count() or 1) + 2))
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(outputs)
    assert lock.read(recipe.load(str(cpu_copy))) is not None  # valid, fresh, not edited
    assert sorted(p.name for p in cpu_copy.parent.iterdir()) == ["cpu.lock.json", "cpu.yaml"]  # no temp left


PREDICTABLE = ["cpu.lock.json.tmp", ".cpu.lock.json.tmp", "cpu.lock.json~", "cpu.lock.json.new", ".cpu.lock.json"]


def test_planted_symlinks_are_not_followed(cpu_copy: Path, tmp_path: Path, cpu_wheels: Index) -> None:
    folder = cpu_copy.parent
    victims = {}
    for name in [*PREDICTABLE, "cpu.lock.json"]:
        victim = tmp_path / f"victim-{name.strip('.')}"
        victim.write_text("precious\n")
        (folder / name).symlink_to(victim)
        victims[name] = victim
    result = CliRunner().invoke(app, ["lock", str(cpu_copy)])
    assert result.exit_code == 0, result.output
    assert all(v.read_text() == "precious\n" for v in victims.values())
    written = folder / "cpu.lock.json"
    assert not written.is_symlink() and written.is_file()  # the planted link was replaced, not written through
    assert lock.read(recipe.load(str(cpu_copy))) is not None
    assert all((folder / name).is_symlink() for name in PREDICTABLE)


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_the_lock_has_a_plain_files_mode(cpu_copy: Path, umask: int, mode: int, cpu_wheels: Index) -> None:
    old = os.umask(umask)
    try:
        result = CliRunner().invoke(app, ["lock", str(cpu_copy)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((cpu_copy.parent / "cpu.lock.json").stat().st_mode) == mode


def test_an_unwritable_folder_is_a_lock_error_not_a_crash(cpu_copy: Path, cpu_wheels: Index) -> None:
    if os.geteuid() == 0:
        # root writes anywhere: make the lock's path a folder instead
        (cpu_copy.parent / "cpu.lock.json").mkdir()
    else:
        cpu_copy.parent.chmod(0o555)
    try:
        result = CliRunner().invoke(app, ["lock", str(cpu_copy)])
    finally:
        cpu_copy.parent.chmod(0o755)
    assert result.exit_code == 4, result.output
    assert "cannot write the lock" in result.output
    assert [p.name for p in cpu_copy.parent.iterdir() if p.name.endswith(".tmp")] == []


# ---- a recipe without a lock builds nothing: every command that builds on one is exit 4 naming it

NEEDS_A_LOCK = {
    "render": ["render", "{r}"],
    "render -o": ["render", "{r}", "-o", "{d}/ctx"],
    "build": ["build", "{r}"],
    "verify": ["verify", "{r}"],
    "verify --host": ["verify", "{r}", "--host", "local"],
    "push": ["push", "{r}", "--registry", "127.0.0.1:5000/team"],
    "sbom": ["sbom", "{r}"],
    "sbom -o": ["sbom", "{r}", "-o", "{d}/cpu.cdx.json"],
    "sources fetch": ["sources", "fetch", "{r}", "-o", "{d}/sources"],
    "run --print": ["run", "{r}", "--print"],
    "run": ["run", "{r}", "--", "true"],
    "cluster job": ["cluster", "job", "{r}", "--engine", "slurm", "--nodes", "2"],
    "cluster test": ["cluster", "test", "--hosts", "h1,h2", "--recipe", "{r}"],
    "matrix": ["matrix", "{r}"],
}


@pytest.mark.parametrize("case", sorted(NEEDS_A_LOCK))
def test_a_recipe_without_a_lock_is_refused_by_every_command_that_builds_on_one(cpu_copy: Path, case: str) -> None:
    """No image, Dockerfile, SBOM, sources folder or job from pins nobody locked: exit 4 naming the lock file that is
    missing, with `imgbuild lock RECIPE` as the way on, before any engine, registry or host is asked, and nothing
    written."""
    d = cpu_copy.parent
    args = [a.format(r=cpu_copy, d=d) for a in NEEDS_A_LOCK[case]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == LockError.exit_code == 4, result.output
    stderr = " ".join(result.stderr.split())
    missing = recipe.display(cpu_copy.with_name("cpu.lock.json"))
    assert f"imgbuild: error: {missing}: no such lock: {recipe.display(cpu_copy)} has not been locked" in stderr
    assert f"hint: imgbuild lock {recipe.display(cpu_copy)}" in stderr
    assert result.stdout == "" and "Traceback" not in result.output
    assert sorted(p.name for p in d.iterdir()) == ["cpu.yaml"]  # nothing written, no lock guessed


def test_a_shipped_recipe_without_its_lock_is_named_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint names a shipped recipe as users do (`imgbuild lock cpu`), the lock file by its path."""
    shipped = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", shipped)
    (shipped / "cpu.lock.json").unlink()
    monkeypatch.setenv("IMGBUILD_RECIPES_DIR", str(shipped))
    result = CliRunner().invoke(app, ["build", "cpu"])
    assert result.exit_code == 4, result.output
    assert "cpu.lock.json: no such lock" in result.stderr and "hint: imgbuild lock cpu\n" in result.stderr


def test_show_resolves_a_recipe_without_a_lock_and_says_so(cpu_copy: Path, cpu_wheels: Index) -> None:
    """`show` only shows: without a lock it resolves afresh, says the pins are a fresh resolution, and tags nothing
    `lock-`; once locked it shows the lock and render takes it."""
    runner = CliRunner()
    result = runner.invoke(app, ["show", str(cpu_copy)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "pins from a fresh resolution: no lock yet" in text and f"imgbuild lock {recipe.display(cpu_copy)}" in text
    assert "imgbuild/cpu:unlocked-" in text and ":lock-" not in text
    data = json.loads(runner.invoke(app, ["show", str(cpu_copy), "--json"]).stdout)
    assert data["from"] == "resolved" and data["image"][0].startswith("imgbuild/cpu:unlocked-")
    assert sorted(p.name for p in cpu_copy.parent.iterdir()) == ["cpu.yaml"]
    assert runner.invoke(app, ["lock", str(cpu_copy)]).exit_code == 0
    data = json.loads(runner.invoke(app, ["show", str(cpu_copy), "--json"]).stdout)
    assert data["from"] == "lock" and data["image"][0].startswith("imgbuild/cpu:lock-")
    rendered = runner.invoke(app, ["render", str(cpu_copy)])
    assert rendered.exit_code == 0 and "--require-hashes" in rendered.stdout, rendered.output


# ---- one read of the recipe and its lock per command, handed down (what `imgbuild push cpu --sbom` once read four
# times: the CLI's architectures, the push's, the source lookup's and the SBOM's)

ONE_READ = {
    "render": ["render", "cpu"],
    "build": ["build", "cpu"],
    "build --platform": ["build", "cpu", "--platform", "linux/arm64"],
    "push": ["push", "cpu", "--registry", "127.0.0.1:5000/team"],
    "push --sbom": ["push", "cpu", "--platform", "linux/amd64", "-r", "127.0.0.1:5000/team", "--sbom", "{d}/s.json"],
    "verify": ["verify", "cpu"],
    "sbom": ["sbom", "cpu"],
    "sources fetch": ["sources", "fetch", "cpu", "-o", "{d}/sources"],
    "run --print": ["run", "cpu", "--print"],
    "cluster job": ["cluster", "job", "cpu", "--engine", "slurm", "--nodes", "2"],
}


@pytest.mark.parametrize("case", sorted(ONE_READ))
def test_a_command_reads_its_recipe_and_lock_once(
    case: str, lock_reads: dict[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command resolves its recipe once, in the CLI, and hands the result down (the resolved recipe, its image's
    identity): one `lock.for_ref`, one resolver run (the lock's pins checked against the recipe). With no engine
    here, the commands that need one end there (exit 8), after everything they read before it."""
    from imgbuild.core.errors import EngineError

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    args = [a.format(d=tmp_path) for a in ONE_READ[case]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, EngineError.exit_code), result.output
    assert "Traceback" not in result.output
    assert lock_reads == {"for_ref": 1, "resolve": 1}, result.output


@pytest.mark.parametrize("case", sorted(ONE_READ))
def test_a_command_reads_its_images_identity_once(
    case: str, identity_reads: dict[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command reads its image's identity once (identity.of: the lock's digest and the user's code) and hands
    it down: `run`, `cluster job` and `verify` name the image and compare or use its manifest (render.manifest) by
    the one reading, as the build's plan and the push do. With no engine here, a command that needs one ends there
    (exit 8), after it has read the identity; `sources fetch` asks the engine first, and so ends before."""
    from imgbuild.core.errors import EngineError

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    args = [a.format(d=tmp_path) for a in ONE_READ[case]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, EngineError.exit_code), result.output
    once = 0 if case == "sources fetch" else 1
    assert identity_reads == {"lock_digest": once, "image_digests": once}, result.output


def test_a_lock_is_checked_once_per_process_and_again_when_it_changes(
    cpu_copy: Path, lock_reads: dict[str, int]
) -> None:
    """lock.read checks the pins against the recipe (a resolver run) once per process for one lock and recipe; an
    edited lock is a new pair, checked (and refused) again."""
    path = cpu_copy.with_name("cpu.lock.json")
    shutil.copy(REPO / "recipes" / "cpu.lock.json", path)
    loaded = recipe.load(str(cpu_copy))
    assert lock.read(loaded) is not None and lock.read(recipe.load(str(cpu_copy))) is not None
    assert lock_reads["resolve"] == 1
    data = json.loads(path.read_text())
    data["pins"]["nccl"]["version"] = "2.26.2"
    path.write_text(json.dumps(data))
    with pytest.raises(LockError, match=r"was edited by hand .*nccl.version: lock '2.26.2'"):
        lock.read(loaded)
    assert lock_reads["resolve"] == 2
    shutil.copy(REPO / "recipes" / "cpu.lock.json", path)
    assert lock.read(loaded) is not None and lock_reads["resolve"] == 2  # the lock checked before, as it was


@pytest.mark.parametrize("kind", ["fifo", "loop", "folder"])
def test_a_lock_path_that_is_no_file_is_a_lock_error(cpu_copy: Path, kind: str) -> None:
    """A lock path that is a FIFO (reading it would wait for a writer: render and build hung), a link loop (exit 1,
    RuntimeError) or a folder: refused unread by the one rule for reading files (core/files), exit 4 naming it."""
    path = cpu_copy.with_name("cpu.lock.json")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        path.symlink_to(path.name)
    else:
        path.mkdir()
    for command in ("render", "build"):
        # a process of its own, ended if it waits after all
        ran = subprocess.run(
            [sys.executable, "-m", "imgbuild", command, str(cpu_copy)], capture_output=True, text=True, timeout=120,
            env={**os.environ, "DOCKER_HOST": f"unix://{cpu_copy.parent}/no-engine.sock"}, check=False,
        )  # fmt: skip
        assert ran.returncode == LockError.exit_code, (command, ran.stderr)
        assert f"{path}: unreadable lock file" in ran.stderr or "cpu.lock.json: unreadable lock file" in ran.stderr
        assert "unexpected error" not in ran.stderr
