"""The gaudi block: gaudi.py (its options, pin rule, contribution and checks), gaudi.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.gaudi.gaudi import (
    BLOCK,
    Gaudi,
    check_base,
)

__all__ = [
    "BLOCK",
    "Gaudi",
    "check_base",
]
