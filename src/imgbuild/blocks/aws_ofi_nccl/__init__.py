"""The aws_ofi_nccl block: aws_ofi_nccl.py (its options, pin rule, contribution and checks), aws_ofi_nccl.j2 (its
Dockerfile fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.aws_ofi_nccl.aws_ofi_nccl import (
    BLOCK,
    CONFIG_HEADER,
    AwsOfiNccl,
    PluginDetails,
    aws_ofi_nccl_api,
    aws_ofi_nccl_plugin,
    plugin_fact,
    plugin_file,
)

__all__ = [
    "BLOCK",
    "CONFIG_HEADER",
    "AwsOfiNccl",
    "PluginDetails",
    "aws_ofi_nccl_api",
    "aws_ofi_nccl_plugin",
    "plugin_fact",
    "plugin_file",
]
