"""The launch line of a multi-node job: the one place that builds the mpirun (and torchrun) command.

The SageMaker `train` script gets the fixed part rendered in (`MpiLaunch.args`, `torchrun_args`) and adds the
job's hosts, program and environment; `imgbuild verify --nodes` runs `MpiLaunch.argv` for its own hosts. Both
come from the image's manifest (its `mpirun` section is the recipe's), so what verify proves is what jobs run.

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
(`MpiLaunch.shell_defaults`): a value the job sets (train: the job's network interface) wins, and `-x` passes
whichever it is to every rank.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imgbuild.manifest import Manifest
    from imgbuild.recipe import MpiRun

NO_TREE_SPAWN = "plm_rsh_no_tree_spawn"
INTERFACE_EXCLUDES = ("btl_tcp_if_exclude", "oob_tcp_if_exclude")


@dataclass(frozen=True)
class Launch:
    """The launch lines of one image: the fixed parts of its mpirun and torchrun commands, and the launcher
    environment's defaults. `train` gets `mpirun`, `torchrun` and `shell_defaults()` rendered in."""

    mpirun: tuple[str, ...]
    torchrun: tuple[str, ...]
    env_defaults: tuple[tuple[str, str], ...] = ()

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

    def torchrun_shell(self) -> str:
        """The torchrun options as `train` writes them: the same options, with the job's shell variables."""
        options = self.torchrun_options(
            nnodes="${#hosts[@]}",
            nproc_per_node="${slots}",
            endpoint="${leader}:${IMGBUILD_MASTER_PORT:-29500}",
            run_id="${TRAINING_JOB_NAME:-imgbuild}",
            local_addr="${current_host}",  # resourceconfig.json's current_host (one host without it: hostname)
        )
        return " ".join(f'"{option}"' for option in options)

    def mpirun_lines(self) -> list[str]:
        """The fixed part shell-quoted, one option with its values per line (for a bash array)."""
        lines: list[list[str]] = []
        for arg in self.mpirun:
            if lines and not arg.startswith("-") and lines[-1][0].startswith("-"):
                lines[-1].append(arg)
            else:
                lines.append([arg])
        return [shlex.join(line) for line in lines]

    def shell_defaults(self) -> str:
        """Shell lines that give the launcher's environment its defaults (each kept when already set)."""
        return "".join(
            f'[ -n "${{{name}:-}}" ] || {name}={shlex.quote(value)}\nexport {name}\n'
            for name, value in self.env_defaults
        )


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
