"""What every building block is made of: its pin, its contribution, the facts blocks pass to each other, and
the resolution state a block's pin rule works on. Component modules import this; nothing here names one."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from imgbuild import compat
from imgbuild.errors import ResolveError
from imgbuild.paths import display
from imgbuild.schema import Strict

if TYPE_CHECKING:
    from imgbuild.recipe import Recipe

HERE = Path(__file__).resolve().parent


class Pin(BaseModel):
    """One component, pinned: its version, where it comes from, and why that version.

    `details` are the block's own facts (prefixes, tags, checks); the block that writes them reads them back.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str | None
    source: str
    origin: str
    details: dict[str, str] = {}


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
    manifest: dict[str, Any] = field(default_factory=dict)
    # Device nodes a container of the image is given where the host has them (the manifest's runtime.host_devices).
    host_devices: list[str] = field(default_factory=list)
    # The builder compiles against libfabric / Open MPI, so the EFA installer must run in the builder too.
    needs_fabric_in_builder: bool = False
    # Free disk the engine needs for this block's layers while they are written and committed.
    build_disk_gb: float = 0.0


@dataclass(frozen=True)
class Context:
    """Facts about the target that several blocks need: the target's, and the paths other blocks produce."""

    resolved: Any  # imgbuild.resolver.Resolved
    cuda_home: str | None = None
    gencode: str | None = None
    mpi_home: str | None = None
    libfabric_prefix: str | None = None
    venv: str | None = None
    python: str = "python3"  # interpreter that pip-installed packages run under
    site_packages: str | None = None  # the venv's site-packages
    nccl_home: str | None = None  # the NCCL others compile against (include/ and lib/)
    efa_in_builder: bool = False


def builder_base(resolved: Any) -> str:
    """The builder stage's base: the recipe's `base.builder_tag` of the same image, else the runtime's base."""
    return str(resolved.pins["base"].details.get("builder", resolved.base_ref))


def slug(text: str) -> str:
    """`text` as a BuildKit cache id part a person can read: lower case, runs of anything but letters, digits and dots
    as one '-' (nvidia/cuda:12.8.1-devel-ubuntu22.04 -> nvidia-cuda-12.8.1-devel-ubuntu22.04); an image digest keeps
    its first 12 hex digits."""
    text = re.sub(r"@sha256:([0-9a-f]{12})[0-9a-f]*", r"@\1", text.lower())
    return re.sub(r"[^a-z0-9.]+", "-", text).strip("-")


class Resolution:
    """The state a block's pin rule reads and writes: the recipe, the pins made so far, warnings."""

    def __init__(self, recipe: Recipe, path: Path, lookup_torch: Callable[[str], compat.TorchWheel] | None) -> None:
        self.r = recipe
        self.path = path
        self.lookup_torch = lookup_torch
        self.pins: dict[str, Pin] = {}
        self.warnings: list[str] = []
        self.os_id = f"{recipe.os.family}{recipe.os.version}"
        self.torch_wheel: compat.TorchWheel | None = None  # what the pytorch block found (nccl reads it)

    def options(self, name: str) -> Any:
        """A block's options in the recipe (None when the recipe leaves it out)."""
        return getattr(self.r.components, name)

    def fail(self, keys: str, message: str, hint: str | None = None) -> ResolveError:
        return ResolveError(f"{display(self.path)}: {keys}: {message}", hint=hint)

    def distro_pin(self, key: str, what: str, wanted: str | None) -> Pin:
        """The version the target distribution ships of `what` (compat.DISTRO), checked against `wanted`."""
        distro = compat.DISTRO.get(self.os_id)
        if distro is None:
            raise self.fail(f"{key}.source", f"no package table for {self.os_id} (known: {list(compat.DISTRO)})")
        version = getattr(distro, what)
        if wanted is not None and wanted != version:
            raise self.fail(f"{key}.version", f"{self.os_id} ships {what} {version}, got {wanted}")
        return Pin(version=version, source="distro", origin=f"{self.os_id} package")

    def require_venv(self) -> None:
        """Blocks that pip-install need the python block with its virtual environment."""
        py = self.options("python")
        if py is None or py.venv is None:
            raise self.fail("components.python", "pip-installed components need components.python (with a venv)")

    def from_efa(self, key: str, component: str) -> Pin:
        """A pin for something the EFA installer brings (needs a non-minimal components.efa)."""
        e = self.options("efa")
        if e is None or e.minimal:
            raise self.fail(key, f"{component} from the EFA installer needs components.efa (not minimal)")
        return Pin(version=None, source="efa", origin=f"EFA installer {e.version}")


def _no_contribution(pin: Pin, ctx: Context) -> Contribution:
    return Contribution(name="")


def _no_facts(pin: Pin, facts: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class Block:
    """One building block of an image, whole: hpccm's building block plus its pin rule and its checks.

    name         the key under `components:` in a recipe;
    options      its pydantic model (parameters with defaults; unknown keys are errors);
    modes        each source mode it accepts and how that mode reaches the image (`Provides`);
    resolve      its pin rule: options + resolution state -> its Pin (compatibility checks it owns included);
    contribute   packages, PATH / LD_LIBRARY_PATH, environment, manifest extras of a pin;
    facts        what it tells other blocks (prefixes) through the Context;
    after        blocks whose pins its rule reads (they resolve first);
    build_after  blocks whose builder output its builder fragment uses (their fragments come first);
    tag          (rank, short name) for the readable image tag, None to leave it out;
    required     why a recipe without the block is wrong (None when it may be left out);
    files        (context path, template, mode) of the files its fragments COPY (rendered with the recipe,
                 the context, the pins and every block's options by name).
    Its Dockerfile fragments are the macros `builder` and `runtime` of `<name>.j2` next to its module, and its
    verify checks are registered with `imgbuild.checks.check(..., "<name>")` in its module.
    """

    name: str
    options: type[Strict]
    modes: Mapping[str, Provides]
    resolve: Callable[[Any, Resolution], Pin]
    contribute: Callable[[Pin, Context], Contribution] = _no_contribution
    facts: Callable[[Pin, dict[str, Any]], None] = _no_facts
    after: tuple[str, ...] = ()
    build_after: tuple[str, ...] = ()
    tag: tuple[int, str] | None = None
    required: Callable[[Recipe], str | None] = lambda recipe: None
    files: tuple[tuple[str, str, int], ...] = ()
    template_globals: Mapping[str, Callable[..., Any]] = field(default_factory=dict)

    @property
    def template(self) -> str:
        return f"components/{self.name}.j2"

    def contribution(self, pin: Pin, ctx: Context) -> Contribution:
        """The block's contribution with its manifest entry (the pin, as the image records it)."""
        c = self.contribute(pin, ctx)
        c.name = self.name
        c.manifest = {"version": pin.version, "source": pin.source, "origin": pin.origin, **pin.details, **c.manifest}
        return c
