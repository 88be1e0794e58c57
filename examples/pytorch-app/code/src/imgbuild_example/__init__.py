"""A small training package: a model and a C++ extension (`_stack`) built against the image's torch, NCCL and MPI."""

import torch  # first: the extension's symbols come from torch's libraries

from imgbuild_example._stack import mpi_library_version, nccl_version, scale_

__all__ = ["Model", "mpi_library_version", "nccl_version", "scale_"]


class Model(torch.nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(width, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)
