"""The launch line of a multi-node job: the one place that builds the mpirun (and torchrun) command.

The SageMaker `train` script reads the fixed part as data the sagemaker block writes into the image (`Launch.mpirun`,
`Launch.torchrun_template`, `Launch.env_defaults`: one argument or NAME=VALUE per line) and adds the job's hosts,
program and environment; `imgbuild verify --nodes` runs `Launch.mpirun_argv` for its own hosts. Both come from the
image's manifest (its `mpirun` section is the recipe's), so what verify proves is what jobs run.

The mpirun line, in order:

    LAUNCHER  EXTRA_ARGS...                          the recipe's `mpirun.launcher` and `mpirun.extra_args`
    --mca KEY VALUE ...                              `mpirun.mca`, sorted by key
    --mca btl_tcp_if_exclude lo,docker0              `mpirun.exclude_interfaces`, for the TCP BTL and for ORTE's
    --mca oob_tcp_if_exclude lo,docker0                out-of-band channel, unless `mca` sets them itself
    --mca plm_rsh_no_tree_spawn 1                    the launcher starts every remote daemon itself, so only
                                                       it must reach every peer over ssh (unless `mca` says)
    -x NAME ...                                      every variable the image's ENV sets and the recipe's env
                                                       (ssh sessions on the other hosts don't inherit them)
    -np N --hostfile FILE [--wdir DIR] PROGRAM...    per run

`mpirun.nccl_socket_ifname` is the default of NCCL_SOCKET_IFNAME in the launcher's environment
(`Launch.env_defaults`, `Launch.defaults_for`): a value the job sets (train: the job's network interface) wins, and
`-x` passes whichever it is to every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imgbuild.image.manifest import Manifest
    from imgbuild.recipe import MpiRun

NO_TREE_SPAWN = "plm_rsh_no_tree_spawn"
INTERFACE_EXCLUDES = ("btl_tcp_if_exclude", "oob_tcp_if_exclude")
# The per-host values of torchrun's options (`Launch.torchrun_options`' arguments): `train` substitutes them for
# their placeholders in `Launch.torchrun_template`.
TORCHRUN_FIELDS = ("nnodes", "nproc_per_node", "endpoint", "run_id", "local_addr")


@dataclass(frozen=True)
class Launch:
    """The launch lines of one image: the fixed parts of its mpirun and torchrun commands, and the launcher
    environment's defaults (each applies where the launcher's environment does not set the variable). `train` reads
    `mpirun`, `torchrun_template()` and `env_defaults` from the image's data files (the sagemaker block's)."""

    mpirun: tuple[str, ...]
    torchrun: tuple[str, ...]
    env_defaults: tuple[tuple[str, str], ...] = ()

    def defaults_for(self, already_set: Sequence[str]) -> list[str]:
        """`NAME=VALUE` for each default whose variable is not among `already_set` (for `env NAME=VALUE ... CMD`)."""
        return [f"{name}={value}" for name, value in self.env_defaults if name not in already_set]

    def mpirun_argv(self, *, hostfile: str, np: int, program: Sequence[str], wdir: str | None = None) -> list[str]:
        """The whole mpirun command for `np` ranks on the hosts of `hostfile` (what train runs)."""
        return [*self.mpirun, "-np", str(np), "--hostfile", hostfile, *(["--wdir", wdir] if wdir else []), *program]

    @staticmethod
    def torchrun_options(
        *, nnodes: int | str, nproc_per_node: int | str, endpoint: str, run_id: str, local_addr: str
    ) -> list[str]:
        """torchrun's options for one host of a job: c10d rendezvous at `endpoint` (HOST:PORT of the first host,
        whose agent hosts the store); node ranks are assigned by the rendezvous. `local_addr` is this host's name
        as the others reach it (the list `endpoint` comes from): the address rank 0's agent publishes as the
        master's, which is otherwise `socket.getfqdn()` (on SageMaker the container's hostname is not the name
        the other hosts resolve; resourceconfig.json's `current_host` is)."""
        return [
            f"--nnodes={nnodes}",
            f"--nproc_per_node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={run_id}",
            f"--local-addr={local_addr}",
        ]

    def torchrun_argv(
        self,
        *,
        nnodes: int,
        nproc_per_node: int,
        endpoint: str,
        run_id: str,
        local_addr: str,
        program: Sequence[str],
    ) -> list[str]:
        """The whole torchrun command of one host (`--no-python` first in `program` for a non-Python one)."""
        options = self.torchrun_options(
            nnodes=nnodes, nproc_per_node=nproc_per_node, endpoint=endpoint, run_id=run_id, local_addr=local_addr
        )
        return [*self.torchrun, *options, *program]

    def torchrun_template(self) -> list[str]:
        """The whole torchrun command with a placeholder `{NAME}` for each per-host value of `torchrun_options`
        (TORCHRUN_FIELDS): what `train` reads, one argument per line, and fills in for its job."""
        return [*self.torchrun, *self.torchrun_options(**{name: "{" + name + "}" for name in TORCHRUN_FIELDS})]


def for_manifest(manifest: Manifest) -> Launch:
    """The image's launch lines (see the module's docstring)."""
    return launch_for(manifest.mpirun, manifest.rank_env, manifest.python)


def launch_for(mpirun: MpiRun, env_names: Sequence[str], python: str) -> Launch:
    """The launch lines of an `mpirun:` section whose ranks need the variables `env_names`, with `python`."""
    args = [mpirun.launcher, *mpirun.extra_args]
    for key, value in sorted(mpirun.mca.items()):
        args += ["--mca", key, value]
    if mpirun.exclude_interfaces:
        excluded = ",".join(mpirun.exclude_interfaces)
        for key in INTERFACE_EXCLUDES:
            if key not in mpirun.mca:
                args += ["--mca", key, excluded]
    if NO_TREE_SPAWN not in mpirun.mca:
        args += ["--mca", NO_TREE_SPAWN, "1"]
    defaults = (("NCCL_SOCKET_IFNAME", mpirun.nccl_socket_ifname),) if mpirun.nccl_socket_ifname else ()
    for name in dict.fromkeys([*env_names, *(n for n, _ in defaults)]):
        args += ["-x", name]
    # `python -m torch.distributed.run`: the torchrun console script need not be on PATH.
    return Launch(tuple(args), (python, "-m", "torch.distributed.run"), defaults)
