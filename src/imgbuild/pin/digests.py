"""Base image digests for the lock: what a base reference resolves to today, asked of the registry through the
engine (which holds the credentials and mirrors), else the engine's own record of a pulled image.

A base made on this machine (`imgbuild base bootstrap`, `docker import`) has an image id but no registry digest:
its id differs on every machine that makes it, so the lock records it as local, not as a pin (a build still labels
the image with the id it started from). Nothing here invents a digest: a reference neither the registry nor the
engine can answer for is recorded as unestablished, with both reasons.
"""

from __future__ import annotations

import re
from typing import Any

from imgbuild.core import imageref
from imgbuild.pin.content import ImageDigest
from imgbuild.pin.resolver import Resolved


def same_repository(ref: str, other: str) -> bool:
    """Whether image references `ref` and `other` (an engine's RepoDigests entry) name one repository, tag and digest
    aside, as Docker normalises a name (`debian` is `docker.io/library/debian`; a registry's :port is kept). An
    entry that is not an image reference names none."""
    try:
        return imageref.parse(ref).full_repository == imageref.parse(other).full_repository
    except ValueError:
        return False


def establish(ref: str, resolved: Resolved | None = None, *, engine: Any | None = None) -> ImageDigest:
    """The digest of base image `ref`: from the recipe (`image@sha256:...`), else the registry (asked through
    `engine`), else the engine's RepoDigests of the local image; a local image without any is recorded as local."""
    if "@" in ref:
        digest = ref.split("@", 1)[1]
        return ImageDigest(ref=ref, digest=digest, origin="recipe (base.digest)")
    if engine is None:
        return ImageDigest(ref=ref, digest=None, origin="unestablished: no Docker engine to ask the registry through")
    import docker.errors

    try:
        data = engine.api.inspect_distribution(ref)
        digest = data["Descriptor"]["digest"]
        return ImageDigest(ref=ref, digest=digest, origin="registry (asked through the engine)")
    except (docker.errors.APIError, KeyError, TypeError) as exc:
        registry_error = _short(exc)
    try:
        image = engine.images.get(ref)
    except docker.errors.ImageNotFound:
        return ImageDigest(
            ref=ref,
            digest=None,
            origin=f"unestablished: the registry did not answer ({registry_error}) and the engine has no such image",
        )
    except docker.errors.APIError as exc:
        return ImageDigest(
            ref=ref,
            digest=None,
            origin=f"unestablished: the registry did not answer ({registry_error}); the engine: {_short(exc)}",
        )
    for repo_digest in image.attrs.get("RepoDigests") or []:
        name, _, digest = repo_digest.partition("@")
        if same_repository(ref, name):
            return ImageDigest(ref=ref, digest=digest, origin="engine (the pulled image's RepoDigests)")
    return ImageDigest(
        ref=ref,
        digest=None,
        origin=(
            "local: the engine's image was made on its machine (imgbuild base bootstrap / docker import), so it has "
            "no registry digest and its id differs wherever it is made; `imgbuild sources fetch` saves it with its id"
        ),
    )


def _short(exc: BaseException) -> str:
    """An engine error in one line."""
    explanation = getattr(exc, "explanation", None)
    text = str(explanation or exc).strip().splitlines()
    line = (text[0] if text else type(exc).__name__)[:200]
    # the machine's own resolver or proxy address says nothing about the image and would differ in every lock
    return re.sub(r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b", "<address>", line)
