"""The cache between machines: `cache_plan` turns `--cache-from` / `--cache-to` into the builder's options: a
registry cache where buildx has a driver that exports one, the inline cache otherwise (the image itself carries its
cache metadata and is pushed as the --cache-to ref through docker-py: `push_inline_cache`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from imgbuild.build.builders.choice import Builder
from imgbuild.core.errors import UsageError

if TYPE_CHECKING:
    import docker

__all__ = ["Cache", "cache_plan", "cache_ref_problem", "check_cache_ref", "push_inline_cache"]


@dataclass(frozen=True)
class Cache:
    """What `--cache-from` / `--cache-to` become for one builder: `mode` "registry" (buildx exports and imports a
    registry cache), "inline" (the image carries its cache; --cache-to pushes it as `push_ref`) or "none"."""

    mode: Literal["none", "inline", "registry"]
    args: tuple[str, ...] = ()
    push_ref: str | None = None

    def describe(self) -> str:
        if self.mode == "registry":
            return "registry cache (buildx: type=registry, mode=max)"
        if self.mode == "inline":
            return "inline cache (cache metadata in the image" + (
                f"; pushed as {self.push_ref})" if self.push_ref else ")"
            )
        return "no cache between machines"


def cache_ref_problem(value: str, option: str) -> str | None:
    """Why `value` is no --cache-from / --cache-to reference (Docker's grammar; --cache-to takes a tag, no digest);
    None when it is one."""
    from imgbuild.core import validate

    try:
        validate.image_ref(value)
    except ValueError as exc:
        return str(exc)
    if option == "--cache-to" and "@" in value:
        return f"a cache is written under a tag, not a digest: {validate.shown(value)}"
    return None


def check_cache_ref(value: str, option: str) -> str:
    """`value` when it is a --cache-from / --cache-to reference (`cache_ref_problem`); `UsageError` (exit 2) naming
    the option otherwise."""
    problem = cache_ref_problem(value, option)
    if problem:
        raise UsageError(f"{option}: {problem}")
    return value


def cache_plan(builder: Builder, cache_from: Sequence[str] = (), cache_to: str | None = None) -> Cache:
    """The builder's options for the cache refs (checked with `check_cache_ref`)."""
    for ref in cache_from:
        check_cache_ref(ref, "--cache-from")
    if cache_to:
        check_cache_ref(cache_to, "--cache-to")
    if not cache_from and not cache_to:
        return Cache("none")
    args: list[str] = []
    if builder.registry_cache:
        for ref in cache_from:
            args += ["--cache-from", f"type=registry,ref={ref}"]
        if cache_to:
            # image-manifest: ECR takes a cache only as an image manifest (buildkit 0.12+)
            args += ["--cache-to", f"type=registry,ref={cache_to},mode=max,image-manifest=true,oci-mediatypes=true"]
        return Cache("registry", tuple(args))
    for ref in cache_from:
        args += ["--cache-from", ref]
    if cache_to:
        args += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    return Cache("inline", tuple(args), cache_to or None)


def push_inline_cache(client: docker.DockerClient, image_id: str, ref: str, *, progress: Any | None = None) -> str:
    """Push the built image (built with BUILDKIT_INLINE_CACHE=1) as `ref` through `publish.Publisher`: retries,
    `docker login` credentials, ECR's (an ECR host). The local tag `ref` is there only during the push (a tag
    already there is put back): a failed push leaves no half-pushed tag here. Returns the pushed digest; `PushError`
    when the push fails."""
    import docker.utils

    from imgbuild.publish import ecr, registry
    from imgbuild.publish.push import Publisher
    from imgbuild.publish.source import Source

    repo, tag = docker.utils.parse_repository_tag(ref)
    host = repo.split("/")[0] if registry.strip_domain(repo) != repo else "docker.io"
    ecr_registry = ecr.EcrRegistry(host) if ecr.parse_host(host) else None
    publisher = Publisher(client, registry.Destination(host), ecr=ecr_registry, immutable=False, progress=progress)
    target = f"{repo}:{tag or 'latest'}"
    try:
        pushed = publisher.push_ref(Source(image_id, (target,)), target)
    finally:
        publisher.progress.close()
    return pushed.digest
