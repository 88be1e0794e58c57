"""`imgbuild list`, `show`, `render`, `lock` and `outdated`: recipes in, pins and Dockerfiles out; no engine, no
network (except `lock` asking the package index for releases not in the shipped tables, and `outdated` and
`lock --upgrade` asking it for the newest releases)."""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from imgbuild.cli.console import FilesOption, RecipeArg, err, handled, out, platform_arch, print_json, resolved, warn
from imgbuild.core.interrupts import terminable

if TYPE_CHECKING:
    from imgbuild.pin.outdated import Report


def register(app: typer.Typer) -> None:
    """Add `list`, `show`, `render`, `lock` and `outdated` to `app`."""
    app.command("list")(list_)
    app.command("show")(show)
    app.command("render")(render_)
    app.command("lock")(lock_)
    app.command("outdated")(outdated_)


@handled
def list_(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """List the shipped recipes and the state of their locks."""
    from imgbuild import recipe
    from imgbuild.core.errors import LockError
    from imgbuild.pin import lock

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
    """Show a recipe's resolved components: versions, sources and why each version. From its lock; a recipe without
    one is resolved afresh (versions only: no content), and says so."""
    from imgbuild import recipe
    from imgbuild.core import platforms
    from imgbuild.image import identity
    from imgbuild.pin import lock

    loaded = recipe.load(ref).concrete()
    res, how = lock.lock_or_fresh(loaded)
    refs = identity.of(res).refs()
    if as_json:
        data = {
            "recipe": res.name,
            "file": recipe.display(loaded.path),
            "from": how,
            "base": res.base_ref,
            "platforms": [platforms.docker_platform(a) for a in res.recipe.platform.arch],
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
    where = (
        f"the lock {recipe.display(lock.lock_path(loaded))}"
        if how == "lock"
        else "a fresh resolution: no lock yet, so render and build refuse it until "
        f"`imgbuild lock {lock.command_ref(loaded)}`"
    )
    out().print(f"file: {recipe.display(loaded.path)}  (pins from {where})")
    out().print(f"base: {res.base_ref}")
    out().print(f"platforms: {', '.join(platforms.docker_platform(a) for a in res.recipe.platform.arch)}")
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
    platform: Annotated[
        str | None,
        typer.Option(
            "--platform",
            callback=platform_arch,
            help="linux/amd64 or linux/arm64: one of the recipe's platform.arch (default its first).",
        ),
    ] = None,
    unlocked: Annotated[
        bool,
        typer.Option(
            "--unlocked",
            help="Render from a fresh resolution instead of the lock, to look at an edit before locking it: versions "
            "only, no digests or hashes (no --require-hashes), tags unlocked-<hash>. `build` takes none of it.",
        ),
    ] = False,
    files: FilesOption = None,
) -> None:
    """Render a recipe's Dockerfile from its lock (to stdout, or with its build context into a folder); a recipe
    without a lock is exit 4 (or --unlocked)."""
    from imgbuild.image import provenance, render

    if unlocked:
        from imgbuild import recipe
        from imgbuild.pin.resolver import index_lookup, resolve

        loaded = recipe.load(ref).concrete()
        res = resolve(loaded, lookup_torch=index_lookup)
        err().print(
            f"imgbuild: --unlocked: {res.name} rendered from a fresh resolution, not a lock: nothing is pinned by "
            "content; not for a build",
            markup=False,
        )
    else:
        loaded, res = resolved(ref)
    found: dict[str, Path] = {}
    if files is not None:
        from imgbuild.build.sources import local_downloads

        found = local_downloads(files, res.content, say=lambda line: err().print(line, markup=False))
    plan = render.plan(res, provenance.of(loaded), arch=platform, local_files=found)
    warn(res)
    if output is None:
        sys.stdout.write(plan.dockerfile)
        return
    from imgbuild.build import dockercontext

    dockercontext.write(plan, output)
    if found:
        from imgbuild.build.sources import stage_files

        stage_files(found, output)
    err().print(f"wrote {output}/Dockerfile and {len(plan.files)} context files", markup=False)


@handled
@terminable
def lock_(
    ref: RecipeArg,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="No network: PyPI-free pins from the shipped tables; content from the engine, the shipped checksum "
            "table, the requirement sets the recipe's own or a parent's lock resolved from the same inputs, and uv's "
            "cache (a download nobody here can vouch for offline is recorded as unestablished).",
        ),
    ] = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Re-resolve and read the content again (keeping the lock's versions), write nothing, and list what "
            "differs from the lock: a moved tag, a re-uploaded tarball, a wheel served with another hash, a stale "
            "recipe, a pin that no longer resolves or was yanked. Exit 15 on any drift: what a nightly job runs. A "
            "newer release is not drift (`imgbuild outdated` lists those).",
        ),
    ] = False,
    upgrade: Annotated[
        bool,
        typer.Option(
            "--upgrade",
            "-U",
            help="Move every component `imgbuild outdated` tracks to its newest release that fits the rest: the new "
            "versions are written into the recipe file (that value's text, comments kept), then the lock follows, "
            "every Python distribution at its newest release that fits (a plain relock keeps the lock's versions). "
            "When a newest release does not fit, nothing is written: exit 5 with the rule that blocks it and the "
            "newest release that fits instead.",
        ),
    ] = False,
    files: FilesOption = None,
    upgrade_package: Annotated[
        list[str] | None,
        typer.Option(
            "--upgrade-package",
            "-P",
            metavar="COMPONENT[==VERSION]",
            help="As --upgrade, for this component only (repeatable; a row of `imgbuild outdated`: pytorch, numpy, "
            "efa, nccl_tests...); ==VERSION takes that release instead of the newest. A Python distribution the lock "
            "pins (botocore, six...) is released from the lock's versions: the newest release that fits.",
        ),
    ] = None,
) -> None:
    """Resolve a recipe, read what its build fetches (base digests, checksums, wheel hashes) and write both to a
    lock file beside it. An existing lock's Python versions are kept while they still resolve and fit (as uv and
    pip-tools keep an existing output's pins). With --upgrade / --upgrade-package, first move the recipe's versions to
    the newest releases that fit (see `imgbuild outdated`) and release the lock's versions (all, or those named)."""
    from imgbuild import recipe
    from imgbuild.core.errors import UsageError
    from imgbuild.pin import locking

    def say(line: str) -> None:
        out().print(line, markup=False)

    def note(line: str) -> None:
        err().print(f"imgbuild: {line}", markup=False)

    loaded = recipe.load(ref).concrete()
    locked = locking.kept_versions(loaded, note)
    keep = locked
    upgraded = None
    if upgrade or upgrade_package:
        if check or offline:
            raise UsageError(
                "--upgrade reads the package index and writes the recipe: not with "
                + ("--check" if check else "--offline")
            )
        components, released = locking.released(ref, loaded, upgrade_package or [], locked)
        keep = {} if upgrade else {name: v for name, v in keep.items() if name not in released}
        if upgrade or components:
            upgraded = locking.upgrade(ref, loaded, components or None)
            if not upgraded.moves:
                say(f"{loaded.recipe.name}: nothing to upgrade (every component is at its newest release)")
            for move in upgraded.moves:
                say(f"upgraded {move.track.component} {move.old} -> {move.new} ({recipe.display(loaded.path)}: "
                    f"{move.track.key})")  # fmt: skip
            loaded = upgraded.loaded
    with locking.put_back_on_failure(upgraded, note):
        run = locking.relock(
            ref, loaded, offline=offline, keep=keep, engine=_engine_or_none(), say=say, note=note, files=files
        )
        if check:
            lines = run.drift()
            for line in lines:
                say(f"  {line}")
            if lines:
                raise run.drift_error(lines)
            say(
                f"{run.fresh.name}: the lock matches what resolves today (a newer release is not drift: "
                f"imgbuild outdated {ref} reports the components', imgbuild lock {ref} --upgrade takes them)"
            )
            return
        for line in run.withdrawn:
            note(f"warning: {line}; kept, as pip installs a release pinned exactly")
        for line in run.moved(locked):
            say(line)
        path = run.write()
        say(f"locked {run.fresh.name} -> {recipe.display(path)}")


@handled
@terminable
def outdated_(
    ref: Annotated[
        str | None,
        typer.Argument(help="A shipped recipe's name or a YAML file (default: every recipe that is not abstract)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """List each pinned component, the newest release its source offers, and whether that release fits the other
    pins (the recipe resolved again with that one version replaced: what changes, or the rule that refuses it).

    Sources: the package index (as pip finds it: IMGBUILD_INDEX_URL, PIP_INDEX_URL, pip's configuration) for torch,
    numpy, mpi4py (pip) and an nvidia-nccl wheel no PyTorch pins; yanked and pre-releases are left out. The rest
    (EFA installer, nccl-tests, GDRCopy, Gaudi, CUDA, distribution packages) comes from the shipped tables, each
    shown with when it was read: a release published since is not in it.

    A component the recipe holds (`hold: {COMPONENT: REASON}`) is shown as held, with that reason, not as behind.
    A pinned release (or a combination of them) that a component's release file marks bad is shown with why and the
    upstream links: a risk, or a known-bad release a hold keeps (citing a link); one that is refused fails the recipe.

    Exit codes: 0 when every component is at its source's newest release or held; 18 when one is not, whether or
    not the newer release fits (as `npm outdated` exits 1); 7 when the index could not say (the report is
    incomplete).
    `imgbuild lock RECIPE --upgrade` moves the recipe to the newest releases that fit.
    """
    from imgbuild import recipe
    from imgbuild.core.errors import ImgbuildError, IndexLookupError, OutdatedError
    from imgbuild.pin import outdated

    if ref is not None:
        refs = [ref]
    else:
        refs = [name for name in recipe.shipped_names() if not recipe.load(name).recipe.abstract]
    reports: list[Report] = []
    failed: list[tuple[str, ImgbuildError]] = []
    releases = outdated.IndexReleases()  # each project asked once, one deadline for the whole run
    for name in refs:
        try:
            reports.append(outdated.report(recipe.load(name).concrete(), releases))
        except ImgbuildError as error:
            if ref is not None:
                raise
            failed.append((name, error))
    if as_json:
        print_json(
            {
                "recipes": [
                    {
                        "recipe": r.resolved.name,
                        "file": recipe.display(r.loaded.path),
                        "components": [f.as_json() for f in r.findings],
                    }
                    for r in reports
                ],
                "errors": [{"recipe": name, "error": problem.message} for name, problem in failed],
                "outdated": sum(len(r.outdated) for r in reports),
                "held": sum(len(r.held) for r in reports),
            }
        )
    else:
        _outdated_table(reports)
    for name, problem in failed:
        err().print(f"imgbuild: {name}: {problem.message}", markup=False)
    if failed:
        first, problem = failed[0]
        raise type(problem)(
            f"{len(failed)} recipe(s) could not be checked, first {first}: {problem.message}", hint=problem.hint
        )
    unknown = [(r.resolved.name, f) for r in reports for f in r.unknown]
    if unknown:
        raise IndexLookupError(
            "the newest release is not known for "
            + "; ".join(f"{name} {f.track.component} ({f.error})" for name, f in unknown)
        )
    behind = [r for r in reports if r.outdated]
    if behind:
        what = ", ".join(f"{r.resolved.name} ({', '.join(f.track.component for f in r.outdated)})" for r in behind)
        raise OutdatedError(
            f"newer releases than the recipe pins: {what}",
            hint="imgbuild lock RECIPE --upgrade (or --upgrade-package COMPONENT) moves to the newest that fit",
        )


def _outdated_table(reports: "list[Report]") -> None:
    from rich.markup import escape
    from rich.table import Table

    from imgbuild import recipe

    for r in reports:
        out().print(f"[bold]{escape(r.resolved.name)}[/bold]  {escape(recipe.display(r.loaded.path))}")
        table = Table("component", "pinned", "newest", "from", "fits", box=None)
        for f in r.findings:
            if f.status == "outdated" and f.fits is None:
                fits = f"unknown: {f.error}"
            elif f.fits is True:
                fits = "yes" + (f": {'; '.join(f.changes)}" if f.changes else " (no other pin changes)")
            elif f.fits is False:
                fits = f"no: {f.blocked_by}"
            else:
                fits = {"current": "-", "follows": "-", "untracked": "-"}.get(f.status, f"unknown: {f.error}")
            if f.track.fixed and f.status == "outdated":
                fits += f" (not moved by lock --upgrade: {f.track.fixed})"
            if f.status == "held":
                fits = f"held by the recipe: {f.held} (would it fit: {fits})"
            if f.bad:
                fits = f"{f.bad}; {fits}"
            newest = f.newest or {"follows": "-", "untracked": "?"}.get(f.status, "?")
            newest = f"[bold]{escape(newest)}[/bold]" if f.status == "outdated" else escape(newest)
            table.add_row(escape(f.track.component), escape(f.track.current), newest,
                          escape(f.track.source.describe()), escape(fits))  # fmt: skip
        out().print(table)
    if any(f.track.source.kind == "table" for r in reports for f in r.findings):
        out().print(
            "A table or release file lists the releases known when it was read (blocks/<name>/releases.yaml's "
            "read_on, core.distro.TABLES): one published since is not seen here.",
            markup=False,
        )


def _engine_or_none() -> object | None:
    """The Docker engine when one answers (base digests are asked through it), else None (they are recorded as
    unestablished, with that reason)."""
    from imgbuild.engine import client as engine

    try:
        client = engine.new_client(timeout=10)
        client.ping()
    except Exception as exc:
        err().print(f"imgbuild: no Docker engine answered ({engine.reason(exc)}): base digests are not recorded",
                    markup=False)  # fmt: skip
        return None
    return client
