"""A small DistributedDataParallel training, the multi-node PyTorch check of `imgbuild verify --nodes`.

Runs unchanged under the image's two launchers:
- torchrun (c10d rendezvous): RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT come from torchrun;
- mpirun (the recipe's launch line, as `train` runs it): ranks from OMPI_COMM_WORLD_*; rank 0 picks a free port
  and its address (`own_address`), and mpi4py broadcasts them, so nothing has to be agreed on beforehand.
The backend is nccl where CUDA is available, else gloo. Every rank trains on its own data for STEPS steps; DDP
averages the gradients, so afterwards the model's parameters must be identical on every rank: each rank's
parameter checksum is gathered, and rank 0 prints one JSON line with the result. Exit 0 only when all agree.
"""

import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("IMGBUILD_DDP_STEPS", "20"))


def rendezvous():
    """(rank, world size, local rank, init_method) from torchrun's variables or from mpirun's."""
    if "RANK" in os.environ and "MASTER_ADDR" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return rank, world, int(os.environ.get("LOCAL_RANK", "0")), "env://", "torchrun"
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        endpoint = None
        if comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            endpoint = (own_address(), port)
        address, port = comm.bcast(endpoint, root=0)
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
        return comm.Get_rank(), comm.Get_size(), local, f"tcp://{address}:{port}", "mpirun"
    sys.exit("ddp_train: neither torchrun's RANK/MASTER_ADDR nor mpirun's OMPI_COMM_WORLD_RANK is set")


def own_address():
    """The address the other ranks reach this host by: IMGBUILD_MASTER_ADDR when set, else the source address of
    the default route (no packet is sent by connect on UDP), else what this host's name resolves to (a private
    network without a way out has no default route; its hosts resolve each other's names)."""
    given = os.environ.get("IMGBUILD_MASTER_ADDR")
    if given:
        return given
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: any routable address will do
            return probe.getsockname()[0]
    except OSError:
        pass
    address = socket.gethostbyname(socket.gethostname())
    if address.startswith("127."):
        sys.exit(
            f"ddp_train: no default route and this host's name resolves to {address}: set IMGBUILD_MASTER_ADDR "
            "to the address the other hosts reach this one by"
        )
    return address


def nccl_version():
    """The NCCL torch was built with, or None for a build without NCCL (CPU wheels)."""
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return None


def train(rank, local_rank):
    """STEPS steps of DDP; returns (the parameters' checksum, the last loss). The model, its DDP
    wrapper (which holds the process group) and the optimizer live only in here."""
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    loss = torch.tensor(0.0)
    for _ in range(STEPS):
        x = torch.randn(64, 32, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    flat = torch.cat([p.detach().float().cpu().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16], round(float(loss.detach()), 6)


def main():
    rank, world, local_rank, init_method, launcher = rendezvous()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    start = time.monotonic()
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
    digest, loss = train(rank, local_rank)
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    seconds = round(time.monotonic() - start, 3)
    dist.destroy_process_group()
    same = len(set(digests)) == 1
    if rank == 0:
        print(
            json.dumps(
                {
                    "ddp": "ok" if same else "parameters differ",
                    "launcher": launcher,
                    "backend": backend,
                    "world_size": world,
                    "steps": STEPS,
                    "hosts": sorted(set(hosts)),
                    "checksums": digests,
                    "loss": loss,
                    "seconds": seconds,
                    "nccl": nccl_version(),
                }
            ),
            flush=True,
        )
    finish(0 if same else 3)


def finish(code):
    """End the process here, not through the interpreter's shutdown. destroy_process_group() does not join gloo's
    worker threads, and one can still hold the last reference to a collective's tensor (all_gather_object's) a
    moment after the collective returns; if the interpreter is finalizing when the thread lets it go, the thread
    cannot take the GIL and the process aborts ("terminate called without an active exception", exit 134) after
    its result is printed: PyTorch's open issue pytorch/pytorch#190489, seen in 7 of 30 DDP runs under
    `mpirun -np 2` on a loaded 2-core machine. So: flush, end MPI (mpi4py would at exit), and _exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)


if __name__ == "__main__":
    main()
