"""Pin every component of a recipe and prove the versions fit together, or say exactly why not.

The target's own rules (base image, platform and CUDA) live here; every component's pin rule lives in its block
(imgbuild.blocks), and this module runs them in dependency order. `resolve()` is pure when every PyTorch
release it meets is in the shipped table; for another release it asks `lookup_torch` (by default the package
index, through range requests on the wheel's METADATA).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from imgbuild.blocks import BY_NAME, Details, Pin, RecipeRules, Resolution, known_bad, resolve_order
from imgbuild.blocks._releases import Artifacts
from imgbuild.blocks.pytorch import TorchWheel
from imgbuild.pin.content import Content
from imgbuild.recipe import LoadedRecipe, Recipe

__all__ = ["Artifacts", "Pin", "Resolved", "TorchLookup", "details_model", "index_lookup", "read_details", "resolve"]


class BaseImageDetails(Details):
    """The `base` pin: the image, and the builder stage's own tag of it when the recipe names one."""

    image: str
    builder: str | None = None  # IMAGE:builder_tag


TARGET_DETAILS: dict[str, type[Details]] = {"base": BaseImageDetails}


def details_model(name: str) -> type[Details]:
    """The details model of pin `name`: its block's, or the target's own (base)."""
    block = BY_NAME.get(name)
    return block.details if block is not None else TARGET_DETAILS.get(name, Details)


def read_details(name: str, data: object, where: str) -> Details:
    """`data` (JSON: a lock's or a manifest's) as pin `name`'s details model; a ValueError naming each field that
    does not fit under `where` (`pins.sshd.details.ports.0`, `components.sshd.ports.0`)."""
    try:
        return details_model(name).model_validate(data)
    except ValidationError as exc:
        raise ValueError(
            "; ".join(f"{where}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        ) from None


LOCKED_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|\+00:00)")  # ISO 8601, UTC


class Pinned(BaseModel):
    """What a resolution decides: the merged recipe's digest, the base image reference, every pin, warnings."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    recipe_digest: str
    base_ref: str
    pins: dict[str, Pin]
    warnings: tuple[str, ...] = ()
    # What the build fetches, by content (imgbuild.pin.content): read from the world at `imgbuild lock`, so a fresh
    # resolution (pure, no network) has none.
    content: Content | None = None
    # When the content was read (ISO 8601, UTC): the image's org.opencontainers.image.created, so a rebuild from one
    # lock makes the same image. Kept by `imgbuild lock` when nothing else changed.
    locked_at: str | None = None

    @field_validator("locked_at")
    @classmethod
    def _timestamp(cls, value: str | None) -> str | None:
        """`imgbuild lock`'s UTC time to the second (it becomes the image's created label)."""
        if value is not None and not LOCKED_AT.fullmatch(value):
            raise ValueError(
                f"expected an ISO 8601 time in UTC (YYYY-MM-DDTHH:MM:SS+00:00, as imgbuild lock writes it), "
                f"got {value!r}"
            )
        return value

    @field_validator("pins", mode="before")
    @classmethod
    def _typed(cls, value: object) -> object:
        """A pin's details from JSON are validated against its block's model (unknown keys are errors)."""
        if not isinstance(value, dict):
            return value
        return {
            name: (
                {**pin, "details": read_details(name, pin.get("details", {}), f"pins.{name}.details")}
                if isinstance(pin, dict) and isinstance(pin.get("details", {}), dict)
                else pin
            )
            for name, pin in value.items()
        }


class Resolved(Pinned):
    """A recipe with every component pinned (what the lock file holds, with the recipe itself)."""

    recipe: Recipe

    @property
    def name(self) -> str:
        return self.recipe.name

    def version(self, component: str) -> str | None:
        pin = self.pins.get(component)
        return pin.version if pin else None


# (torch version, machine: x86_64 | aarch64) -> what that release's wheel for Linux on that machine pins
TorchLookup = Callable[[str, str], TorchWheel]


def index_lookup(torch_version: str, machine: str = "x86_64") -> TorchWheel:
    """Read a PyTorch release's NCCL and CUDA pins, and the CUDA wheels it requires, from its wheel for Linux on
    `machine` on the package index (range requests on the wheel's METADATA)."""
    from imgbuild.core.errors import ResolveError
    from imgbuild.pin import pypi  # network edge: imported only when a release is not in the shipped table

    pins = pypi.torch_pins(torch_version, machine=machine)
    if pins.cuda_version is None:
        raise ResolveError(f"torch {torch_version}: its {machine} wheel pins no CUDA runtime (a CPU build?)")
    return TorchWheel(pins.nccl_package, pins.nccl_version, pins.cuda_version, pins.cuda_wheels)


def resolve(
    loaded: LoadedRecipe, *, lookup_torch: TorchLookup | None = index_lookup, artifacts: Artifacts | None = None
) -> Resolved:
    """Pin and check a loaded recipe. Raises ResolveError naming the file, the keys and the conflict. `artifacts`:
    what the publishers' artifacts say (`imgbuild lock`: imgbuild.pin.artifacts, the EFA installer's bundle and the
    plugin's release notes); without it, or where it answers None, the shipped release files
    (blocks/*/releases.yaml)."""
    rs = Resolution(loaded.recipe, loaded.path, {"pytorch": lookup_torch}, artifacts)
    base_ref = _base(rs)
    for name in resolve_order():
        block = BY_NAME[name]
        options = rs.options(name)
        if options is None:
            why = block.required(rs.recipe) if isinstance(block, RecipeRules) else None
            if why:
                raise rs.fail(f"components.{name}", why)
            continue
        rs.pins[name] = block.resolve(options, rs)
        # as soon as its pins are made: the first refusal names the cause, not what follows
        _known_bad(rs, loaded.recipe, name)
    return Resolved(
        recipe=loaded.recipe,
        recipe_digest=loaded.digest,
        base_ref=base_ref,
        pins=dict(sorted(rs.pins.items())),
        warnings=tuple(rs.warnings),
    )


def _known_bad(rs: Resolution, recipe: Recipe, name: str) -> None:
    """THE rule for what the release files mark bad (`imgbuild.blocks.known_bad`) that pin `name` completes among the
    pins made so far: a `refuse` is a ResolveError naming the recipe's key, the upstream links and the nearest
    good release; a `warn` is a warning. `hold:` keeps a refused one only where its reason cites one of the links (the
    recipe then says why it keeps it): a warning again."""
    for found in known_bad(rs.pins, involving=name):
        where = found.names[0]
        key = f"{'components.' if where in type(recipe.components).model_fields else ''}{where}.version"
        held = [n for n in found.names if any(link in recipe.hold.get(n, "") for link in found.bad.links)]
        if found.bad.level == "warn" or held:
            kept = f" (kept: hold.{held[0]} cites it)" if held else ""
            rs.warnings.append(f"{found.message()}{kept} [{found.listed_in}]")
            continue
        good = f"use {found.bad.good}, or " if found.bad.good else ""
        raise rs.fail(
            key,
            f"{found.message()} [{found.listed_in}]",
            hint=f"{good}keep it with hold.{where}: a reason that cites one of those links",
        )


def _base(rs: Resolution) -> str:
    b = rs.recipe.base
    if b.tag == "latest" and not b.latest_only:
        raise rs.fail(
            "base.tag",
            "'latest' is not a pinned version",
            hint="use a versioned tag, or set base.latest_only: true with base.digest if the "
            "publisher offers only 'latest'",
        )
    if b.latest_only and b.digest is None:
        rs.warnings.append(
            f"base image {b.image} publishes only '{b.tag}', so it is not pinned: add base.digest "
            f"(docker inspect --format '{{{{index .RepoDigests 0}}}}' {b.image}:{b.tag}) to pin it"
        )
    ref = f"{b.image}@{b.digest}" if b.digest else f"{b.image}:{b.tag}"
    details = BaseImageDetails(image=b.image, builder=f"{b.image}:{b.builder_tag}" if b.builder_tag else None)
    rs.pins["base"] = Pin(version=b.digest or b.tag, source="image", origin="recipe", details=details)
    return ref
