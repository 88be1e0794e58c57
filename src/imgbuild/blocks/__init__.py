"""The building blocks of an image, one module each, and the registry that lists them in layer order.

A block (see `_core.Block`) holds, in one place: its recipe options (pydantic), its pin rule, what it contributes
(packages, PATH / LD_LIBRARY_PATH, environment, manifest entry), its Dockerfile fragments (`<name>.j2` next to
its module: Jinja macros `builder` and `runtime`) and its verify checks. The recipe schema, the resolver, the
renderer and verify iterate over `REGISTRY`; none of them names a component.

Adding a component: write `<name>.py` (options, resolve, contribute, BLOCK, checks) and `<name>.j2`, and put it
in REGISTRY where its runtime layer belongs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from imgbuild.blocks import (
    _releases as releases,
)
from imgbuild.blocks import (
    app,
    aws_ofi_nccl,
    cuda,
    efa,
    gaudi,
    gdrcopy,
    hwloc,
    libfabric,
    mpi4py,
    nccl,
    nccl_tests,
    openmpi,
    python,
    pytorch,
    sagemaker,
    sshd,
)
from imgbuild.blocks._block import (
    Block,
    Downloads,
    PythonDists,
    PythonSets,
    RecipeRules,
    Released,
    ShipsFiles,
    Tracks,
    UserCode,
)
from imgbuild.blocks._core import (
    HERE,
    Context,
    Contribution,
    Details,
    Installed,
    Pin,
    Provides,
    Resolution,
    Tracked,
    builder_base,
    python_of,
    slug,
)

# Runtime layer order: what changes least goes first, so bumping a component rebuilds only what follows it:
# EFA/libfabric, hwloc, MPI, GDRCopy, NCCL, plugin, tests, Python (+PyTorch), then the parts that change most often
# (sshd and the entrypoint, SageMaker). The builder stage keeps this order except where a block's builder needs
# another's output first (`build_after`: the venv before anything pip installs). The runtime stage keeps it except for
# the blocks `under_os_packages` (Python's venv, PyTorch's wheels): they come first, in this order, on an apt layer of
# their own packages, so that what changes below them in this list does not rebuild their 7 GB.
REGISTRY: tuple[Block, ...] = tuple(
    m.BLOCK
    for m in (
        cuda,  # the target's toolkit (top-level `cuda:`): what the compiled parts build against
        efa,
        libfabric,
        hwloc,
        openmpi,
        gdrcopy,
        nccl,
        aws_ofi_nccl,
        nccl_tests,
        python,
        pytorch,
        mpi4py,
        gaudi,
        sshd,
        sagemaker,
        app,  # the user's layer: after the whole stack (its `final` stages)
    )
)
BY_NAME: dict[str, Block] = {b.name: b for b in REGISTRY}
TEMPLATE_DIR = HERE


def _ordered(deps: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Registry order, moved only as far as each block's dependencies require (a stable topological sort)."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in path:
            raise ValueError(f"component dependency cycle: {' -> '.join((*path, name))}")
        for dep in deps[name]:
            visit(dep, (*path, name))
        done.append(name)

    for b in REGISTRY:
        visit(b.name, ())
    return tuple(done)


@cache
def resolve_order() -> tuple[str, ...]:
    """The order pin rules run in: a block after the blocks whose pins it reads."""
    return _ordered({b.name: b.after for b in REGISTRY})


@cache
def builder_order() -> tuple[str, ...]:
    """The order of builder-stage fragments."""
    return _ordered({b.name: b.build_after for b in REGISTRY})


def runtime_order() -> tuple[str, ...]:
    return tuple(b.name for b in REGISTRY)


def context_for(resolved: Any, arch: str | None = None) -> Context:
    """What blocks may ask of each other: the pins, which pinned block provides what it does not name, the
    architecture rendered for (`arch`, default the recipe's first), and which blocks install requirement sets."""
    providers = {what: b.name for b in REGISTRY if b.name in resolved.pins for what in b.provides}
    ctx = Context(resolved=resolved, providers=providers, arch=arch or resolved.recipe.platform.arch[0])
    pins = resolved.pins
    sets = tuple(
        b.name for b in REGISTRY if b.name in pins and isinstance(b, PythonSets) and b.requirements(pins[b.name], ctx)
    )
    return replace(ctx, requirement_blocks=sets)


def feeding(check: str) -> tuple[str, ...]:
    """The blocks that feed verify's node check `check` (`Block.node_checks`), in registry order, then the blocks
    that provide one of them (`Block.provides`: the EFA installer's libfabric)."""
    declared = [b.name for b in REGISTRY if check in b.node_checks]
    return tuple(dedupe([*declared, *(b.name for b in REGISTRY if set(b.provides) & set(declared))]))


@dataclass(frozen=True)
class KnownBad:
    """A pinned release, or a combination of pins, that a block's release file marks bad (`Row.bad`, `known_bad`)."""

    what: str  # "aws_ofi_nccl 1.18.0", "cuda 13.0.2 with cuda.gpu_arch sm_70"
    names: tuple[str, ...]  # the components it is about: the first is where a recipe sets it
    bad: releases.Bad
    listed_in: str  # the release file that says so

    def message(self) -> str:
        good = f"; the nearest good release: {self.bad.good}" if self.bad.good else ""
        known = "known bad" if self.bad.level == "refuse" else "a known risk"
        return f"{self.what} is {known}: {self.bad.why} ({', '.join(self.bad.links)}){good}"


def known_bad(pins: Mapping[str, Pin], involving: str | None = None) -> list[KnownBad]:
    """What the release files say is bad among `pins`: each pinned release whose row (or its series' row) is marked
    `bad`, then each `known_bad` combination whose every `when` entry holds, in registry order; with `involving`,
    only what names that block (the resolver asks as each pin is made: each finding is met once, at the pin that
    completes it)."""
    found: list[KnownBad] = []
    for block in REGISTRY:
        pin = pins.get(block.name)
        if not isinstance(block, Released) or pin is None:  # a file's combinations name its own component
            continue
        listed = block.release_file()
        where = releases.file_name(block.name)
        if pin.version is not None and involving in (None, block.name):
            for row in releases.row_for(listed.releases, pin.version):
                if row.bad is not None:
                    origin = f" ({pin.origin})" if pin.origin != "recipe" else ""
                    found.append(KnownBad(f"{block.name} {pin.version}{origin}", (block.name,), row.bad, where))
                    break
        for combo in listed.known_bad:
            names = tuple(dedupe(key.split(".", 1)[0] for key in combo.when))
            if involving not in (None, *names):
                continue
            if all(
                name in pins and releases.holds(pins[name].version, pins[name].details, key, value)
                for key, value in combo.when.items()
                for name in [key.split(".", 1)[0]]
            ):
                parts = [
                    f"{key} {value}" if "." in key else f"{key} {pins[key].version}"
                    for key, value in combo.when.items()
                ]
                found.append(KnownBad(" with ".join(parts), names, combo, where))
    return found


def recorded_checksums() -> dict[str, releases.Checksum]:
    """Every download's checksum the release files record (their rows' `downloads` and their own), by URL: what a
    well-known third party published of it, or why nobody could read one (imgbuild.pin.checksums, step c)."""
    out: dict[str, releases.Checksum] = {}
    for block in REGISTRY:
        if isinstance(block, Released):
            listed = block.release_file()
            out.update(listed.downloads)
            for row in listed.releases:
                out.update(row.downloads)
    return out


def dedupe(items: Iterable[str]) -> list[str]:
    """Keep the first occurrence of each item, in order."""
    return list(dict.fromkeys(items))


__all__ = [
    "BY_NAME",
    "REGISTRY",
    "TEMPLATE_DIR",
    "Block",
    "Context",
    "Contribution",
    "Details",
    "Downloads",
    "Installed",
    "KnownBad",
    "Pin",
    "Provides",
    "PythonDists",
    "PythonSets",
    "RecipeRules",
    "Released",
    "Resolution",
    "ShipsFiles",
    "Tracked",
    "Tracks",
    "UserCode",
    "builder_base",
    "builder_order",
    "context_for",
    "dedupe",
    "feeding",
    "known_bad",
    "python_of",
    "recorded_checksums",
    "resolve_order",
    "runtime_order",
    "slug",
]
