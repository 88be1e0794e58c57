"""Lock files: the resolved pins of a recipe, written beside it (`cpu.yaml` -> `cpu.lock.json`).

Builds and renders use the lock, and refuse a recipe without one (`resolved_for`). A lock records the digest of the
merged recipe it was made from, so a change to the recipe or to any parent makes it stale, and a stale lock is an
error, not a guess. A lock whose pins were edited by hand (they no longer follow from the recipe by the resolver's
rules) is an error too. That check runs the resolver, once per process for a given lock and recipe (`_FOLLOWS`): a
command reads its recipe's lock once (`for_ref`) and hands the result down.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from imgbuild.blocks import BY_NAME, Released
from imgbuild.blocks.pytorch import PyTorchDetails, TorchWheel
from imgbuild.core.errors import ImgbuildError, LockError
from imgbuild.core.outputs import write_atomic  # the lock is written whole or not at all
from imgbuild.pin import record
from imgbuild.pin.content import Content, Requirement
from imgbuild.pin.resolver import Pin, Pinned, Resolved, TorchLookup, index_lookup, resolve
from imgbuild.recipe import LoadedRecipe, display, load

LOCK_VERSION: Literal[3] = 3  # 2: typed pin details (each block's own model); 3: content (digests, hashes)
MAX_LOCK_BYTES = 4 << 20  # the shipped locks are up to about 60 KB (a PyTorch image's wheel hashes)
# The locks whose pins this process found to follow from their recipe (`_check_not_edited`), by (lock file, the
# lock's digest, the merged recipe's digest): any change to the lock's pins or content, or to the recipe or a
# parent, is a new key and is checked again.
_FOLLOWS: set[tuple[str, str, str]] = set()


class Lock(Pinned):
    """What a lock file holds: a resolution's decisions under the recipe's name, with the content its build fetches
    (imgbuild.pin.content) and that content's digest, so a hash edited by hand is refused."""

    lock_version: Literal[3] = LOCK_VERSION
    recipe: str
    content_digest: str | None = None

    @classmethod
    def of(cls, resolved: Resolved) -> Lock:
        return cls(
            recipe=resolved.name,
            recipe_digest=resolved.recipe_digest,
            base_ref=resolved.base_ref,
            pins=dict(sorted(resolved.pins.items())),
            warnings=resolved.warnings,
            content=resolved.content,
            locked_at=resolved.locked_at,
            content_digest=resolved.content.digest() if resolved.content is not None else None,
        )

    def dumps(self) -> str:
        """The lock file's text: sorted keys, stable across runs."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def digest(self) -> str:
        """sha256 of the pins' canonical JSON (lock_version left out): the content-addressed tag derives from it."""
        text = json.dumps(self.model_dump(mode="json", exclude={"lock_version"}), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def drift(old: Lock, new: Lock) -> list[str]:
    """What differs between a lock and a fresh one, a line each (when it was locked left out): pins, base digests,
    download checksums, requirement sets (a hash, a version, a distribution added or gone). The fresh one keeps the
    lock's Python versions where they still resolve (`preferences`), so a version that differs is one that no longer
    resolves or fits: a newer release alone is never drift (`imgbuild outdated` reports those)."""
    lines = []
    for name in sorted(set(old.pins) | set(new.pins)):
        a, b = old.pins.get(name), new.pins.get(name)
        if a != b:
            lines.append(f"pins.{name}: {_pin_text(a)} -> {_pin_text(b)}")
    oc, nc = old.content or Content(), new.content or Content()
    for ref in sorted(set(oc.bases) | set(nc.bases)):
        x, y = oc.bases.get(ref), nc.bases.get(ref)
        if (x and x.digest) != (y and y.digest):
            lines.append(f"base {ref}: {x.digest if x else 'absent'} -> {y.digest if y else 'absent'}"
                         + (f" ({y.origin})" if y and y.digest is None else ""))  # fmt: skip
    for url in sorted(set(oc.downloads) | set(nc.downloads)):
        x2, y2 = oc.downloads.get(url), nc.downloads.get(url)
        if (x2 and x2.sha256) != (y2 and y2.sha256):
            lines.append(f"download {url}: sha256 {x2.sha256 if x2 else 'absent'} -> {y2.sha256 if y2 else 'absent'}"
                         + (f" ({y2.origin})" if y2 else ""))  # fmt: skip
    for set_name in sorted(set(oc.python) | set(nc.python)):
        xs = {r.name: r for r in oc.python.get(set_name, ())}
        ys = {r.name: r for r in nc.python.get(set_name, ())}
        for dist in sorted(set(xs) | set(ys)):
            x3, y3 = xs.get(dist), ys.get(dist)
            if x3 is None or y3 is None:
                lines.append(f"python {set_name}: {dist} {'added' if x3 is None else 'gone'}")
            elif x3.version != y3.version:
                lines.append(f"python {set_name}: {dist}=={x3.version} no longer resolves (gone from the index, or "
                             f"no longer fits the set's requirements): {y3.version} resolves instead")  # fmt: skip
            elif set(x3.hashes) != set(y3.hashes):
                gone, added = sorted(set(x3.hashes) - set(y3.hashes)), sorted(set(y3.hashes) - set(x3.hashes))
                lines.append(f"python {set_name}: {dist}=={x3.version}: hashes changed (gone: "
                             f"{', '.join(h[7:19] for h in gone) or 'none'}; new: "
                             f"{', '.join(h[7:19] for h in added) or 'none'})")  # fmt: skip
    return lines


def _pin_text(pin: object) -> str:
    if pin is None:
        return "absent"
    assert isinstance(pin, Pin)
    return f"{pin.version} ({pin.source}, {pin.origin})"


def lock_path(loaded: LoadedRecipe) -> Path:
    return loaded.path.with_name(f"{loaded.path.stem}.lock.json")


def dumps(resolved: Resolved) -> str:
    """The lock file's text for a resolution."""
    return Lock.of(resolved).dumps()


def write(loaded: LoadedRecipe, resolved: Resolved) -> Path:
    """Write the lock beside its recipe, atomically: readers (and other `imgbuild lock` runs of the same recipe)
    see the old lock or the new one, never a part of either."""
    path = lock_path(loaded)
    try:
        write_atomic(path, dumps(resolved))
    except OSError as exc:
        raise LockError(f"{display(path)}: cannot write the lock: {exc.strerror or exc}") from None
    return path


def read(loaded: LoadedRecipe) -> Resolved | None:
    """The recipe's lock as a Resolved, None when there is none; LockError when unreadable, stale or edited."""
    path = lock_path(loaded)
    if not path.exists() and not path.is_symlink():  # a broken link or a loop is read, and refused, below
        return None
    hint = f"imgbuild lock {command_ref(loaded)}"
    data = _json(path, hint)
    if not isinstance(data, dict) or data.get("lock_version") != LOCK_VERSION:
        found = data.get("lock_version") if isinstance(data, dict) else None
        older = (
            " (written by an older imgbuild: it pins versions, not content: no base digests, checksums or wheel hashes)"
            if isinstance(found, int) and 0 < found < LOCK_VERSION
            else ""
        )
        raise LockError(f"{display(path)}: lock_version: expected {LOCK_VERSION}{older}", hint=hint)
    if data.get("recipe_digest") != loaded.digest:
        raise LockError(
            f"{display(path)} is stale: {display(loaded.path)} (or a recipe it extends) changed since the lock "
            "was written",
            hint=hint,
        )
    try:
        lock = Lock.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise LockError(f"{display(path)}: malformed lock: {problems}", hint=hint) from None
    if lock.content is None:
        raise LockError(f"{display(path)}: content: missing (the digests, checksums and hashes)", hint=hint)
    if lock.content_digest != lock.content.digest():
        raise LockError(
            f"{display(path)}: content was edited by hand: its digest is {lock.content.digest()[:12]}, "
            f"content_digest says {str(lock.content_digest)[:12]} (a checksum or hash no lock run recorded)",
            hint=f"{hint} (reads them from the world again), or `git checkout` the lock",
        )
    resolved = Resolved(
        recipe=loaded.recipe,
        recipe_digest=lock.recipe_digest,
        base_ref=lock.base_ref,
        pins=lock.pins,
        warnings=lock.warnings,
        content=lock.content,
        locked_at=lock.locked_at,
    )
    key = (str(path.resolve()), lock.digest(), loaded.digest)
    if key not in _FOLLOWS:
        _check_not_edited(loaded, resolved, path, hint)
        _FOLLOWS.add(key)
    return resolved


def _json(path: Path, hint: str) -> object:
    """A lock file's JSON, read bounded (MAX_LOCK_BYTES); a LockError naming the file when it cannot be read."""
    from imgbuild.core import files as userfiles

    try:
        raw = userfiles.read_bounded(path, MAX_LOCK_BYTES)  # a FIFO, a device or a loop refused unopened
        return json.loads(raw.decode("utf-8"))
    except userfiles.Refused as exc:
        raise LockError(f"{display(path)}: unreadable lock file: {exc}", hint=hint) from None
    except ValueError as exc:  # not UTF-8, not JSON, or a number past Python's 4300-digit limit
        raise LockError(f"{display(path)}: unreadable lock file: {str(exc).split(';')[0]}", hint=hint) from None
    except RecursionError:
        raise LockError(f"{display(path)}: unreadable lock file: nested too deeply for a lock", hint=hint) from None


def preferences(loaded: LoadedRecipe) -> dict[str, str]:
    """The Python distributions the recipe's existing lock pins (normalized name -> version): `imgbuild lock` keeps
    them as uv and pip-tools keep an existing output's pins (`wheels.compile_sets`), so a relock moves one only when
    it no longer resolves or no longer fits, or when --upgrade / --upgrade-package asks. Read from any readable lock, a
    stale one included (a recipe edit keeps the pins it still allows); {} when there is none, or none it records.
    A LockError when the file is there but cannot be read as JSON."""
    from packaging.utils import canonicalize_name

    path = lock_path(loaded)
    if not path.exists():
        return {}
    data = _json(path, f"imgbuild lock {command_ref(loaded)}")
    content = data.get("content") if isinstance(data, dict) else None
    python = content.get("python") if isinstance(content, dict) else None
    out: dict[str, str] = {}
    for reqs in python.values() if isinstance(python, dict) else ():
        for item in reqs if isinstance(reqs, list) else ():
            try:
                req = Requirement.model_validate(item)
            except ValidationError:  # an entry edited into something else: no preference, not an error
                continue
            out[canonicalize_name(req.name)] = req.version
    return out


def at_hand(loaded: LoadedRecipe) -> list[tuple[str, Resolved]]:
    """The locks an offline relock may take requirement sets from (`record.record`'s `at_hand`), each with its file's
    name: the recipe's own lock where it is fresh, then each parent's that has one (nearest first). One that cannot
    be read, is stale or was edited is left out: it vouches for nothing."""
    out: list[tuple[str, Resolved]] = []
    for path in loaded.chain:
        try:
            owner = loaded if path == loaded.path else load(str(path))
            if owner.recipe.abstract:
                continue
            locked = read(owner)
        except ImgbuildError:
            continue
        if locked is not None:
            out.append((display(lock_path(owner)), locked))
    return out


class _Recorded:
    """The publishers' artifacts as a lock recorded them when it was written (releases.Artifacts): what its pins are
    checked against, with no network (None where the lock recorded none: the release files were used)."""

    def __init__(self, locked: Resolved) -> None:
        self.pins = locked.pins

    def read(self, block: str, version: str, url: str | None) -> BaseModel | None:
        owner = BY_NAME[block]
        pin, spec = self.pins.get(block), owner.artifact if isinstance(owner, Released) else None
        if pin is None or pin.version != version or spec is None:
            return None
        return spec.recorded(pin)


def _check_not_edited(loaded: LoadedRecipe, locked: Resolved, path: Path, hint: str) -> None:
    """The lock's pins must be what the resolver's rules give for the recipe (with the lock's own record of a
    PyTorch wheel's pins, so this needs no network): a pin edited by hand would build something never checked."""

    def from_lock(version: str, machine: str = "x86_64") -> TorchWheel:  # one record for every machine
        pin = locked.pins.get("pytorch")
        wheel = pin.typed(PyTorchDetails).wheel() if pin is not None else None
        if wheel is None:
            raise LockError(
                f"{display(path)}: pins.pytorch.details: the wheel's nccl_package, nccl, cuda and cuda_wheels pins "
                "are missing (a lock written by an older imgbuild?)",
                hint=hint,
            )
        return wheel

    try:
        fresh = resolve(loaded, lookup_torch=from_lock, artifacts=_Recorded(locked))
    except LockError:
        raise
    except ImgbuildError as exc:  # the recipe's rules reject what the lock says (a bug elsewhere still surfaces)
        raise LockError(f"{display(path)} does not follow from {display(loaded.path)}: {exc}", hint=hint) from None
    diffs = []
    for name in sorted(set(locked.pins) | set(fresh.pins)):
        mine, theirs = locked.pins.get(name), fresh.pins.get(name)
        if mine is None or theirs is None:
            diffs += (
                []
                if mine == theirs
                else [f"{name}: {'missing from the lock' if mine is None else 'not in the recipe'}"]
            )
            continue
        diffs += [
            f"{name}.{field}: lock {getattr(mine, field)!r}, the recipe gives {getattr(theirs, field)!r}"
            for field in ("version", "source", "origin")
            if getattr(mine, field) != getattr(theirs, field)
        ]
        a, b = mine.details.model_dump(), theirs.details.model_dump()
        diffs += [
            f"{name}.details.{key}: lock {a.get(key)!r}, the recipe gives {b.get(key)!r}"
            for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key)
        ]
    diffs += _content_diffs(locked, fresh)
    if diffs:
        raise LockError(
            f"{display(path)} was edited by hand (it does not follow from {display(loaded.path)}): " + "; ".join(diffs),
            hint=hint,
        )


def _content_diffs(locked: Resolved, fresh: Resolved) -> list[str]:
    """What the recipe decides beyond the pins, as the lock has it: the base image reference (FROM), and the keys of
    its content: the bases the build starts from, the URLs its blocks download, the requirement sets they install
    (each record under its own key). Content's values (digests, checksums, hashes) come from the world; their digest
    (`content_digest`) and their formats are checked on read."""
    diffs = []
    if locked.base_ref != fresh.base_ref:
        diffs.append(f"base_ref: lock {locked.base_ref!r}, the recipe gives {fresh.base_ref!r}")
    content = locked.content
    if content is None:
        return diffs
    wanted = {
        "content.bases": (set(content.bases), set(record.bases(fresh))),
        "content.downloads": (set(content.downloads), set(record.downloads(fresh))),
        "content.python": (set(content.python), set(record.requirement_sets(fresh))),
    }
    for field, (have, want) in wanted.items():
        if extra := sorted(have - want):
            diffs.append(f"{field}: {', '.join(map(repr, extra))} not among what the recipe's blocks need")
        if missing := sorted(want - have):
            diffs.append(f"{field}: {', '.join(map(repr, missing))} missing from the lock")
    diffs += [f"content.bases[{k!r}].ref: {d.ref!r}" for k, d in content.bases.items() if d.ref != k]
    diffs += [f"content.downloads[{k!r}].url: {d.url!r}" for k, d in content.downloads.items() if d.url != k]
    return diffs


def for_ref(ref: str) -> tuple[LoadedRecipe, Resolved]:
    """The recipe REF (refused when abstract) with the pins of its lock: a LockError when it has none (or one that is
    stale, unreadable or edited). What every command that builds on a lock uses (render, build, verify, push...)."""
    loaded = load(ref).concrete()
    return loaded, resolved_for(loaded)


def resolved_for(loaded: LoadedRecipe) -> Resolved:
    """The recipe's lock as a Resolved; a LockError naming the lock file when there is none: an image is built from
    pinned content (versions, digests, hashes) or not at all, never from whatever resolves today."""
    locked = read(loaded)
    if locked is None:
        raise LockError(
            f"{display(lock_path(loaded))}: no such lock: {display(loaded.path)} has not been locked, and images "
            "are built from a lock's pins and hashes only",
            hint=f"imgbuild lock {command_ref(loaded)}",
        )
    return locked


def lock_or_fresh(
    loaded: LoadedRecipe, *, lookup_torch: TorchLookup | None = index_lookup
) -> tuple[Resolved, Literal["lock", "resolved"]]:
    """The recipe's lock when it has one ("lock"), else a fresh resolution ("resolved": versions only, no content)
    for what only shows pins (`show`, `doctor`), never for what builds on them. A stale or edited lock is still an
    error."""
    locked = read(loaded)
    if locked is not None:
        return locked, "lock"
    return resolve(loaded, lookup_torch=lookup_torch), "resolved"


def command_ref(loaded: LoadedRecipe) -> str:
    """How to name the recipe on the command line: its name when shipped, else its path."""
    from imgbuild.core import paths

    if loaded.path.resolve().parent == paths.recipes_dir().resolve():
        return loaded.path.stem
    return display(loaded.path)
