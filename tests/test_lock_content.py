"""Locks pin content: the shipped locks record base digests, download checksums and wheel hashes, each with where it
came from; a lock from an older imgbuild (no content) or with a hash edited by hand is refused with how to refresh it;
`imgbuild lock --check` re-reads the world and exits 15 on any drift of content or recipe (what a nightly job runs).

Relocking keeps the lock's versions, as uv and pip-tools keep an existing output's pins: a newer release on the index
is neither drift nor a reason to rewrite the lock (`imgbuild outdated` reports it; --upgrade / --upgrade-package take
it). Those tests run against a package index on 127.0.0.1 (conftest's `index_env`: real wheels, served and changed
by the test), so they judge only what the test itself changes; the ones marked `network` read the real index and
hold whatever it publishes next."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from imgbuild import recipe
from imgbuild.cli import app
from imgbuild.core.errors import LockError
from imgbuild.pin import lock
from localindex import Index, make_wheel


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


@pytest.mark.network
def test_lock_check_on_the_shipped_lock_holds_whatever_the_index_publishes_next(cpu_copy: Path) -> None:
    """The shipped cpu lock against the real index: its unpinned dependencies (botocore, urllib3...) have newer
    releases than the lock records, or will have; none of them is drift."""
    result = CliRunner().invoke(app, ["lock", str(cpu_copy), "--check"])
    assert result.exit_code == 0, result.output
    assert "matches what resolves today (a newer release is not drift" in result.output


@pytest.mark.docker
@pytest.mark.network
def test_relocking_unchanged_content_keeps_the_lock_identical(cpu_copy: Path, docker_client: object) -> None:
    path = cpu_copy.with_name("cpu.lock.json")
    before = path.read_text()
    result = CliRunner().invoke(app, ["lock", str(cpu_copy)])
    assert result.exit_code == 0, result.output
    assert path.read_text() == before  # same content: same locked_at, same image tag


# ------------------------------------------------------------------------------------------------------------
# Against a local index: relocking keeps pins; --check reports content and recipe, not newer releases

# The cpu image with the user's requirement top-lib, which depends on dep-lib (any version): dep-lib is what a
# newer release on the index could move. The SageMaker block's boto3 is not on the local index: left out.
MINE = "extends: cpu\ndescription: mine\ncomponents: {sagemaker: null}\napp: {requirements: [top-lib==1.0]}\n"


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def wheel(index: Index, tmp_path: Path, project: str, version: str, requires: tuple[str, ...] = (), **kw: bool) -> str:
    """A real wheel of `project` `version` on the index (py3-none-any: every architecture installs it, one hash); new
    bytes each time (make_wheel's random payload). Returns its file name."""
    filename = f"{project.replace('-', '_')}-{version}-py3-none-any.whl"
    index.add_wheel(project, filename, make_wheel(tmp_path, filename, list(requires), junk=2000), **kw)
    return filename


def versions(path: Path) -> dict[str, str]:
    """The Python distributions the recipe's lock pins (read as render reads it: fresh, not edited)."""
    locked = lock.read(recipe.load(path).concrete())
    assert locked is not None and locked.content is not None
    return {r.name: r.version for reqs in locked.content.python.values() for r in reqs}


@pytest.fixture
def mine(index_env: Index, recipe_dir: Path, tmp_path: Path) -> Path:
    """MINE, locked against the local index while dep-lib 1.0 is its newest release."""
    wheel(index_env, tmp_path, "nvidia-nccl-cu12", recipe.load("cpu").recipe.components.nccl.version)
    wheel(index_env, tmp_path, "top-lib", "1.0", ("dep-lib>=1.0",))
    wheel(index_env, tmp_path, "dep-lib", "1.0")
    path = recipe_dir / "mine.yaml"
    path.write_text(MINE)
    result = run("lock", str(path))
    assert result.exit_code == 0, result.output
    assert versions(path)["dep-lib"] == "1.0"
    return path


def test_a_newer_release_is_not_drift_and_relocking_keeps_the_pin(mine: Path, index_env: Index, tmp_path: Path) -> None:
    wheel(index_env, tmp_path, "dep-lib", "1.1")
    lock_file = mine.with_name("mine.lock.json")
    before = lock_file.read_text()
    check = run("lock", str(mine), "--check")
    assert check.exit_code == 0, check.output
    assert f"a newer release is not drift: imgbuild outdated {mine} reports the components'" in check.stdout
    assert f"imgbuild lock {mine} --upgrade takes them" in check.stdout
    relock = run("lock", str(mine))
    assert relock.exit_code == 0, relock.output
    assert lock_file.read_text() == before  # byte for byte: locked_at too, so the same image tags
    assert "dep-lib" not in relock.stdout


@pytest.mark.parametrize("args", [["--upgrade-package", "dep-lib"], ["-P", "Dep_Lib"], ["--upgrade"]])
def test_upgrade_releases_the_locked_versions(mine: Path, index_env: Index, tmp_path: Path, args: list[str]) -> None:
    wheel(index_env, tmp_path, "dep-lib", "1.1")
    text = mine.read_text()
    result = run("lock", str(mine), *args)
    assert result.exit_code == 0, result.output
    assert "python app: dep-lib 1.0 -> 1.1" in result.stdout
    assert {name: v for name, v in versions(mine).items() if name.endswith("-lib")} == {
        "top-lib": "1.0",
        "dep-lib": "1.1",
    }
    assert mine.read_text() == text  # a distribution is not a recipe value: the recipe stays as it was
    assert run("lock", str(mine), "--check").exit_code == 0


def test_the_same_version_with_other_bytes_is_drift(mine: Path, index_env: Index, tmp_path: Path) -> None:
    """A re-uploaded wheel: dep-lib 1.0 served with other bytes. --check names it and exits 15, writing nothing."""
    lock_file = mine.with_name("mine.lock.json")
    before = lock_file.read_text()
    index_env.remove("dep-lib", "dep_lib-1.0-py3-none-any.whl")
    wheel(index_env, tmp_path, "dep-lib", "1.0")  # new bytes, the same name and version
    result = run("lock", str(mine), "--check")
    assert result.exit_code == 15, result.output
    assert "python app: dep-lib==1.0: hashes changed (gone: " in result.stdout
    assert "the lock differs from what resolves today (1 difference)" in result.stderr
    assert lock_file.read_text() == before


def test_a_pin_gone_from_the_index_is_drift(mine: Path, index_env: Index, tmp_path: Path) -> None:
    wheel(index_env, tmp_path, "dep-lib", "1.1")
    index_env.remove("dep-lib", "dep_lib-1.0-py3-none-any.whl")
    result = run("lock", str(mine), "--check")
    assert result.exit_code == 15, result.output
    assert "python app: dep-lib==1.0 no longer resolves" in result.stdout and "1.1 resolves instead" in result.stdout
    relock = run("lock", str(mine))  # what no longer resolves moves; nothing else does
    assert relock.exit_code == 0, relock.output
    assert "python app: dep-lib 1.0 -> 1.1" in relock.stdout
    assert versions(mine)["dep-lib"] == "1.1"


def test_a_yanked_pin_is_drift_and_kept_when_relocking(mine: Path, index_env: Index, tmp_path: Path) -> None:
    """PEP 592: a release pinned exactly still installs when yanked (pip, uv), so the lock keeps it, saying so; the
    nightly --check reports it."""
    wheel(index_env, tmp_path, "dep-lib", "1.1")
    name = "dep_lib-1.0-py3-none-any.whl"
    data = index_env.server.files[f"/files/{name}"]
    index_env.remove("dep-lib", name)
    index_env.add_wheel("dep-lib", name, data, yanked=True)  # the same bytes, yanked
    lock_file = mine.with_name("mine.lock.json")
    before = lock_file.read_text()
    result = run("lock", str(mine), "--check")
    assert result.exit_code == 15, result.output
    assert "python app: dep-lib==1.0 is yanked on the index" in result.stdout
    assert f"imgbuild lock {mine} --upgrade-package dep-lib moves it" in result.stdout
    relock = run("lock", str(mine))
    assert relock.exit_code == 0, relock.output
    assert "warning: python app: dep-lib==1.0 is yanked on the index" in relock.stderr
    assert lock_file.read_text() == before


def test_a_recipe_edit_keeps_the_pins_it_still_allows(mine: Path, index_env: Index, tmp_path: Path) -> None:
    """The lock is stale (--check says so), and relocking it keeps dep-lib 1.0: the edit does not touch it."""
    wheel(index_env, tmp_path, "dep-lib", "1.1")
    mine.write_text(MINE.replace("description: mine", "description: mine, edited"))
    check = run("lock", str(mine), "--check")
    assert check.exit_code == 15, check.output
    assert "mine.lock.json is stale" in check.stderr
    relock = run("lock", str(mine))
    assert relock.exit_code == 0, relock.output
    assert versions(mine)["dep-lib"] == "1.0"


def test_a_recipe_edit_moves_a_pin_that_no_longer_fits(mine: Path, index_env: Index, tmp_path: Path) -> None:
    for version in ("1.1", "1.2"):
        wheel(index_env, tmp_path, "dep-lib", version)
    wheel(index_env, tmp_path, "top-lib", "2.0", ("dep-lib>=1.1",))
    mine.write_text(MINE.replace("top-lib==1.0", "top-lib==2.0"))
    result = run("lock", str(mine))
    assert result.exit_code == 0, result.output
    assert "python app: top-lib 1.0 -> 2.0" in result.stdout and "python app: dep-lib 1.0 -> 1.2" in result.stdout
    assert versions(mine)["dep-lib"] == "1.2"  # the newest that fits, as uv takes a preference that no longer does


def test_an_unreadable_lock_keeps_nothing_and_says_so(mine: Path, index_env: Index, tmp_path: Path) -> None:
    wheel(index_env, tmp_path, "dep-lib", "1.1")
    mine.with_name("mine.lock.json").write_text("{not json")
    result = run("lock", str(mine))
    assert result.exit_code == 0, result.output
    assert "mine.lock.json: unreadable lock file" in result.stderr and "none of its versions is kept" in result.stderr
    assert versions(mine)["dep-lib"] == "1.1"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("dep-lib==1.1", "dep-lib is a Python distribution the lock pins, not a component"),
        ("no-such-lib", "mine: no pinned component or locked Python distribution 'no-such-lib'"),
    ],
)
def test_upgrade_package_names_a_component_or_a_locked_distribution(mine: Path, item: str, message: str) -> None:
    before = mine.with_name("mine.lock.json").read_text()
    result = run("lock", str(mine), "--upgrade-package", item)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    if item == "no-such-lib":
        assert "its components: " in result.stderr
        assert "the lock's distributions: dep-lib, nvidia-nccl-cu12, top-lib" in result.stderr
    assert mine.with_name("mine.lock.json").read_text() == before


# ---- offline, a requirement set resolved from the same inputs is taken from the lock at hand


def test_an_offline_lock_takes_the_parents_sets_with_no_cache_and_no_network(recipe_dir: Path) -> None:
    """A user's recipe that extends cpu and changes none of its requirement sets locks --offline on a fresh machine
    (this session's uv cache is empty and the fast lane has loopback only): each set is the parent lock's, hashes
    included, and `lock` says where it took them; relocked, they come from its own lock."""
    path = recipe_dir / "mine.yaml"
    path.write_text("extends: cpu\nos: {packages: [less]}\n")
    result = run("lock", str(path), "--offline")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert "python python/uv, nccl, sagemaker: from " in said and "cpu.lock.json (--offline:" in said, said
    mine, cpu = lock.read(recipe.load(str(path)).concrete()), lock.read(recipe.load("cpu"))
    assert mine is not None and cpu is not None and mine.content is not None and cpu.content is not None
    assert mine.content.python == cpu.content.python
    again = run("lock", str(path), "--offline")
    assert again.exit_code == 0 and "mine.lock.json (--offline:" in " ".join(again.stdout.split()), again.output


def test_an_offline_lock_asks_uv_for_a_set_whose_requirements_changed(recipe_dir: Path) -> None:
    """A set whose inputs differ from the parent's (the nccl wheel moved) is not taken: uv is asked, offline, and with
    nothing cached it fails naming that set and the version; the set resolved before it was taken, and no lock is
    written."""
    path = recipe_dir / "moved.yaml"
    path.write_text("extends: cpu\ncomponents: {nccl: {version: 2.28.9}}\n")
    result = run("lock", str(path), "--offline")
    assert result.exit_code == 5, result.output
    assert "python python/uv: from " in " ".join(result.stdout.split()), result.output
    stderr = " ".join(result.stderr.split())
    assert "requirement set nccl (nvidia-nccl-cu12==2.28.9)" in stderr and "not found in the cache" in stderr
    assert not path.with_name("moved.lock.json").exists()


def test_an_offline_lock_takes_nothing_from_an_edited_lock(recipe_dir: Path) -> None:
    """Only a lock that vouches for its content is taken from: the same parent (by path), once a hash in its lock
    was edited by hand, gives nothing, and uv is asked."""
    (recipe_dir / "base").mkdir()
    for name in ("cpu.yaml", "cpu.lock.json"):
        shutil.copy(REPO / "recipes" / name, recipe_dir / "base" / name)
    child = recipe_dir / "child.yaml"
    child.write_text("extends: base/cpu.yaml\n")
    taken = run("lock", str(child), "--offline")
    assert taken.exit_code == 0 and "base/cpu.lock.json (--offline:" in " ".join(taken.stdout.split()), taken.output
    child.with_name("child.lock.json").unlink()
    data = json.loads((recipe_dir / "base" / "cpu.lock.json").read_text())
    data["content"]["python"]["nccl"][0]["hashes"] = ["sha256:" + "0" * 64]  # content_digest no longer agrees
    (recipe_dir / "base" / "cpu.lock.json").write_text(json.dumps(data))
    with pytest.raises(LockError, match="edited by hand"):
        lock.read(recipe.load(str(recipe_dir / "base" / "cpu.yaml")))
    result = run("lock", str(child), "--offline")
    assert result.exit_code == 5 and "not found in the cache" in result.stderr, result.output
    assert "from " not in result.stdout


def test_a_set_is_taken_only_up_to_one_whose_versions_the_recipes_own_lock_contradicts() -> None:
    """`wheels.reusable` on the cpu lock itself: every set, in resolution order; with a preference (the recipe's own
    lock's version) that a set's recorded closure contradicts, the sets before it and not that one."""
    from imgbuild.pin import record, wheels

    cpu = lock.read(recipe.load("cpu"))
    assert cpu is not None
    sets = record.requirement_sets(cpu)
    rec = wheels.recorded_in("cpu.lock.json", cpu, sets)
    assert rec is not None
    order = wheels.resolution_order(list(sets))
    assert order == ["python/uv", "nccl", "sagemaker"]
    assert wheels.reusable(sets, cpu, [rec], {}) == ({name: rec.python[name] for name in order}, "cpu.lock.json")
    taken, _ = wheels.reusable(sets, cpu, [rec], {"botocore": "0.1"})
    assert list(taken) == ["python/uv", "nccl"]


def _redigest(data: dict) -> None:
    """content_digest recomputed as Content.digest computes it, as a careful hand would after editing content (the
    file holds the model's JSON dump: the same text)."""
    text = json.dumps(data["content"], sort_keys=True, separators=(",", ":"))
    data["content_digest"] = hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda d: d.update(base_ref="evil.example/x:latest"), "base_ref: lock 'evil.example/x:latest', the recipe"),
        (lambda d: d.update(base_ref="-oevil"), "base_ref: lock '-oevil', the recipe gives 'debian:bookworm-slim'"),
        (
            lambda d: (d["content"]["bases"].update(other={**d["content"]["bases"][d["base_ref"]], "ref": "other"}),
                       _redigest(d)),
            "content.bases: 'other' not among what the recipe's blocks need",
        ),
        (
            lambda d: (d["content"]["python"]["app"][0].update(version="1.0\n--index-url http://evil.example/simple"),
                       _redigest(d)),
            "expected a PEP 440 version, got '1.0\\n--index-url",
        ),
        (lambda d: d.update(locked_at="2026-11-27T00:40:41+00:00\nLABEL x=y"), "locked_at: Value error, expected"),
    ],
    ids=["base_ref-registry", "base_ref-option", "content-extra-base", "requirement-version-newline", "locked_at"],
)  # fmt: skip
def test_a_lock_edited_by_hand_beyond_its_pins_is_refused(
    mine: Path, edit: Callable[[dict], object], words: str
) -> None:
    """Everything in a lock that reaches a build is checked: what the recipe decides (FROM's base_ref, the keys of
    its content) against the recipe, the recorded values against their formats, whatever content_digest says.
    render refuses (exit 4, naming the field) and writes no Dockerfile; lock --check says so (exit 15)."""
    lock_file = mine.with_name("mine.lock.json")
    _rewrite(lock_file, edit)
    result = run("render", str(mine))
    assert result.exit_code == 4, result.output
    assert words in result.output and "FROM " not in result.output
    check = run("lock", str(mine), "--check")
    assert check.exit_code == 15, check.output
    assert words in check.output
