"""What `imgbuild lock` does with a loaded recipe, below the command line (which parses options, calls these and
prints what they return):

- `kept_versions`: the lock's Python versions, kept while they still resolve (none when the lock is unreadable);
- `released`: `--upgrade-package`'s values split into the components moved in the recipe and the Python
  distributions released from the lock's versions;
- `upgrade`: the recipe moved to the newest releases that fit, written to its file (`Upgraded`), and
  `put_back_on_failure` restoring the file when the lock that follows cannot be made;
- `relock`: resolve, read the content (base digests, checksums, wheel hashes) and compare with the lock file:
  a `Relock` that says what drifted (`lock --check`), which versions moved, and writes the lock.

Lines said while the work runs (where the pins came from, what could not be pinned by content) go to the caller's
`say` (the command's output) and `note` (its diagnostics).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.core.errors import DriftError, LockError, UsageError
from imgbuild.pin import lock

if TYPE_CHECKING:
    from imgbuild.pin.outdated import Move
    from imgbuild.pin.resolver import Resolved
    from imgbuild.pin.wheels import Yank
    from imgbuild.recipe import LoadedRecipe

__all__ = ["Relock", "Upgraded", "kept_versions", "put_back_on_failure", "released", "relock", "upgrade"]

Say = Callable[[str], None]


def kept_versions(loaded: LoadedRecipe, note: Say) -> dict[str, str]:
    """The lock's Python versions (name -> version), which a relock keeps while they still resolve and fit; none,
    noted, when the lock cannot be read."""
    try:
        return lock.preferences(loaded)
    except LockError as exc:
        note(f"{exc.message}: none of its versions is kept")
        return {}


def released(ref: str, loaded: LoadedRecipe, items: list[str], locked: dict[str, str]) -> tuple[list[str], set[str]]:
    """`--upgrade-package` values split as uv's are: (the components `imgbuild outdated` tracks, moved in the recipe;
    the Python distributions released from the lock's versions). A component releases its own distribution too
    (pytorch: torch). A name that is neither is a UsageError naming both lists."""
    from packaging.utils import canonicalize_name

    from imgbuild.pin import outdated
    from imgbuild.pin.resolver import resolve

    tracks = {t.component: t for t in outdated.tracks(resolve(loaded))}
    components: list[str] = []
    freed: set[str] = set()
    unknown: list[str] = []
    for item in items:
        name, sep, _ = item.partition("==")
        track = tracks.get(name.strip().replace("-", "_"))
        dist = canonicalize_name(name.strip())
        if track is not None:
            components.append(item)
            if track.source.kind == "index":
                freed.add(canonicalize_name(track.source.name))
        elif dist in locked and sep:
            raise UsageError(
                f"--upgrade-package {item!r}: {dist} is a Python distribution the lock pins, not a component: it is "
                "released from the lock's version and takes the newest release that fits (no ==VERSION)",
                hint=f"imgbuild lock {ref} --upgrade-package {dist}",
            )
        elif dist in locked:
            freed.add(dist)
        elif name.strip():
            unknown.append(name.strip())
        else:
            components.append(item)  # outdated.parse_wanted refuses it: expected COMPONENT or COMPONENT==VERSION
    if unknown:
        raise UsageError(
            f"{loaded.recipe.name}: no pinned component or locked Python distribution {', '.join(map(repr, unknown))}",
            hint=f"its components: {', '.join(tracks)}"
            + (f"; the lock's distributions: {', '.join(sorted(locked))}" if locked else ""),
        )
    return components, freed


@dataclass(frozen=True)
class Upgraded:
    """What `lock --upgrade` did to the recipe file: the recipe as it now loads, the versions moved, and the file's
    old text (None when nothing moved, the file untouched)."""

    loaded: LoadedRecipe
    moves: tuple[Move, ...]
    old_text: str | None


def upgrade(ref: str, loaded: LoadedRecipe, items: list[str] | None) -> Upgraded:
    """The recipe moved to the newest releases that fit (those of `items`, `--upgrade-package`'s, else every
    component), written to its file; a ResolveError, nothing written, when a newest release does not fit."""
    from imgbuild.pin import outdated

    plan = outdated.upgrade(loaded, outdated.parse_wanted(items) if items else None)
    if plan.blocked:
        raise outdated.refusal(plan, ref)
    if not plan.moves:
        return Upgraded(loaded, (), None)
    moved, old_text = outdated.write(loaded, plan)
    return Upgraded(moved, tuple(plan.moves), old_text)


@contextlib.contextmanager
def put_back_on_failure(upgraded: Upgraded | None, note: Say) -> Iterator[None]:
    """The lock must follow from the recipe: when what runs inside fails (or is interrupted), the recipe file an
    upgrade wrote is put back as it was, and noted."""
    try:
        yield
    except BaseException:
        if upgraded is not None and upgraded.old_text is not None:
            from imgbuild import recipe
            from imgbuild.pin import outdated

            outdated.restore(upgraded.loaded.path, upgraded.old_text)
            note(f"{recipe.display(upgraded.loaded.path)} is back as it was (locking failed)")
        raise


@dataclass(frozen=True)
class Relock:
    """A recipe resolved and its content read again, beside the lock file it has (if any)."""

    ref: str
    loaded: LoadedRecipe
    fresh: Resolved  # the lock as it would be written now
    old: Resolved | None  # the lock file's; None when there is none or it cannot be read (`old_error`)
    old_error: LockError | None
    yanked: tuple[Yank, ...]

    @property
    def withdrawn(self) -> list[str]:
        """A line for each pinned version its publisher withdrew (yanked on the index)."""
        return [
            f"python {y.set}: {y.name}=={y.version} is yanked on the index{f' ({y.reason})' if y.reason else ''}: "
            f"the publisher withdrew it (imgbuild lock {self.ref} --upgrade-package {y.name} moves it)"
            for y in self.yanked
        ]

    def drift(self) -> list[str]:
        """What differs from the lock file, yanked pins included (`lock --check`); a DriftError when there is no
        lock to compare with."""
        from imgbuild import recipe

        if self.old is None:
            raise DriftError(
                f"{recipe.display(lock.lock_path(self.loaded))}: "
                + (self.old_error.message if self.old_error is not None else "no lock to check"),
                hint=f"imgbuild lock {self.ref}",
            )
        return lock.drift(lock.Lock.of(self.old), lock.Lock.of(self.fresh)) + self.withdrawn

    def drift_error(self, lines: list[str]) -> DriftError:
        """Exit 15: the lock differs from what resolves today in `lines` (`drift`)."""
        return DriftError(
            f"{self.fresh.name}: the lock differs from what resolves today ({len(lines)} difference"
            f"{'s' if len(lines) != 1 else ''})",
            hint=f"review, then imgbuild lock {self.ref} (it keeps every version that still resolves)",
        )

    def moved(self, locked: dict[str, str]) -> list[str]:
        """A line for each Python distribution whose version differs from the lock's (`locked`)."""
        python = self.fresh.content.python if self.fresh.content is not None else {}
        return [
            f"python {set_name}: {req.name} {locked[req.name]} -> {req.version}"
            for set_name, reqs in python.items()
            for req in reqs
            if locked.get(req.name) is not None and locked[req.name] != req.version
        ]

    def write(self) -> Path:
        """Write the lock file; a lock that did not change keeps its date (the same lock makes the same image)."""
        fresh = self.fresh
        if self.old is not None and not lock.drift(lock.Lock.of(self.old), lock.Lock.of(fresh)):
            fresh = fresh.model_copy(update={"locked_at": self.old.locked_at})
        return lock.write(self.loaded, fresh)


def relock(
    ref: str,
    loaded: LoadedRecipe,
    *,
    offline: bool,
    keep: dict[str, str],
    engine: object | None,
    say: Say,
    note: Say,
    files: Path | None = None,
) -> Relock:
    """Resolve `loaded` and read its content: the Python distributions at the versions in `keep` where they still
    resolve, base digests through `engine` (None: recorded as unestablished), the downloads `files` holds hashed
    from there; no network with `offline`. Says where the EFA installer's and the plugin's pins came from, notes
    the resolution's warnings and what could not be pinned by content. Offline, a requirement set whose inputs are
    those the recipe's own lock or a parent's resolved it from is taken from that lock (`lock.at_hand`), and said."""
    from imgbuild.pin import artifacts, record
    from imgbuild.pin.resolver import index_lookup, resolve

    r = loaded.recipe
    read = artifacts.reader(f"{r.os.family}{r.os.version}", r.platform.arch, files=files, offline=offline)
    try:
        res = resolve(loaded, lookup_torch=None if offline else index_lookup, artifacts=read)
    finally:  # what the EFA installer's and the plugin's pins came from (their archives or the shipped data), and why
        for line in read.said:
            say(line)
    for warning in res.warnings:
        note(f"warning: {warning}")
    yanked: list[Yank] = []
    taken: list[str] = []
    try:
        content = record.record(
            res, engine=engine, offline=offline, preferences=keep, yanked=yanked, files=files,
            established=read.downloaded, at_hand=lock.at_hand(loaded) if offline else (), taken=taken,
        )  # fmt: skip
    finally:  # which requirement sets came from a lock at hand, also when a later one could not be resolved
        for line in taken:
            say(line)
    for item in content.unestablished():
        note(f"not pinned by content: {item}")
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    fresh = res.model_copy(update={"content": content, "locked_at": now})
    try:
        old, old_error = lock.read(loaded), None
    except LockError as exc:
        old, old_error = None, exc
    return Relock(ref, loaded, fresh, old, old_error, tuple(yanked))
