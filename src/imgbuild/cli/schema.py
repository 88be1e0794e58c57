"""`imgbuild schema [-o FILE]`: the JSON Schema of a recipe file, for editors (yaml-language-server) and CI. The
schema is made in imgbuild.recipe.schema (`recipe_schema()`, also what the docs site's table of recipe keys is built
from); this is the command that prints it."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from imgbuild.cli.console import err, handled


def register(app: typer.Typer) -> None:
    """Add the `schema` command to `app`."""
    app.command("schema")(schema_command)


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
    from imgbuild.recipe.schema import schema_text

    text = schema_text()
    if output is None:
        sys.stdout.write(text)
        return
    write_file(output, text, what="the recipe schema")
    err().print(f"wrote {output}: the JSON Schema of a recipe file", markup=False)
