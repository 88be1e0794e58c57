"""`imgbuild sbom RECIPE`: the CycloneDX SBOM of a built image (imgbuild.publish.inventory, imgbuild.image.sbom)."""

import sys
from pathlib import Path
from typing import Annotated

import typer

from imgbuild.cli.console import RecipeArg, err, handled, resolved, warn
from imgbuild.core import validate
from imgbuild.core.interrupts import terminable


def register(app: typer.Typer) -> None:
    """Add the `sbom` command to `app`."""
    app.command("sbom")(sbom_command)


@handled
@terminable
def sbom_command(
    ref: RecipeArg,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the document here (default: stdout).")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="REF",
            callback=validate.option(validate.image_ref),
            help="The image to describe (default: the recipe's lock-<hash> image).",
        ),
    ] = None,
) -> None:
    """What a built image holds, as CycloneDX JSON: the lock's pins and checksums, its Debian packages and Python
    distributions with their hashes, its digests."""
    from imgbuild.image import identity
    from imgbuild.publish import inventory

    _, res = resolved(ref)
    warn(res)
    made = inventory.make(res, identity.of(res), image=image)
    for warning in made.warnings:
        err().print(f"imgbuild: warning: {warning}", markup=False)
    if output is None:
        sys.stdout.write(made.text)
        return
    inventory.write(made, output)
    err().print(f"wrote {output}: the SBOM of {made.image} ({made.image_id[:19]})", markup=False)
