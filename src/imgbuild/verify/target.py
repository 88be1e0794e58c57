"""What `imgbuild verify` is asked to verify, resolved (`Target`): RECIPE -> its content-addressed image
`imgbuild/<name>:lock-<digest12>` and its lock's manifest; IMAGE -> the recipe its label `io.imgbuild.recipe` names
(and that recipe's lock when it is a shipped one). What to check comes from the image's own manifest
(/etc/imgbuild/manifest.json, image/manifest.py): its components, their paths, its run profile; the lock only says
what the manifest must hold (the `manifest` check)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import docker

from imgbuild import recipe
from imgbuild.core import platforms
from imgbuild.core.errors import ImgbuildError, LockError, VerifyError
from imgbuild.engine import client as engine
from imgbuild.image import identity, render
from imgbuild.image.identity import Identity
from imgbuild.image.manifest import Manifest
from imgbuild.pin import lock
from imgbuild.pin.resolver import Resolved

LABEL_RECIPE = "io.imgbuild.recipe"


@dataclass(frozen=True)
class Target:
    """What the user named, resolved: the image, the recipe and its lock (when there is one)."""

    ref: str
    kind: Literal["recipe", "image"]
    image: str | None
    recipe: str | None
    resolved: Resolved | None
    expected_manifest: Manifest | None  # what the lock says the image's manifest holds
    note: str = ""  # why there is no lock to compare with, or where the expectations come from


def expected_manifest(resolved: Resolved, named: Identity, arch: str | None = None) -> Manifest:
    """The manifest the lock gives the image of `arch` (default: the recipe's first), what its
    /etc/imgbuild/manifest.json must hold: no template is rendered. `named`: the image's identity, as the caller
    read it (identity.of, once)."""
    return render.manifest(resolved, named, arch)


def looks_like_image(ref: str) -> bool:
    return ":" in ref or "@" in ref


def target_for_recipe(ref: str, resolved: Resolved, arch: str | None = None) -> Target:
    """Recipe REF with its lock (the command's `lock.for_ref`: a recipe without a lock is refused there, its image
    would be no lock's): the image `imgbuild build RECIPE [--platform linux/ARCH]` tags (`Identity.ref`: `-ARCH`
    after the tag for an architecture other than the recipe's first), and its lock's manifest for that
    architecture."""
    named = identity.of(resolved)  # read once: the image's reference and its manifest name the same lock
    arch = named.check_arch(arch)  # a RenderError naming the recipe's architectures
    expected = expected_manifest(resolved, named, arch)
    return Target(ref, "recipe", named.ref(arch), resolved.name, resolved, expected)


def target_for_image(ref: str, labels: dict[str, str], arch: str | None = None) -> Target:
    """An image: the recipe its label names, and that recipe's lock (its manifest for `arch`, the architecture the
    engine records for the image) when the recipe is shipped."""
    name = labels.get(LABEL_RECIPE)
    if not name:
        return Target(ref, "image", ref, None, None, None, f"{ref} has no {LABEL_RECIPE} label: no lock to compare")
    if name not in recipe.shipped_names():
        note = f"recipe '{name}' is not a shipped recipe: the image's manifest is the only expectation"
        return Target(ref, "image", ref, name, None, None, note)
    loaded = recipe.load(name)
    try:
        resolved = lock.read(loaded)
    except LockError as exc:
        return Target(ref, "image", ref, name, None, None, f"the lock of '{name}' cannot be used: {exc.message}")
    if resolved is None:
        return Target(ref, "image", ref, name, None, None, f"shipped recipe '{name}' has no lock")
    if arch is not None and arch not in resolved.recipe.platform.arch:
        note = f"recipe '{name}' is not built for {arch}: the image's manifest is the only expectation"
        return Target(ref, "image", ref, name, None, None, note)
    note = f"compared with the lock of shipped recipe '{name}'"
    return Target(ref, "image", ref, name, resolved, expected_manifest(resolved, identity.of(resolved), arch), note)


def names_recipe(ref: str) -> bool:
    """Whether REF names a recipe (a shipped name or a YAML file), not an image: decided before any engine is asked,
    so that a recipe without a lock is exit 4 whether or not an engine answers."""
    if looks_like_image(ref):
        return False
    try:
        recipe.find(ref)
    except ImgbuildError:
        return False
    return True


def resolve_target(ref: str, client: docker.DockerClient | None, arch: str | None = None) -> Target:
    """RECIPE (shipped name or YAML path: its lock read here, for a caller that holds none) or IMAGE (has ':' or '@',
    or the engine knows it). `arch` (--platform): which of a recipe's architectures; for an image, the architecture
    it must be."""
    if names_recipe(ref):
        return target_for_recipe(ref, lock.for_ref(ref)[1], arch)
    if not looks_like_image(ref) and (client is None or image_labels(client, ref) is None):
        recipe.find(ref)  # neither a recipe nor an image the engine has: the recipe's error (no such recipe...)
    if client is None:
        raise VerifyError(f"{ref}: verifying an image needs the Docker engine")
    info = engine.inspect_image(client, ref)
    if info is None:
        raise VerifyError(f"image {ref} is not in the engine", hint="imgbuild build RECIPE, or docker pull it")
    recorded = str(info.get("Architecture") or "")
    if arch is not None and recorded != arch:
        raise VerifyError(f"image {ref} is {info.get('Os') or 'linux'}/{recorded or '?'}, not --platform linux/{arch}")
    return target_for_image(ref, _labels(info), recorded if recorded in platforms.MACHINE else None)


def image_labels(client: docker.DockerClient, ref: str) -> dict[str, str] | None:
    info = engine.inspect_image(client, ref)
    return None if info is None else _labels(info)


def _labels(info: dict[str, Any]) -> dict[str, str]:
    """An image's labels, from the engine's record of it."""
    return dict((info.get("Config") or {}).get("Labels") or {})
