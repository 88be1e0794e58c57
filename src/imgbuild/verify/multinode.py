"""`imgbuild verify RECIPE --nodes N`: the checks of nodechecks.py across N containers of an image on a private
network of this host, through `DockerNodes` (docker exec into the containers).

`verify --nodes` (`run_multinode`), and what it leaves behind (nothing):

- a fresh ed25519 key pair made for this run only, in a temporary folder that is bind-mounted read-only at
  /run/imgbuild/ssh in every container (the entrypoint installs it); the folder is removed at the end and the
  private key never enters an image or a log;
- a private bridge network `imgbuild-verify-<run>` (internal: no way out) and containers
  `imgbuild-verify-<run>-node-K` with hostname and network alias `node-K`, started with the image's run
  profile (on the run's network, not the host's) and `sleep infinity` after the image's entrypoint. On a host
  with GPUs (and an image for them), each node gets its own share of the GPUs (NCCL refuses two ranks on one
  GPU), and one rank per GPU at most.

Containers, network and key folder are removed in a `finally`, also on errors and Ctrl-C (containers.py).
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.blocks.sshd import SSH_KEY_DIR
from imgbuild.checks.results import CheckResult
from imgbuild.core.errors import Interrupted, VerifyError
from imgbuild.core.interrupts import sigint_deferred
from imgbuild.engine.containers import LABEL, Containers, Exec
from imgbuild.image.manifest import Manifest
from imgbuild.verify.nodechecks import run_checks, timings_result
from imgbuild.verify.nodesession import BASE_TIMEOUT_S, DDP_TIMEOUT_S, NCCL_TESTS_TIMEOUT_S, SSHD_WAIT_S, Nodes, Session

if TYPE_CHECKING:
    import docker

    from imgbuild.engine.runprofile import RunSpec

__all__ = [
    "KEY_MOUNT",
    "DockerNodes",
    "gpu_shares",
    "host_gpus",
    "run_multinode",
]

KEY_MOUNT = SSH_KEY_DIR  # where sshd's entrypoint hook looks for the run's keys


# --------------------------------------------------------------------------------------------------------
# the node executor of verify --nodes


@dataclass
class _Spawned:
    container: Any
    exec_id: str
    label: str
    started: float
    timeout_s: float


class DockerNodes(Nodes):
    """The containers of `verify --nodes`, through `docker exec` (containers.py)."""

    def __init__(self, containers: Containers, members: Sequence[tuple[str, Any]]) -> None:
        self.containers = containers
        self.names = tuple(name for name, _ in members)
        self.members = [c for _, c in members]

    def run(self, k: int, script: str, *, timeout_s: float, label: str) -> Exec:
        return self.containers.exec(self.members[k], script, timeout_s=timeout_s, label=label)

    def spawn(self, k: int, script: str, *, timeout_s: float, label: str) -> _Spawned:
        started = time.monotonic()
        exec_id = self.containers.spawn(self.members[k], script, timeout_s=timeout_s, label=label)
        return _Spawned(self.members[k], exec_id, label, started, timeout_s)

    def wait(self, handle: _Spawned, *, timeout_s: float) -> Exec:
        return self.containers.wait(
            handle.container, handle.exec_id, timeout_s=timeout_s, label=handle.label, started=handle.started
        )

    def put_files(self, files: dict[str, tuple[bytes, int]]) -> None:
        for container in self.members:
            self.containers.copy_in(container, files)

    def diagnose(self, k: int) -> str:
        return f"{self.names[k]} container log:\n{self.containers.logs(self.members[k])}"


# --------------------------------------------------------------------------------------------------------
# verify --nodes: the containers


def host_gpus(pattern: str = "/dev/nvidia[0-9]*") -> int:
    """How many NVIDIA GPUs this host has (its /dev/nvidiaN devices)."""
    return len([p for p in glob.glob(pattern) if re.fullmatch(r".*/nvidia\d+", p)])


def gpu_shares(gpus: int, nodes: int) -> list[list[int]]:
    """The GPUs each of `nodes` containers on one host gets: disjoint equal shares (NCCL refuses two ranks on one
    GPU); empty when there are fewer GPUs than nodes."""
    per = gpus // nodes
    return [list(range(k * per, (k + 1) * per)) for k in range(nodes)] if per else []


@dataclass
class _Run:
    """The containers of one `verify --nodes` run, until they are running (then `DockerNodes` takes over)."""

    containers: Containers
    image_ref: str
    spec: RunSpec
    nodes: int
    shares: list[list[int]]  # the GPUs of each node (empty: no GPUs)
    notes: list[str] = field(default_factory=list)
    members: list[tuple[str, Any]] = field(default_factory=list)  # (node-K, container)
    key_dir: Path | None = None

    @property
    def prefix(self) -> str:
        return self.containers.prefix

    def make_keys(self) -> None:
        self.key_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-keys-"))
        _keypair(self.key_dir, comment=f"imgbuild-verify-{self.containers.run_id}")

    def start(self) -> list[CheckResult]:
        """Network and containers; a result for each node that did not come up."""
        network = self.containers.network()
        self.spec = self._start_node(1, network)
        rest = list(range(2, self.nodes + 1))
        if rest:
            with ThreadPoolExecutor(max_workers=min(8, len(rest))) as pool:
                list(pool.map(lambda k: self._start_node(k, network), rest))
        self.members.sort(key=lambda m: int(m[0].split("-")[1]))
        failed = []
        for name, container in self.members:
            container.reload()
            if container.status != "running":
                code = container.attrs.get("State", {}).get("ExitCode")
                failed.append(
                    CheckResult(
                        name="multinode: container",
                        status="fail",
                        expected="running",
                        found=f"{container.status} (exit code {code})",
                        reason=f"{name} stopped right after start:\n{self.containers.logs(container)}",
                        node=name,
                    )
                )
        return failed

    def _start_node(self, k: int, network: str) -> RunSpec:
        """Start node-K with the run's keys; the spec it started with (memlock may be dropped)."""
        import docker.types

        assert self.key_dir is not None
        name = f"node-{k}"
        options: dict[str, Any] = {
            "init": True,  # sshd daemonizes: something must reap its children
            "hostname": name,
            "network": network,
            "networking_config": {network: self.containers.client.api.create_endpoint_config(aliases=[name])},
        }
        if self.shares:
            ids = [str(i) for i in self.shares[k - 1]]
            options["device_requests"] = [docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
        files: dict[str, tuple[bytes, int]] = {}
        dirs = {}
        if _engine_is_local(self.containers.client):
            options["volumes"] = {str(self.key_dir): {"bind": KEY_MOUNT, "mode": "ro"}}
        else:
            dirs[KEY_MOUNT] = 0o700
            # A remote engine can't see this machine's folders: copy the run's keys into the container instead
            # (its writable layer, removed with it).
            files = {
                f"{KEY_MOUNT}/{p.name}": (p.read_bytes(), p.stat().st_mode & 0o777)
                for p in sorted(self.key_dir.iterdir())
            }
        container, spec, note = self.containers.start(
            self.image_ref, ["sleep", "infinity"], name, self.spec, files=files, dirs=dirs, **options
        )
        if note:
            self.notes.append(note)
        self.members.append((name, container))
        return spec

    def cleanup(self) -> list[str]:
        """Remove everything this run made; returns what could not be removed."""
        left = self.containers.remove_all()
        if self.key_dir is not None:
            shutil.rmtree(self.key_dir, ignore_errors=True)
            if self.key_dir.exists():
                left.append(f"key folder {self.key_dir}")
        return left


def run_multinode(
    image_ref: str,
    manifest: Manifest,
    nodes: int,
    *,
    client: docker.DockerClient | None = None,
    timeout_s: float | None = None,
    sshd_wait_s: float = SSHD_WAIT_S,
    gpus: int | None = None,
    slowdown: float = 1.0,
) -> list[CheckResult]:
    """Start `nodes` containers of image_ref on a private network and run `run_checks` across them.

    manifest: the image's (`Manifest.parse` of its /etc/imgbuild/manifest.json); its `mpirun`, `runtime`,
    `platform` and `components` drive the run. timeout_s bounds the whole check (default: 180 s, plus 600 s
    for the PyTorch trainings and 300 s for nccl-tests where they run); sshd_wait_s how long node-1 waits for
    each node's sshd; gpus: the host's GPU count (default: its /dev/nvidiaN devices); slowdown: how much slower the
    image runs than natively (another architecture under QEMU: verify.EMULATION_SLOWDOWN), scaling both waits.

    Returns per-node results (sshd, allreduce), overall ones (mpirun allreduce, rank and ssh environment,
    fi_pingpong, DDP per launcher, nccl-tests) and a last "multinode: timings" result whose details hold the
    seconds spent in each phase. Containers, network and keys are removed before it returns, also on errors;
    Ctrl-C raises `Interrupted` after cleaning up.
    """
    from imgbuild.engine import client as engine
    from imgbuild.engine.client import ENGINE_ERRORS
    from imgbuild.engine.runprofile import for_engine, host_efa_devices, run_spec

    if nodes < 1:
        raise VerifyError(f"--nodes must be 1 or more, got {nodes}")
    if not manifest.ssh_ports:
        raise VerifyError("the image has no sshd component (components.sshd.ports): mpirun cannot reach peers")
    own_client = client is None
    if client is None:
        client = engine.connect()
    began = time.monotonic()
    info = engine.inspect_image(client, image_ref) or {}
    env = dict(item.split("=", 1) for item in (info.get("Config") or {}).get("Env") or [] if "=" in item)
    spec = run_spec(manifest.runtime, host_efa_devices())
    runtimes = list((client.info().get("Runtimes") or {}).keys())
    wants_gpu = manifest.platform.accelerator == "nvidia" or bool(manifest.runtime.gpus)
    count = host_gpus() if gpus is None else gpus
    shares = gpu_shares(count, nodes) if wants_gpu else []
    # On the run's own network (for_engine); GPUs only as disjoint shares (_Run._start_node), never all of them.
    spec, notes = for_engine(spec, runtimes=runtimes, has_gpu=False)
    if wants_gpu and count and not shares:
        notes.append(f"{count} GPU(s) for {nodes} nodes: the nodes run without GPUs (one GPU per node at least)")
    slots = min(manifest.slots, len(shares[0])) if shares else manifest.slots
    if timeout_s is None:
        timeout_s = BASE_TIMEOUT_S + (2 * DDP_TIMEOUT_S if "pytorch" in manifest.components else 0)
        timeout_s += NCCL_TESTS_TIMEOUT_S if shares and "nccl_tests" in manifest.components else 0
        timeout_s *= slowdown
    sshd_wait_s *= slowdown
    run = _Run(Containers(client), image_ref, spec, nodes, shares)
    run.notes += notes
    session: Session | None = None
    results: list[CheckResult] = []
    timings: dict[str, float] = {}
    try:
        run.make_keys()
        t0 = time.monotonic()
        expected = f"{nodes} containers of {image_ref} running"
        try:
            failed = run.start()
        except ENGINE_ERRORS as exc:
            reason = f"the engine refused: {engine.reason(exc)}"
            failed = [CheckResult("multinode: containers", "fail", expected, "not started", reason=reason)]
        timings["container_start_s"] = round(time.monotonic() - t0, 3)
        if failed:
            results += failed
        else:
            results.append(
                CheckResult(
                    "multinode: containers",
                    "pass",
                    expected,
                    f"{nodes} running on network {run.prefix}"
                    + (f", GPUs {'; '.join(','.join(map(str, g)) for g in shares)}" if shares else ""),
                    duration_s=timings["container_start_s"],
                    details={"network": run.prefix, "containers": [c.name for _, c in run.members]},
                )
            )
            session = Session(
                DockerNodes(run.containers, run.members),
                manifest,
                {**env, **dict(run.spec.env)},
                began + timeout_s,
                gpus=bool(shares),
                slots=slots,
                run_id=f"imgbuild-{run.containers.run_id}",
                timings=timings,
            )
            results += run_checks(session, sshd_wait_s=sshd_wait_s)
    except ENGINE_ERRORS as exc:
        # Mid-run engine trouble (a container gone, the socket closed): a failure naming it, after what passed.
        reason = f"the engine failed mid-run: {engine.reason(exc)}"
        results.append(CheckResult("multinode: engine", "fail", "the engine answers", "an error", reason=reason))
    except KeyboardInterrupt:
        # The finally below removes everything before this propagates.
        raise Interrupted("multinode check interrupted; its containers, network and keys were removed") from None
    finally:
        t1 = time.monotonic()
        with sigint_deferred("the multi-node check's containers"):
            leftovers = run.cleanup()
        timings["cleanup_s"] = round(time.monotonic() - t1, 3)
        timings["total_s"] = round(time.monotonic() - began, 3)
        if own_client:
            client.close()
    all_notes = [*run.notes, *(session.notes if session else [])]
    results += [CheckResult("multinode: note", "skip", reason=note) for note in all_notes]
    if leftovers:
        results.append(
            CheckResult(
                "multinode: cleanup",
                "fail",
                "containers, network and keys removed",
                ", ".join(leftovers),
                reason=f"could not remove: {', '.join(leftovers)} (labelled {LABEL}={run.containers.run_id})",
            )
        )
    final = session or Session(DockerNodes(run.containers, []), manifest, {}, 0.0, timings=timings)
    final.notes = all_notes
    results.append(timings_result(final, run.prefix, nodes))
    return results


# --------------------------------------------------------------------------------------------------------
# helpers


def _keypair(folder: Path, *, comment: str) -> None:
    """id_ed25519, id_ed25519.pub and authorized_keys in folder (0700), made for this run only."""
    folder.chmod(0o700)
    private, public = folder / "id_ed25519", folder / "id_ed25519.pub"
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:
        exe = shutil.which("ssh-keygen")
        if exe is None:
            raise VerifyError(
                "cannot make the run's SSH key: neither the cryptography package nor ssh-keygen is available"
            ) from None
        subprocess.run(
            [exe, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(private)], check=True, timeout=30
        )
    else:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        private.touch(mode=0o600)
        private.write_bytes(pem)
        line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        public.write_bytes(line + f" {comment}\n".encode())
    private.chmod(0o600)
    (folder / "authorized_keys").write_bytes(public.read_bytes())


def _engine_is_local(client: docker.DockerClient) -> bool:
    """Whether the engine sees this machine's folders (a local socket), so the key folder can be bind-mounted."""
    base = str(getattr(client.api, "base_url", ""))
    return base in ("http+docker://localhost", "http+docker://localunixsocket", "http+docker://localnpipe")
