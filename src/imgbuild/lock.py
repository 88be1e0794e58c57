"""Lock files: the resolved pins of a recipe, written beside it (`cpu.yaml` -> `cpu.lock.json`).

Builds and renders use the lock when it is there. A lock records the digest of the merged recipe it was made
from, so a change to the recipe or to any parent makes it stale, and a stale lock is an error, not a guess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from imgbuild.errors import LockError
from imgbuild.recipe import LoadedRecipe, display
from imgbuild.resolver import Pin, Resolved, TorchLookup, index_lookup, resolve, resolved_to_json

LOCK_VERSION = 1


def lock_path(loaded: LoadedRecipe) -> Path:
    return loaded.path.with_name(f"{loaded.path.stem}.lock.json")


def dumps(resolved: Resolved) -> str:
    """The lock file's text: sorted keys, stable across runs."""
    return json.dumps({"lock_version": LOCK_VERSION, **resolved_to_json(resolved)}, indent=2, sort_keys=True) + "\n"


def write(loaded: LoadedRecipe, resolved: Resolved) -> Path:
    path = lock_path(loaded)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(dumps(resolved))
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise LockError(f"{display(path)}: cannot write the lock: {exc.strerror}") from None
    return path


def read(loaded: LoadedRecipe) -> Resolved | None:
    """The recipe's lock as a Resolved, None when there is none; LockError when unreadable or stale."""
    path = lock_path(loaded)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LockError(f"{display(path)}: unreadable lock file: {exc}", hint=f"imgbuild lock {_ref(loaded)}") from None
    if not isinstance(data, dict) or data.get("lock_version") != LOCK_VERSION:
        raise LockError(f"{display(path)}: lock_version: expected {LOCK_VERSION}", hint=f"imgbuild lock {_ref(loaded)}")
    if data.get("recipe_digest") != loaded.digest:
        raise LockError(
            f"{display(path)} is stale: {display(loaded.path)} (or a recipe it extends) changed since the lock "
            "was written",
            hint=f"imgbuild lock {_ref(loaded)}",
        )
    try:
        pins = {k: Pin.model_validate(v) for k, v in data["pins"].items()}
        return Resolved(
            recipe=loaded.recipe,
            recipe_digest=data["recipe_digest"],
            base_ref=data["base_ref"],
            pins=pins,
            warnings=tuple(data.get("warnings", ())),
        )
    except (KeyError, TypeError, AttributeError, ValidationError) as exc:
        raise LockError(f"{display(path)}: malformed lock: {exc}", hint=f"imgbuild lock {_ref(loaded)}") from None


def resolved_for(
    loaded: LoadedRecipe, *, lookup_torch: TorchLookup | None = index_lookup
) -> tuple[Resolved, Literal["lock", "resolved"]]:
    """The lock when present (and fresh), else a fresh resolution."""
    locked = read(loaded)
    if locked is not None:
        return locked, "lock"
    return resolve(loaded, lookup_torch=lookup_torch), "resolved"


def _ref(loaded: LoadedRecipe) -> str:
    """How to name the recipe on the command line: its name when shipped, else its path."""
    from imgbuild import paths

    if loaded.path.resolve().parent == paths.recipes_dir().resolve():
        return loaded.path.stem
    return display(loaded.path)
