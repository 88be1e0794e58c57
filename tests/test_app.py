"""The user's layer (`app:`): the recipe section and its bad input, its lock (requirements after the stack's pins, a
conflicting one refused naming both versions), and what render makes of it (stages, context, tags). The image built,
verified and run as a SageMaker job is tests/test_app_image.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import REPO, hadolint
from imgbuild import recipe
from imgbuild.core.errors import RecipeError, RenderError, ResolveError
from imgbuild.image import identity, render
from imgbuild.pin import record, resolver, wheels

EXAMPLE = REPO / "examples" / "pytorch-app" / "pytorch-app.yaml"


def write(folder: Path, text: str, name: str = "app.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def resolve(path: Path) -> resolver.Resolved:
    return resolver.resolve(recipe.load(path), lookup_torch=None)


@pytest.fixture
def code(recipe_dir: Path) -> Path:
    folder = recipe_dir / "code"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("print('training')\n")
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (folder / "run.sh").chmod(0o755)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "__pycache__").mkdir()
    (folder / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (folder / "data").mkdir()
    (folder / "data" / "big.bin").write_bytes(b"\1" * 10)
    return folder


# ------------------------------------------------------------------------------------------------------------
# The section


def test_requirements_as_a_list_and_as_a_file_beside_the_recipe(recipe_dir: Path) -> None:
    listed = resolve(write(recipe_dir, "extends: pytorch\napp: {requirements: [einops==0.8.1, tqdm]}\n"))
    (recipe_dir / "requirements.txt").write_text("# ours\neinops==0.8.1  # tensors\n\ntqdm\n")
    filed = resolve(write(recipe_dir, "extends: pytorch\napp: {requirements: requirements.txt}\n", "f.yaml"))
    for resolved in (listed, filed):
        assert resolved.pins["app"].details.requirements == ("einops", "tqdm")
        assert record.requirement_sets(resolved)["app"] == ["einops==0.8.1", "tqdm"]


def test_editing_the_requirements_file_makes_the_lock_stale(recipe_dir: Path) -> None:
    (recipe_dir / "requirements.txt").write_text("einops==0.8.1\n")
    path = write(recipe_dir, "extends: pytorch\napp: {requirements: requirements.txt}\n")
    before = recipe.load(path).digest
    (recipe_dir / "requirements.txt").write_text("einops==0.8.0\n")
    assert recipe.load(path).digest != before


@pytest.mark.parametrize(
    ("app", "files", "message"),
    [
        ("{requirements: missing.txt}", {}, r"app.yaml:2: app.requirements: no such file .*missing.txt"),
        (
            "{requirements: reqs.txt}",
            {"reqs.txt": "einops\n--index-url http://example.invalid/simple\n"},
            r"reqs.txt:2: expected a requirement such as transformers==4.46.3, got the pip option",
        ),
        ("{requirements: reqs.txt}", {"reqs.txt": "p @ https://example.invalid/p.whl\n"}, r"reqs.txt:1: .*direct ref"),
        ("{requirements: ../outside.txt}", {}, r"app.requirements: '../outside.txt' is outside the recipe's folder"),
        ("{requirements: [torch>=]}", {}, r"app.requirements.0: expected a requirement .*PEP 508"),
        ("{code: {dir: ../elsewhere}}", {}, r"app.code.dir: '../elsewhere' is outside the recipe's folder"),
        ("{code: {dir: nothing-here}}", {}, r"app.code.dir: no such folder .*nothing-here"),
        ("{code: {dir: /etc}}", {}, r"app.code.dir: expected a relative path"),
        ("{packages: ['Bad Name']}", {}, r"app.packages.0: expected a Debian package name"),
        ("{requirement: [x]}", {}, r"app.requirement: unknown key; did you mean 'requirements'"),
    ],
    ids=["missing-file", "pip-option", "url", "outside-file", "malformed", "outside-code", "no-code", "abs-code",
         "os-package", "typo"],
)  # fmt: skip
def test_bad_input_names_the_file_the_key_and_what_was_expected(
    recipe_dir: Path, app: str, files: dict[str, str], message: str
) -> None:
    (recipe_dir.parent / "elsewhere").mkdir(exist_ok=True)
    (recipe_dir.parent / "outside.txt").write_text("einops\n")
    for name, text in files.items():
        (recipe_dir / name).write_text(text)
    with pytest.raises(RecipeError) as err:
        recipe.load(write(recipe_dir, f"extends: pytorch\napp: {app}\n"))
    assert re.search(message, str(err.value)), str(err.value)
    assert err.value.exit_code == 3


def test_a_code_folder_that_links_out_of_the_recipes_folder_is_refused(recipe_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    os.symlink(tmp_path / "secret", recipe_dir / "code")
    with pytest.raises(RecipeError, match="outside the recipe's folder"):
        recipe.load(write(recipe_dir, "extends: pytorch\napp: {code: {dir: code}}\n"))


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("{requirements: [einops], from_source: [horovod]}", r"app.from_source: horovod not among app.requirements"),
        ("{requirements: [einops, Einops==0.8.1]}", r"app.requirements: named more than once: einops"),
        ("{code: {dir: code}, program: nope.py}", r"app.program: 'nope.py' is not a file in the code folder"),
        ("{code: {dir: code, install: true}}", r"app.code.install: .*pyproject.toml: missing"),
    ],
    ids=["from-source", "twice", "program", "install"],
)
def test_resolution_refuses_what_cannot_be_built(recipe_dir: Path, code: Path, app: str, message: str) -> None:
    with pytest.raises(ResolveError) as err:
        resolve(write(recipe_dir, f"extends: pytorch\napp: {app}\n"))
    assert re.search(message, str(err.value)), str(err.value)
    assert err.value.exit_code == 5


def test_a_program_without_sagemaker_is_refused(recipe_dir: Path, code: Path) -> None:
    text = "extends: pytorch\ncomponents: {sagemaker: null}\napp: {code: {dir: code}, program: train.py}\n"
    path = write(recipe_dir, text)
    with pytest.raises(ResolveError, match=r"app\.program: the default program is train's"):
        resolve(path)


# ------------------------------------------------------------------------------------------------------------
# The lock: requirements after the stack's pins


@pytest.mark.network
@pytest.mark.parametrize(
    ("requirement", "replaced"),
    [
        ("torch==2.8.0", "torch 2.9.1 (requirement set pytorch/torch) with 2.8.0"),
        ("numpy<2", "numpy 2.2.6 (requirement set pytorch/torch) with 1.26.4"),
        ("mpi4py==4.0.3", "mpi4py 3.1.4 (components.mpi4py (distro)) with 4.0.3"),
    ],
    ids=["torch", "numpy-transitive-bound", "distro-mpi4py"],
)
def test_a_requirement_that_would_replace_a_pinned_distribution_is_refused_at_lock_time(
    recipe_dir: Path, requirement: str, replaced: str
) -> None:
    resolved = resolve(write(recipe_dir, f"extends: pytorch\napp: {{requirements: ['{requirement}']}}\n"))
    with pytest.raises(ResolveError) as err:
        record.record(resolved, offline=False)
    text = str(err.value)
    assert f"requirements would replace {replaced}" in text, text
    assert err.value.exit_code == 5


@pytest.mark.network
def test_the_users_requirements_are_pinned_after_the_stacks_and_hold_none_of_its() -> None:
    resolved = resolve(EXAMPLE)
    sets = record.requirement_sets(resolved)
    out = wheels.compile_sets(sets, resolved)
    assert list(out)[-2:] == ["app", "app/build"]
    app = {r.name: r for r in out["app"]}
    assert app["einops"].version == "0.8.1" and "tqdm" in app
    stack = {r.name for name, reqs in out.items() if not name.startswith("app") for r in reqs}
    assert not stack & app.keys()  # torch, numpy... stay the stack's
    assert {r.name for r in out["app/build"]} == {"setuptools"}


# ------------------------------------------------------------------------------------------------------------
# Render


def test_code_is_copied_after_its_ignore_rules_with_its_modes(recipe_dir: Path, code: Path) -> None:
    path = write(recipe_dir, "extends: pytorch\napp: {code: {dir: code, ignore: ['data/']}, program: train.py}\n")
    resolved = resolve(path)
    plan = render.plan(resolved)
    files = {f.path: f for f in plan.files if f.path.startswith("imgbuild/app/code/")}
    assert sorted(files) == [f"imgbuild/app/code/{p}" for p in ("pkg/__init__.py", "run.sh", "train.py")]
    assert files["imgbuild/app/code/run.sh"].mode == 0o755 and files["imgbuild/app/code/train.py"].mode == 0o644
    assert "COPY imgbuild/app/code/ /opt/ml/code/" in plan.dockerfile
    assert "FROM runtime AS app-build" not in plan.dockerfile  # nothing to compile: no build stage
    assert resolved.pins["app"].details.program == "/opt/ml/code/train.py"
    assert plan.manifest is not None and plan.manifest.app is not None and plan.manifest.app.code_digest


def test_an_edited_program_makes_new_tags_without_a_new_lock(recipe_dir: Path, code: Path) -> None:
    resolved = resolve(write(recipe_dir, "extends: pytorch\napp: {code: {dir: code}}\n"))
    before = identity.of(resolved).refs()
    (code / "train.py").write_text("print('training harder')\n")
    after = identity.of(resolved).refs()
    assert before[0] != after[0] and before[1] != after[1]
    assert re.fullmatch(r"imgbuild/app:pt2\.9\.1-nccl2\.27\.5-ompi4\.1\.4-code[0-9a-f]{8}", after[1])
    (code / "data" / "big.bin").write_bytes(b"\2")  # ignored? not here: only the defaults are
    assert identity.of(resolved).refs()[0] != after[0]


def test_a_link_out_of_the_code_folder_is_a_render_error(recipe_dir: Path, code: Path, tmp_path: Path) -> None:
    (tmp_path / "key").write_text("secret")
    os.symlink(tmp_path / "key", code / "key")
    with pytest.raises(RenderError, match=r"key is a link to .*key: only links to files inside the folder"):
        render.plan(resolve(write(recipe_dir, "extends: pytorch\napp: {code: {dir: code}}\n")))


def test_the_example_builds_its_package_in_a_stage_of_its_own_against_the_stack() -> None:
    resolved = resolve(EXAMPLE)
    text = render.plan(resolved).dockerfile
    build, image = text.split("FROM runtime AS app-build")[1].split("FROM runtime AS app\n")
    assert "libopenmpi-dev" in build and "python3-dev" in build
    assert "NCCL_LIB_DIR=/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib" in build
    assert "pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/imgbuild-app-wheels" in build
    assert "build-essential" not in image and "from=app-build" in image
    assert text.index("FROM runtime AS app\n") < text.index("COPY imgbuild/manifest.json")


@pytest.mark.parametrize("name", ["example", "from-source"])
def test_the_users_layer_is_hadolint_clean(name: str, recipe_dir: Path, tmp_path: Path) -> None:
    if name == "example":
        resolved = resolve(EXAMPLE)
    else:
        path = write(
            recipe_dir,
            "extends: pytorch\napp:\n  requirements: [horovod==0.28.1]\n  from_source: [horovod]\n"
            "  build_env: {HOROVOD_WITH_PYTORCH: '1'}\n  packages: [curl]\n",
        )
        resolved = resolve(path)
        assert record.requirement_sets(resolved)["app/source"] == ["--no-binary=horovod", "horovod==0.28.1"]
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(render.plan(resolved).dockerfile)
    import subprocess

    ran = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
