"""The openmpi block: openmpi.py (its options, pin rule, contribution and checks), openmpi.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.openmpi.openmpi import (
    BLOCK,
    OpenMPI,
    owns_libmpi,
)

__all__ = [
    "BLOCK",
    "OpenMPI",
    "owns_libmpi",
]
