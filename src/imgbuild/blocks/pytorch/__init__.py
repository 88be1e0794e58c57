"""The pytorch block: pytorch.py (its options, pin rule, contribution and checks), pytorch.j2 (its Dockerfile
fragments), releases.yaml (its release rows)."""

from imgbuild.blocks.pytorch.pytorch import (
    BLOCK,
    PyTorch,
    PyTorchDetails,
    TorchWheel,
    gpu_nccl_allreduce,
    gpu_torch_cuda,
    shipped,
    torch_probe,
    torch_wheel,
)

__all__ = [
    "BLOCK",
    "PyTorch",
    "PyTorchDetails",
    "TorchWheel",
    "gpu_nccl_allreduce",
    "gpu_torch_cuda",
    "shipped",
    "torch_probe",
    "torch_wheel",
]
