"""`imgbuild schema [-o FILE]`: the JSON Schema of a recipe file, for editors (yaml-language-server) and CI.

`recipe_schema()` is the one place the schema is made: from the pydantic model (`imgbuild.recipe.Recipe`),
loosened for what a *file* may say that the merged recipe cannot: `extends:`, keys left to a parent (nothing is
required in a file), and `null`, which removes an inherited key. The docs site's table of recipe keys is built from
the same function (docs/hooks.py).
"""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from imgbuild.cli.console import err, handled

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def register(app: typer.Typer) -> None:
    """Add the `schema` command to `app`."""
    app.command("schema")(schema_command)


def _file_object(node: dict[str, Any]) -> None:
    """An object of the model as a file may write it: every key optional, and each may be null."""
    node.pop("required", None)
    for name, prop in node.get("properties", {}).items():
        if prop.get("type") == "null" or {"type": "null"} in prop.get("anyOf", ()):
            continue
        keep = {k: prop.pop(k) for k in ("title", "description", "default") if k in prop}
        node["properties"][name] = {"anyOf": [prop, {"type": "null"}], **keep}


def _requirements_file(app: dict[str, Any]) -> None:
    """`app.requirements` as a file writes it (imgbuild/recipe.py's `_read_requirements_file`): a list, or the name of a
    requirements file beside the recipe; `requirements_file` is what the loader sets from that name, never written."""
    del app["requirements_file"]
    listed = app["requirements"]["anyOf"][0]
    listed.setdefault("description", "the requirements, one specifier each")
    app["requirements"]["anyOf"].insert(
        1, {"type": "string", "pattern": r"\.txt$", "description": "a requirements file beside the recipe (*.txt)"}
    )


def recipe_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a recipe file, as `imgbuild schema` prints it."""
    from imgbuild.recipe import Recipe

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


@handled
def schema_command(
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Write the schema to this file (default: stdout)."),
    ] = None,
) -> None:
    """Print the JSON Schema of a recipe file, for editors: a recipe's first line
    `# yaml-language-server: $schema=FILE` makes yaml-language-server complete and check it."""
    from imgbuild.core.outputs import write_file

    text = schema_text()
    if output is None:
        sys.stdout.write(text)
        return
    write_file(output, text, what="the recipe schema")
    err().print(f"wrote {output}: the JSON Schema of a recipe file", markup=False)
