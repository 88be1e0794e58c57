"""The cuda block: cuda.py (its options, pin rule, contribution and checks), cuda.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.cuda.cuda import (
    BLOCK,
    Cuda,
    arch,
    arches,
    driver_floors,
    release_file,
)

__all__ = [
    "BLOCK",
    "Cuda",
    "arch",
    "arches",
    "driver_floors",
    "release_file",
]
