"""What every command (imgbuild.cli, imgbuild.cluster) shares: the consoles, the error handler, the RECIPE argument.

Kept light on purpose: every command module imports it when `imgbuild` starts, so rich and the recipe model are
imported only when a command first prints or loads a recipe (`imgbuild --version` needs neither).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from imgbuild.errors import ImgbuildError

if TYPE_CHECKING:
    from rich.console import Console

    from imgbuild.recipe import LoadedRecipe
    from imgbuild.resolver import Resolved

F = TypeVar("F", bound=Callable[..., Any])

RecipeArg = Annotated[str, typer.Argument(help="A shipped recipe's name (see `imgbuild list`) or a YAML file.")]


@functools.cache
def out() -> Console:
    """The console for results (stdout)."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


@functools.cache
def err() -> Console:
    """The console for progress, warnings and errors (stderr)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def handled(fn: F) -> F:
    """Turn ImgbuildError into a message on stderr and the error class's exit code (a traceback only with
    IMGBUILD_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ImgbuildError as exc:
            if os.environ.get("IMGBUILD_DEBUG"):
                raise
            err().print(f"imgbuild: error: {exc.message}", markup=False)
            if exc.hint:
                err().print(f"hint: {exc.hint}", markup=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def warn(resolved: Resolved) -> None:
    """The resolution's warnings, one line each on stderr."""
    for w in resolved.warnings:
        err().print(f"imgbuild: warning: {w}", markup=False)


def resolved(ref: str) -> tuple[LoadedRecipe, Resolved, str]:
    """The recipe REF (refused when abstract) with its pins: from its lock when fresh ("lock"), else freshly
    resolved ("resolved")."""
    from imgbuild import lock, recipe

    loaded = recipe.load(ref).concrete()
    result, how = lock.resolved_for(loaded)
    return loaded, result, how
