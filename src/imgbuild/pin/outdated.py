"""Keeping pins current: which components have a newer release, whether it fits, and moving a recipe to it.

Each pinned component's newer releases come from one source (`tracks`):

- the package index for what pip installs (torch, numpy, mpi4py from pip, an nvidia-nccl wheel that no PyTorch pins):
  its final releases, yanked and pre-releases left out (`pypi.releases`);
- a shipped list for the rest: a component's release file (blocks/<name>/releases.yaml: its rows; a base image's
  CUDA against the CUDA PyTorch's wheels are built for) or the distribution table (core.distro.DISTRO), named with
  when it was read (the file's `read_on`, core.distro.TABLES): a release published since is not in it;
- none where another pin decides the version (NCCL = PyTorch's pin, a plugin or libfabric bundled with the EFA
  installer: they follow that component) or the base image brings it.

Whether a release fits is never a rule of this module: the recipe is copied with that one value replaced and resolved
by the real resolver (`try_version`); what it pins differently, or the error it raises, is the answer. `upgrade`
walks each component's newer releases newest first and keeps the newest the resolver accepts with the rest;
`write` puts the new versions into the recipe file (imgbuild.recipe.edit: that value's text, comments kept), since a
lock must follow from its recipe.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import ValidationError

from imgbuild.blocks import BY_NAME, Pin, Released, Tracked, Tracks, known_bad, resolve_order
from imgbuild.blocks import _releases as releases
from imgbuild.core.distro import TABLES
from imgbuild.core.errors import ImgbuildError, IndexLookupError, RecipeError, ResolveError
from imgbuild.core.paths import display
from imgbuild.pin.resolver import Resolved, resolve
from imgbuild.recipe import LoadedRecipe, Recipe, edit, load, where_set

Kind = Literal["index", "table", "follows", "base", "none"]
Status = Literal["current", "outdated", "held", "follows", "untracked", "unknown"]


@dataclass(frozen=True)
class Source:
    """Where a component's releases are listed. index: `name` is the project; table: `name` is a release file
    (blocks/<name>/releases.yaml) or the distribution table, with `about` (what it was read from) and `read_on` (the
    file's, core.distro.TABLES); follows: `name` is the component it follows. Each block says which (`Block.track`)."""

    kind: Kind
    name: str
    about: str = ""
    read_on: str | None = None

    def describe(self) -> str:
        if self.kind == "index":
            return f"index: {self.name}"
        if self.kind == "table":
            where = self.name if self.name.endswith(".yaml") else f"table core.distro.{self.name}"
            return f"{where}, read {self.read_on or 'on a date not recorded'}"
        if self.kind == "follows":
            return f"follows {self.name}"
        return "the base image" if self.kind == "base" else "no source of releases"

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.kind == "table":
            data |= {"about": self.about, "read_on": self.read_on}
        return data


@dataclass(frozen=True)
class Track:
    """One version a recipe pins and where newer ones come from. `keys`: where the recipe sets it; `fixed`: why it
    cannot be moved alone (None: `lock --upgrade` may move it)."""

    component: str
    pin: str  # the pin it shows in (numpy: pytorch)
    current: str
    source: Source
    keys: tuple[str, ...] | None = None
    versions: tuple[str, ...] = ()  # a table's releases (an index's are read when asked)
    fixed: str | None = None

    @property
    def key(self) -> str | None:
        return ".".join(self.keys) if self.keys else None


def _released(name: str) -> Source:
    """A block's release file as a source of its releases: what it was read from and when."""
    listed = _release_file(name)
    return Source("table", releases.file_name(name), listed.about, listed.read_on)


def tracks(resolved: Resolved) -> list[Track]:
    """What each pinned version of `resolved` is checked against, in resolve order (CUDA first): its block's
    `track` where it has one, else by the pin's source (`_by_source`)."""
    r, pins = resolved.recipe, resolved.pins
    os_id = f"{r.os.family}{r.os.version}"
    out: list[Track] = []
    for name in resolve_order():
        pin = pins.get(name)
        if pin is None or pin.version is None:
            continue
        block = BY_NAME[name]
        found = block.track(pin, resolved, _release_file) if isinstance(block, Tracks) else None
        for t in found if found is not None else _by_source(name, pin, os_id):
            current = t.current or pin.version
            if t.kind == "distro":
                distro = TABLES["DISTRO"]
                source = Source("table", f"DISTRO[{os_id}]", distro.source, distro.read_on)
            elif t.kind == "table":
                source = _released(t.name)
            else:
                source = Source(t.kind, t.name if t.kind != "base" else "base")
            out.append(Track(t.component or name, name, current, source, t.keys, t.versions, t.fixed))
    return out


def _release_file(name: str) -> Any:
    """Block `name`'s release file (what a block's `track` may read of another's)."""
    block = BY_NAME[name]
    assert isinstance(block, Released), f"{name} has no release file"
    return block.release_file()


def _by_source(name: str, pin: Pin, os_id: str) -> list[Tracked]:
    """A block without a `track` of its own, by its pin's source: a distribution's package (its table: it changes
    with os.version), what the block it comes with brings (the EFA installer's libfabric), the base image's, a
    release or installer download listed in its release file, else no source of releases."""
    block = BY_NAME[name]
    if pin.source == "distro":
        return [
            Tracked("distro", versions=(pin.version or "",), fixed=f"{os_id}'s package: it changes with os.version")
        ]
    if pin.source in BY_NAME:
        return [Tracked("follows", pin.source, fixed=f"{pin.origin} brings it")]
    if pin.source == "base":
        return [Tracked("base", fixed="comes with the base image")]
    if isinstance(block, Released) and pin.source in ("release", "installer"):
        versions = tuple(r.version for r in block.release_file().releases)
        return [Tracked("table", name, ("components", name, "version"), versions)]
    return [Tracked("none", fixed=f"no shipped table lists {name} releases")]


def _order(version: str) -> tuple[int, Version | str]:
    """A sort key: versions by PEP 440, anything else after them by text (AWS's libfabric 2.6.0amzn1.0)."""
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)


def newer(a: str, b: str) -> bool:
    """Whether release `a` is newer than `b`."""
    return _order(a) > _order(b)


Releases = Callable[[str], list[str]]


def index_releases(project: str) -> list[str]:
    """A project's final releases on the configured index (pypi.releases)."""
    from imgbuild.pin import pypi  # network edge

    return pypi.releases(project)


class IndexReleases:
    """`index_releases` for one run (`imgbuild outdated` over every recipe, `lock --upgrade`): each project's page is
    asked for once, its answer or its failure kept for the rest of the run, and the whole run has one deadline
    (IMGBUILD_INDEX_DEADLINE, else the index's default): a stalled index costs the run one deadline, not one per
    project and recipe. A project not yet asked when the deadline has passed is an IndexLookupError saying so."""

    def __init__(self, deadline: float | None = None) -> None:
        import time

        from imgbuild.pin import pypi  # network edge

        self._clock = time.monotonic
        self.seconds = pypi.deadline_seconds(deadline)
        self.ends = self._clock() + self.seconds
        self.answers: dict[str, list[str] | IndexLookupError] = {}

    def __call__(self, project: str) -> list[str]:
        from packaging.utils import canonicalize_name

        from imgbuild.pin import pypi

        key = canonicalize_name(project)
        if key not in self.answers:
            left = self.ends - self._clock()
            if left <= 0:
                self.answers[key] = IndexLookupError(
                    f"{project} releases: not asked: this run's deadline for the index ({self.seconds:g} s, "
                    f"{pypi.DEADLINE_ENV}) had passed"
                )
            else:
                try:
                    self.answers[key] = pypi.releases(project, deadline=left)
                except IndexLookupError as exc:
                    self.answers[key] = exc
        answer = self.answers[key]
        if isinstance(answer, IndexLookupError):
            raise answer
        return list(answer)


def available(track: Track, releases: Releases = index_releases) -> list[str]:
    """The releases `track`'s source offers, oldest first (empty for a pin that follows another or the base's)."""
    if track.source.kind == "index":
        return releases(track.source.name)
    return sorted(set(track.versions), key=_order)


# --------------------------------------------------------------------------------------------------
# Does it fit? The recipe with one value replaced, through the real resolver.


def bumped(loaded: LoadedRecipe, keys: Sequence[str], value: str) -> LoadedRecipe:
    """A copy of `loaded` whose merged recipe has `keys` set to `value` (validated like a loaded recipe: a value the
    schema refuses is a RecipeError naming the key)."""
    merged = copy.deepcopy(loaded.merged)
    node = merged
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value
    try:
        recipe = Recipe.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RecipeError(f"{display(loaded.path)}: {'.'.join(keys)} = {value}: {problems}") from None
    return LoadedRecipe(recipe=recipe, path=loaded.path, chain=loaded.chain, merged=merged)


@dataclass(frozen=True)
class Fit:
    """What resolving with one version replaced gave: the resolution, or the resolver's refusal."""

    resolved: Resolved | None
    error: ImgbuildError | None = None

    @property
    def ok(self) -> bool:
        return self.resolved is not None


def try_version(loaded: LoadedRecipe, track: Track, version: str) -> Fit:
    """Resolve `loaded` with `track`'s value set to `version`. The package index failing to answer is raised
    (IndexLookupError: not an answer about the fit); every other refusal is the answer."""
    assert track.keys is not None
    try:
        return Fit(resolve(bumped(loaded, track.keys, version)))
    except IndexLookupError:
        raise
    except ImgbuildError as exc:
        return Fit(None, exc)


def changes(old: Resolved, new: Resolved, track: Track) -> list[str]:
    """What `new` pins differently from `old`, besides the bumped value itself: `nccl 2.29.7 -> 2.30.7`,
    `pytorch.cuda 13.0 -> 13.2`, `pytorch.cuda_wheels changed`, and warnings it adds."""
    lines = []
    for name in sorted(set(old.pins) | set(new.pins)):
        a, b = old.pins.get(name), new.pins.get(name)
        if a == b:
            continue
        if a is None or b is None:
            lines.append(f"{name} {'added' if a is None else 'removed'}")
            continue
        bumped_here = name == track.pin and track.keys is not None
        if a.version != b.version and not (bumped_here and track.keys and track.keys[-1] == "version"):
            lines.append(f"{name} {a.version} -> {b.version}")
        if a.source != b.source:
            lines.append(f"{name}.source {a.source} -> {b.source}")
        x, y = a.details.model_dump(), b.details.model_dump()
        for key in sorted(set(x) | set(y)):
            if x.get(key) == y.get(key) or (bumped_here and track.keys and key == track.keys[-1]):
                continue
            if isinstance(x.get(key), (tuple, list)) or isinstance(y.get(key), (tuple, list)):
                lines.append(f"{name}.{key} changed")
            else:
                lines.append(f"{name}.{key} {x.get(key)} -> {y.get(key)}")
    lines += [f"warning: {w}" for w in new.warnings if w not in old.warnings]
    return lines


# --------------------------------------------------------------------------------------------------
# imgbuild outdated


@dataclass(frozen=True)
class Finding:
    """One row of `imgbuild outdated`."""

    track: Track
    status: Status
    newest: str | None = None
    fits: bool | None = None
    changes: tuple[str, ...] = ()
    blocked_by: str | None = None
    error: str | None = None
    held: str | None = None  # the recipe's reason to stay behind (`hold:`), when status is "held"
    # what a release file says is bad about the pinned release or a combination it is in (blocks.KnownBad.message):
    # a risk the resolver warned of, or a known-bad release the recipe keeps with a `hold:` that cites its link
    bad: str | None = None

    def as_json(self) -> dict[str, Any]:
        t = self.track
        return {
            "component": t.component, "key": t.key, "pinned": t.current, "newest": self.newest,
            "status": self.status, "source": t.source.as_json(), "fits": self.fits, "changes": list(self.changes),
            "blocked_by": self.blocked_by, "fixed": t.fixed, "error": self.error, "held": self.held, "bad": self.bad,
        }  # fmt: skip


@dataclass(frozen=True)
class Report:
    """`imgbuild outdated` for one recipe."""

    loaded: LoadedRecipe
    resolved: Resolved
    findings: tuple[Finding, ...]

    @property
    def outdated(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "outdated"]

    @property
    def unknown(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "unknown"]

    @property
    def held(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "held"]


def check(loaded: LoadedRecipe, resolved: Resolved, track: Track, releases: Releases = index_releases) -> Finding:
    """`track`'s newest release and, when it is newer than the pin, whether the recipe resolves with it."""
    if track.source.kind in ("follows", "base"):
        return Finding(track, "follows")
    if track.source.kind == "none":
        return Finding(track, "untracked")
    try:
        versions = available(track, releases)
    except IndexLookupError as exc:
        return Finding(track, "unknown", error=exc.message)
    if not versions:
        return Finding(track, "unknown", error=f"{track.source.describe()} lists no release")
    newest = versions[-1]
    if not newer(newest, track.current):
        return Finding(track, "current", newest)
    try:
        fit = try_version(loaded, track, newest)
    except IndexLookupError as exc:
        return Finding(track, "outdated", newest, error=f"could not check the fit: {exc.message}")
    if fit.ok:
        assert fit.resolved is not None
        return Finding(track, "outdated", newest, True, tuple(changes(resolved, fit.resolved, track)))
    return Finding(track, "outdated", newest, False, blocked_by=str(fit.error))


def _holds(loaded: LoadedRecipe, all_tracks: Sequence[Track]) -> Mapping[str, str]:
    """The recipe's `hold:` entries, each naming a component `outdated` tracks (else a RecipeError naming the key)."""
    holds = loaded.recipe.hold
    known = [t.component for t in all_tracks]
    for name in holds:
        if name not in known:
            path, where = where_set(loaded, "hold", name)
            inherited = path != loaded.path
            raise RecipeError(
                f"{where}: hold.{name}: expected a component `imgbuild outdated` tracks for "
                f"{display(loaded.path) if inherited else 'this recipe'} ({', '.join(known)})"
                + (f"; {display(loaded.path)} inherits this hold from {display(path)}" if inherited else ""),
                hint=f"in {display(loaded.path)}: hold: {{{name}: null}} (null removes an inherited key)"
                if inherited
                else f"remove hold.{name}, or name one of {', '.join(known)}",
            )
    return holds


def report(loaded: LoadedRecipe, releases: Releases | None = None) -> Report:
    """Every pinned version of the recipe against its source's newest release (the recipe freshly resolved, not its
    lock: the lock may be stale). A component the recipe holds (`hold:`) that has a newer release is "held", with
    the recipe's reason, instead of "outdated". `releases`: the run's (`IndexReleases`, shared by the recipes of one
    run), else one of this report's own."""
    releases = releases or IndexReleases()
    resolved = resolve(loaded)
    all_tracks = tracks(resolved)
    holds = _holds(loaded, all_tracks)
    bad = known_bad(resolved.pins)
    findings = []
    for t in all_tracks:
        found = check(loaded, resolved, t, releases)
        if found.status == "outdated" and t.component in holds:
            found = replace(found, status="held", held=holds[t.component])
        said = [b.message() for b in bad if t.pin in b.names]
        findings.append(replace(found, bad="; ".join(said)) if said else found)
    return Report(loaded, resolved, tuple(findings))


# --------------------------------------------------------------------------------------------------
# imgbuild lock --upgrade


@dataclass(frozen=True)
class Move:
    """One version `lock --upgrade` moves: from `old` to `new` at `keys`."""

    track: Track
    old: str
    new: str


@dataclass(frozen=True)
class Blocked:
    """A component whose newest release (or the release asked for) the resolver refuses."""

    track: Track
    wanted: str
    error: ImgbuildError
    instead: str | None  # the newest newer release that fits, if any


@dataclass
class Upgrade:
    """What `lock --upgrade` decided: the versions it moves, those it cannot, and the recipe with the moves made."""

    loaded: LoadedRecipe
    moves: list[Move] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)


def parse_wanted(items: Sequence[str]) -> dict[str, str | None]:
    """`--upgrade-package` values (`pytorch`, `nccl-tests`, `pytorch==2.15.0`) as component -> version (None: the
    newest that fits). Names are the rows of `imgbuild outdated` (`-` and `_` alike)."""
    wanted: dict[str, str | None] = {}
    for item in items:
        name, sep, version = item.partition("==")
        name = name.strip().replace("-", "_")
        if not name or (sep and not version.strip()):
            from imgbuild.core.errors import UsageError

            raise UsageError(f"--upgrade-package {item!r}: expected COMPONENT or COMPONENT==VERSION")
        wanted[name] = version.strip() or None
    return wanted


def upgrade(
    loaded: LoadedRecipe, wanted: Mapping[str, str | None] | None = None, releases: Releases | None = None
) -> Upgrade:
    """The newest releases that fit: for each component (`wanted`'s, else every one `lock --upgrade` may move), its
    newer releases newest first, each resolved with the moves made before it; the first the resolver accepts is kept.
    A component asked for with a version gets that version or nothing. `Upgrade.blocked` lists the components whose
    newest (or asked-for) release the resolver refuses."""
    from imgbuild.core.errors import UsageError

    releases = releases or IndexReleases()
    resolved = resolve(loaded)
    all_tracks = tracks(resolved)
    by_name = {t.component: t for t in all_tracks}
    if wanted is not None:
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise UsageError(
                f"{resolved.name}: no pinned component {', '.join(map(repr, unknown))}",
                hint=f"its components: {', '.join(by_name)}",
            )
        stuck = [f"{n} ({by_name[n].fixed})" for n in wanted if by_name[n].fixed]
        if stuck:
            raise UsageError(f"{resolved.name}: lock --upgrade does not move {'; '.join(stuck)}")
    holds = _holds(loaded, all_tracks)  # moved only when named
    chosen = [
        t
        for t in all_tracks
        if (t.component in wanted if wanted is not None else t.fixed is None and t.component not in holds)
    ]
    plan = Upgrade(loaded)
    for track in chosen:
        versions = available(track, releases)
        asked = wanted.get(track.component) if wanted is not None else None
        if asked is not None:
            if asked not in versions:
                shown = ", ".join(versions[-5:]) or "none"
                raise UsageError(
                    f"{track.component} {asked} is not a release {track.source.describe()} lists (newest: {shown})"
                )
            candidates = [] if asked == track.current else [asked]
        else:
            candidates = sorted((v for v in versions if newer(v, track.current)), key=_order, reverse=True)
        first_error: ImgbuildError | None = None
        for version in candidates:
            fit = try_version(plan.loaded, track, version)
            if fit.ok:
                assert track.keys is not None
                plan.loaded = bumped(plan.loaded, track.keys, version)
                plan.moves.append(Move(track, track.current, version))
                break
            first_error = first_error or fit.error
        if first_error is not None:
            instead = plan.moves[-1].new if plan.moves and plan.moves[-1].track is track else None
            assert first_error is not None
            plan.blocked.append(Blocked(track, candidates[0], first_error, instead))
    return plan


def refusal(plan: Upgrade, ref: str) -> ResolveError:
    """Why `lock --upgrade` writes nothing: each blocked component with the rule that blocks it and the newest
    release that fits instead, and the command that takes those."""
    lines = []
    for b in plan.blocked:
        instead = (
            f"the newest that fits is {b.instead}"
            if b.instead
            else f"no newer release fits; it stays at {b.track.current}"
        )
        lines.append(f"{b.track.component} {b.wanted} does not fit: {b.error}; {instead}")
    takes = " ".join(f"--upgrade-package {m.track.component}=={m.new}" for m in plan.moves)
    hint = f"imgbuild lock {ref} {takes} writes the releases that fit" if takes else None
    return ResolveError(f"{plan.loaded.recipe.name}: nothing written: " + " | ".join(lines), hint=hint)


def write(original: LoadedRecipe, plan: Upgrade) -> tuple[LoadedRecipe, str]:
    """Put `plan`'s moves into the recipe's own file (its parents are never edited: a version it inherits is set in
    it), check that the file now loads as the planned recipe, and return it with the file's old text (to put back
    if locking fails). RecipeError, the file restored, when the edit does not give the planned recipe."""
    from imgbuild.core.outputs import write_atomic

    path = original.path
    where = display(path)
    try:
        old_text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"{where}: cannot read the recipe to edit it: {exc.strerror or exc}") from None
    text = old_text
    for move in plan.moves:
        assert move.track.keys is not None
        text = edit.set_value(text, move.track.keys, move.new, where=where)
    if text == old_text:
        return original, old_text
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise RecipeError(f"{where}: cannot write the recipe: {exc.strerror or exc}") from None
    try:
        again = load(path)
        if again.merged != plan.loaded.merged:
            raise RecipeError(f"{where}: the edited file does not load as the upgraded recipe (nothing changed)")
    except BaseException:
        restore(path, old_text)
        raise
    return again, old_text


def restore(path: Any, text: str) -> None:
    """Put a recipe's old text back (locking after an upgrade failed)."""
    from imgbuild.core.outputs import write_atomic

    write_atomic(path, text)
