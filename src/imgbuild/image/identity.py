"""An image's identity: its repository, tags and references, as pure functions of a resolved recipe (a lock, or a
fresh resolution for `show`). What every step after the lock names an image by (the build's tags, push, verify,
run, jobs, the SBOM) without rendering a template.

`of(resolved)` reads the image's identity once (the lock's digest, and the user's code the image carries, hashed
from the recipe's folder): the command that names an image calls it once and hands the `Identity` down, to the
manifest (`render.manifest`), the run profile, the job and the SBOM; `render.plan` tags a build with the one it reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from imgbuild.blocks import REGISTRY, UserCode
from imgbuild.core import platforms
from imgbuild.core.errors import RenderError
from imgbuild.pin.lock import Lock
from imgbuild.pin.resolver import Resolved


def lock_digest(resolved: Resolved) -> str:
    """sha256 of the lock's canonical JSON: the content-addressed tag derives from it."""
    return Lock.of(resolved).digest()


def readable_tag(resolved: Resolved) -> str:
    """A tag a person can read: the versions that matter most for this target, ranked by the blocks' `Block.tag`s
    (gaudi 1, pt 2, cuda 3, nccl 4, ofi 5, efa 6, ompi 7)."""
    specs = {b.name: b.tag for b in REGISTRY if b.tag is not None}
    ranked = [(spec, resolved.version(name)) for name, spec in specs.items()]
    parts = [f"{short}{version}" for (_, short), version in sorted(ranked) if version]
    return "-".join(parts) or "latest"


def repository(resolved: Resolved) -> str:
    """The local repository of the image: `imgbuild/NAME`."""
    return f"imgbuild/{resolved.name}"


def lock_tag(digest: str, *, locked: bool = True) -> str:
    """The content-addressed tag of an image whose lock has sha256 `digest`: `lock-<12 hex>`; `unlocked-<12 hex>`
    for a resolution that is no lock (`render --unlocked`, `show` of a recipe without one), so nothing is ever taken
    for a locked image."""
    return f"{'lock' if locked else 'unlocked'}-{digest[:12]}"


def image_digests(resolved: Resolved) -> dict[str, str]:
    """What the image holds of each block beyond its lock (`Block.image_digest`: the user's code, read from the
    recipe's folder), by block name; blocks with nothing there are left out."""
    return {
        b.name: d
        for b in REGISTRY
        if b.name in resolved.pins and isinstance(b, UserCode)
        if (d := b.image_digest(resolved.pins[b.name], resolved))
    }


def code_digest(digests: Mapping[str, str]) -> str | None:
    """What the image holds beyond its lock (image_digests), as one digest; None: nothing."""
    parts = list(digests.values())
    if len(parts) <= 1:
        return parts[0] if parts else None
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def check_arch(resolved: Resolved, arch: str | None) -> str:
    """`arch`, which must be one of the recipe's platform.arch (None: the first); a RenderError saying how to add it."""
    return _check_arch(resolved.name, tuple(resolved.recipe.platform.arch), arch)


def _check_arch(name: str, arches: tuple[str, ...], arch: str | None) -> str:
    if arch is None:
        return arches[0]
    if arch not in arches:
        raise RenderError(
            f"{name} is built for {', '.join(platforms.docker_platform(a) for a in arches)}, not "
            f"{platforms.docker_platform(arch)}: its recipe's platform.arch does not list {arch}",
            hint=f"add {arch} to platform.arch in the recipe and run `imgbuild lock {name}`",
        )
    return arch


@dataclass(frozen=True)
class Identity:
    """The names of a recipe's images: one per architecture of its platform.arch, in `repository`.

    `plain` are the tags of the recipe's first architecture: the content-addressed one, then the readable one. The
    engine keeps one image per tag, so the image of another architecture carries its name after a dash
    (`lock-<12 hex>-arm64`); `imgbuild push` publishes the architectures under the plain tags as one image index.
    An image that carries the user's code (app.code) is its lock and that code: the content-addressed tag is the
    sha256 of both digests, and the readable one ends in `-code<8 hex>`, so an edited program makes a new image
    under new tags without a new lock."""

    recipe: str
    repository: str  # imgbuild/NAME
    lock_digest: str  # lock_digest(resolved)
    arches: tuple[str, ...]  # the recipe's platform.arch, its first the default
    plain: tuple[str, str]  # (content-addressed tag, readable tag) of the first architecture
    digests: Mapping[str, str]  # image_digests(resolved): what the image holds beyond its lock, by block

    def check_arch(self, arch: str | None) -> str:
        """`arch`, one of the recipe's architectures (None: the first); a RenderError saying how to add it."""
        return _check_arch(self.recipe, self.arches, arch)

    def suffix(self, arch: str | None) -> str:
        """`-<arch>` for an architecture other than the recipe's first, else nothing."""
        return "" if arch is None or arch == self.arches[0] else f"-{arch}"

    def tags(self, arch: str | None = None) -> tuple[str, str]:
        """The tags of the image of `arch` (default: the recipe's first), content-addressed first."""
        suffix = self.suffix(arch)
        return self.plain[0] + suffix, self.plain[1] + suffix

    def refs(self, arch: str | None = None) -> list[str]:
        """Every reference the image of `arch` is tagged with (`REPOSITORY:TAG`), content-addressed first."""
        return [f"{self.repository}:{tag}" for tag in self.tags(arch)]

    def ref(self, arch: str | None = None) -> str:
        """The content-addressed reference of the image of `arch` (`imgbuild/NAME:lock-<12 hex>`)."""
        return self.refs(arch)[0]


def of(resolved: Resolved) -> Identity:
    """The identity of the images of `resolved`: its lock's digest and the user's code (image_digests), each read
    here, once; a command calls it once and hands the result down."""
    digest = lock_digest(resolved)
    locked = resolved.content is not None  # a lock always records content; a fresh resolution never does
    digests = image_digests(resolved)
    code = code_digest(digests)
    if code is None:
        plain = (lock_tag(digest, locked=locked), readable_tag(resolved))
    else:
        both = hashlib.sha256(f"{digest}\n{code}".encode()).hexdigest()
        plain = (lock_tag(both, locked=locked), f"{readable_tag(resolved)}-code{code[:8]}")
    return Identity(resolved.name, repository(resolved), digest, tuple(resolved.recipe.platform.arch), plain, digests)
