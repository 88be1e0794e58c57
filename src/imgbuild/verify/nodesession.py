"""What the checks across nodes (nodechecks.py, nodeworkloads.py) share: the `Nodes` executor they run through
(multinode's `DockerNodes`, cluster.live's ssh executor), the `Session` of one run (the nodes, the image's manifest and
ENV, a deadline, where results go), the check names and timeouts, the image's launch lines (`mpirun_argv`,
`launched`), and why a check skips on an image without the blocks that feed it (`lacking`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from imgbuild import probes
from imgbuild.blocks import Pin, feeding
from imgbuild.engine.containers import Exec
from imgbuild.image.launch import Launch, for_manifest
from imgbuild.image.manifest import Manifest

__all__ = [
    "WORKDIR",
    "Nodes",
    "Session",
    "lacking",
    "launched",
    "mpirun_argv",
    "with_defaults",
]

WORKDIR = "/tmp/imgbuild-verify"
PINGPONG_PORT = 47592  # fi_pingpong's default control port (its -B/-P)
MASTER_PORT = 29500  # torchrun's (train's IMGBUILD_MASTER_PORT default)

SSHD_WAIT_S = 30.0
MPIRUN_TIMEOUT_S = 120.0
PINGPONG_TIMEOUT_S = 60.0
DDP_TIMEOUT_S = 300.0  # importing torch on a loaded 2-core machine takes a while
NCCL_TESTS_TIMEOUT_S = 300.0
BASE_TIMEOUT_S = 180.0

# The ids of the checks the blocks feed (`Block.node_checks`): each runs where the image has a block that feeds it.
PINGPONG = "fi_pingpong"
DDP_MPIRUN = "ddp (mpirun)"
DDP_TORCHRUN = "ddp (torchrun)"
NCCL_TESTS = "nccl-tests all_reduce_perf"
GATHER = "mpi4py gather"


def mpirun_argv(manifest: Manifest, *, hostfile: str, ranks: int, program: list[str], wdir: str) -> list[str]:
    """The mpirun command these checks run: the image's launch line (`train` renders the same one)."""
    return for_manifest(manifest).mpirun_argv(hostfile=hostfile, np=ranks, program=program, wdir=wdir)


def launched(manifest: Manifest, argv: list[str]) -> list[str]:
    """`argv` under `env` with the launch line's environment defaults that the containers' environment (the image's
    ENV, the recipe's runtime env) does not set (`Launch.defaults_for`), as `train` gives them to its launcher."""
    defaults = for_manifest(manifest).defaults_for([*manifest.rank_env, *manifest.runtime.env])
    return ["env", *defaults, *argv] if defaults else argv


def with_defaults(s: Session, argv: list[str]) -> list[str]:
    """`launched` for the session's image."""
    return launched(s.manifest, argv)


# --------------------------------------------------------------------------------------------------------
# where the checks run: the node executor (multinode.DockerNodes, cluster.live's ssh executor)


class Nodes(Protocol):
    """Runs bash scripts on the nodes of a run (node 0 is where launchers start) and copies files to them.

    `names` are the nodes as node 0 reaches them (the hostfile's names, ssh's and torchrun's master address)."""

    names: tuple[str, ...]

    def run(self, k: int, script: str, *, timeout_s: float, label: str) -> Exec:
        """Run bash `script` on node k for at most timeout_s seconds; its exit status and output."""

    def spawn(self, k: int, script: str, *, timeout_s: float, label: str) -> Any:
        """Start bash `script` on node k in the background; a handle for `wait`."""

    def wait(self, handle: Any, *, timeout_s: float) -> Exec:
        """The outcome of a spawned script (waiting until it ends, or gives up after its time limit)."""

    def put_files(self, files: dict[str, tuple[bytes, int]]) -> None:
        """Copy files (absolute path -> (content, mode)) to every node."""

    def diagnose(self, k: int) -> str:
        """What else to say when node k misbehaves (a container's log); empty when there is nothing."""


# --------------------------------------------------------------------------------------------------------
# one run of the checks


@dataclass
class Session:
    """What the checks need: the nodes, the image's manifest and ENV, a deadline, and where results go.

    image_env: what every rank and ssh session must see (the image's ENV and the run profile's env);
    prefix: the check names' prefix ("multinode", "cluster"); gpus: whether the nodes have GPUs to use;
    slots: ranks per node (the manifest's, or fewer where a node has fewer GPUs); expect_efa: EFA must carry
    the traffic (the image has EFA and the nodes have its devices)."""

    nodes: Nodes
    manifest: Manifest
    image_env: dict[str, str]
    deadline: float
    prefix: str = "multinode"
    workdir: str = WORKDIR
    gpus: bool = False
    slots: int | None = None
    expect_efa: bool = False
    master_port: int = MASTER_PORT
    run_id: str = "imgbuild"  # torchrun's rendezvous id (c10d), one per run
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    hostnames: dict[str, str] = field(default_factory=dict)  # node name -> its own hostname (from the sshd check)

    @property
    def n(self) -> int:
        return len(self.nodes.names)

    @property
    def per_node(self) -> int:
        return self.slots if self.slots is not None else self.manifest.slots

    @property
    def launch(self) -> Launch:
        return for_manifest(self.manifest)

    @property
    def port(self) -> int:
        return self.manifest.ssh_ports[0]

    def fed(self, check: str) -> list[Pin]:
        """The image's pins of the blocks that feed check `check` (`blocks.feeding`), in that order."""
        comps = self.manifest.components
        return [comps[name] for name in feeding(check) if name in comps]

    def version(self, component: str) -> str | None:
        """The image's pinned version of `component` (None without one)."""
        pin = self.manifest.components.get(component)
        return pin.version if pin is not None else None

    @property
    def hostfile(self) -> str:
        return f"{self.workdir}/hostfile"

    @property
    def program(self) -> str:
        return f"{self.workdir}/allreduce.py"

    @property
    def env_names(self) -> str:
        return f"{self.workdir}/env-names.json"

    @property
    def ddp_program(self) -> str:
        return f"{self.workdir}/ddp_train.py"

    def name(self, check: str) -> str:
        return f"{self.prefix}: {check}"

    def left(self, cap: float) -> float:
        return max(1.0, min(cap, self.deadline - time.monotonic()))

    def hostfile_text(self) -> str:
        return "".join(f"{name} slots={self.per_node}\n" for name in self.nodes.names)

    def files(self) -> dict[str, tuple[bytes, int]]:
        """What the checks run, copied to every node before they start."""
        files = {
            self.program: (probes.text("mpi_allreduce.py").encode(), 0o644),
            self.hostfile: (self.hostfile_text().encode(), 0o644),
            self.env_names: (json.dumps(sorted(self.image_env)).encode(), 0o644),
        }
        if self.fed(DDP_MPIRUN) or self.fed(DDP_TORCHRUN):
            files[self.ddp_program] = (probes.text("ddp_train.py").encode(), 0o644)
        return files

    def node_of(self, rank: int, host: str) -> str:
        """The node a rank ran on: by the hostname it reported when that names one node, else by Open MPI's
        default placement (the hostfile's slots filled in order)."""
        owners = [name for name, h in self.hostnames.items() if h == host]
        if len(owners) == 1:
            return owners[0]
        if host in self.nodes.names and not self.hostnames:
            return host
        return self.nodes.names[min(rank // max(1, self.per_node), self.n - 1)]


def lacking(check: str) -> str:
    """Why `check` skips on an image without the blocks that feed it, named from the registry: 'the image has no
    nccl_tests component', 'the image has no libfabric (no libfabric or efa component)'."""
    names = feeding(check)
    if len(names) == 1:
        return f"the image has no {names[0]} component"
    return f"the image has no {names[0]} (no {' or '.join(names)} component)"
