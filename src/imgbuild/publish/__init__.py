"""`imgbuild push`: publish a recipe's images (named by its lock) or a local image's tags to a registry.

One module per step, each doing one job:

* `source`: what is pushed: a recipe's lock-derived refs (``imgbuild/cpu:lock-<12hex>`` and the readable tag; the
  `Recipe` the command read once), or the tags of a local image; each must be built before anything is pushed;
* `push`: the `Publisher`: tagging under the registry, the push stream, the immutable-tag check, the scan gate;
* `retry`: which failures are retried (`classify`) and how (`Retry`);
* `index`: a recipe of several architectures as one OCI image index under the plain tags;
* `results`: what a run reports (`PublishResult`);
* `registry`, `ecr`, `scan`: the registry's HTTP API, Amazon ECR's credentials and repositories, ECR's scan gate;
* `inventory`: what a built image holds, for the SBOM `imgbuild push --sbom` writes;
* `command`: the whole command (`publish`).

"""

from imgbuild.publish.command import publish
from imgbuild.publish.index import index_document
from imgbuild.publish.push import Publisher, PushObserver, QuietProgress
from imgbuild.publish.results import IndexEntry, IndexReport, PublishResult, PushedRef
from imgbuild.publish.retry import Retry, classify
from imgbuild.publish.source import (
    ArchImage,
    Recipe,
    Source,
    is_recipe,
    recipe,
    resolve_arch_images,
    resolve_source,
)

__all__ = [
    "ArchImage",
    "IndexEntry",
    "IndexReport",
    "PublishResult",
    "Publisher",
    "PushObserver",
    "PushedRef",
    "QuietProgress",
    "Recipe",
    "Retry",
    "Source",
    "classify",
    "index_document",
    "is_recipe",
    "publish",
    "recipe",
    "resolve_arch_images",
    "resolve_source",
]
