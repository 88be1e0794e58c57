"""A build's tags, put back: a build that fails, is cancelled or makes the wrong image may have moved a tag while
exporting. `TagSnapshot` notes which image each tag named before the build and puts every one back."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from imgbuild.core.errors import EngineError
from imgbuild.engine.client import ENGINE_ERRORS, inspect_image

if TYPE_CHECKING:
    import docker

__all__ = ["TagSnapshot"]


class TagSnapshot:
    """Which image each of `tags` names in the engine now (None: no such tag)."""

    def __init__(self, client: docker.DockerClient, tags: Sequence[str]) -> None:
        self.client = client
        self.tags = list(tags)
        self.before = {tag: _image_id(client, tag) for tag in self.tags}

    def restore(self) -> list[str]:
        """Put every tag back where it was (a tag the build made is removed); returns those it moved back."""
        import docker.utils

        moved = []
        for tag in self.tags:
            with contextlib.suppress(*ENGINE_ERRORS, EngineError):
                now, was = _image_id(self.client, tag), self.before[tag]
                if now == was:
                    continue
                if was is None:
                    self.client.api.remove_image(tag)
                else:
                    repo, name = docker.utils.parse_repository_tag(tag)
                    self.client.api.tag(was, repo, tag=name or "latest", force=True)
                moved.append(tag)
        return moved

    def not_restored(self) -> list[str]:
        """The tags that name another image than before."""
        return [tag for tag in self.tags if _image_id(self.client, tag) != self.before[tag]]


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    found = inspect_image(client, ref)
    return str(found["Id"]) if found else None
