"""Schema and loading: every error names the file, the line, the key path and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgbuild import recipe
from imgbuild.core import paths
from imgbuild.core.errors import RecipeError
from imgbuild.recipe import loading

CPU_LIKE = """\
extends: cpu
description: mine
"""


def write(d: Path, name: str, text: str) -> Path:
    p = d / name
    p.write_text(text)
    return p


def error_of(path: Path) -> str:
    with pytest.raises(RecipeError) as info:
        recipe.load(path)
    return str(info.value)


def test_shipped_recipes_load() -> None:
    assert recipe.shipped_names() == [
        *("a100", "b200", "b300", "cpu", "debian-cuda", "gaudi-1.15", "gaudi-1.21", "gb200", "h100", "h200"),
        *("pytorch", "v100"),
    ]
    for name in recipe.shipped_names():
        loaded = recipe.load(name)
        assert loaded.recipe.name == name
        assert not loaded.recipe.abstract


def test_user_recipe_extends_a_shipped_one(recipe_dir: Path) -> None:
    p = write(recipe_dir, "mine.yaml", CPU_LIKE + "components:\n  sshd: {ports: [2222]}\n  sagemaker: null\n")
    loaded = recipe.load(p)
    r = loaded.recipe
    assert r.name == "mine" and r.description == "mine"
    assert r.components.sshd is not None and r.components.sshd.ports == (2222,)
    assert r.components.sagemaker is None  # null removes an inherited block
    assert r.components.openmpi is not None and r.components.openmpi.source == "distro"  # merged from cpu
    assert loaded.chain[-1].name == "cpu.yaml"


def test_misspelled_key_suggests_the_right_one(recipe_dir: Path) -> None:
    p = write(recipe_dir, "typo.yaml", CPU_LIKE + "components:\n  ncl: {source: wheel}\n")
    msg = error_of(p)
    assert "typo.yaml:4: components.ncl: unknown key; did you mean 'nccl'?" in msg


def test_misspelled_nested_key(recipe_dir: Path) -> None:
    p = write(recipe_dir, "typo2.yaml", CPU_LIKE + "components:\n  sshd: {prots: [22]}\n")
    assert "components.sshd.prots: unknown key; did you mean 'ports'?" in error_of(p)


def test_wrong_type(recipe_dir: Path) -> None:
    p = write(recipe_dir, "type.yaml", CPU_LIKE + "platform:\n  devices_per_node: many\n")
    msg = error_of(p)
    assert "type.yaml:4: platform.devices_per_node:" in msg and "integer" in msg and "'many'" in msg


@pytest.mark.parametrize("version", ["latest", ">=2.20", "2.*", "~=2.21", "2.21.x", "2.20 - 2.22"])
def test_unpinned_version_is_rejected(recipe_dir: Path, version: str) -> None:
    p = write(recipe_dir, "unpinned.yaml", CPU_LIKE + f"components:\n  nccl: {{version: '{version}'}}\n")
    msg = error_of(p)
    assert "components.nccl.version" in msg and "unpinned versions are not allowed" in msg


@pytest.mark.parametrize("port", [0, 70000])
def test_port_out_of_range(recipe_dir: Path, port: int) -> None:
    p = write(recipe_dir, "port.yaml", CPU_LIKE + f"components:\n  sshd: {{ports: [{port}]}}\n")
    msg = error_of(p)
    assert "port.yaml:4: components.sshd.ports.0:" in msg and str(port) in msg


def test_missing_extends_parent(recipe_dir: Path) -> None:
    p = write(recipe_dir, "orphan.yaml", "extends: cpuu\n")
    with pytest.raises(RecipeError) as info:
        recipe.load(p)
    assert "orphan.yaml:1: extends: no recipe named 'cpuu'" in str(info.value)
    assert info.value.hint == "did you mean 'cpu'?"


def test_missing_extends_file(recipe_dir: Path) -> None:
    p = write(recipe_dir, "orphan.yaml", "extends: ./nothere.yaml\n")
    assert "extends: no such file" in error_of(p)


def test_extends_cycle(recipe_dir: Path) -> None:
    write(recipe_dir, "a.yaml", "extends: ./b.yaml\n")
    write(recipe_dir, "b.yaml", "extends: ./c.yaml\n")
    write(recipe_dir, "c.yaml", "extends: ./a.yaml\n")
    msg = error_of(recipe_dir / "a.yaml")
    assert "extends: cycle:" in msg and "a.yaml -> " in msg and msg.rstrip().endswith("a.yaml")


def _chain(recipe_dir: Path, length: int) -> Path:
    """r0.yaml extends r1.yaml ... extends the shipped cpu: `length` recipe files, then cpu's own chain (one file)."""
    for i in range(length):
        write(recipe_dir, f"r{i}.yaml", f"extends: ./r{i + 1}.yaml\n" if i + 1 < length else "extends: cpu\n")
    return recipe_dir / "r0.yaml"


def test_a_chain_at_the_limit_loads(recipe_dir: Path) -> None:
    loaded = recipe.load(_chain(recipe_dir, loading.MAX_CHAIN - 1))
    assert len(loaded.chain) == loading.MAX_CHAIN and loaded.recipe.name == "r0"


@pytest.mark.parametrize("length", [loading.MAX_CHAIN, 1500])
def test_a_chain_past_the_limit_is_refused_naming_the_file_and_the_limit(recipe_dir: Path, length: int) -> None:
    """A deep chain is a recipe error (exit 3) naming the file that extends once too far and the limit, through the
    CLI; 1500 recipes crashed the recursive walk with RecursionError (exit 1) after 26 s."""
    from typer.testing import CliRunner

    from imgbuild.cli import app

    result = CliRunner().invoke(app, ["show", str(_chain(recipe_dir, length))])
    assert result.exit_code == RecipeError.exit_code == 3, result.output
    text = " ".join(result.output.split())
    last = loading.MAX_CHAIN - 1 if length > loading.MAX_CHAIN else length - 1  # the one whose parent is one too many
    assert f"r{last}.yaml:1: extends" in text and f"longer than {loading.MAX_CHAIN} recipes" in text, text
    assert "Traceback" not in result.output and "RecursionError" not in result.output


def test_missing_required_key(recipe_dir: Path) -> None:
    p = write(recipe_dir, "bare.yaml", "description: nothing\n")
    msg = error_of(p)
    for key in ("platform", "base", "os"):
        assert f"{key}: required key is missing" in msg


def test_error_in_parent_names_the_parent(recipe_dir: Path) -> None:
    write(recipe_dir, "parent.yaml", CPU_LIKE + "components:\n  sshd: {ports: [99999]}\n")
    p = write(recipe_dir, "child.yaml", "extends: ./parent.yaml\n")
    assert "parent.yaml:4: components.sshd.ports.0" in error_of(p)


def test_not_yaml(recipe_dir: Path) -> None:
    p = write(recipe_dir, "bad.yaml", "extends: cpu\ncomponents: [unclosed\n")
    assert "bad.yaml:" in error_of(p) and "not valid YAML" in error_of(p)


def test_unknown_recipe_name() -> None:
    with pytest.raises(RecipeError) as info:
        recipe.load("a10")
    assert info.value.hint == "did you mean 'a100'?"


def test_digest_changes_with_parent(recipe_dir: Path) -> None:
    parent = write(recipe_dir, "parent.yaml", CPU_LIKE)
    child = write(recipe_dir, "child.yaml", "extends: ./parent.yaml\n")
    before = recipe.load(child).digest
    parent.write_text(CPU_LIKE + "env: {X: '1'}\n")
    assert recipe.load(child).digest != before


TRICKY = """\
description: >-
  folded
  text
released: 2024-01-01
flags: [yes, no, on, "off", 0o17, 0x1f, 1e3, ~, null]
nested: {a: {b: [1, {c: 'x: y'}]}}
empty: {}
"""


@pytest.mark.parametrize(
    "path",
    [
        *sorted(Path(paths.recipes_dir()).glob("*.yaml")),
        *sorted((Path(__file__).parent / "recipes").glob("*.yaml")),
    ],
    ids=lambda p: p.name,
)
def test_libyaml_and_guarded_loader_read_recipes_alike(path: Path) -> None:
    """Recipes are read by libyaml when they hold no anchor, alias or deep nesting (start-up), else by the guarded
    pure-Python loader: both must give the same value and the same line for every key."""
    assert loading._CLoader is not None, "PyYAML without libyaml: the fast path is not tested"
    text = path.read_text()
    assert loading._plain(text)
    results = []
    for loader_class in (loading._CLoader, loading._Loader):
        node, value = loading._read(loader_class, text)
        results.append((value, loading._line_map(node)))
    assert results[0] == results[1]


def test_libyaml_reads_the_tricky_scalars_as_the_guarded_loader_does(tmp_path: Path) -> None:
    test_libyaml_and_guarded_loader_read_recipes_alike(write(tmp_path, "tricky.yaml", TRICKY))


@pytest.mark.parametrize(
    "text",
    ["a: &x 1\n", "a: 1\nb: *x\n", "[" * (loading.MAX_DEPTH + 1) + "]" * (loading.MAX_DEPTH + 1) + "\n"],
    ids=["anchor", "alias", "deep"],
)
def test_documents_libyaml_must_not_compose_go_to_the_guarded_loader(text: str) -> None:
    assert not loading._plain(text)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("extends: a100\ncomponents:\n  sshd: {ports: [22]}\n", 3),  # the GPU targets' run profile: the host's network
        ("extends: cpu\nruntime:\n  network: host\ncomponents:\n  sshd:\n    ports: [3022, 22]\n", 6),
    ],
)
@pytest.mark.parametrize("command", ["show", "render", "lock"])
def test_sshd_on_port_22_with_the_hosts_network_is_refused_by_every_command(
    recipe_dir: Path, tmp_path: Path, text: str, line: int, command: str
) -> None:
    """The host's own sshd has port 22 on every node of a host-network job: each command that reads such a recipe
    refuses it (exit 3) naming the file, the line and the key. `lock` accepted it (exit 0) after issue 28."""
    from typer.testing import CliRunner

    from imgbuild.cli import app

    path = write(recipe_dir, "mine.yaml", text)
    args = [command, str(path), *(["-o", str(tmp_path / "out")] if command == "render" else [])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == RecipeError.exit_code == 3, result.output
    text = " ".join(result.output.split())
    assert f"mine.yaml:{line}: components.sshd.ports: port 22 is the host's own sshd's" in text, text
    assert "runtime.network: host" in text and not (recipe_dir / "mine.lock.json").exists()


def test_sshd_on_port_22_without_the_hosts_network_loads(recipe_dir: Path) -> None:
    """On a bridge network (cpu's run profile) the container's port 22 is its own."""
    loaded = recipe.load(write(recipe_dir, "mine.yaml", "extends: cpu\ncomponents:\n  sshd: {ports: [22]}\n"))
    assert loaded.recipe.components.sshd.ports == (22,) and loaded.recipe.runtime.network is None
