"""A one-GPU NCCL all_reduce of 2.0 through torch.distributed (world_size 1, nccl backend); one JSON line with the
value and torch's NCCL version (checks' gpu-nccl-allreduce)."""

from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist

store = os.path.join(tempfile.mkdtemp(), "store")
dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
t = torch.full((1 << 20,), 2.0, device="cuda:0")
dist.all_reduce(t)
torch.cuda.synchronize()
value = float(t[0].item())
dist.destroy_process_group()
print(json.dumps({"value": value, "nccl": list(torch.cuda.nccl.version()) if hasattr(torch.cuda, "nccl") else None}))
