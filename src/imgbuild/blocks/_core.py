"""What every building block is made of: its pin, its contribution, the facts blocks pass to each other, and
the resolution state a block's pin rule works on. Component modules import this; nothing here names one."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, SerializeAsAny, SerializerFunctionWrapHandler, model_serializer

import imgbuild.blocks._releases as releases
from imgbuild.core import platforms
from imgbuild.core.distro import DISTRO
from imgbuild.core.errors import LockError, ResolveError
from imgbuild.core.paths import display

HERE = Path(__file__).resolve().parent


class Details(BaseModel):
    """A block's own facts about its pin, typed: each block subclasses it (`Block.details`) with the fields its pin
    rule decides (a prefix, ports, the wheels it installs...). The lock, the image's manifest and verify's checks
    carry these models; only a block's `resolve` reads the recipe's options, everything after it reads the pin.
    Spack's `spec["dep"].prefix`: other blocks ask `Context.prefix(name)` / `Context.details(name)`."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    prefix: str | None = None  # where the block installs, when not in the system's paths


class Installed(Details):
    """Details of a block always installed under a prefix of its own (nccl-tests, GDRCopy)."""

    prefix: str


class FromTag(Installed):
    """A block built from GitHub's archive of a release tag (nccl-tests, GDRCopy): `commit` is the commit that
    archive was made from where `imgbuild lock` read it (`Resolution.tag_commit`), left out of the lock when it was
    not read, so such locks read as before."""

    commit: str | None = None

    @model_serializer(mode="wrap")
    def _unread_commit_left_out(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("commit") is None:
            data.pop("commit", None)
        return data


D = TypeVar("D", bound=Details)


class Pin(BaseModel):
    """One component, pinned: its version, where it comes from, why that version, and its block's typed details.

    A Pin read from JSON (a lock, a manifest) gets its block's details model from the reader
    (`imgbuild.pin.resolver.read_details`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    version: str | None
    source: str
    origin: str
    details: SerializeAsAny[Details] = Details()

    def typed(self, model: type[D]) -> D:
        """The details as `model` (the block's own), checked: a pin of another block is an error, not a guess."""
        if not isinstance(self.details, model):
            raise TypeError(f"pin details are {type(self.details).__name__}, not {model.__name__}")
        return self.details


# How a source mode reaches the image:
#   fragment - the block's template renders Dockerfile instructions for it (an empty render is an error);
#   packages - the block adds distribution packages to a stage (and may add paths, env);
#   provided - another part (the base image, the EFA installer) already brings it; the block adds paths/env only.
Provides = Literal["fragment", "packages", "provided"]


@dataclass
class Contribution:
    """What one block adds to the image besides its Dockerfile fragments."""

    name: str
    builder_packages: set[str] = field(default_factory=set)
    runtime_packages: set[str] = field(default_factory=set)
    path: list[str] = field(default_factory=list)
    ld_library_path: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Device nodes a container of the image is given where the host has them (the manifest's runtime.host_devices).
    host_devices: list[str] = field(default_factory=list)
    # The builder compiles against libfabric / Open MPI, so what brings them (the EFA installer) runs there too.
    needs_fabric_in_builder: bool = False
    # Free disk the engine needs for this block's layers while they are written and committed.
    build_disk_gb: float = 0.0
    # Configure arguments this block offers to another block's build, by that block's name ({"openmpi":
    # [with_prefix("ofi", prefix)]}): a consumer's template appends `ctx.configure_args(its name)` when it builds
    # from source, so a block others use changes only its own files. Offers to a block the image lacks are ignored.
    offers: dict[str, list[str]] = field(default_factory=dict)
    # Shell commands run right after the runtime stage's apt-get install, in its RUN (sshd: remove the host keys the
    # package made, so no image carries keys).
    post_install: list[str] = field(default_factory=list)
    # Distribution packages a dependency names that the image must not carry, each with why: both stages install an
    # empty stand-in first (dockerfile.stub_packages_run), so apt never fetches the real one.
    stub_packages: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """What a block may ask about the rest of the image while it contributes and renders: the target's facts
    (CUDA, the GPU architecture) and, through generic queries, any other block's pin (`has`, `pin`, `details`,
    `prefix`). No field names a block: a block that others use (a library several builds link) is found by its name."""

    resolved: Any  # imgbuild.pin.resolver.Resolved
    providers: Mapping[str, str] = field(default_factory=dict)  # what a pinned block provides -> that block
    fabric_in_builder: bool = False  # a block compiles against the fabric (libfabric, MPI) in the builder
    offers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # consumer -> what blocks offer it
    arch: str = platforms.DEFAULT_ARCH  # the CPU architecture this image is rendered for (one of platform.arch)
    # the pinned blocks whose `requirements` name a set, found before this field was filled (so a block whose sets
    # depend on it, python's uv, is not among them), in registry order
    requirement_blocks: tuple[str, ...] = ()

    def with_arg(self, option: str, name: str | None = None) -> list[str]:
        """The configure argument for building against block `name` (default: `option`) where the image has it
        (itself, or a block that provides it): `with_prefix(option, its prefix)`; nothing where the image lacks it."""
        name = name or option
        if not self.has(name) and name not in self.providers:
            return []
        return [with_prefix(option, self.prefix(name))]

    def configure_args(self, name: str) -> list[str]:
        """The configure arguments other blocks offer to block `name`'s build (`Contribution.offers`), in the
        registry's order."""
        return list(self.offers.get(name, ()))

    def has(self, name: str) -> bool:
        """Whether the image has block `name`."""
        return name in self.resolved.pins

    def pin(self, name: str) -> Pin | None:
        return self.resolved.pins.get(name)

    def need(self, name: str) -> Pin:
        """Block `name`'s pin, which the asking block's pin rule made sure is there."""
        pin = self.pin(name)
        if pin is None:
            raise KeyError(f"no {name} pin (the asking block's resolve should have refused the recipe)")
        return pin

    def details(self, name: str) -> Any:
        """Block `name`'s typed details (None when the image has no such block)."""
        pin = self.pin(name)
        return pin.details if pin is not None else None

    def prefix(self, name: str) -> str | None:
        """Where `name` is installed: its block's details' prefix, or, without that block, the prefix of a block
        that provides it (`Block.provides`: the EFA installer's libfabric). None: absent or in the system's paths."""
        details = self.details(name)
        if details is None and name in self.providers:
            details = self.details(self.providers[name])
        prefix = details.prefix if details is not None else None
        return platforms.for_arch(prefix, self.arch) if prefix else prefix

    @property
    def machine(self) -> str:
        """The architecture as `uname -m` and wheel tags name it: x86_64, aarch64."""
        return platforms.MACHINE[self.arch]

    @property
    def multiarch(self) -> str:
        """Debian's multiarch triplet of the architecture (library directories): x86_64-linux-gnu."""
        return platforms.multiarch(self.arch)

    @property
    def content(self) -> Any:
        """What the lock records of the build's content (imgbuild.pin.content.Content): checksums of downloads,
        hashes of requirement sets, base digests. None before `imgbuild lock` has read it from the world."""
        return self.resolved.content

    def recorded(self, url: str) -> Any:
        """What the lock records of download `url` (imgbuild.pin.content.Download), for `_build.j2`'s `download`;
        None when the recipe is rendered without a lock's content. A content without `url` predates the block's
        download: an error that says to lock again, never a silently unchecked download."""
        if self.content is None:
            return None
        try:
            return self.content.download(url)
        except KeyError:
            raise LockError(
                f"{self.resolved.name}: the lock records no checksum for {url}", hint="run `imgbuild lock` again"
            ) from None

    @property
    def cuda_home(self) -> str | None:
        """The target's CUDA_HOME (the `cuda` pin's prefix; None off NVIDIA)."""
        return self.prefix("cuda")

    @property
    def gencode(self) -> str | None:
        """nvcc's -gencode flags for the target's GPU architecture (None off NVIDIA)."""
        details = self.details("cuda")
        return details.gencode if details is not None else None

    @property
    def python(self) -> str:
        """The interpreter pip-installed packages run under: the python block's venv's, else python3."""
        return python_of(self.resolved.pins)


# The prefix of the compiler's own search paths (/usr/include, /usr/lib). A configure script given `--with-X=/usr`
# adds `-isystem /usr/include`, which moves /usr/include ahead of libstdc++'s headers: g++'s <cstdlib> then fails at
# its `#include_next <stdlib.h>` ("stdlib.h: No such file or directory"; GCC 11, 13 and 14 alike).
SYSTEM_PREFIX = "/usr"


def with_prefix(option: str, prefix: str | None) -> str:
    """THE configure argument that builds against a dependency installed under `prefix`: `--with-OPTION=PREFIX`, or
    the bare `--with-OPTION` (autoconf's "yes": use it, from the compiler's default paths) where it is in the system's
    paths (`prefix` None, or /usr however written). Every `--with-X` a block passes or offers is made here."""
    if prefix is None or "/" + posixpath.normpath(prefix).lstrip("/") == SYSTEM_PREFIX:
        return f"--with-{option}"
    return f"--with-{option}={prefix}"


def python_of(pins: Mapping[str, Pin]) -> str:
    """The image's Python, from its pins: the python block's venv's interpreter, else python3 on PATH."""
    py = pins.get("python")
    return f"{py.details.prefix}/bin/python" if py is not None and py.details.prefix else "python3"


def builder_base(resolved: Any) -> str:
    """The builder stage's base: the recipe's `base.builder_tag` of the same image, else the runtime's base."""
    return resolved.pins["base"].details.builder or resolved.base_ref


def slug(text: str) -> str:
    """`text` as a BuildKit cache id part a person can read: lower case, runs of anything but letters, digits and dots
    as one '-' (nvidia/cuda:12.8.1-devel-ubuntu22.04 -> nvidia-cuda-12.8.1-devel-ubuntu22.04); an image digest keeps
    its first 12 hex digits."""
    text = re.sub(r"@sha256:([0-9a-f]{12})[0-9a-f]*", r"@\1", text.lower())
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-")


class Target(Protocol):
    """What a block reads of the recipe: its sections, by name. imgbuild.recipe.Recipe is one; it is the floor
    above, since it composes the blocks' options (`components`, and the top-level `cuda` and `app` of the blocks so
    named), so its section models are not named here: a block reads them as the recipe's model defines them."""

    @property
    def name(self) -> str: ...
    @property
    def os(self) -> Any: ...
    @property
    def base(self) -> Any: ...
    @property
    def platform(self) -> Any: ...
    @property
    def runtime(self) -> Any: ...
    @property
    def components(self) -> Any: ...
    @property
    def cuda(self) -> Any: ...
    @property
    def app(self) -> Any: ...


class Resolution:
    """The state a block's pin rule reads and writes: the recipe, the pins made so far, warnings."""

    def __init__(
        self,
        recipe: Target,
        path: Path,
        lookups: Mapping[str, Callable[..., Any] | None] | None = None,
        artifacts: releases.Artifacts | None = None,
    ) -> None:
        self.recipe = recipe
        self.path = path
        # Each block's reader of what its publisher says of a release not in its release file (pytorch: a wheel's
        # METADATA on the package index), by block name; a block without one (or None) reads only its rows.
        self.lookups = dict(lookups or {})
        # What the publishers' artifacts say (the EFA installer tarball's bundle, the plugin's RELEASENOTES.md):
        # `imgbuild lock` reads them where it can, a lock's own record when its pins are checked; None, or a None
        # answer: the release files (blocks/*/releases.yaml).
        self.artifacts = artifacts
        self._read: dict[tuple[str, str, str | None], Any] = {}
        self.pins: dict[str, Pin] = {}
        self.warnings: list[str] = []
        self.os_id = f"{recipe.os.family}{recipe.os.version}"

    def lookup(self, name: str) -> Callable[..., Any] | None:
        """Block `name`'s reader of its publisher's data (None: off, or the block has none)."""
        return self.lookups.get(name)

    def options(self, name: str) -> Any:
        """A block's options in the recipe (None when the recipe leaves it out): `components.<name>`, or the top-level
        key `<name>` of a block whose options are a section of their own (`Block.top_level`: the user's `app`)."""
        if name in type(self.recipe.components).model_fields:
            return getattr(self.recipe.components, name)
        return getattr(self.recipe, name)

    def fail(self, keys: str, message: str, hint: str | None = None) -> ResolveError:
        return ResolveError(f"{display(self.path)}: {keys}: {message}", hint=hint)

    def distro_pin(self, key: str, what: str, wanted: str | None) -> Pin:
        """The version the target distribution ships of `what` (DISTRO), checked against `wanted`."""
        distro = DISTRO.get(self.os_id)
        if distro is None:
            raise self.fail(f"{key}.source", f"no package table for {self.os_id} (known: {list(DISTRO)})")
        version = getattr(distro, what)
        if wanted is not None and wanted != version:
            raise self.fail(f"{key}.version", f"{self.os_id} ships {what} {version}, got {wanted}")
        return Pin(version=version, source="distro", origin=f"{self.os_id} package")

    def artifact(self, name: str, version: str, url: str | None = None) -> Any:
        """What block `name`'s publisher says of release `version` in its own artifact (`Block.artifact`; `url`: the
        archive the build downloads, where the block has several), read once per resolution; None: not read (no
        reader, offline, or unreadable: the release file's rows answer, and `imgbuild lock` says why)."""
        key = (name, version, url)
        if key not in self._read:
            self._read[key] = self.artifacts.read(name, version, url) if self.artifacts is not None else None
        return self._read[key]

    def tag_commit(self, name: str, version: str, url: str) -> str | None:
        """The commit block `name`'s archive of tag v`version` was made from, where `imgbuild lock` read it (None:
        not read). Refused when its release file records another commit for the tag: the tag moved, or the archive
        is not the tag's."""
        read = self.artifact(name, version, url)
        if read is None:
            return None
        row = releases.tag_releases(name).get(version)
        if row is not None and row.commit is not None and row.commit != read.commit:
            raise self.fail(
                f"components.{name}.version",
                f"{read.read_from} was made from commit {read.commit}, but {releases.file_name(name)} records "
                f"tag {row.tag} at {row.commit} ({row.source}): the tag moved, or the archive is not the tag's",
                hint=f"check the tag upstream; correct {releases.file_name(name)}'s row if it really moved",
            )
        commit: str = read.commit
        return commit


@dataclass(frozen=True)
class Artifact:
    """How `imgbuild lock` reads what a block's publisher says of a release in its own archive (imgbuild.pin.artifacts
    fetches the archive once, from `--files` or the URL, and streams its members by): the members whose text it needs
    (`keep`), what they say (`parse`: the scan, the release, the target -> the block's model, ValueError saying why
    not), and what a lock's pin records of it (`recorded`: a lock's pins are checked with no network). `what` and
    `archive` name them in `lock`'s lines ("bundle" read from "the installer tarball"); `url` is the archive of a
    release where the pin rule gives none; `listed` the release file's values, to say where the archive differs."""

    what: str
    archive: str
    parse: Callable[[Any, str, Any], BaseModel]
    recorded: Callable[[Pin], BaseModel | None]
    keep: Callable[[str], bool] = lambda name: False
    url: Callable[[str], str] | None = None
    listed: Callable[[str], Mapping[str, str | None]] = lambda version: {}
    describe: Callable[[Any], str] | None = None  # what was read, in words (default: its fields and values)


@dataclass(frozen=True)
class Tracked:
    """Where `imgbuild outdated` looks for newer releases of a pinned version (`Block.track`): `kind` index (`name`:
    the package index's project), table (`name`: the block whose release file lists them, `versions` its releases),
    distro (the distribution release's package: `versions` the one it ships), follows (`name`: what it comes with),
    base (the base image) or none; `keys` where the recipe sets it (`lock
    --upgrade` edits them), `fixed` why it cannot move alone; `component` and `current` where the row is not the
    block's own version (numpy, beside torch)."""

    kind: Literal["index", "table", "distro", "follows", "base", "none"]
    name: str = ""
    keys: tuple[str, ...] | None = None
    versions: tuple[str, ...] = ()
    fixed: str | None = None
    component: str | None = None
    current: str | None = None


def _tag_commit(scan: Any, version: str, target: Any) -> releases.TagRead:
    """The commit a git archive of a tag was made from (git archive writes it as its global pax header's comment)."""
    commit = scan.pax.get("comment", "")
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"{scan.read_from} names no commit (not made by git archive)")
    return releases.TagRead(commit=commit, read_from=scan.read_from)


def _recorded_commit(pin: Pin) -> releases.TagRead | None:
    commit = getattr(pin.details, "commit", None)
    return releases.TagRead(commit=commit, read_from="the lock") if isinstance(commit, str) else None


def tag_artifact(url: Callable[[str], str]) -> Artifact:
    """The artifact of a block built from GitHub's archive of a release tag (`url`: the archive of a release): the
    commit the archive was made from, checked against its release file's row (`Resolution.tag_commit`)."""
    return Artifact(
        what="the commit of its tag",
        archive="the archive of its tag",
        parse=_tag_commit,
        recorded=_recorded_commit,
        url=url,
        describe=lambda read: f"commit {read.commit}",
    )
