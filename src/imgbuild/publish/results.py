"""What `imgbuild push` reports: each ref pushed (`PushedRef`), an image index put (`IndexReport`), the whole run
(`PublishResult`, its JSON `imgbuild push --json` prints)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class PushedRef:
    source: str  # imgbuild/cpu:lock-...
    target: str  # 127.0.0.1:5000/team/imgbuild/cpu:lock-...
    digest: str  # sha256:... of the manifest in the registry
    size: int | None
    status: Literal["pushed", "already published"]
    attempts: int


@dataclass(frozen=True)
class IndexEntry:
    """One architecture's image in an image index: its manifest in the registry (the descriptor's digest, media type
    and size) and the platform it runs on."""

    arch: str  # platform.arch's name: amd64, arm64
    digest: str
    media_type: str
    size: int
    image_id: str = ""  # the local image pushed (for the report; not in the index)

    @property
    def platform(self) -> str:
        return f"linux/{self.arch}"


@dataclass(frozen=True)
class IndexReport:
    """The image index put under the plain tags: its digest, and the per-architecture manifests it names."""

    digest: str
    media_type: str
    size: int
    manifests: tuple[IndexEntry, ...]
    refs: tuple[PushedRef, ...]  # one per plain tag (lock-<12 hex>, the readable one)

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "media_type": self.media_type,
            "size": self.size,
            "manifests": [
                {
                    "platform": m.platform,
                    "digest": m.digest,
                    "media_type": m.media_type,
                    "size": m.size,
                    "image_id": m.image_id,
                }
                for m in self.manifests
            ],
            "refs": [asdict(r) for r in self.refs],
        }


@dataclass(frozen=True)
class PublishResult:
    registry: str
    image_id: str
    refs: tuple[PushedRef, ...]
    warnings: tuple[str, ...] = ()
    scan: Any | None = None  # scan.GateReport with --scan-gate
    index: IndexReport | None = None  # a multi-architecture push: refs are the per-architecture tags

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"registry": self.registry, "image_id": self.image_id,
                                "refs": [asdict(r) for r in self.refs], "warnings": list(self.warnings)}  # fmt: skip
        if self.scan is not None:
            data["scan"] = self.scan.to_json()
        if self.index is not None:
            data["index"] = self.index.to_json()
        return data
