"""The one parser of an image reference, after the distribution reference grammar (what docker and registries
accept): `[DOMAIN[:PORT]/]PATH[:TAG][@DIGEST]`.

The first `/`-separated component is a registry when it holds a '.' or a ':' or is `localhost` (or holds an
upper-case letter, which no path component may), as Docker decides; otherwise the reference is on Docker Hub
(`docker.io`, with `library/` before a one-component path). So `host:5000/repo` is the repository `repo` on
`host:5000`, untagged, and `localhost/x` is `x` on `localhost`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imgbuild.core.errors import ImgbuildError, UsageError

DOCKER_HUB = "docker.io"
MAX_NAME = 255  # the grammar's limit on DOMAIN/PATH

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?")
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference. `domain` is None when the reference named none (Docker Hub)."""

    domain: str | None
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def registry(self) -> str:
        """The registry the reference points at: its domain, or Docker Hub."""
        return self.domain or DOCKER_HUB

    @property
    def repository(self) -> str:
        """DOMAIN/PATH as written (no tag, no digest): `host:5000/repo`, `ubuntu`."""
        return f"{self.domain}/{self.path}" if self.domain else self.path

    @property
    def full_repository(self) -> str:
        """The repository with its registry always named, as Docker normalises it: `docker.io/library/ubuntu`."""
        if self.domain:
            return self.repository
        path = self.path if "/" in self.path else f"library/{self.path}"
        return f"{DOCKER_HUB}/{path}"

    @property
    def name(self) -> str:
        """The last path component: `repo` of `host:5000/team/repo:1`."""
        return self.path.rsplit("/", 1)[-1]

    def __str__(self) -> str:
        return self.repository + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse(ref: str, *, where: str = "image reference", error: type[ImgbuildError] = UsageError) -> ImageRef:
    """Parse `ref`; anything the grammar refuses raises `error` naming `where` (the file and key, the option...)
    and what was expected."""

    def bad(why: str) -> ImgbuildError:
        return error(
            f"{where}: {ref!r} is not an image reference ({why}); expected [REGISTRY[:PORT]/]PATH[:TAG][@DIGEST], "
            "e.g. ghcr.io/org/image:1.0 or host:5000/repo@sha256:<64 hex>"
        )

    if not ref or ref != ref.strip():
        raise bad("empty or surrounded by spaces")
    rest, at, digest = ref.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise bad(f"digest {digest!r} is not ALGORITHM:HEX")
    first, slash, remainder = rest.partition("/")
    domain: str | None = None
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not _DOMAIN.fullmatch(first):
            raise bad(f"registry {first!r} is not a host name with an optional :PORT")
        domain, rest = first, remainder
    path, colon, tag = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if colon and not _TAG.fullmatch(tag):
        raise bad(f"tag {tag!r} is not 1-128 of letters, digits, '_', '.', '-' starting with a letter, digit or '_'")
    for component in path.split("/"):
        if not _PATH_COMPONENT.fullmatch(component):
            raise bad(f"path component {component!r} is not lower-case letters and digits joined by '.', '_', '-'")
    if len(f"{domain}/{path}" if domain else path) > MAX_NAME:
        raise bad(f"the name is longer than {MAX_NAME} characters")
    return ImageRef(domain=domain, path=path, tag=tag if colon else None, digest=digest if at else None)
