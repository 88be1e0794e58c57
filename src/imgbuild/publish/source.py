"""What `imgbuild push` publishes: a recipe's images, named by its lock (`Recipe`: the identity the command read
once, imgbuild.image.identity), each of which must be built; or the tags of a local image.

Everything here is looked up in the engine before anything is pushed: a recipe's image that is not built (or not
every one of its tags on one image, or not of the architecture asked for) is a `PushError` naming the
`imgbuild build` to run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker

from imgbuild.core import imageref
from imgbuild.core.errors import PushError
from imgbuild.engine.client import inspect_image
from imgbuild.image.identity import Identity
from imgbuild.publish.registry import strip_domain

if TYPE_CHECKING:
    from imgbuild.pin.resolver import Resolved
    from imgbuild.recipe import LoadedRecipe

_IMAGE_ID_RE = re.compile(r"^(?:sha256:)?[0-9a-f]{12,64}\Z")


def split_ref(ref: str) -> tuple[str, str]:
    """`REPOSITORY:TAG` -> (repository, tag), "latest" where none is named."""
    parsed = imageref.parse(ref, where="the engine's image tag", error=PushError)
    return parsed.repository, parsed.tag or "latest"


@dataclass(frozen=True)
class Source:
    """A local image and the refs of it to publish (``<repo>:<tag>``)."""

    image_id: str
    refs: tuple[str, ...]
    repo_digests: tuple[str, ...] = ()
    recipe: str | None = None


@dataclass(frozen=True)
class Recipe:
    """A recipe to publish: its images' names, from the lock the command read (once), and how the command line
    names the recipe (`ref`: the `imgbuild build` a hint asks for)."""

    ref: str
    identity: Identity


def recipe(loaded: LoadedRecipe, resolved: Resolved) -> Recipe:
    """The recipe `loaded`, with its lock `resolved` (`lock.for_ref`), as `imgbuild push` publishes it."""
    from imgbuild.image import identity
    from imgbuild.pin.lock import command_ref

    return Recipe(command_ref(loaded), identity.of(resolved))


def is_recipe(what: str) -> bool:
    """Whether WHAT of `imgbuild push WHAT` names a recipe (a YAML file or a shipped name), not an image."""
    from imgbuild import recipe as recipes

    return what.endswith((".yaml", ".yml")) or what in recipes.shipped_names()


def resolve_source(client: docker.DockerClient, what: str | Recipe, arch: str | None = None) -> Source:
    """A Recipe -> its lock-derived refs (which must be built; those of `arch`, one of its platform.arch, where given:
    `lock-<12 hex>-arm64` for another than the first); IMAGE -> that image's tags.

    An IMAGE given by name (``imgbuild/cpu:lock-...``) publishes every tag of that image in the same repository;
    given by id, every tag of the image that names no registry.
    """
    if isinstance(what, Recipe):
        named = what.identity
        refs = named.refs(named.check_arch(arch))
        build_cmd = f"imgbuild build {what.ref}" + (f" --platform linux/{arch}" if arch else "")
        built = _built_image(client, refs, f"recipe {named.recipe}", build_cmd)
        return Source(str(built["Id"]), tuple(refs), tuple(built.get("RepoDigests") or ()), named.recipe)

    found = inspect_image(client, what)
    if found is None:
        raise PushError(f"{what!r} is neither a recipe nor an image in the engine",
                        hint="`imgbuild list` names the recipes; `docker images` the images")  # fmt: skip
    tags = [t for t in (found.get("RepoTags") or []) if t and t != "<none>:<none>"]
    if _IMAGE_ID_RE.match(what):
        refs = [t for t in tags if strip_domain(split_ref(t)[0]) == split_ref(t)[0]]
    else:
        name = split_ref(what)[0]
        refs = [t for t in tags if split_ref(t)[0] == name]
    if not refs:
        raise PushError(f"image {what} has no tags to publish", hint="tag it first: docker tag IMAGE NAME:TAG")
    return Source(str(found["Id"]), tuple(dict.fromkeys(refs)), tuple(found.get("RepoDigests") or ()))


def _built_image(client: docker.DockerClient, refs: Sequence[str], what: str, hint: str) -> dict[str, Any]:
    """The engine's record of the image a recipe's build tagged `refs` with: every ref on one image, else a PushError
    naming the ref (`what`: "recipe cpu", "the linux/arm64 image of cpu") with the build to run as its hint."""
    found = inspect_image(client, refs[0])
    if found is None:
        raise PushError(f"{refs[0]} is not in the engine: {what} has not been built from its lock", hint=hint)
    for ref in refs[1:]:
        other = inspect_image(client, ref)
        if other is None or other["Id"] != found["Id"]:
            state = "is not in the engine" if other is None else f"is a different image ({other['Id'][:19]})"
            raise PushError(f"{ref} {state}; expected the image of {refs[0]} ({found['Id'][:19]})", hint=hint)
    return found


@dataclass(frozen=True)
class ArchImage:
    """One architecture's image of a multi-architecture recipe: the local image and, for each of its refs, the
    plain tag the index goes under (`Identity.tags` without the architecture's suffix)."""

    arch: str
    image_id: str
    repository: str  # imgbuild/cpu
    tags: tuple[tuple[str, str], ...]  # (local ref, plain tag): (imgbuild/cpu:lock-<12 hex>-arm64, lock-<12 hex>)
    repo_digests: tuple[str, ...] = ()


def resolve_arch_images(
    client: docker.DockerClient, recipe: Recipe, arches: Sequence[str] | None = None
) -> list[ArchImage]:
    """The recipe's image of each architecture in `arches` (default: every one its platform.arch lists), each built
    from the lock (every tag `Identity.refs` gives it, on one image recorded as that architecture): else a PushError
    naming the `imgbuild build ... --platform` to run, before anything is pushed."""
    from imgbuild.core import platforms

    named = recipe.identity
    wanted = [named.check_arch(a) for a in arches] if arches else list(named.arches)
    plain = named.tags()
    images: list[ArchImage] = []
    for arch in wanted:
        refs = named.refs(arch)
        platform = platforms.docker_platform(arch)
        hint = f"imgbuild build {recipe.ref} --platform {platform}"
        found = _built_image(client, refs, f"the {platform} image of {named.recipe}", hint)
        if (got := str(found.get("Architecture") or "?")) != arch:
            raise PushError(f"{refs[0]} is a linux/{got} image, not {platform}", hint=hint)
        images.append(ArchImage(arch, str(found["Id"]), named.repository, tuple(zip(refs, plain, strict=True)),
                                tuple(found.get("RepoDigests") or ())))  # fmt: skip
    return images
