"""The nccl block: nccl.py (its options, pin rule, contribution and checks), nccl.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.nccl.nccl import (
    BLOCK,
    NCCL,
    code_to_version,
    nccl_code,
    nccl_header_version,
    nccl_probe,
    nccl_runtime_version,
    net_plugin_api,
)

__all__ = [
    "BLOCK",
    "NCCL",
    "code_to_version",
    "nccl_code",
    "nccl_header_version",
    "nccl_probe",
    "nccl_runtime_version",
    "net_plugin_api",
]
