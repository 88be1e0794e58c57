"""The gdrcopy block: gdrcopy.py (its options, pin rule, contribution and checks), gdrcopy.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.gdrcopy.gdrcopy import (
    BLOCK,
    GDRDRV,
    GdrCopy,
    gdrcopy_device,
)

__all__ = [
    "BLOCK",
    "GDRDRV",
    "GdrCopy",
    "gdrcopy_device",
]
