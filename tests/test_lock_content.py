"""Locks pin content: the shipped locks record base digests, download checksums and wheel hashes, each with where it
came from; a lock from an older imgbuild (no content) or with a hash edited by hand is refused with how to refresh it;
`imgbuild lock --check` re-reads the world and exits 15 on any drift (what a nightly job runs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from imgbuild.cli import app
from imgbuild.pin import lock
from imgbuild.pin.content import Content
from imgbuild.spec import recipe


@pytest.fixture
def cpu_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    for name in ("cpu.yaml", "cpu.lock.json"):
        shutil.copy(REPO / "recipes" / name, folder / name)
    return folder / "cpu.yaml"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_lock_records_content_with_origins(name: str) -> None:
    resolved = lock.read(recipe.load(name).concrete())
    assert resolved is not None and resolved.content is not None
    content = resolved.content
    assert content.bases, "every lock names its bases"
    for base in content.bases.values():
        assert base.origin  # a digest, or why there is none
    for dl in content.downloads.values():
        assert dl.origin and (dl.sha256 is not None or dl.origin.startswith("unestablished"))
    assert resolved.locked_at


def test_cpu_and_pytorch_pin_every_wheel_by_hash() -> None:
    for name, must in (("cpu", {"nvidia-nccl-cu12"}), ("pytorch", {"torch", "nvidia-nccl-cu12", "numpy"})):
        resolved = lock.read(recipe.load(name).concrete())
        assert resolved is not None and resolved.content is not None
        names = {r.name for reqs in resolved.content.python.values() for r in reqs}
        assert must <= names, (name, names)
        assert all(r.hashes for reqs in resolved.content.python.values() for r in reqs)


def _rewrite(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def test_a_lock_without_content_says_how_to_refresh_it(cpu_copy: Path) -> None:
    _rewrite(cpu_copy.with_name("cpu.lock.json"), lambda d: d.update(lock_version=2))
    result = CliRunner().invoke(app, ["render", str(cpu_copy)])
    assert result.exit_code == 4, result.output
    assert "older imgbuild" in result.output and "hint: imgbuild lock" in result.output


def test_a_hash_edited_by_hand_is_refused(cpu_copy: Path) -> None:
    def edit(data: dict) -> None:
        req = next(iter(data["content"]["python"].values()))[0]
        req["hashes"][0] = "sha256:" + "0" * 64

    _rewrite(cpu_copy.with_name("cpu.lock.json"), edit)
    result = CliRunner().invoke(app, ["render", str(cpu_copy)])
    assert result.exit_code == 4, result.output
    assert "content was edited by hand" in result.output


def test_lock_check_passes_on_a_fresh_lock(cpu_copy: Path) -> None:
    result = CliRunner().invoke(app, ["lock", str(cpu_copy), "--check"])
    assert result.exit_code == 0, result.output
    assert "matches what resolves today" in result.output


def test_lock_check_reports_a_wheel_served_with_another_hash(cpu_copy: Path) -> None:
    """What a re-uploaded wheel looks like from the lock's side: the lock (consistently, its digest updated) records
    a hash the index no longer serves. --check names the distribution and exits 15, writing nothing."""
    path = cpu_copy.with_name("cpu.lock.json")

    def edit(data: dict) -> None:
        req = next(iter(data["content"]["python"].values()))[0]
        req["hashes"] = ["sha256:" + "1" * 64]
        data["content_digest"] = Content.model_validate(data["content"]).digest()

    _rewrite(path, edit)
    before = path.read_text()
    result = CliRunner().invoke(app, ["lock", str(cpu_copy), "--check"])
    assert result.exit_code == 15, result.output
    assert "nvidia-nccl-cu12==2.27.5: hashes changed" in result.output
    assert path.read_text() == before


def test_lock_check_reports_a_changed_recipe(cpu_copy: Path) -> None:
    text = cpu_copy.read_text().replace("packages: [ca-certificates, iproute2, procps]", "packages: [iproute2, procps]")
    cpu_copy.write_text(text)
    result = CliRunner().invoke(app, ["lock", str(cpu_copy), "--check"])
    assert result.exit_code == 15, result.output
    assert "stale" in result.output


@pytest.mark.docker
def test_relocking_unchanged_content_keeps_the_lock_identical(cpu_copy: Path, docker_client: object) -> None:
    path = cpu_copy.with_name("cpu.lock.json")
    before = path.read_text()
    result = CliRunner().invoke(app, ["lock", str(cpu_copy)])
    assert result.exit_code == 0, result.output
    assert path.read_text() == before  # same content: same locked_at, same image tag
