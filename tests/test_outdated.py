"""`imgbuild outdated` and `imgbuild lock --upgrade`: the newest release of each pinned component, whether it fits the
other pins (the real resolver on a copy of the recipe with that one version replaced), and moving a recipe to the
newest releases that fit (its file edited in place, comments kept, then locked).

Every test but the last runs against a package index on 127.0.0.1 (conftest's `index` fixture: real wheels with
METADATA, read with range requests) and writes recipes to a temporary folder. The last one reads the real index.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from packaging.version import Version
from typer.testing import CliRunner

from conftest import REPO
from imgbuild import recipe
from imgbuild.cli import app
from imgbuild.core.errors import RecipeError
from imgbuild.pin import lock, outdated, pypi
from imgbuild.recipe.edit import set_value
from localindex import CP, Index, make_wheel, torch_wheel_name

# h100 with torch 2.13.0 (NCCL 2.29.7) and EFA 1.50.0's aws-ofi-nccl 1.21.1, tested with NCCL up to 2.31.2 (what h100
# shipped before issue 30 moved it to 2.15.0 and EFA 1.51.0).
GPU_RECIPE = """\
# an H100 image of our own
extends: h100
description: H100 test image
components:
  pytorch: {version: 2.13.0}  # the release we trained with
  efa: {version: 1.50.0}
  nccl_tests: {version: 2.18.3}
"""
# A made-up torch release whose wheel pins an NCCL newer than the plugin was tested with.
TORCH_NEXT = "2.16.0"
TORCH_NEXT_REQUIRES = [
    "filelock",
    'nvidia-nccl-cu13==2.32.3; platform_system == "Linux"',
    'cuda-toolkit[cudart,cublas]==13.2.2; platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.26.0.51; platform_system == "Linux"',
]
PLUGIN_RULE = "aws-ofi-nccl 1.21.1 was tested with NCCL up to 2.31.2; NCCL 2.32.3 is newer"
NCCL_NEXT = "2.99.1"  # a made-up nvidia-nccl-cu12 release on the local index


def serve(
    index: Index, tmp_path: Path, project: str, version: str, requires: tuple[str, ...] = (), **kw: bool
) -> dict[str, str]:
    """Real wheels of `project` `version` on the index, for Linux x86_64 and aarch64 (torch, numpy: this
    interpreter's cp tag; others py3-none); returns each one's sha256 by architecture (amd64, arm64)."""
    hashes = {}
    for arch, machine in (("amd64", "x86_64"), ("arm64", "aarch64")):
        if project == "torch":
            filename = torch_wheel_name(version, platform=f"manylinux_2_28_{machine}")
        elif project == "numpy":
            filename = f"numpy-{version}-{CP}-{CP}-manylinux_2_17_{machine}.whl"
        else:
            filename = f"{project.replace('-', '_')}-{version}-py3-none-manylinux2014_{machine}.whl"
        data = make_wheel(tmp_path, filename, list(requires), junk=2000)
        index.add_wheel(project, filename, data, **kw)
        hashes[arch] = f"sha256:{hashlib.sha256(data).hexdigest()}"
    return hashes


def serve_sdist(index: Index, project: str, version: str) -> None:
    data = f"an sdist of {project} {version}".encode()
    url = index.add_file(f"/files/{project.replace('-', '_')}-{version}.tar.gz", data)
    index.add_link(project, f"{url}#sha256={hashlib.sha256(data).hexdigest()}")


def gpu_index(index: Index, tmp_path: Path, torch: list[str]) -> None:
    """What a GPU recipe asks the index: torch's releases (2.13.0 and 2.15.0 are in the shipped table; others are
    read from their wheel's METADATA), numpy 2.2.6, mpi4py 4.0.3 (its sdist: built against the image's MPI)."""
    for version in torch:
        serve(index, tmp_path, "torch", version, tuple(TORCH_NEXT_REQUIRES) if version == TORCH_NEXT else ())
    serve(index, tmp_path, "numpy", "2.2.6")
    serve_sdist(index, "mpi4py", "4.0.3")


@pytest.fixture
def gpu(recipe_dir: Path) -> Path:
    path = recipe_dir / "gpu.yaml"
    path.write_text(GPU_RECIPE)
    return path


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def rows(output: str, recipe_name: str) -> dict[str, dict]:
    data = json.loads(output)
    (entry,) = [r for r in data["recipes"] if r["recipe"] == recipe_name]
    return {row["component"]: row for row in entry["components"]}


# ------------------------------------------------------------------------------------------------------------
# The index's releases


def test_releases_leave_out_yanked_pre_and_dev_releases(index: Index, tmp_path: Path) -> None:
    for version in ("1.0.0", "1.2.0rc1", "1.3.0.dev0", "1.1.0.post1"):
        serve(index, tmp_path, "some-lib", version)
    serve(index, tmp_path, "some-lib", "1.4.0", yanked=True)  # every file of 1.4.0 yanked: not a release
    serve(index, tmp_path, "some-lib", "1.1.0", yanked=True)  # one file of 1.1.0 yanked, its sdist not: a release
    serve_sdist(index, "some-lib", "1.1.0")
    index.add_link("some-lib", f"{index.root}/files/other_lib-9.0.0-py3-none-any.whl")  # another project's file
    index.add_link("some-lib", f"{index.root}/files/some_lib-1.5.0-py3-none-any.whl.asc")  # not a distribution
    page = (index.server.files["/simple/some-lib/"]).decode()
    assert page.count("data-yanked") == 4  # the server really marks them (both wheels of 1.4.0 and 1.1.0)
    assert pypi.releases("Some_Lib", index=index.simple) == ["1.0.0", "1.1.0", "1.1.0.post1"]


def test_releases_of_a_missing_project_name_the_page(index: Index) -> None:
    with pytest.raises(pypi.IndexLookupError, match=r"no-such-project releases: no project .* answered 404"):
        pypi.releases("no-such-project", index=index.simple)


# ------------------------------------------------------------------------------------------------------------
# imgbuild outdated


def test_everything_current_exits_0(index_env: Index, recipe_dir: Path, tmp_path: Path) -> None:
    path = recipe_dir / "mine.yaml"
    path.write_text("extends: cpu\n")
    current = recipe.load(path).recipe.components.nccl.version
    serve(index_env, tmp_path, "nvidia-nccl-cu12", current)
    serve(index_env, tmp_path, "nvidia-nccl-cu12", NCCL_NEXT, yanked=True)
    serve(index_env, tmp_path, "nvidia-nccl-cu12", "3.0.0rc1")
    result = run("outdated", str(path), "--json")
    assert result.exit_code == 0, result.output
    found = rows(result.stdout, "mine")
    assert found["nccl"]["status"] == "current" and found["nccl"]["newest"] == current
    assert found["nccl"]["source"] == {"kind": "index", "name": "nvidia-nccl-cu12"}
    assert found["openmpi"]["source"]["name"] == "DISTRO[debian12]"
    assert found["openmpi"]["source"]["read_on"] is None  # nobody recorded when: said, not invented
    assert {row["status"] for row in found.values()} == {"current"}
    text = run("outdated", str(path))
    assert text.exit_code == 0, text.output
    assert "read on a date not recorded" in text.stdout


def test_a_held_component_is_shown_with_its_reason_and_not_moved(
    index_env: Index, recipe_dir: Path, tmp_path: Path
) -> None:
    """`hold: {COMPONENT: REASON}`: a newer release of that component is reported as held with the recipe's reason
    (exit 0 when nothing else is behind), lock --upgrade leaves it unless named; a hold naming no tracked component
    or with no reason is the recipe's error (exit 2), naming the file and the key."""
    path = recipe_dir / "mine.yaml"
    path.write_text("extends: cpu\nhold:\n  nccl: the NCCL our cluster's plugin was validated with\n")
    current = recipe.load(path).recipe.components.nccl.version
    serve(index_env, tmp_path, "nvidia-nccl-cu12", current)
    serve(index_env, tmp_path, "nvidia-nccl-cu12", NCCL_NEXT)
    result = run("outdated", str(path), "--json")
    assert result.exit_code == 0, result.output
    nccl = rows(result.stdout, "mine")["nccl"]
    assert (nccl["status"], nccl["newest"], nccl["fits"]) == ("held", NCCL_NEXT, True)
    assert nccl["held"] == "the NCCL our cluster's plugin was validated with"
    assert json.loads(result.stdout)["held"] == 1 and json.loads(result.stdout)["outdated"] == 0
    text = run("outdated", str(path))
    assert text.exit_code == 0 and "held by the recipe: the NCCL our cluster's plugin was validated with" in text.stdout
    loaded = recipe.load(path).concrete()
    assert outdated.upgrade(loaded).moves == []  # lock --upgrade: held, not moved
    named = outdated.upgrade(loaded, outdated.parse_wanted(["nccl"]))  # --upgrade-package nccl: moved
    assert [(m.track.component, m.old, m.new) for m in named.moves] == [("nccl", current, NCCL_NEXT)]
    # Without the hold (cpu's own dropped too: `null` removes an inherited one) the same release is behind (exit 18).
    held_digest = recipe.load(path).digest
    path.write_text("extends: cpu\nhold: {nccl: null}\n")
    assert recipe.load(path).digest == held_digest  # a hold never makes a lock stale: it changes nothing built
    assert run("outdated", str(path)).exit_code == 18
    path.write_text("extends: cpu\nhold:\n  torch: no reason\n")
    bad = run("outdated", str(path))
    assert bad.exit_code == RecipeError.exit_code
    assert "mine.yaml:3: hold.torch: expected a component `imgbuild outdated` tracks for this recipe" in bad.stderr
    path.write_text("extends: cpu\nhold:\n  nccl: ''\n")
    empty = run("outdated", str(path))
    assert empty.exit_code == RecipeError.exit_code and "hold.nccl" in empty.stderr
    # The parent holds a component the child removes: the key is in the parent's file, the way out in the child's.
    path.write_text("extends: cpu\ncomponents: {nccl: null}\n")
    parent = run("outdated", str(path))
    assert parent.exit_code == RecipeError.exit_code, parent.output
    text = " ".join(parent.stderr.split())
    assert f"cpu.yaml:{recipe.where_set(recipe.load('cpu'), 'hold', 'nccl')[1].rsplit(':', 1)[1]}: hold.nccl:" in text
    assert "mine.yaml inherits this hold from" in text and "hint: in " in text and "hold: {nccl: null}" in text
    path.write_text("extends: cpu\ncomponents: {nccl: null}\nhold: {nccl: null}\n")
    assert run("outdated", str(path)).exit_code != RecipeError.exit_code


def test_outdated_and_fits(index_env: Index, gpu: Path, tmp_path: Path) -> None:
    gpu_index(index_env, tmp_path, ["2.12.1", "2.13.0", "2.15.0"])
    before = gpu.read_text()
    result = run("outdated", str(gpu), "--json")
    assert result.exit_code == 18, result.output
    assert "newer releases than the recipe pins: gpu (" in result.stderr
    found = rows(result.stdout, "gpu")
    torch = found["pytorch"]
    assert (torch["pinned"], torch["newest"], torch["status"], torch["fits"]) == ("2.13.0", "2.15.0", "outdated", True)
    assert torch["key"] == "components.pytorch.version"
    # the resolver's pins for 2.15.0: its NCCL and its CUDA (read from the shipped table, not from a rule here)
    assert "nccl 2.29.7 -> 2.30.7" in torch["changes"] and "pytorch.cuda 13.0 -> 13.2" in torch["changes"]
    assert found["nccl"]["status"] == "follows" and found["nccl"]["source"] == {"kind": "follows", "name": "pytorch"}
    assert found["numpy"]["status"] == "current" and found["mpi4py"]["status"] == "current"
    # a table's newest, said to come from a table read on a date
    efa = found["efa"]
    about = "the AWS EFA installer changelog (efa-changelog in the EC2 user guide)"
    listed = {"kind": "table", "name": "blocks/efa/releases.yaml", "about": about, "read_on": "2026-11-26"}
    assert efa["source"] == listed
    assert efa["newest"] == "1.51.0" and efa["fits"] is True  # its plugin 1.22.0 has a row (issue 30)
    # nccl-tests 2.20.0 is a row, but h100's parent holds 2.19.6 (its archive was not readable here), saying why
    tests = found["nccl_tests"]
    assert (tests["newest"], tests["status"], tests["fits"]) == ("2.20.0", "held", True)
    assert tests["held"].startswith("2.20.0 (the newest tag, blocks/nccl_tests/releases.yaml) could not be read here")
    assert gpu.read_text() == before  # outdated writes nothing

    text = run("outdated", str(gpu))
    assert text.exit_code == 18
    assert "blocks/efa/releases.yaml, read 2026-11-26" in text.stdout and "index: torch" in text.stdout
    assert "yes: nccl 2.29.7 -> 2.30.7" in text.stdout


def test_outdated_but_blocked_names_the_rule(index_env: Index, gpu: Path, tmp_path: Path) -> None:
    gpu_index(index_env, tmp_path, ["2.13.0", "2.15.0", TORCH_NEXT])
    result = run("outdated", str(gpu), "--json")
    assert result.exit_code == 18, result.output
    torch = rows(result.stdout, "gpu")["pytorch"]
    assert (torch["newest"], torch["fits"], torch["changes"]) == (TORCH_NEXT, False, [])
    assert PLUGIN_RULE in torch["blocked_by"]  # the resolver's own message, read from the wheel's METADATA
    assert "components.aws_ofi_nccl.version / components.nccl" in torch["blocked_by"]


def test_an_index_that_cannot_answer_exits_7(index_env: Index, gpu: Path, tmp_path: Path) -> None:
    gpu_index(index_env, tmp_path, ["2.13.0"])
    del index_env.server.files["/simple/numpy/"]
    result = run("outdated", str(gpu), "--json")
    assert result.exit_code == 7, result.output
    numpy = rows(result.stdout, "gpu")["numpy"]
    assert numpy["status"] == "unknown" and "no project 'numpy' on the index" in numpy["error"]


# ------------------------------------------------------------------------------------------------------------
# imgbuild lock --upgrade

# boto3 (the sagemaker block's set) is not on the local index: the block is left out. cpu holds its NCCL (for the
# Docker CI's build); `hold: null` drops that: this image is ours to move.
INHERITED = (
    "# mine: the cpu image, as shipped\nextends: cpu\ndescription: mine  # keep this comment\n"
    "components: {sagemaker: null}\nhold: null\n"
)
IN_PLACE = """\
extends: cpu
description: mine
hold: null
components:
  nccl:
    source: wheel
    version: {version}   # the wheel's release
    package: nvidia-nccl-cu12
  sagemaker: null
"""


@pytest.mark.parametrize("where", ["inherited", "in place"])
def test_upgrade_writes_the_recipe_then_the_lock(
    index_env: Index, recipe_dir: Path, tmp_path: Path, where: str
) -> None:
    path = recipe_dir / "mine.yaml"
    path.write_text(INHERITED)
    current = recipe.load(path).recipe.components.nccl.version
    if where == "in place":
        path.write_text(IN_PLACE.format(version=current))
    before = path.read_text()
    serve(index_env, tmp_path, "nvidia-nccl-cu12", current)
    served = serve(index_env, tmp_path, "nvidia-nccl-cu12", NCCL_NEXT)

    result = run("lock", str(path), "--upgrade")
    assert result.exit_code == 0, result.output
    assert f"upgraded nccl {current} -> {NCCL_NEXT}" in result.stdout
    after = path.read_text()
    if where == "inherited":  # the parent is never edited: the recipe's own file sets the version
        assert after == before.replace(
            "components: {sagemaker: null}", f"components: {{sagemaker: null, nccl: {{version: {NCCL_NEXT}}}}}"
        )
    else:  # that value's text and nothing else
        assert after == before.replace(f"version: {current}   #", f"version: {NCCL_NEXT}   #")
    loaded = recipe.load(path)
    locked = lock.read(loaded)  # fresh, and its pins follow from the recipe (lock.read refuses an edited lock)
    assert locked is not None and locked.version("nccl") == NCCL_NEXT
    assert locked.content is not None
    (wheel,) = locked.content.python["nccl"]
    archs = getattr(loaded.recipe.platform, "arch", ("amd64",))  # a requirement holds each architecture's hash
    assert (wheel.name, wheel.version) == ("nvidia-nccl-cu12", NCCL_NEXT)
    assert set(wheel.hashes) == {served[arch] for arch in archs}

    check = run("lock", str(path), "--check")  # what resolves today is what the lock says
    assert check.exit_code == 0, check.output
    assert "the lock matches what resolves today" in check.stdout
    assert run("outdated", str(path)).exit_code == 0


def test_a_lock_that_fails_after_the_upgrade_puts_the_recipe_back(
    index_env: Index, recipe_dir: Path, tmp_path: Path
) -> None:
    """The lock must follow from the recipe: when the upgrade wrote the recipe and locking it then fails (the new
    release's wheel needs a distribution the index does not have), the recipe file is put back and no lock written."""
    path = recipe_dir / "mine.yaml"
    path.write_text(INHERITED)
    current = recipe.load(path).recipe.components.nccl.version
    before = path.read_text()
    serve(index_env, tmp_path, "nvidia-nccl-cu12", current)
    serve(index_env, tmp_path, "nvidia-nccl-cu12", NCCL_NEXT, ("no-such-distribution==1.0",))

    result = run("lock", str(path), "--upgrade")
    assert result.exit_code == 5 and "no-such-distribution" in result.stderr, result.output
    assert f"upgraded nccl {current} -> {NCCL_NEXT}" in result.stdout
    assert "mine.yaml is back as it was (locking failed)" in result.stderr
    assert path.read_text() == before and not path.with_name("mine.lock.json").exists()


def test_upgrade_refuses_a_newest_that_does_not_fit(index_env: Index, gpu: Path, tmp_path: Path) -> None:
    gpu_index(index_env, tmp_path, ["2.13.0", "2.15.0", TORCH_NEXT])
    before = gpu.read_text()
    result = run("lock", str(gpu), "--upgrade-package", "pytorch")
    assert result.exit_code == 5, result.output
    assert f"pytorch {TORCH_NEXT} does not fit" in result.stderr and PLUGIN_RULE in result.stderr
    assert "the newest that fits is 2.15.0" in result.stderr
    assert f"imgbuild lock {gpu} --upgrade-package pytorch==2.15.0" in result.stderr
    assert gpu.read_text() == before and not gpu.with_name("gpu.lock.json").exists()  # nothing written

    # what that command would take: 2.15.0 only, in the recipe's own line, its comment kept
    plan = outdated.upgrade(recipe.load(gpu), outdated.parse_wanted(["pytorch==2.15.0"]))
    assert [(m.track.component, m.old, m.new) for m in plan.moves] == [("pytorch", "2.13.0", "2.15.0")]
    assert plan.blocked == []
    assert plan.loaded.recipe.components.pytorch.version == "2.15.0"


def test_upgrade_everything_refuses_when_one_newest_is_blocked(index_env: Index, gpu: Path, tmp_path: Path) -> None:
    gpu_index(index_env, tmp_path, ["2.13.0", "2.15.0", TORCH_NEXT])
    result = run("lock", str(gpu), "--upgrade")
    assert result.exit_code == 5, result.output
    # torch 2.16.0 pins NCCL 2.32.3, newer than EFA 1.51.0's plugin (1.22.0) was tested with; the rest fits
    assert "pytorch 2.16.0 does not fit" in result.stderr and "the newest that fits is 2.15.0" in result.stderr
    assert "aws-ofi-nccl 1.22.0 was tested with NCCL up to 2.31.2; NCCL 2.32.3 is newer" in result.stderr
    hint = result.stderr.split("hint:")[2]
    assert "--upgrade-package pytorch==2.15.0" in hint and "nccl_tests" not in hint  # held by the parent
    assert "--upgrade-package efa==1.51.0" in hint
    assert "cuda" not in hint  # CUDA comes with the base image: never moved alone
    assert gpu.read_text() == GPU_RECIPE


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-P", "hwloc"], "does not move hwloc (ubuntu24.04's package: it changes with os.version)"),
        (["-P", "cuda"], "CUDA comes with the base image"),
        (["-P", "nccl"], "does not move nccl (it is PyTorch's pin)"),
        (["-P", "tensorflow"], "no pinned component or locked Python distribution 'tensorflow'"),
        (["-P", "pytorch==9.9.9"], "pytorch 9.9.9 is not a release index: torch lists"),
        (["-P", "pytorch=="], "expected COMPONENT or COMPONENT==VERSION"),
        (["--upgrade", "--offline"], "not with --offline"),
        (["--upgrade", "--check"], "not with --check"),
    ],
)
def test_upgrade_usage_errors(index_env: Index, gpu: Path, tmp_path: Path, args: list[str], message: str) -> None:
    gpu_index(index_env, tmp_path, ["2.13.0", "2.15.0"])
    result = run("lock", str(gpu), *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert gpu.read_text() == GPU_RECIPE


# ------------------------------------------------------------------------------------------------------------
# Editing a recipe's text


def test_set_value_replaces_only_the_value() -> None:
    text = "a: 1\ncomponents:\n  efa: {version: 1.43.2}  # why\n  nccl:\n    version: '2.21.5'  # quoted\n"
    assert set_value(text, ("components", "efa", "version"), "1.50.0", where="f") == text.replace("1.43.2", "1.50.0")
    assert set_value(text, ("components", "nccl", "version"), "2.27.5", where="f") == text.replace(
        "'2.21.5'", "'2.27.5'"
    )


def test_set_value_adds_a_missing_key_in_the_mappings_style() -> None:
    text = "extends: h100\ncomponents:\n  pytorch: {version: 2.13.0}\n  gdrcopy:\n    version: 2.5.1\n# end\n"
    flow = set_value(text, ("components", "pytorch", "numpy"), "2.3.5", where="f")
    assert "  pytorch: {version: 2.13.0, numpy: 2.3.5}\n" in flow
    block = set_value(text, ("components", "gdrcopy", "prefix"), "x", where="f")
    assert block.endswith("  gdrcopy:\n    version: 2.5.1\n    prefix: x\n# end\n")
    new = set_value(text, ("components", "efa", "version"), "1.50.0", where="f")
    assert new.endswith("    version: 2.5.1\n  efa: {version: 1.50.0}\n# end\n")
    root = set_value("extends: a100\n", ("cuda", "version"), "13.2", where="f")
    assert root == 'extends: a100\ncuda: {version: "13.2"}\n'  # 13.2 unquoted would read as a number


RECIPE_TEXT = """# head comment
extends: a100  # parent
description: "a long
  folded description"
hold:
  pytorch: null
app:
  requirements:
    - einops==0.8.1
    - tqdm   # why
components:
  # efa first
  efa: {version: 1.43.2}  # eol
  nccl:
    version: '2.21.5'
    source: wheel
cuda:
  version: "12.8.1"
# trailing
"""


@pytest.mark.parametrize(
    ("keys", "value", "old_line", "new_line"),
    [
        (("components", "nccl", "version"), "2.27.5", "    version: '2.21.5'\n", "    version: '2.27.5'\n"),
        (("cuda", "version"), "13.0.1", '  version: "12.8.1"\n', '  version: "13.0.1"\n'),
        (("components", "efa", "version"), "1.50.0", "{version: 1.43.2}  # eol", "{version: 1.50.0}  # eol"),
    ],
)
def test_set_value_keeps_comments_key_order_quoting_and_every_other_line(
    keys: tuple[str, ...], value: str, old_line: str, new_line: str
) -> None:
    """The round-trip library's whole dump would fold the description onto one line, write `pytorch:` for `null`
    and re-indent the list: none of that reaches the file, only the edited value's line changes."""
    assert set_value(RECIPE_TEXT, keys, value, where="f") == RECIPE_TEXT.replace(old_line, new_line)


def test_set_value_adds_a_key_after_the_mappings_last_line_not_after_its_comments() -> None:
    added = set_value(RECIPE_TEXT, ("components", "pytorch", "version"), "2.15.0", where="f")
    assert added == RECIPE_TEXT.replace("    source: wheel\n", "    source: wheel\n  pytorch: {version: 2.15.0}\n")
    deeper = set_value(RECIPE_TEXT, ("sagemaker", "a", "b"), "1", where="f")
    assert deeper == RECIPE_TEXT.replace("# trailing\n", 'sagemaker:\n  a: {b: "1"}\n# trailing\n')


@pytest.mark.parametrize("name", ["v100", "a100", "h100"])
def test_set_value_on_a_shipped_recipe_changes_one_line(name: str) -> None:
    """The shipped recipes hold multi-line quoted reasons (hold:) that the library would re-wrap."""
    text = (REPO / "recipes" / f"{name}.yaml").read_text()
    new = set_value(text, ("components", "nccl", "version"), "9.9.9", where=name)
    old_lines, new_lines = text.splitlines(), new.splitlines()
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=False) if a != b]
    assert yaml.safe_load(new)["components"]["nccl"]["version"] == "9.9.9"
    if len(new_lines) == len(old_lines):  # the recipe sets nccl's version: that line alone changes
        assert len(changed) == 1 and "9.9.9" in changed[0][1]
    else:  # it did not: lines are added, none changed
        added = [line for line in new_lines if line not in old_lines]
        assert all(line in new_lines for line in old_lines) and "9.9.9" in "".join(added) and len(added) <= 2


def test_set_value_refuses_what_it_cannot_edit() -> None:
    with pytest.raises(RecipeError, match=r"f: components.pytorch is null \(removed\)"):
        set_value("components:\n  pytorch: null\n", ("components", "pytorch", "version"), "2.15.0", where="f")
    with pytest.raises(RecipeError, match=r"f: components.sshd.ports: expected a single value"):
        set_value("components:\n  sshd: {ports: [22]}\n", ("components", "sshd", "ports"), "3022", where="f")
    with pytest.raises(RecipeError, match="expected a version-like value"):
        set_value("a: 1\n", ("a",), "1\nb: 2", where="f")
    # a flow mapping over two lines: the library writes it on one, so the edit would rewrite a line it does not own
    with pytest.raises(RecipeError, match=r"f: cannot set components.pytorch.version without rewriting lines"):
        set_value(
            "components:\n  pytorch: {version: 2.13.0,\n    numpy: 2.3.5}\n",
            ("components", "pytorch", "version"),
            "2.15.0",
            where="f",
        )


# ------------------------------------------------------------------------------------------------------------
# The real index


@pytest.mark.network
def test_h100_against_the_real_index() -> None:
    """The configured index (as pip finds it) has torch 2.15.0 or newer, and h100 (torch 2.15.0) is reported current
    against it, or behind once the index has a newer release."""
    newest = pypi.releases("torch")[-1]
    assert Version(newest) >= Version("2.15.0")
    result = run("outdated", "h100", "--json")
    torch = rows(result.stdout, "h100")["pytorch"]
    assert torch["pinned"] == "2.15.0" and torch["newest"] == newest
    assert torch["status"] == ("current" if newest == "2.15.0" else "outdated")
    assert torch["source"] == {"kind": "index", "name": "torch"}
    behind = json.loads(result.stdout)["outdated"]
    assert result.exit_code == (18 if behind else 0), result.output


def test_a_stalled_index_costs_the_run_one_deadline(index_env: Index, monkeypatch: pytest.MonkeyPatch) -> None:
    """`outdated --json` over every shipped recipe against an index that never answers in time: each project's page
    is asked for once in the whole run (it was asked again for every recipe: 27 waits of the full deadline), and the
    projects not asked before the run's one deadline passed say so. The JSON is whole; exit 7 (the index could not
    say)."""
    index_env.server.slow_prefix = "/simple/"
    index_env.server.stall_before = 30.0
    monkeypatch.setenv("IMGBUILD_INDEX_DEADLINE", "2")
    result = run("outdated", "--json")
    assert result.exit_code == 7, result.output
    data = json.loads(result.stdout)
    asked = [path for method, path, _ in index_env.server.log if path.startswith("/simple/")]
    assert asked and len(asked) == len(set(asked)), asked
    unknown = [f for r in data["recipes"] for f in r["components"] if f["status"] == "unknown"]
    assert len(unknown) > len(asked)  # the same projects, for many recipes, asked once
    reasons = " ".join(json.dumps(f) for f in unknown)
    assert "this run's deadline for the index (2 s, IMGBUILD_INDEX_DEADLINE) had passed" in reasons


def test_a_known_risk_is_shown_on_its_row(index_env: Index, recipe_dir: Path, tmp_path: Path) -> None:
    """A pinned release its component's release file marks bad (here a risk: EFA 1.48.0's aws-ofi-nccl 1.19.0) is on
    its row, with why and the upstream link, in the JSON and the table."""
    gpu_index(index_env, tmp_path, ["2.13.0"])
    path = recipe_dir / "risk.yaml"
    path.write_text(GPU_RECIPE.replace("efa: {version: 1.50.0}", "efa: {version: 1.48.0}"))
    result = run("outdated", str(path), "--json")
    assert result.exit_code == 18, result.output  # EFA 1.48.0 is behind 1.51.0
    plugin = rows(result.stdout, "risk")["aws_ofi_nccl"]
    assert plugin["pinned"] == "1.19.0" and plugin["bad"].startswith(
        "aws_ofi_nccl 1.19.0 (bundled with EFA installer 1.48.0) is a known risk:"
    )
    assert "https://github.com/aws/deep-learning-containers/pull/6668" in plugin["bad"]
    assert rows(result.stdout, "risk")["efa"]["bad"] is None
    text = run("outdated", str(path))
    assert "is a known risk" in " ".join(text.stdout.split())
