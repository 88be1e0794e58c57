"""MkDocs hooks: the parts of the docs the code already says, made from the code when the site is built.

A page asks for one with a marker line, `<!-- generated: NAME -->`:

- `commands`: every command, argument and option, read from the CLI itself (typer's own Markdown of
  `imgbuild.cli.app`, as `typer imgbuild.cli utils docs` writes it);
- `exit-codes`: each `ImgbuildError` subclass of `imgbuild.core.errors` with its exit code and docstring;
- `recipe-keys`: every key of a recipe file, from `imgbuild.recipe.schema.recipe_schema()` (what `imgbuild schema`
  prints, made from the pydantic model).

The built site also carries that schema as `recipe.schema.json`. A marker naming nothing known fails the build.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import typer
from mkdocs.exceptions import PluginError
from typer.cli import get_docs_for_click

from imgbuild.cli import app
from imgbuild.core import errors
from imgbuild.recipe.schema import recipe_schema, schema_text

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def _cell(text: str) -> str:
    """One Markdown table cell: one line, pipes escaped, `<` shown (`_shown`)."""
    return _shown(" ".join(text.split()).replace("|", "\\|"))


_CODE = re.compile(r"^```.*?^```$|(`+).+?\1", re.MULTILINE | re.DOTALL)


def _shown(markdown: str) -> str:
    """`markdown` with each `<` outside code (spans and fenced blocks) escaped: help text's placeholders
    (`<tag>-<arch>`, `unlocked-<hash>`) are text, not HTML tags a browser drops."""
    out, last = [], 0
    for code in _CODE.finditer(markdown):
        out += [markdown[last : code.start()].replace("<", "&lt;"), code.group()]
        last = code.end()
    return "".join([*out, markdown[last:].replace("<", "&lt;")])


# --------------------------------------------------------------------------------------------------------------
# Commands


def commands() -> str:
    """typer's own Markdown for the CLI (what `typer imgbuild.cli utils docs` prints), one heading level down: each
    command's docstring and each option's and argument's `help=`, as written once in the CLI's code."""
    command = typer.main.get_command(app)
    text = get_docs_for_click(obj=command, ctx=typer.Context(command), name="imgbuild", indent=1)
    return _shown(text.strip()) + "\n"


# --------------------------------------------------------------------------------------------------------------
# Exit codes


def _error_classes() -> list[type[errors.ImgbuildError]]:
    found: list[type[errors.ImgbuildError]] = []
    todo: list[type[errors.ImgbuildError]] = [errors.ImgbuildError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return sorted((c for c in found if c.__module__ == errors.__name__), key=lambda c: c.exit_code)


def exit_codes() -> str:
    rows = ["| code | error | meaning |", "| --- | --- | --- |", "| 0 | | success |"]
    for cls in _error_classes():
        doc = inspect.getdoc(cls) or ""
        if cls is errors.ImgbuildError:
            doc = "an unexpected error (any exception that is no ImgbuildError; IMGBUILD_DEBUG=1 shows its traceback)"
        rows.append(f"| {cls.exit_code} | `{cls.__name__}` | {_cell(doc)} |")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------------------------------------------
# Recipe keys


def _target(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node` without its `null` branch, a `$ref` followed."""
    branches: list[dict[str, Any]] = [b for b in node.get("anyOf", [node]) if b.get("type") != "null"]
    one: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    ref = one.get("$ref")
    if isinstance(ref, str):
        return dict(schema["$defs"][ref.rsplit("/", 1)[1]])
    return one


def _type(schema: dict[str, Any], node: dict[str, Any]) -> str:
    node = _target(schema, node)
    if "anyOf" in node:
        return " or ".join(_type(schema, b) for b in node["anyOf"])
    if "enum" in node:
        return " | ".join(f"`{v}`" for v in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type(schema, node.get('items', {}))}"
    if kind == "object":
        values = node.get("additionalProperties")
        return f"mapping to {_type(schema, values)}" if isinstance(values, dict) else "mapping"
    if kind == "integer":
        bounds = [
            f">= {node['minimum']}" if "minimum" in node else "",
            f"<= {node['maximum']}" if "maximum" in node else "",
        ]
        return " ".join(["integer", *[b for b in bounds if b]])
    return str(kind or "any")


def _default(node: dict[str, Any]) -> str:
    if "default" not in node or node["default"] in (None, {}, [], ""):
        return ""
    value = node["default"]
    if isinstance(value, dict):
        return ""  # a section's defaults are its keys' own
    return f"`{value if isinstance(value, str) else json.dumps(value)}`"


def _rows(schema: dict[str, Any], node: dict[str, Any], prefix: str) -> list[str]:
    rows: list[str] = []
    for name, prop in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        target = _target(schema, prop)
        if target.get("type") == "object" and "properties" in target:
            doc = target.get("description", "")
            rows.append(f"| **`{key}`** | section | | {_cell(doc)} |")
            rows += _rows(schema, target, f"{key}.")
        else:
            cells = [f"`{key}`", _type(schema, prop), _default(prop), prop.get("description", "")]
            rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def recipe_keys() -> str:
    schema = recipe_schema()
    return (
        "\n".join(["| key | type | default | about |", "| --- | --- | --- | --- |", *_rows(schema, schema, "")]) + "\n"
    )


GENERATORS = {"commands": commands, "exit-codes": exit_codes, "recipe-keys": recipe_keys}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise PluginError(
                f"{page.file.src_path}: no generated part named {name!r} (known: {', '.join(GENERATORS)})"
            )
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_post_build(config: Any) -> None:
    (Path(config["site_dir"]) / "recipe.schema.json").write_text(schema_text())
