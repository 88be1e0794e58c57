"""The JSON Schema of a recipe file, for editors (yaml-language-server) and CI: what `imgbuild schema` prints
(imgbuild.cli.schema) and the docs site's table of recipe keys is built from (docs/hooks.py).

`recipe_schema()` is the one place the schema is made: from the pydantic model (`imgbuild.recipe.model.Recipe`),
loosened for what a *file* may say that the merged recipe cannot: `extends:`, keys left to a parent (nothing is
required in a file), and `null`, which removes an inherited key.
"""

from __future__ import annotations

import json
from typing import Any

from imgbuild.recipe.model import Recipe

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _file_object(node: dict[str, Any]) -> None:
    """An object of the model as a file may write it: every key optional, and each may be null."""
    node.pop("required", None)
    for name, prop in node.get("properties", {}).items():
        if prop.get("type") == "null" or {"type": "null"} in prop.get("anyOf", ()):
            continue
        keep = {k: prop.pop(k) for k in ("title", "description", "default") if k in prop}
        node["properties"][name] = {"anyOf": [prop, {"type": "null"}], **keep}


def _requirements_file(app: dict[str, Any]) -> None:
    """`app.requirements` as a file writes it (imgbuild/recipe/loading.py's `_read_requirements_file`): a list, or the
    name of a requirements file beside the recipe; `requirements_file` is what the loader sets from that name, never
    written."""
    del app["requirements_file"]
    listed = app["requirements"]["anyOf"][0]
    listed.setdefault("description", "the requirements, one specifier each")
    app["requirements"]["anyOf"].insert(
        1, {"type": "string", "pattern": r"\.txt$", "description": "a requirements file beside the recipe (*.txt)"}
    )


def recipe_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a recipe file, as `imgbuild schema` prints it."""
    schema = Recipe.model_json_schema(mode="validation")
    for node in [schema, *schema.get("$defs", {}).values()]:
        if node.get("type") == "object" and "properties" in node:
            _file_object(node)
    _requirements_file(schema["$defs"]["App"]["properties"])
    schema["properties"] = {
        "extends": {
            "type": "string",
            "title": "Extends",
            "description": "The parent recipe: a shipped recipe's name or the path of a .yaml/.yml file relative "
            "to this one. Its keys are merged into this file's, key by key; null removes an inherited key.",
        },
        **schema["properties"],
    }
    schema["title"] = "imgbuild recipe"
    schema["description"] = (
        "A recipe file of imgbuild (recipes/NAME.yaml). Each file is checked as written: keys may come from "
        "its parent (extends), so none is required here; `imgbuild show RECIPE` checks the merged recipe."
    )
    return {"$schema": SCHEMA_DIALECT, **schema}


def schema_text() -> str:
    """`recipe_schema()` as the indented JSON `imgbuild schema` writes, ending with a newline."""
    return json.dumps(recipe_schema(), indent=2, sort_keys=False) + "\n"
