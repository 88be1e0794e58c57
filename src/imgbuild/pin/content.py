"""What a build fetches, pinned by content: the base images' digests, a sha256 for every file the Dockerfile
downloads, and the hashes of every Python distribution the image installs (transitive ones included).

Pins (imgbuild.pin.resolver) say which versions; content says which bytes. Pins follow from the recipe by rules and
need no network; content is read from the world at `imgbuild lock` (the registry or the engine for digests, the
publisher or a well-known third party for checksums, the package index for wheel hashes) and recorded in the lock,
each value with where it came from. A value nobody here could establish is recorded as such (None, with the reason
in its `origin`), never invented.

Blocks say what they fetch (`Block.downloads`: URLs; `Block.requirements`: named sets of requirement specifiers);
this module's models are what the lock records for them, and what templates read back through `ctx.content`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, field_validator

from imgbuild.core import imageref
from imgbuild.core.errors import RecipeError

SHA256 = re.compile(r"[0-9a-f]{64}")
DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")  # PEP 508's name


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class ImageDigest(_Frozen):
    """A base image reference and the manifest digest it resolved to (None: not established, `origin` says why)."""

    ref: str
    digest: str | None
    origin: str

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith("sha256:") and SHA256.fullmatch(value[7:])):
            raise ValueError(f"expected sha256:<64 hex digits>, got {value!r}")
        return value

    @property
    def local(self) -> bool:
        """Whether the image was made on the engine's machine (no registry digest: imgbuild.pin.digests)."""
        return self.digest is None and self.origin.startswith("local:")


def local_ref(ref: str, arch: str) -> str:
    """The engine's name of a base made on this machine for `arch`. The engine's store holds one image per name, so
    beside the amd64 copy (the recipe's own name) another architecture's copy carries it after a dash:
    debian:bookworm-slim -> debian:bookworm-slim-arm64 (imgbuild base bootstrap --platform makes it so). RecipeError
    for what is not an image reference (core/imageref)."""
    if arch == "amd64":
        return ref
    # A digest names the bytes of the recipe's own image, not of this architecture's copy: the copy is NAME:TAG-arch.
    parsed = imageref.parse(ref, where="base image", error=RecipeError)
    return f"{parsed.repository}:{parsed.tag or 'latest'}-{arch}"  # no tag: the implicit latest


# GitHub's archive of a tag: https://github.com/OWNER/REPO/archive/refs/tags/TAG.tar.gz (or .zip, or the older
# form without refs/tags/).
_TAG_ARCHIVE = re.compile(
    r"https://github\.com/[^/]+/(?P<repo>[^/]+)/archive/(?:refs/tags/)?(?P<tag>[^/]+?)(?P<ext>\.tar\.gz|\.zip)"
)


def download_name(url: str) -> str:
    """THE file name a download is saved under: in the build (`_build.j2`'s `download`), in a sources folder
    (`imgbuild sources fetch`'s files/) and in a `--files` folder. GitHub's archive of a tag
    (https://github.com/OWNER/REPO/archive/refs/tags/v2.18.3.tar.gz) is named as GitHub's Content-Disposition names
    it, REPO-VERSION with the tag's leading `v` dropped (nccl-tests-2.18.3.tar.gz); any other URL by its last path
    part."""
    m = _TAG_ARCHIVE.fullmatch(url)
    if m is None:
        return url.rsplit("/", 1)[-1]
    tag = m["tag"]
    version = tag[1:] if re.fullmatch(r"v\d.*", tag) else tag
    return f"{m['repo']}-{version}{m['ext']}"


class Download(_Frozen):
    """A file the Dockerfile downloads: its URL, its sha256 (None: nobody here could establish it) and where the
    checksum came from ("publisher: URL", "computed at lock time", "spack: ...", "unestablished: why")."""

    url: str
    sha256: str | None
    origin: str

    @field_validator("sha256")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not SHA256.fullmatch(value):
            raise ValueError(f"expected 64 lower-case hex digits, got {value!r}")
        return value

    @property
    def filename(self) -> str:
        return download_name(self.url)


class Requirement(_Frozen):
    """One Python distribution an image installs, exactly: normalized name, version, and the sha256 of every file the
    index offers for it (any may be installed; pip --require-hashes accepts one of them)."""

    name: str
    version: str
    hashes: tuple[str, ...]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not DIST_NAME.fullmatch(value):
            raise ValueError(f"expected a distribution name (letters, digits and ._- between them), got {value!r}")
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        from packaging.version import VERSION_PATTERN

        if not re.fullmatch(VERSION_PATTERN, value, re.VERBOSE | re.IGNORECASE):
            raise ValueError(f"expected a PEP 440 version, got {value!r}")
        return value

    @field_validator("hashes")
    @classmethod
    def _hashes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("a requirement needs at least one sha256 hash")
        for h in value:
            if not (h.startswith("sha256:") and SHA256.fullmatch(h[7:])):
                raise ValueError(f"expected sha256:<64 hex digits>, got {h!r}")
        return value

    def line(self) -> str:
        """The requirement as a line of a pip requirements file in --require-hashes mode."""
        return " \\\n    ".join([f"{self.name}=={self.version}", *(f"--hash={h}" for h in self.hashes)])


class Content(_Frozen):
    """Everything a build fetches, by content.

    bases      base image ref -> its digest (the runtime's and the builder stage's);
    downloads  URL -> its checksum (every URL a block's `downloads` names);
    python     requirement set name (`<block>` or `<block>/<layer>`, see `Block.requirements`) -> the set's closure
               with hashes, in install order: each set installs with --no-deps, so the sets of an image together
               hold every distribution it installs.
    """

    bases: dict[str, ImageDigest] = {}
    downloads: dict[str, Download] = {}
    python: dict[str, tuple[Requirement, ...]] = {}

    def download(self, url: str) -> Download:
        """The recorded checksum of `url`; KeyError when the lock has none (it predates the block's download)."""
        return self.downloads[url]

    def requirements(self, name: str) -> tuple[Requirement, ...]:
        """The closure of requirement set `name` (KeyError when the lock has none)."""
        return self.python[name]

    def requirements_text(self, name: str) -> str:
        """Requirement set `name` as a pip requirements file (--require-hashes mode)."""
        return "".join(r.line() + "\n" for r in self.requirements(name))

    def engine_ref(self, ref: str, arch: str) -> str:
        """The name the engine holds base `ref` under for `arch`: a base made on this machine (recorded local) has a
        copy per architecture (`local_ref`); any other is the recipe's own name (a registry's digest, its index's,
        serves every architecture)."""
        recorded = self.bases.get(ref)
        return local_ref(ref, arch) if recorded is not None and recorded.local else ref

    def unestablished(self) -> list[str]:
        """What this content could not pin (each with the reason): a build says so, it never hides it."""
        out = [f"base {d.ref}: {d.origin}" for d in self.bases.values() if d.digest is None]
        out += [f"{d.url}: {d.origin}" for d in self.downloads.values() if d.sha256 is None]
        return out

    def digest(self) -> str:
        """sha256 of the canonical JSON: a lock records it, so a hash edited by hand is refused on read."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """The sha256 (hex) of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def merged(parts: Iterable[Content]) -> Content:
    """One Content of several (later parts win on a shared key)."""
    bases: dict[str, ImageDigest] = {}
    downloads: dict[str, Download] = {}
    python: dict[str, tuple[Requirement, ...]] = {}
    for c in parts:
        bases.update(c.bases)
        downloads.update(c.downloads)
        python.update(c.python)
    return Content(bases=dict(sorted(bases.items())), downloads=dict(sorted(downloads.items())), python=python)
