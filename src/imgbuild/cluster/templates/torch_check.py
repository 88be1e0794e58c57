# imgbuild's PyTorch check (`imgbuild cluster job --engine trainjob|pytorchjob`), run by torchrun on every node:
# every rank adds rank+1 in an all_reduce over the accelerator's backend (NCCL, Habana's HCCL, or gloo on CPUs)
# and checks the sum and the world size. Usage: torchrun ... --no-python python -c THIS ACCELERATOR NODES
import os
import socket
import sys

import torch
import torch.distributed as dist

accelerator, nodes = sys.argv[1], int(sys.argv[2])
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
if accelerator == "gaudi":
    import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the hccl backend)

    backend, device = "hccl", torch.device("hpu")
elif accelerator == "nvidia":
    torch.cuda.set_device(local_rank)
    backend, device = "nccl", torch.device("cuda", local_rank)
else:
    backend, device = "gloo", torch.device("cpu")
dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)], device=device)
dist.all_reduce(value)
total, want = int(value.item()), size * (size + 1) // 2
per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
host = socket.gethostname()
print(f"imgbuild-torch-check rank={rank} size={size} host={host} backend={backend} sum={total} expected={want}")
dist.destroy_process_group()
sys.exit(0 if total == want and size == nodes * per_node else 1)
