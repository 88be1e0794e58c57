"""The one parser of an image reference, after the distribution reference grammar (what docker and registries
accept): `[DOMAIN[:PORT]/]PATH[:TAG][@DIGEST]`.

The first `/`-separated component is a registry when it holds a '.' or a ':' or is `localhost` (or holds an
upper-case letter, which no path component may), as Docker decides; otherwise the reference is on Docker Hub
(`docker.io`, with `library/` before a one-component path). So `host:5000/repo` is the repository `repo` on
`host:5000`, untagged, and `localhost/x` is `x` on `localhost`.

This module holds the grammar once (core/validate.py's `image_ref` option check and `redact`'s digest use it) and
imports nothing of imgbuild, so that every floor may use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
MAX_NAME = 255  # the grammar's limit on DOMAIN/PATH
MAX_REF = 512  # name, tag (128) and a sha512 digest fit; longer input is refused before any regex runs

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
# Compiled on first use (re's own cache keeps them), not when the module is imported.
_DOMAIN_RE = f"(?a){DOMAIN}"
_PATH_COMPONENT_RE = f"(?a){PATH_COMPONENT}"
_TAG_RE = f"(?a){TAG}"
_DIGEST_RE = f"(?a){DIGEST}"


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


def parse(ref: str, *, where: str = "image reference", error: type[Exception] = ValueError) -> ImageRef:
    """Parse `ref`; anything the grammar refuses raises `error` (ValueError, or an ImgbuildError class for the
    caller's exit code) naming `where` (the file and key, the option...) and what was expected."""

    def bad(why: str) -> Exception:
        return error(
            f"{where}: {ref!r} is not an image reference ({why}); expected [REGISTRY[:PORT]/]PATH[:TAG][@DIGEST], "
            "e.g. ghcr.io/org/image:1.0 or host:5000/repo@sha256:<64 hex>"
        )

    if not ref or ref != ref.strip():
        raise bad("empty or surrounded by spaces")
    if len(ref) > MAX_REF:
        raise bad(f"longer than {MAX_REF} characters")
    rest, at, digest = ref.partition("@")
    if at and not re.fullmatch(_DIGEST_RE, digest):
        raise bad(f"digest {digest!r} is not ALGORITHM:HEX")
    first, slash, remainder = rest.partition("/")
    domain: str | None = None
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not re.fullmatch(_DOMAIN_RE, first):
            raise bad(f"registry {first!r} is not a host name with an optional :PORT")
        domain, rest = first, remainder
    path, colon, tag = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if colon and not re.fullmatch(_TAG_RE, tag):
        raise bad(f"tag {tag!r} is not 1-128 of letters, digits, '_', '.', '-' starting with a letter, digit or '_'")
    for component in path.split("/"):
        if not re.fullmatch(_PATH_COMPONENT_RE, component):
            raise bad(f"path component {component!r} is not lower-case letters and digits joined by '.', '_', '-'")
    if len(f"{domain}/{path}" if domain else path) > MAX_NAME:
        raise bad(f"the name is longer than {MAX_NAME} characters")
    return ImageRef(domain=domain, path=path, tag=tag if colon else None, digest=digest if at else None)
