"""The nccl_tests block: nccl_tests.py (its options, pin rule, contribution and checks), nccl_tests.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.nccl_tests.nccl_tests import (
    BLOCK,
    NCCL_TESTS_BINARIES,
    PREFIX,
    NcclTests,
    make_variables,
    nccl_tests_links,
    source_url,
)

__all__ = [
    "BLOCK",
    "NCCL_TESTS_BINARIES",
    "PREFIX",
    "NcclTests",
    "make_variables",
    "nccl_tests_links",
    "source_url",
]
