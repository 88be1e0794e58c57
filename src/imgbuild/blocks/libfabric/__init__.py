"""The libfabric block: libfabric.py (its options, pin rule, contribution and checks), libfabric.j2 (its Dockerfile
fragments)."""

from imgbuild.blocks.libfabric.libfabric import (
    BLOCK,
    Libfabric,
    libfabric_providers,
    libfabric_release,
)

__all__ = [
    "BLOCK",
    "Libfabric",
    "libfabric_providers",
    "libfabric_release",
]
