"""A recipe built for several architectures, published as one OCI image index (`publish_index`).

Each architecture's image is pushed under ``<tag>-<arch>`` (amd64 too), then an OCI image index
(``application/vnd.oci.image.index.v1+json``) naming each image's manifest and platform goes up under the plain tags
(``lock-<12 hex>`` and the readable one) through the registry's HTTP API (`registry.RegistryAPI.put_manifest`: the
engine pushes images, not indexes). `docker pull --platform linux/arm64` of a plain tag then gets the arm64 image, a
plain pull the engine's own. Every architecture's image must be built before anything is pushed
(`source.resolve_arch_images`); an index that cannot be put says which per-architecture tags were pushed. Immutable
tags hold for the index as for images: the same index (its digest, from the same per-architecture manifests) is
"already published", another one refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from imgbuild.core.errors import PushError
from imgbuild.publish.registry import OCI_INDEX, strip_domain
from imgbuild.publish.results import IndexEntry, IndexReport, PublishResult, PushedRef
from imgbuild.publish.source import ArchImage, Source

if TYPE_CHECKING:
    from imgbuild.publish.push import Publisher


def index_document(entries: Sequence[IndexEntry]) -> bytes:
    """The OCI image index naming `entries` (in their order; one per architecture), as the bytes put in the registry:
    compact JSON with sorted keys, so the same manifests always give the same index digest (an immutable tag's
    "already published" check compares it)."""
    if not entries:
        raise PushError("an image index needs at least one architecture's image")
    if len({e.arch for e in entries}) != len(entries):
        raise PushError(f"an architecture is named twice in the index: {', '.join(e.arch for e in entries)}")
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": e.media_type,
                "digest": e.digest,
                "size": e.size,
                "platform": {"architecture": e.arch, "os": "linux"},
            }
            for e in entries
        ],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def publish_index(publisher: Publisher, images: Sequence[ArchImage]) -> PublishResult:
    """Push each architecture's image under `<tag>-<arch>`, then the OCI image index of them under the plain tags.
    An index that cannot be put is a PushError naming the per-architecture tags this run pushed."""
    pushed: list[PushedRef] = []
    warnings: list[str] = []
    entries: list[IndexEntry] = []
    destination = publisher.destination
    try:
        for image in images:
            source = Source(image.image_id, tuple(local for local, _ in image.tags), image.repo_digests)
            first: PushedRef | None = None
            for local, plain in image.tags:
                try:
                    done = publisher.push_ref(source, local, warnings, as_tag=f"{plain}-{image.arch}")
                except PushError as exc:
                    if not pushed:
                        raise
                    raise PushError(
                        f"{exc.message}\nno image index was put; pushed before it: "
                        + ", ".join(r.target for r in pushed),
                        hint=exc.hint,
                    ) from None
                pushed.append(done)
                first = first or done
            assert first is not None
            entries.append(_entry(publisher, image, first))
        body = index_document(entries)
        digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
        refs: list[PushedRef] = []
        repo = images[0].repository
        path = destination.path(strip_domain(repo))
        for plain in (plain for _, plain in images[0].tags):
            target = f"{destination.repository(strip_domain(repo))}:{plain}"
            try:
                refs.append(_put_index(publisher, path, plain, target, body, digest))
            except PushError as exc:
                done_tags = [r.target for r in pushed] + [r.target for r in refs]
                raise PushError(
                    f"{exc.message}\nthe image index {digest} is not under {target}; pushed before it: "
                    + ", ".join(done_tags),
                    hint=exc.hint or "run the push again: the per-architecture tags are already there",
                ) from None
        index = IndexReport(digest, OCI_INDEX, len(body), tuple(entries), tuple(refs))
    finally:
        publisher.close()
    return PublishResult(str(destination), images[0].image_id, tuple(pushed), tuple(warnings), index=index)


def _entry(publisher: Publisher, image: ArchImage, pushed: PushedRef) -> IndexEntry:
    """The index's descriptor of an architecture's pushed image: its manifest as the registry holds it."""
    host = publisher.destination.host
    path = publisher.destination.path(strip_domain(image.repository))
    remote = publisher.with_retries(pushed.target, lambda: publisher.registry_api().manifest(path, pushed.digest))
    if remote is None or remote.size is None:
        raise PushError(f"{host} has no manifest {pushed.digest} for {pushed.target}, just pushed")
    return IndexEntry(image.arch, remote.digest, remote.media_type, remote.size, image.image_id)


def _put_index(publisher: Publisher, path: str, tag: str, target: str, body: bytes, digest: str) -> PushedRef:
    """The index under one plain tag: "already published" where the registry holds that very index; refused
    where an immutable tag holds another manifest; put otherwise."""
    api = publisher.registry_api()
    if publisher.is_immutable(path):
        remote = publisher.with_retries(target, lambda: api.manifest(path, tag))
        if remote is not None:
            if remote.digest == digest:
                done = PushedRef(target, target, digest, len(body), "already published", 1)
                publisher.progress.done(done)
                return done
            raise publisher.fail(
                target,
                f"the tag already exists in the immutable repository with different content: the registry has "
                f"{remote.digest} ({remote.media_type}), this run's image index is {digest}",
                1,
                hint="a published tag is never overwritten: change the recipe's lock (a new lock-<hash> tag) or "
                "delete the tag in the registry on purpose",
            )
    publisher.progress.start(target, 1)
    publisher.with_retries(target, lambda: api.put_manifest(path, tag, body, OCI_INDEX))
    done = PushedRef(target, target, digest, len(body), "pushed", 1)
    publisher.progress.done(done)
    return done
