# imgbuild's MPI check for images without nccl-tests (`imgbuild cluster job`): every rank adds rank+1 in an
# allreduce and checks the sum; rank 0 also checks that the ranks ran on as many hosts as the job has nodes (an
# mpirun that ignored its hostfile runs every rank on the launcher's host). Usage: python -c THIS NODES
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
host = socket.gethostname()
total = comm.allreduce(rank + 1, op=MPI.SUM)
hosts = sorted(set(comm.allgather(host)))
want = size * (size + 1) // 2
print(f"imgbuild-mpi-check rank={rank} size={size} host={host} sum={total} expected={want}", flush=True)
ok = total == want
if rank == 0:
    nodes = int(sys.argv[1])
    print(f"imgbuild-mpi-check: {size} ranks on {len(hosts)} hosts ({', '.join(hosts)}), {nodes} expected", flush=True)
    ok = ok and len(hosts) == nodes
sys.exit(0 if ok else 1)
