"""The hwloc block: hwloc.py (its options, pin rule, contribution and checks), hwloc.j2 (its Dockerfile
fragments)."""

from imgbuild.blocks.hwloc.hwloc import (
    BLOCK,
    Hwloc,
    hwloc_library,
)

__all__ = [
    "BLOCK",
    "Hwloc",
    "hwloc_library",
]
