"""The efa block: efa.py (its options, pin rule, contribution and checks), efa.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.efa.efa import (
    BLOCK,
    Efa,
    EfaFile,
    bundled,
    bundled_in,
    efa_file,
    efa_release,
    from_efa,
)

__all__ = [
    "BLOCK",
    "Efa",
    "EfaFile",
    "bundled",
    "bundled_in",
    "efa_file",
    "efa_release",
    "from_efa",
]
