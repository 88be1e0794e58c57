"""What every command (imgbuild.cli, imgbuild.cluster) shares: the consoles, the error handler, the RECIPE argument.

Kept light on purpose: every command module imports it when `imgbuild` starts, so rich and the recipe model are
imported only when a command first prints or loads a recipe (`imgbuild --version` needs neither).
"""

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO, TypeVar

import typer

from imgbuild.core.errors import ImgbuildError

if TYPE_CHECKING:
    from rich.console import Console

    from imgbuild.pin.resolver import Resolved
    from imgbuild.recipe import LoadedRecipe

F = TypeVar("F", bound=Callable[..., Any])

RecipeArg = Annotated[str, typer.Argument(help="A shipped recipe's name (see `imgbuild list`) or a YAML file.")]


# --files DIR of `build`, `lock` and `render`: a local folder of downloads (a corporate mirror, CI's copy), consulted
# before the network; a DIR that is not a readable folder is a usage error (exit 2) naming the option.
def _files_folder(value: Path | None) -> Path | None:
    """--files: a folder (click's dir_okay/file_okay pass a device or FIFO, which is neither a file nor a folder)."""
    if value is not None and not value.is_dir():
        raise typer.BadParameter(f"{value}: not a folder (a device, a FIFO or a socket)")
    return value


FilesOption = Annotated[
    Path | None,
    typer.Option(
        "--files",
        envvar="IMGBUILD_FILES",
        exists=True,
        file_okay=False,
        dir_okay=True,
        readable=True,
        callback=_files_folder,
        help="A local folder consulted before the network for every file the recipe downloads (tarballs, not "
        "wheels or packages), found by its file name (GitHub's archive of tag vX.Y as REPO-X.Y.tar.gz): `lock` "
        "hashes it from the file; `build` checks it against the lock's sha256 first (a mismatch is exit 16) and "
        "copies it into the build instead of downloading it. Not consulted with --sources.",
    ),
]


def platform_arch(value: str | None) -> str | None:
    """--platform linux/arm64 -> "arm64" (platform.arch's name); anything else is a usage error (exit 2) naming the
    option and the platforms imgbuild knows."""
    from imgbuild.core import platforms

    if value is None:
        return None
    try:
        return platforms.parse_platform(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def platform_archs(values: list[str] | None) -> list[str] | None:
    """A repeatable --platform: each as platform_arch reads it, none twice."""
    arches = [a for a in (platform_arch(v) for v in values or []) if a is not None]
    if len(set(arches)) != len(arches):
        raise typer.BadParameter(f"a platform is given twice: {', '.join(values or [])}")
    return arches or None


# The width of a table written to a pipe or a CI log without COLUMNS: wide enough that no row is wrapped (a table
# takes the width its cells need, never this whole width).
UNWRAPPED_WIDTH = 10_000
_OFF = ("0", "false", "no", "off")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def width_for(stream: TextIO) -> int:
    """The width tables on `stream` are laid out for: COLUMNS when set, the terminal's width on a TTY, otherwise
    UNWRAPPED_WIDTH (a pipe or a CI log: a row stays on one line)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if _isatty(stream):
        try:
            return os.get_terminal_size(stream.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            return 80
    return UNWRAPPED_WIDTH


def _console(stderr: bool) -> "Console":
    """A console for stdout or stderr with the width `width_for` gives (TERM=dumb or FORCE_COLOR do not bring
    back rich's 80 columns). FORCE_COLOR=0 (or false/no/off: what CI sets to ask for no colour) means no colour
    and no escape sequences, and whether the stream is a terminal is then its own answer; NO_COLOR and other
    FORCE_COLOR values are rich's."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    lines = os.environ.get("LINES", "").strip()
    options: dict[str, Any] = {
        "stderr": stderr,
        "highlight": False,
        "soft_wrap": True,
        "width": width_for(stream),
        "height": int(lines) if lines.isdigit() and int(lines) > 0 else 25,
    }
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None and force_color.strip().lower() in _OFF:
        options.update(color_system=None, force_terminal=_isatty(stream))
    return Console(**options)


@functools.cache
def out() -> "Console":
    """The console for results (stdout)."""
    return _console(stderr=False)


@functools.cache
def err() -> "Console":
    """The console for progress, warnings and errors (stderr)."""
    return _console(stderr=True)


def print_json(data: Any) -> None:
    """`data` as JSON on stdout, indented, exactly as json.dumps writes it: no colour, no escape sequences and no
    wrapping whatever FORCE_COLOR, NO_COLOR, TERM or the terminal say (a program reads it)."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (invalid UTF-8 a program printed, read as text): \u-escaped
        text = json.dumps(data, indent=2)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def handled(fn: F) -> F:
    """Turn ImgbuildError into a message on stderr and the error class's exit code (a traceback only with
    IMGBUILD_DEBUG=1). The message has no password in it: `ImgbuildError` redacts credentials when it is made."""

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


def warn(resolved: "Resolved") -> None:
    """The resolution's warnings, one line each on stderr."""
    for w in resolved.warnings:
        err().print(f"imgbuild: warning: {w}", markup=False)


def resolved(ref: str) -> "tuple[LoadedRecipe, Resolved]":
    """The recipe REF (refused when abstract) with its lock's pins; exit 4 naming the lock file when it has none.
    Each command that builds on a lock calls it once and hands the result down (build, push, verify, sbom, run,
    render, sources fetch, cluster job): nothing below the CLI looks the command's recipe up again."""
    from imgbuild.pin import lock

    return lock.for_ref(ref)
