"""verify --nodes: each MPI rank prints one line the host parses (its sum of an allreduce, its view of the variables
named in the JSON list in the file argv[1]); rank 0 prints every rank's hostname and MPI library (a gather).
`sys.exit(3)` makes a wrong sum fail mpirun as well."""

from __future__ import annotations

import json
import os
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
want = size * (size + 1) // 2
host = socket.gethostname()
with open(sys.argv[1]) as f:
    env = {name: os.environ.get(name) for name in json.load(f)}
print(f"IMGBUILD-ENV rank={rank} host={host} {json.dumps(env, sort_keys=True)}", flush=True)
print(f"IMGBUILD-ALLREDUCE rank={rank} size={size} host={host} sum={total} expected={want}", flush=True)
gathered = comm.gather([host, MPI.Get_library_version().strip().splitlines()[0]], root=0)
if rank == 0:
    print(f"IMGBUILD-GATHER {json.dumps(gathered)}", flush=True)
sys.exit(0 if total == want else 3)
