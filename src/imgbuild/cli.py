"""The `imgbuild` command line. Every ImgbuildError becomes a short message and its own exit code; a traceback
only with IMGBUILD_DEBUG=1."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from imgbuild import __version__, lock, recipe, render
from imgbuild.errors import ImgbuildError, LockError, RecipeError
from imgbuild.resolver import Resolved, index_lookup, resolve

app = typer.Typer(
    help="Build, verify and publish container images for multi-node deep-learning training on AWS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])

RecipeArg = Annotated[str, typer.Argument(help="A shipped recipe's name (see `imgbuild list`) or a YAML file.")]


def handled(fn: F) -> F:
    """Turn ImgbuildError into a message on stderr and the error class's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ImgbuildError as exc:
            if os.environ.get("IMGBUILD_DEBUG"):
                raise
            err.print(f"imgbuild: error: {exc.message}", markup=False)
            if exc.hint:
                err.print(f"hint: {exc.hint}", markup=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def _warn(resolved: Resolved) -> None:
    for w in resolved.warnings:
        err.print(f"imgbuild: warning: {w}", markup=False)


def _resolved(ref: str) -> tuple[recipe.LoadedRecipe, Resolved, str]:
    loaded = recipe.load(ref)
    if loaded.recipe.abstract:
        raise RecipeError(
            f"{recipe.display(loaded.path)}: '{loaded.recipe.name}' is abstract (a parent for other recipes)"
        )
    resolved, how = lock.resolved_for(loaded)
    return loaded, resolved, how


def _version_callback(value: bool) -> None:
    if value:
        out.print(f"imgbuild {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """imgbuild: recipes -> pinned, proven Dockerfiles -> images -> verified -> published."""


@app.command("list")
@handled
def list_(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """List the shipped recipes and the state of their locks."""
    rows = []
    for name in recipe.shipped_names():
        loaded = recipe.load(name)
        try:
            state = "locked" if lock.read(loaded) else "no lock"
        except LockError:
            state = "stale lock"
        r = loaded.recipe
        rows.append({"name": name, "accelerator": r.platform.accelerator, "lock": state,
                     "description": r.description})  # fmt: skip
    if as_json:
        out.print_json(json.dumps(rows))
        return
    table = Table("recipe", "accelerator", "lock", "description", box=None)
    for row in rows:
        table.add_row(row["name"], row["accelerator"], row["lock"], row["description"])
    out.print(table)


@app.command()
@handled
def show(
    ref: RecipeArg,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show a recipe's resolved components: versions, sources and why each version."""
    loaded, resolved, how = _resolved(ref)
    plan = render.plan(resolved)
    if as_json:
        data = {
            "recipe": resolved.name,
            "file": recipe.display(loaded.path),
            "from": how,
            "base": resolved.base_ref,
            "image": plan.image_refs,
            "components": {k: v.model_dump() for k, v in resolved.pins.items()},
            "warnings": list(resolved.warnings),
        }
        out.print_json(json.dumps(data))
        return
    _warn(resolved)
    out.print(f"[bold]{resolved.name}[/bold]  {resolved.recipe.description}")
    out.print(
        f"file: {recipe.display(loaded.path)}  (pins from {'the lock' if how == 'lock' else 'a fresh resolution'})"
    )
    out.print(f"base: {resolved.base_ref}")
    out.print(f"tags: {', '.join(plan.image_refs)}")
    table = Table("component", "version", "source", "why", box=None)
    for name, pin in resolved.pins.items():
        table.add_row(name, pin.version or "-", pin.source, pin.origin)
    out.print(table)


@app.command("render")
@handled
def render_(
    ref: RecipeArg,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the Dockerfile and its context files here.")
    ] = None,
) -> None:
    """Render a recipe's Dockerfile (to stdout, or with its build context into a folder)."""
    _, resolved, _ = _resolved(ref)
    plan = render.plan(resolved)
    _warn(resolved)
    if output is None:
        sys.stdout.write(plan.dockerfile)
        return
    from imgbuild import context

    context.write(plan, output)
    err.print(f"wrote {output}/Dockerfile and {len(plan.files)} context files", markup=False)


@app.command("lock")
@handled
def lock_(
    ref: RecipeArg,
    offline: Annotated[bool, typer.Option("--offline", help="Use only the shipped tables, no index lookups.")] = False,
) -> None:
    """Resolve a recipe and write its pins to a lock file beside it."""
    loaded = recipe.load(ref)
    if loaded.recipe.abstract:
        raise RecipeError(
            f"{recipe.display(loaded.path)}: '{loaded.recipe.name}' is abstract (a parent for other recipes)"
        )
    resolved = resolve(loaded, lookup_torch=None if offline else index_lookup)
    _warn(resolved)
    path = lock.write(loaded, resolved)
    out.print(f"locked {resolved.name} -> {recipe.display(path)}", markup=False)


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("imgbuild: interrupted")
        sys.exit(130)
    except Exception as exc:  # an ImgbuildError never gets here: every command is @handled
        if os.environ.get("IMGBUILD_DEBUG"):
            raise
        err.print(f"imgbuild: unexpected error: {type(exc).__name__}: {exc}", markup=False)
        err.print("hint: run again with IMGBUILD_DEBUG=1 for a traceback, and report it", markup=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
