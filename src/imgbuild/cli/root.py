"""The root of the `imgbuild` command line: the typer app with every group's commands registered, its callback
(`--version`), and `main`, the console entry point (SIGINT's default handler taken back; an error no command
handled is one line and exit 1, a traceback only with IMGBUILD_DEBUG=1)."""

import os
import signal
import sys
from typing import Annotated

import typer

import imgbuild.cli.build as build
import imgbuild.cli.publish as publish
import imgbuild.cli.recipes as recipes
import imgbuild.cli.run as run
import imgbuild.cli.sbom as sbom
import imgbuild.cli.schema as schema
import imgbuild.cli.verify as verify
from imgbuild import __version__
from imgbuild.cli.cluster import app as cluster_app
from imgbuild.cli.console import err

__all__ = ["app", "main"]

app = typer.Typer(
    help="Build, verify and publish container images for multi-node deep-learning training on AWS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"imgbuild {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """imgbuild: recipes -> pinned, proven Dockerfiles -> images -> verified -> published."""


recipes.register(app)
build.register(app)
verify.register(app)
run.register(app)
publish.register(app)
sbom.register(app)
schema.register(app)
app.add_typer(cluster_app, name="cluster")


def main() -> None:
    """Console entry point."""
    # A process started in the background by a non-interactive shell inherits "ignore SIGINT"; Ctrl-C (or a
    # CI runner's SIGINT) must still cancel builds cleanly, so take the default handler back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app()
    except KeyboardInterrupt:
        err().print("imgbuild: interrupted")
        sys.exit(130)
    except Exception as exc:  # an ImgbuildError never gets here: every command is @handled
        if os.environ.get("IMGBUILD_DEBUG"):
            raise
        from imgbuild.core.validate import redact

        err().print(f"imgbuild: unexpected error: {type(exc).__name__}: {redact(str(exc))}", markup=False)
        err().print("hint: run again with IMGBUILD_DEBUG=1 for a traceback, and report it", markup=False)
        sys.exit(1)
