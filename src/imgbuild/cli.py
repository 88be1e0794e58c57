"""The `imgbuild` command line. Every ImgbuildError becomes a short message and its own exit code; a traceback
only with IMGBUILD_DEBUG=1."""

from __future__ import annotations

import functools
import json
import os
import signal
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


@app.command("build")
@handled
def build_(
    ref: RecipeArg,
    tag: Annotated[list[str] | None, typer.Option("--tag", "-t", help="Extra image reference(s) to tag.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Build every step again.")] = False,
    pull: Annotated[bool, typer.Option("--pull/--no-pull", help="Try to pull newer base images.")] = False,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", help="KEY=VALUE, repeatable.")] = None,
    ca_bundle: Annotated[
        Path | None,
        typer.Option(
            "--ca-bundle",
            envvar="IMGBUILD_CA_BUNDLE",
            help="PEM bundle that downloads during the build trust (TLS-intercepting proxies). "
            "Used in builder stages only; never in the final image.",
        ),
    ] = None,
) -> None:
    """Build a recipe's image through the Docker engine (DOCKER_HOST and its TLS variables are honoured)."""
    from imgbuild import build, engine

    progress = engine.Progress.auto(err)
    result = build.build(
        ref,
        extra_tags=tag or [],
        nocache=no_cache,
        pull=pull,
        build_args=build.parse_build_args(build_arg or []),
        ca_bundle=build.ca_bundle_from(ca_bundle),
        progress=progress,
    )
    for w in result.warnings:
        err.print(f"imgbuild: warning: {w}", markup=False)
    out.print(f"built {result.image_id}", markup=False)
    for ref_ in result.refs:
        out.print(f"  {ref_}", markup=False)
    out.print(
        f"{result.steps_run} of {result.steps_total} steps run in {result.duration_s:.1f}s; log: {result.log_path}",
        markup=False,
    )


base_app = typer.Typer(help="Base images built offline from a Debian or Ubuntu archive.", no_args_is_help=True)
app.add_typer(base_app, name="base")


@base_app.command("bootstrap")
@handled
def base_bootstrap(
    name: Annotated[str, typer.Argument(help="Image name to create, e.g. debian:bookworm-slim or ubuntu:22.04.")],
    suite: Annotated[str | None, typer.Option(help="Archive suite (bookworm, jammy...); implied by NAME.")] = None,
    mirror: Annotated[str | None, typer.Option(help="Archive mirror URL; the distribution's default.")] = None,
    variant: Annotated[str, typer.Option(help="debootstrap variant.")] = "minbase",
) -> None:
    """Build a base image with debootstrap and import it into the engine under NAME (air-gapped sites)."""
    from imgbuild import bootstrap, engine

    spec = bootstrap.spec_for(name, suite=suite, mirror=mirror, variant=variant)
    client = engine.connect()
    try:
        image_id = bootstrap.bootstrap_base(client, spec, progress_print=lambda s: err.print(s, markup=False))
    finally:
        client.close()
    out.print(f"{name} {image_id}", markup=False)


@app.command()
@handled
def doctor(
    refs: Annotated[
        list[str] | None, typer.Argument(help="Recipes to check for (default: every shipped recipe).")
    ] = None,
) -> None:
    """Check the engine, base images, container runtimes and host devices the recipes need."""
    from imgbuild import doctor as doc
    from imgbuild.errors import DoctorError

    names = refs or recipe.shipped_names()
    bases: dict[str, list[str]] = {}
    runtimes: dict[str, list[str]] = {}
    devices: dict[str, list[str]] = {}
    for name in names:
        _, resolved, _ = _resolved(name)
        r = resolved.recipe
        bases.setdefault(resolved.base_ref, []).append(r.name)
        if r.runtime.runtime:
            runtimes.setdefault(r.runtime.runtime, []).append(r.name)
        if r.runtime.efa_devices:
            devices.setdefault("efa", []).append(r.name)
        if r.platform.accelerator == "gaudi":
            devices.setdefault("gaudi", []).append(r.name)
        if r.platform.accelerator == "nvidia":
            runtimes.setdefault("nvidia", []).append(r.name)
            devices.setdefault("nvidia-gpu", []).append(r.name)
    checks = doc.run_checks(base_images=bases, runtimes_needed=runtimes, devices_needed=devices)
    doc.render_table(checks, out)
    bad = doc.failed(checks, set(names) if refs else None)
    if bad:
        raise DoctorError(
            f"missing for {', '.join(sorted({n for c in bad for n in c.needed_by} or {'all'}))}: "
            + "; ".join(f"{c.name} ({c.detail})" for c in bad)
        )


def _register_extensions() -> None:
    """Commands that live in their own modules (each imports its heavy dependencies lazily)."""
    from imgbuild import cli_publish, cli_run, cli_verify

    cli_verify.register(app)
    cli_run.register(app)
    cli_publish.register(app)


_register_extensions()


def main() -> None:
    """Console entry point."""
    # A process started in the background by a non-interactive shell inherits "ignore SIGINT"; Ctrl-C (or a
    # CI runner's SIGINT) must still cancel builds cleanly, so take the default handler back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
