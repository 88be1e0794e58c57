"""`imgbuild push`, the whole command (`publish`): publish a recipe's images (named by its lock) or a local image's
tags to a registry, through the steps of the package's other modules (imgbuild.publish's docstring lists them).

`--platform` picks architectures: two or more make an index; one alone pushes that architecture's image under the
tags the engine holds it by (the plain tags for the recipe's first, `<tag>-<arch>` for another), as a
single-architecture recipe's image is pushed. The scan gate judges one image's digest, so it is refused for an index;
gate each architecture's image with `--platform linux/ARCH --scan-gate LEVEL`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import docker

from imgbuild.core.errors import PushError
from imgbuild.engine.client import connect
from imgbuild.publish.push import Publisher, PushObserver
from imgbuild.publish.registry import Destination, parse_registry
from imgbuild.publish.results import PublishResult
from imgbuild.publish.retry import Retry
from imgbuild.publish.source import Recipe, resolve_arch_images, resolve_source

__all__ = ["publish"]


def publish(
    what: str | Recipe,
    registry: str | None,
    *,
    ecr: bool = False,
    immutable: bool | None = None,
    retry: Retry | None = None,
    progress: PushObserver | None = None,
    client: docker.DockerClient | None = None,
    auth_config: dict[str, str] | None = None,
    ecr_registry: Any | None = None,
    gate: Any | None = None,
    arches: Sequence[str] | None = None,
) -> PublishResult:
    """`imgbuild push WHAT --registry HOST[/PREFIX] [--ecr] [--scan-gate LEVEL] [--platform P ...]`. WHAT: a recipe
    with its lock (`recipe`, read once by the command), or an image in the engine (its name or id).

    `gate` (a `scan.ScanGate`) needs ECR: on another registry it is a usage error before anything is contacted.
    A recipe built for several architectures (or `arches`, --platform, naming some) is published as an image index
    (`Publisher.publish_index`); the scan gate is refused there (it judges one image's digest).
    """
    from imgbuild.core.errors import UsageError

    recipe_archs = what.identity.arches if isinstance(what, Recipe) else None
    if arches and recipe_archs is None:
        raise UsageError(f"--platform goes with a RECIPE: {what!r} is an image (it is pushed as the engine holds it)")
    selected = list(arches or recipe_archs or ())
    multi = len(selected) > 1
    is_ecr = ecr_registry is not None or ecr or bool(registry and _ecr_host(registry))
    if gate is not None and not is_ecr:
        raise UsageError(
            f"--scan-gate needs Amazon ECR: {registry} has no vulnerability scanner imgbuild can read",
            hint="push to an ECR registry (--ecr, or an <account>.dkr.ecr.<region>.amazonaws.com host), or leave "
            "--scan-gate out and scan the image another way",
        )
    if multi and gate is not None:
        raise UsageError(
            f"--scan-gate judges one image's digest: {_name(what)} is published as an image index of "
            f"{', '.join('linux/' + a for a in selected)}",
            hint="gate each architecture's image on its own (--platform linux/ARCH --scan-gate LEVEL pushes that one "
            "image under its own tags), then push the index without the gate",
        )
    if ecr_registry is None and (ecr or (registry and _ecr_host(registry))):
        from imgbuild.publish.ecr import EcrRegistry

        host = parse_registry(registry).host if registry else None
        ecr_registry = EcrRegistry(host)
    if registry:
        destination = parse_registry(registry)
    elif ecr_registry is not None:
        destination = Destination(ecr_registry.host)
    else:
        raise PushError("no registry given", hint="--registry HOST[/PREFIX], or --ecr for your account's ECR")
    own = client is None
    docker_client = connect() if client is None else client
    try:
        publisher = Publisher(docker_client, destination, ecr=ecr_registry, immutable=immutable, retry=retry,
                              progress=progress, auth_config=auth_config, gate=gate)  # fmt: skip
        if isinstance(what, Recipe) and multi:
            return publisher.publish_index(resolve_arch_images(docker_client, what, selected))
        source = resolve_source(docker_client, what, arches[0] if arches else None)
        return publisher.publish(source)
    finally:
        if own:
            docker_client.close()


def _ecr_host(registry: str) -> bool:
    from imgbuild.publish.ecr import parse_host

    return parse_host(registry.strip().removeprefix("https://").split("/")[0]) is not None


def _name(what: str | Recipe) -> str:
    """WHAT as the command line named it."""
    return what.ref if isinstance(what, Recipe) else what
