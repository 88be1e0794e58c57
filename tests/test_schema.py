"""`imgbuild schema`: the JSON Schema of a recipe file, through the CLI. Every shipped recipe (parents and the
example included) is valid against it, and what the loader refuses as a recipe's error (exit 3) the schema refuses
too, so an editor with yaml-language-server flags what `imgbuild` would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from imgbuild.cli import app

REPO = Path(__file__).resolve().parent.parent
RECIPE_FILES = sorted([*(REPO / "recipes").glob("*.yaml"), *(REPO / "examples").glob("*/*.yaml")])


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> jsonschema.Draft202012Validator:
    out = tmp_path_factory.mktemp("schema") / "recipe.schema.json"
    result = CliRunner().invoke(app, ["schema", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    schema = json.loads(out.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(validator: jsonschema.Draft202012Validator, doc: Any) -> list[str]:
    """Every error as `key.path: message`, those inside an anyOf (a key or null) included."""
    found: list[str] = []
    stack = list(validator.iter_errors(doc))
    while stack:
        error = stack.pop()
        found.append(f"{'.'.join(map(str, error.absolute_path))}: {error.message}")
        stack.extend(error.context or ())
    return found


def test_stdout_is_the_file(validator: jsonschema.Draft202012Validator, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == validator.schema
    # The recipe's own keys reach the schema from the model: a block's options, the top-level keys, extends.
    props = validator.schema["properties"]
    assert {"extends", "platform", "base", "os", "components", "app", "hold"} <= set(props)
    assert "pytorch" in validator.schema["$defs"]["Components"]["properties"]


def test_every_key_has_a_description(validator: jsonschema.Draft202012Validator) -> None:
    """Every key a recipe may hold, the blocks' options included, says what it is for: its field's docstring (or,
    for a section, its model's), carried by the schema `imgbuild schema` prints."""
    schema = validator.schema
    objects = [("(top)", schema), *((name, d) for name, d in schema["$defs"].items() if "properties" in d)]
    keys = [(f"{where}.{key}", prop) for where, node in objects for key, prop in node["properties"].items()]
    assert len(keys) >= 100
    assert {"SageMaker", "Sshd", "Efa", "App", "AppCode", "Runtime"} <= {where for where, _ in objects}
    bare = [key for key, prop in keys if not str(prop.get("description", "")).strip()]
    assert not bare, f"recipe keys without a description (a docstring under the field): {bare}"


def test_a_description_is_the_docstring_under_its_field() -> None:
    """The schema's text is the field's own docstring: written once, beside the field."""
    from imgbuild.blocks.sagemaker import SageMaker
    from imgbuild.core.fields import Strict

    class Sample(Strict):
        """A sample section."""

        documented: int = 1
        """What it is for."""
        bare: int = 2
        inner: SageMaker | None = None

    props = Sample.model_json_schema()["properties"]
    assert props["documented"]["description"] == "What it is for."
    assert "description" not in props["bare"]
    assert props["inner"]["description"] == SageMaker.__doc__  # a section without a docstring: its model's
    launcher = SageMaker.model_json_schema()["properties"]["launcher"]["description"]
    assert launcher.startswith("mpirun: the leader runs the program")


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: p.name)
def test_shipped_recipes_are_valid(validator: jsonschema.Draft202012Validator, path: Path) -> None:
    assert errors(validator, yaml.safe_load(path.read_text())) == []


def test_shipped_recipes_are_all_checked() -> None:
    names = {p.stem for p in RECIPE_FILES}
    assert {"_cuda", "cpu", "gb200", "debian-cuda", "pytorch-app"} <= names


def test_a_child_may_leave_keys_to_its_parent_and_drop_them(validator: jsonschema.Draft202012Validator) -> None:
    doc = yaml.safe_load("extends: cpu\nplatform: {arch: [amd64, arm64]}\ncomponents: {mpi4py: null}\n")
    assert errors(validator, doc) == []


def test_requirements_may_name_a_file(validator: jsonschema.Draft202012Validator) -> None:
    assert errors(validator, {"extends": "pytorch", "app": {"requirements": "requirements.txt"}}) == []
    assert errors(validator, {"extends": "pytorch", "app": {"requirements": ["einops==0.8.1", "tqdm"]}}) == []


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("extends: cpu\nplatfrom: {arch: amd64}\n", ""),  # unknown key (a typo)
        ("extends: cpu\nplatform: {accelerator: tpu}\n", "platform.accelerator"),
        ("extends: cpu\nplatform: {arch: [amd64, riscv64]}\n", "platform.arch"),
        ("extends: cpu\ncomponents: {pytorch: {version: 2.9.1, cuda: 12.8}}\n", "components.pytorch"),
        ("extends: cpu\nruntime: {network: bridge}\n", "runtime.network"),
        ("extends: cpu\nplatform: {devices_per_node: 0}\n", "platform.devices_per_node"),
        ("extends: cpu\napp: {requirements_file: requirements.txt}\n", "app"),  # set by the loader, never written
        ("extends: cpu\napp: {requirements: requirements.yaml}\n", "app.requirements"),
    ],
)
def test_what_imgbuild_refuses_the_schema_refuses(
    validator: jsonschema.Draft202012Validator, tmp_path: Path, text: str, where: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    shown = CliRunner().invoke(app, ["show", str(path)])
    assert shown.exit_code == 3, shown.output  # RecipeError
    assert str(path) in shown.output
    found = errors(validator, yaml.safe_load(text))
    assert found, f"the schema accepts {text!r}, which imgbuild refuses: {shown.output}"
    assert any(e.startswith(f"{where}:") for e in found), found


def test_unwritable_output(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "recipe.schema.json"
    result = CliRunner().invoke(app, ["schema", "-o", str(target)])
    assert result.exit_code == 14, result.output  # OutputError
    assert f"{target}: cannot write the recipe schema" in result.output
    assert not target.exists()
