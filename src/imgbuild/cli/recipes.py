"""`imgbuild list`, `show`, `render` and `lock`: recipes in, pins and Dockerfiles out; no engine, no network
(except `lock` asking the package index for releases not in the shipped tables)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from imgbuild.cli.console import RecipeArg, err, handled, out, print_json, resolved, warn


def register(app: typer.Typer) -> None:
    """Add `list`, `show`, `render` and `lock` to `app`."""
    app.command("list")(list_)
    app.command("show")(show)
    app.command("render")(render_)
    app.command("lock")(lock_)


@handled
def list_(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """List the shipped recipes and the state of their locks."""
    from imgbuild.core.errors import LockError
    from imgbuild.pin import lock
    from imgbuild.spec import recipe

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
        print_json(rows)
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table("recipe", "accelerator", "lock", "description", box=None)
    for row in rows:
        table.add_row(*(escape(str(row[k])) for k in ("name", "accelerator", "lock", "description")))
    out().print(table)


@handled
def show(
    ref: RecipeArg,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show a recipe's resolved components: versions, sources and why each version."""
    from imgbuild.image import render
    from imgbuild.spec import recipe

    loaded, res, how = resolved(ref)
    refs = render.image_refs(res)
    if as_json:
        data = {
            "recipe": res.name,
            "file": recipe.display(loaded.path),
            "from": how,
            "base": res.base_ref,
            "image": refs,
            "components": {k: v.model_dump() for k, v in res.pins.items()},
            "warnings": list(res.warnings),
        }
        print_json(data)
        return
    from rich.markup import escape
    from rich.table import Table

    warn(res)
    # Recipe text is shown as it is, never read as rich markup ("[/bold]" in a description is text).
    out().print(f"[bold]{escape(res.name)}[/bold]  {escape(res.recipe.description)}")
    out().print(
        f"file: {recipe.display(loaded.path)}  (pins from {'the lock' if how == 'lock' else 'a fresh resolution'})"
    )
    out().print(f"base: {res.base_ref}")
    out().print(f"tags: {', '.join(refs)}")
    table = Table("component", "version", "source", "why", box=None)
    for name, pin in res.pins.items():
        table.add_row(*(escape(v) for v in (name, pin.version or "-", pin.source, pin.origin)))
    out().print(table)


@handled
def render_(
    ref: RecipeArg,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the Dockerfile and its context files here.")
    ] = None,
) -> None:
    """Render a recipe's Dockerfile (to stdout, or with its build context into a folder)."""
    from imgbuild.image import provenance, render

    loaded, res, _ = resolved(ref)
    plan = render.plan(res, provenance.of(loaded))
    warn(res)
    if output is None:
        sys.stdout.write(plan.dockerfile)
        return
    from imgbuild.build import dockercontext

    dockercontext.write(plan, output)
    err().print(f"wrote {output}/Dockerfile and {len(plan.files)} context files", markup=False)


@handled
def lock_(
    ref: RecipeArg,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="No network: PyPI-free pins from the shipped tables; content from the engine, the shipped checksum "
            "table and uv's cache (a download nobody here can vouch for offline is recorded as unestablished).",
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Re-resolve and read the content again, write nothing, and list what differs from the lock (a moved "
            "tag, a re-uploaded tarball, a changed wheel hash). Exit 15 on any drift: what a nightly job runs.",
        ),
    ] = False,
) -> None:
    """Resolve a recipe, read what its build fetches (base digests, checksums, wheel hashes) and write both to a
    lock file beside it."""
    import datetime

    from imgbuild.core.errors import DriftError, LockError
    from imgbuild.pin import lock, record
    from imgbuild.pin.resolver import index_lookup, resolve
    from imgbuild.spec import recipe

    loaded = recipe.load(ref).concrete()
    res = resolve(loaded, lookup_torch=None if offline else index_lookup)
    warn(res)
    content = record.record(res, engine=_engine_or_none(), offline=offline)
    for item in content.unestablished():
        err().print(f"imgbuild: not pinned by content: {item}", markup=False)
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    fresh = res.model_copy(update={"content": content, "locked_at": now})
    try:
        old = lock.read(loaded)
        old_error = None
    except LockError as exc:
        old, old_error = None, exc
    if check:
        if old is None:
            raise DriftError(
                f"{recipe.display(lock.lock_path(loaded))}: "
                + (old_error.message if old_error is not None else "no lock to check"),
                hint=f"imgbuild lock {ref}",
            )
        lines = lock.drift(lock.Lock.of(old), lock.Lock.of(fresh))
        if lines:
            for line in lines:
                out().print(f"  {line}", markup=False)
            raise DriftError(
                f"{res.name}: the lock differs from what resolves today ({len(lines)} difference"
                f"{'s' if len(lines) != 1 else ''})",
                hint=f"review, then imgbuild lock {ref}",
            )
        out().print(f"{res.name}: the lock matches what resolves today", markup=False)
        return
    if old is not None and not lock.drift(lock.Lock.of(old), lock.Lock.of(fresh)):
        fresh = fresh.model_copy(update={"locked_at": old.locked_at})  # nothing changed: the same lock, same image
    path = lock.write(loaded, fresh)
    out().print(f"locked {res.name} -> {recipe.display(path)}", markup=False)


def _engine_or_none() -> object | None:
    """The Docker engine when one answers (base digests are asked through it), else None (they are recorded as
    unestablished, with that reason)."""
    from imgbuild import engine

    try:
        client = engine.new_client(timeout=10)
        client.ping()
    except Exception as exc:
        err().print(f"imgbuild: no Docker engine answered ({engine.reason(exc)}): base digests are not recorded",
                    markup=False)  # fmt: skip
        return None
    return client
