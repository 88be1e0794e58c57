"""The registry: every block, in layer order, and the orders and context derived from it. The recipe schema, the
resolver, the renderer and verify iterate over `REGISTRY`; none of them names a component, and this module names
them only in its list."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from functools import cache
from typing import Any

import imgbuild.blocks.app as app
import imgbuild.blocks.aws_ofi_nccl as aws_ofi_nccl
import imgbuild.blocks.cuda as cuda
import imgbuild.blocks.efa as efa
import imgbuild.blocks.gaudi as gaudi
import imgbuild.blocks.gdrcopy as gdrcopy
import imgbuild.blocks.hwloc as hwloc
import imgbuild.blocks.libfabric as libfabric
import imgbuild.blocks.mpi4py as mpi4py
import imgbuild.blocks.nccl as nccl
import imgbuild.blocks.nccl_tests as nccl_tests
import imgbuild.blocks.openmpi as openmpi
import imgbuild.blocks.python as python
import imgbuild.blocks.pytorch as pytorch
import imgbuild.blocks.sagemaker as sagemaker
import imgbuild.blocks.sshd as sshd
from imgbuild.blocks._block import (
    Block,
    PythonSets,
)
from imgbuild.blocks._core import (
    HERE,
    Context,
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


def dedupe(items: Iterable[str]) -> list[str]:
    """Keep the first occurrence of each item, in order."""
    return list(dict.fromkeys(items))
