"""The example's training program: DistributedDataParallel across every rank `train` starts (mpirun on the hosts of a
SageMaker job, or torchrun), using the user's requirements (einops, tqdm) and the package's C++ extension, which
reports the NCCL and MPI it was linked against. Rank 0 writes /opt/ml/model/result.json (SageMaker packs it into
model.tar.gz); every rank's parameters must agree at the end. gloo on CPUs, nccl on GPUs."""

import hashlib
import json
import os
import socket
import sys

import einops
import torch
import torch.distributed as dist
from tqdm import tqdm

import imgbuild_example

MODEL_DIR = os.environ.get("SM_MODEL_DIR", "/opt/ml/model")
HYPERPARAMETERS = "/opt/ml/input/config/hyperparameters.json"


def hyperparameters():
    try:
        with open(HYPERPARAMETERS) as f:
            return {k: json.loads(v) if isinstance(v, str) and v[:1] in "[{0123456789" else v for k, v in json.load(f).items()}
    except FileNotFoundError:
        return {}


def rendezvous():
    """(rank, world size, init_method): torchrun's variables, else mpirun's (rank 0's address and a free port,
    broadcast with mpi4py), else one process."""
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://"
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        endpoint = None
        if comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect(("192.0.2.1", 9))  # the default route's source address; nothing is sent
                endpoint = (probe.getsockname()[0], port)
        address, port = comm.bcast(endpoint, root=0)
        return comm.Get_rank(), comm.Get_size(), f"tcp://{address}:{port}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return 0, 1, f"tcp://127.0.0.1:{s.getsockname()[1]}"


def train(rank, steps):
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if cuda else torch.device("cpu")
    model = imgbuild_example.Model().to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)
    loss = torch.tensor(0.0)
    for _ in tqdm(range(steps), disable=rank != 0, mininterval=5):
        # 4 batches of 16 samples, flattened with einops into one batch of 64
        x = einops.rearrange(torch.randn(4, 16, 32, generator=gen), "b n d -> (b n) d").to(device)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        for p in model.parameters():  # the extension's op: gradient scaling, in place
            imgbuild_example.scale_(p.grad, 0.5)
        opt.step()
    flat = torch.cat([p.detach().float().cpu().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16], round(float(loss.detach()), 6)


def finish(code):
    """End the process here, not through the interpreter's shutdown. A gloo worker thread can still hold the last
    reference to a collective's tensor (all_gather_object's) a moment after the collective returns; if the
    interpreter is finalizing when the thread lets it go, the thread cannot take the GIL and the process aborts
    ("terminate called without an active exception", exit 134) after its work is done: PyTorch's open issue
    pytorch/pytorch#190489, 7 runs in 30 of this program under `mpirun -np 2` on a loaded 2-core machine.
    destroy_process_group() does not join those threads. So: flush, end MPI (mpi4py would at exit), and _exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)


def main():
    steps = int(hyperparameters().get("steps", 20))
    rank, world, init_method = rendezvous()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", init_method=init_method,
                            rank=rank, world_size=world)
    digest, loss = train(rank, steps)
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    dist.destroy_process_group()
    code = imgbuild_example.nccl_version()
    torch_nccl = torch.cuda.nccl.version()
    result = {
        "world_size": world,
        "steps": steps,
        "loss": loss,
        "parameters_agree": len(set(digests)) == 1,
        "extension_nccl": code,
        "torch_nccl": list(torch_nccl),
        "extension_mpi": imgbuild_example.mpi_library_version().splitlines()[0],
        "einops": einops.__version__,
    }
    if rank == 0:
        os.makedirs(MODEL_DIR, exist_ok=True)
        with open(os.path.join(MODEL_DIR, "result.json"), "w") as f:
            json.dump(result, f)
        print(json.dumps(result), flush=True)
    same_nccl = code == torch_nccl[0] * 10000 + torch_nccl[1] * 100 + torch_nccl[2]
    finish(0 if result["parameters_agree"] and same_nccl else 3)


if __name__ == "__main__":
    main()
