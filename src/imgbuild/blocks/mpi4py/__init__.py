"""The mpi4py block: mpi4py.py (its options, pin rule, contribution and checks), mpi4py.j2 (its Dockerfile
fragments)."""

from imgbuild.blocks.mpi4py.mpi4py import (
    BLOCK,
    MPI4Py,
)

__all__ = [
    "BLOCK",
    "MPI4Py",
]
