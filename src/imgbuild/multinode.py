"""`imgbuild verify RECIPE --nodes N`: N containers of an image on a private network, talking MPI over ssh.

What a run does, and what it leaves behind (nothing):

1. a fresh ed25519 key pair made for this run only, in a temporary folder that is bind-mounted read-only at
   /run/imgbuild/ssh in every container (the entrypoint installs it); the folder is removed at the end and the
   private key never enters an image or a log;
2. a private bridge network `imgbuild-verify-<run>` (internal: no way out) and containers
   `imgbuild-verify-<run>-node-K` with hostname and network alias `node-K`, started with the recipe's runtime
   settings (`--shm-size`, memlock unlimited) and `sleep infinity` after the image's entrypoint;
3. from node-1, `ssh -p PORT node-K true` until every node's sshd answers (bounded);
4. mpirun across all nodes, its command line built from the manifest's `mpirun` section, running a small
   mpi4py allreduce in which rank r contributes r+1 and every rank checks the sum is n(n+1)/2;
5. fi_pingpong between node-1 (server) and node-2 (client) over libfabric's tcp provider (efa where the image
   has the EFA installer and the host has EFA devices), reporting the latency and bandwidth table.

Containers, network and key folder are removed in a `finally`, also on errors and Ctrl-C. Every command run
inside a container is wrapped in `timeout`, and the host stops waiting a little after that, so nothing hangs.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import math
import re
import secrets
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from imgbuild import engine
from imgbuild.errors import EngineError, Interrupted, VerifyError
from imgbuild.interrupts import sigint_deferred
from imgbuild.report import CheckResult
from imgbuild.resolver import Resolved

__all__ = ["KEY_MOUNT", "LABEL", "MANIFEST_PATH", "NAME_PREFIX", "read_manifest", "run_multinode"]

NAME_PREFIX = "imgbuild-verify-"
LABEL = "io.imgbuild.verify.run"
MANIFEST_PATH = "/etc/imgbuild/manifest.json"
KEY_MOUNT = "/run/imgbuild/ssh"
WORKDIR = "/tmp/imgbuild-verify"
PINGPONG_PORT = 47592  # fi_pingpong's default control port (its -B/-P)

SSHD_WAIT_S = 30.0
MPIRUN_TIMEOUT_S = 120.0
PINGPONG_TIMEOUT_S = 60.0
TAIL_LINES = 15

_API_ERRORS: tuple[type[BaseException], ...] = (
    docker.errors.DockerException,
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
)

# Each rank prints one line the host parses; `sys.exit(3)` makes a wrong sum fail mpirun as well.
ALLREDUCE_PY = """\
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
want = size * (size + 1) // 2
print(f"IMGBUILD-ALLREDUCE rank={rank} size={size} host={socket.gethostname()} sum={total} expected={want}",
      flush=True)
sys.exit(0 if total == want else 3)
"""

_ALLREDUCE_RE = re.compile(
    r"^IMGBUILD-ALLREDUCE rank=(\d+) size=(\d+) host=(\S+) sum=(-?\d+) expected=(\d+)\s*$", re.MULTILINE
)
_SSHD_RE = re.compile(r"^SSHD-(READY|DOWN) (\S+) (\d+)(?: (.*))?$", re.MULTILINE)
_PINGPONG_ROW_RE = re.compile(
    r"^\s*(\d+[kmg]?)\s+(\d+[kmg]?)\s+=?(\d+[kmg]?)\s+(\S+)\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
    re.MULTILINE,
)


# --------------------------------------------------------------------------------------------------------
# the image's manifest


def read_manifest(client: docker.DockerClient, image_ref: str) -> dict[str, Any]:
    """The image's /etc/imgbuild/manifest.json (`docker run --rm --entrypoint cat`)."""
    try:
        out = client.containers.run(
            image_ref,
            [MANIFEST_PATH],
            entrypoint=["cat"],
            remove=True,
            stdout=True,
            stderr=False,
            network_mode="none",
        )
    except docker.errors.ImageNotFound as exc:
        raise VerifyError(f"image {image_ref} is not in the engine; build it first (imgbuild build)") from exc
    except docker.errors.ContainerError as exc:
        raise VerifyError(f"{image_ref} has no readable {MANIFEST_PATH}: is it an imgbuild image? ({exc})") from exc
    except _API_ERRORS as exc:
        raise EngineError(f"cannot read {MANIFEST_PATH} from {image_ref}: {exc}") from exc
    try:
        data = json.loads(out)
    except (ValueError, TypeError) as exc:
        raise VerifyError(f"{image_ref}: {MANIFEST_PATH} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise VerifyError(f"{image_ref}: {MANIFEST_PATH} is not a JSON object")
    return data


# --------------------------------------------------------------------------------------------------------
# what the run needs from the manifest


@dataclass(frozen=True)
class Settings:
    """Everything the run takes from the manifest (or, for sections an older image lacks, the recipe)."""

    port: int
    slots: int
    shm_size: str | None
    memlock_unlimited: bool
    env: dict[str, str]
    cap_add: tuple[str, ...]
    ipc_host: bool
    launcher: str
    mca: dict[str, str]
    exclude_interfaces: tuple[str, ...]
    nccl_socket_ifname: str | None
    extra_args: tuple[str, ...]
    python: str
    has_libfabric: bool
    efa: bool

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], resolved: Resolved | None) -> Settings:
        recipe = resolved.recipe if resolved is not None else None

        def section(name: str) -> dict[str, Any]:
            value = manifest.get(name)
            if isinstance(value, dict):
                return value
            if recipe is not None:
                return dict(getattr(recipe, name).model_dump(mode="json"))
            return {}

        comps = manifest.get("components") or {}
        sshd = comps.get("sshd")
        if not sshd or not sshd.get("ports"):
            raise VerifyError("the image has no sshd component (components.sshd.ports): mpirun cannot reach peers")
        runtime, mpirun, platform = section("runtime"), section("mpirun"), section("platform")
        venv = (comps.get("python") or {}).get("venv")
        efa = comps.get("efa") or {}
        return cls(
            port=int(sshd["ports"][0]),
            slots=int(platform.get("devices_per_node") or 1),
            shm_size=runtime.get("shm_size"),
            memlock_unlimited=bool(runtime.get("memlock_unlimited", True)),
            env={str(k): str(v) for k, v in (runtime.get("env") or {}).items()},
            cap_add=tuple(runtime.get("cap_add") or ()),
            ipc_host=runtime.get("ipc") == "host",
            launcher=str(mpirun.get("launcher") or "mpirun"),
            mca={str(k): str(v) for k, v in (mpirun.get("mca") or {}).items()},
            exclude_interfaces=tuple(mpirun.get("exclude_interfaces") or ()),
            nccl_socket_ifname=mpirun.get("nccl_socket_ifname"),
            extra_args=tuple(mpirun.get("extra_args") or ()),
            python=f"{venv}/bin/python" if venv else "python3",
            has_libfabric="libfabric" in comps or "efa" in comps,
            efa=efa.get("source") == "installer" and not efa.get("minimal") and bool(runtime.get("efa_devices")),
        )

    def mpirun_argv(self, hostfile: str, ranks: int, python: str, script: str) -> list[str]:
        """The launcher's command line: the recipe's mca settings, interface exclusions and extra args."""
        argv = [self.launcher, *self.extra_args, "--hostfile", hostfile, "-np", str(ranks)]
        for key, value in sorted(self.mca.items()):
            argv += ["--mca", key, value]
        if self.exclude_interfaces:
            excluded = ",".join(self.exclude_interfaces)
            for key in ("btl_tcp_if_exclude", "oob_tcp_if_exclude"):
                if key not in self.mca:
                    argv += ["--mca", key, excluded]
        if self.nccl_socket_ifname:
            argv += ["-x", f"NCCL_SOCKET_IFNAME={self.nccl_socket_ifname}"]
        return [*argv, python, script]


# --------------------------------------------------------------------------------------------------------
# the run


@dataclass
class _Exec:
    rc: int | None  # None: the host gave up waiting
    output: str
    duration_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc in (None, 124, 137)

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


@dataclass
class _Node:
    name: str  # node-K: hostname and network alias
    container: Any  # docker.models.containers.Container


@dataclass
class _Run:
    client: docker.DockerClient
    image_ref: str
    settings: Settings
    nodes: int
    deadline: float
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    members: list[_Node] = field(default_factory=list)
    key_dir: Path | None = None
    network: Any = None

    @property
    def prefix(self) -> str:
        return f"{NAME_PREFIX}{self.run_id}"

    def left(self, cap: float) -> float:
        return max(1.0, min(cap, self.deadline - time.monotonic()))

    # ---- setup

    def make_keys(self) -> None:
        self.key_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-keys-"))
        _keypair(self.key_dir, comment=f"imgbuild-verify-{self.run_id}")

    def start(self) -> list[CheckResult]:
        """Network and containers; a result for each node that did not come up."""
        self.network = self.client.networks.create(
            self.prefix, driver="bridge", internal=True, labels={LABEL: self.run_id}
        )
        memlock = self.settings.memlock_unlimited
        first = self._create(1, memlock=memlock)
        try:
            first.container.start()
        except docker.errors.APIError as exc:
            if not (memlock and "rlimit" in str(exc)):
                raise
            # The engine's host caps memlock below "unlimited" and the engine can't raise it (rootless, or no
            # CAP_SYS_RESOURCE): go on without, and say so. The tcp provider doesn't need locked memory.
            m = re.search(r"error setting rlimit[^\"()]*", str(exc))
            why = m.group(0).strip() if m else _last_line(str(exc))
            self.notes.append(f"the engine refused memlock=unlimited ({why}): ran with its host's default limit")
            memlock = False
            self._remove_containers()
            first = self._create(1, memlock=False)
            first.container.start()
        rest = [self._create(k, memlock=memlock) for k in range(2, self.nodes + 1)]
        if rest:
            with ThreadPoolExecutor(max_workers=min(8, len(rest))) as pool:
                list(pool.map(lambda n: n.container.start(), rest))
        failed = []
        for node in self.members:
            node.container.reload()
            if node.container.status != "running":
                code = node.container.attrs.get("State", {}).get("ExitCode")
                failed.append(
                    CheckResult(
                        name="multinode: container",
                        status="fail",
                        expected="running",
                        found=f"{node.container.status} (exit code {code})",
                        reason=f"{node.name} stopped right after start:\n{self.logs(node)}",
                        node=node.name,
                    )
                )
        return failed

    def _create(self, k: int, *, memlock: bool) -> _Node:
        """Create (not start) node-K, with the run's files copied in."""
        assert self.key_dir is not None and self.network is not None
        s = self.settings
        options: dict[str, Any] = {
            "init": True,  # sshd daemonizes: something must reap its children
            "cap_add": list(s.cap_add) or None,
            "environment": s.env,
            "labels": {LABEL: self.run_id},
        }
        if s.ipc_host:
            options["ipc_mode"] = "host"
        elif s.shm_size:
            options["shm_size"] = s.shm_size
        if memlock:
            options["ulimits"] = [docker.types.Ulimit(name="memlock", soft=-1, hard=-1)]
        devices = sorted(glob.glob("/dev/infiniband/uverbs*")) if s.efa else []
        if devices:
            options["devices"] = [f"{d}:{d}" for d in devices]
        local = _engine_is_local(self.client)
        if local:
            options["volumes"] = {str(self.key_dir): {"bind": KEY_MOUNT, "mode": "ro"}}
        name = f"node-{k}"
        container = self.client.containers.create(
            self.image_ref,
            ["sleep", "infinity"],
            name=f"{self.prefix}-{name}",
            hostname=name,
            network=self.network.name,
            networking_config={self.network.name: self.client.api.create_endpoint_config(aliases=[name])},
            **options,
        )
        node = _Node(name, container)
        self.members.append(node)
        files = {"allreduce.py": (ALLREDUCE_PY.encode(), 0o644), "hostfile": (self.hostfile().encode(), 0o644)}
        if not local:
            # A remote engine can't see this machine's folders: copy the run's keys into the container instead
            # (its writable layer, removed with it).
            files |= {
                f"{KEY_MOUNT}/{p.name}": (p.read_bytes(), p.stat().st_mode & 0o777)
                for p in sorted(self.key_dir.iterdir())
            }
        container.put_archive("/", _tar(files, base=WORKDIR))
        return node

    def hostfile(self) -> str:
        return "".join(f"node-{k} slots={self.settings.slots}\n" for k in range(1, self.nodes + 1))

    # ---- commands in containers

    def spawn(self, node: _Node, script: str, *, timeout_s: float, label: str) -> str:
        """Start `script` in the background inside node's container; output goes to WORKDIR/label.out."""
        limit = max(1, math.ceil(timeout_s))
        wrapped = f"timeout -k 5 {limit} bash -c {shlex.quote(script)} >{WORKDIR}/{label}.out 2>&1"
        exec_id = str(self.client.api.exec_create(node.container.id, ["bash", "-c", wrapped])["Id"])
        self.client.api.exec_start(exec_id, detach=True)
        return exec_id

    def wait(self, node: _Node, exec_id: str, *, timeout_s: float, label: str, started: float) -> _Exec:
        """Poll the exec until it ends (or the host's own limit, a little past the in-container one)."""
        give_up = started + math.ceil(timeout_s) + 10
        pause = 0.02
        rc: int | None = None
        while True:
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running"):
                rc = int(info.get("ExitCode") or 0)
                break
            if time.monotonic() >= give_up:
                break
            time.sleep(pause)
            pause = min(0.25, pause * 1.5)
        duration = time.monotonic() - started
        return _Exec(rc, self.read(node, f"{WORKDIR}/{label}.out"), duration)

    def run(self, node: _Node, script: str, *, timeout_s: float, label: str) -> _Exec:
        started = time.monotonic()
        exec_id = self.spawn(node, script, timeout_s=timeout_s, label=label)
        return self.wait(node, exec_id, timeout_s=timeout_s, label=label, started=started)

    def read(self, node: _Node, path: str) -> str:
        with contextlib.suppress(*_API_ERRORS):
            _, out = node.container.exec_run(["cat", path])
            return bytes(out or b"").decode(errors="replace")
        return ""

    def logs(self, node: _Node, lines: int = TAIL_LINES) -> str:
        with contextlib.suppress(*_API_ERRORS):
            return bytes(node.container.logs(tail=lines)).decode(errors="replace").rstrip() or "(no output)"
        return "(logs unavailable)"

    # ---- teardown

    def _remove_containers(self) -> None:
        for m in self.members:
            with contextlib.suppress(*_API_ERRORS):
                m.container.remove(force=True, v=True)
        self.members = []

    def cleanup(self) -> list[str]:
        """Remove everything this run made; returns what could not be removed."""
        left = []
        self._remove_containers()
        with contextlib.suppress(*_API_ERRORS):
            # Also whatever a lost response left behind: everything carrying this run's label.
            for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.run_id}"}):
                try:
                    c.remove(force=True, v=True)
                except _API_ERRORS:
                    left.append(f"container {c.name}")
        with contextlib.suppress(*_API_ERRORS):
            for n in self.client.networks.list(filters={"label": f"{LABEL}={self.run_id}"}):
                try:
                    n.remove()
                except _API_ERRORS:
                    left.append(f"network {n.name}")
        if self.key_dir is not None:
            shutil.rmtree(self.key_dir, ignore_errors=True)
            if self.key_dir.exists():
                left.append(f"key folder {self.key_dir}")
        return left


# --------------------------------------------------------------------------------------------------------
# the checks


def _sshd_check(run: _Run, wait_s: float) -> list[CheckResult]:
    """From node-1, `ssh -p PORT node-K true` for every node in parallel, until it answers or wait_s passes."""
    port = run.settings.port
    hosts = " ".join(m.name for m in run.members)
    limit_ms = int(wait_s * 1000)
    script = f"""
check() {{
    local h=$1 start now err
    start=$(date +%s%3N)
    while :; do
        if err=$(ssh -p {port} -o BatchMode=yes -o ConnectTimeout=3 "$h" true 2>&1 </dev/null); then
            echo "SSHD-READY $h $(( $(date +%s%3N) - start ))"; return
        fi
        now=$(date +%s%3N)
        if (( now - start >= {limit_ms} )); then
            echo "SSHD-DOWN $h $(( now - start )) $(printf '%s' "$err" | tr -d '\\r' | tail -n1)"; return
        fi
        sleep 0.2
    done
}}
for h in {hosts}; do check "$h" & done
wait
"""
    res = run.run(run.members[0], script, timeout_s=wait_s + 10, label="sshd")
    run.timings["sshd_ready_s"] = round(res.duration_s, 3)
    seen = {m.group(2): m for m in _SSHD_RE.finditer(res.output)}
    results = []
    for node in run.members:
        m = seen.get(node.name)
        expected = f"ssh -p {port} {node.name} true answers from node-1 within {wait_s:g} s"
        if m and m.group(1) == "READY":
            results.append(
                CheckResult(
                    name="multinode: sshd",
                    status="pass",
                    expected=expected,
                    found=f"answered on port {port} after {int(m.group(3)) / 1000:.1f} s",
                    node=node.name,
                    duration_s=int(m.group(3)) / 1000,
                    details={"port": port},
                )
            )
            continue
        last = (m.group(4) or "").strip() if m else ""
        why = f"last ssh error: {last}" if last else f"node-1's check said nothing (exit {res.rc}): {res.tail()}"
        results.append(
            CheckResult(
                name="multinode: sshd",
                status="fail",
                expected=expected,
                found="no answer",
                reason=f"sshd on port {port} of {node.name} didn't answer within {wait_s:g} s ({why})\n"
                f"{_sshd_state(run, node)}\n{node.name} container log:\n{run.logs(node)}",
                node=node.name,
                duration_s=int(m.group(3)) / 1000 if m else res.duration_s,
                details={"port": port, "last_error": last},
            )
        )
    return results


def _sshd_state(run: _Run, node: _Node) -> str:
    """Whether an sshd process runs on node, and the end of its log: what a user needs to see first."""
    res = run.run(
        node,
        "if grep -qx sshd /proc/[0-9]*/comm 2>/dev/null; then echo 'an sshd process is running';"
        " else echo 'no sshd process is running'; fi\n"
        "tail -n 5 /var/log/imgbuild-sshd.log 2>/dev/null | sed 's/^/sshd log: /'",
        timeout_s=10,
        label="sshd-state",
    )
    return f"on {node.name}: {res.output.strip() or f'(no answer, exit {res.rc})'}"


def _allreduce(run: _Run, *, sshd_down: list[str]) -> list[CheckResult]:
    """mpirun from node-1 across all nodes: one result per node and one overall."""
    s, n = run.settings, run.nodes
    ranks = n * s.slots
    want = ranks * (ranks + 1) // 2
    overall_name = f"multinode: mpirun allreduce ({n} nodes)"
    expected = f"{ranks} ranks on {n} nodes, each reporting sum == {want}"
    if sshd_down:
        why = f"sshd not answering on {', '.join(sshd_down)}"
        return [
            *(CheckResult("multinode: allreduce", "skip", reason=why, node=m.name) for m in run.members),
            CheckResult(overall_name, "fail", expected=expected, found="not run", reason=f"mpirun not started: {why}"),
        ]
    argv = s.mpirun_argv(f"{WORKDIR}/hostfile", ranks, "$py", f"{WORKDIR}/allreduce.py")
    # The python is chosen inside the image: the venv's when it exists, else python3.
    command = " ".join('"$py"' if a == "$py" else shlex.quote(a) for a in argv)
    script = f'cd {WORKDIR}\npy={shlex.quote(s.python)}\n[ -x "$py" ] || py=python3\nexec {command}'
    limit = run.left(MPIRUN_TIMEOUT_S)
    res = run.run(run.members[0], script, timeout_s=limit, label="mpirun")
    run.timings["mpirun_s"] = round(res.duration_s, 3)
    printed = command.replace('"$py"', s.python)
    lines = [
        (int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5)))
        for m in _ALLREDUCE_RE.finditer(res.output)
    ]
    results = []
    for node in run.members:
        mine = [ln for ln in lines if ln[2] == node.name]
        good = [ln for ln in mine if ln[1] == ranks and ln[3] == want]
        node_expected = f"{s.slots} rank(s) on {node.name} report sum == {want}"
        found = ", ".join(f"rank {r}: sum {got}" for r, _, _, got, _ in sorted(mine)) or "no output"
        if len(good) == s.slots and len(mine) == s.slots:
            results.append(CheckResult("multinode: allreduce", "pass", node_expected, found, node=node.name))
        else:
            why = "a wrong sum" if mine else f"no allreduce line from {node.name}"
            results.append(
                CheckResult(
                    "multinode: allreduce",
                    "fail",
                    node_expected,
                    found,
                    reason=f"{why} (mpirun exit {res.rc})",
                    node=node.name,
                )
            )
    ok = res.rc == 0 and all(r.status == "pass" for r in results)
    if ok:
        found, reason = f"sum {want} on all {ranks} ranks in {res.duration_s:.1f} s", ""
    elif res.timed_out:
        found = "timed out"
        reason = f"mpirun did not finish within {math.ceil(limit)} s and was killed; last lines:\n{res.tail()}"
    else:
        found = f"exit {res.rc}, {len(lines)}/{ranks} ranks reported"
        reason = f"mpirun failed (exit {res.rc}); last lines:\n{res.tail()}"
    results.append(
        CheckResult(
            overall_name,
            "pass" if ok else "fail",
            expected,
            found,
            reason=reason,
            duration_s=res.duration_s,
            details={"command": printed, "hostfile": run.hostfile(), "exit_code": res.rc},
        )
    )
    return results


def _pingpong(run: _Run) -> CheckResult:
    """fi_pingpong: server on node-1 in the background, client on node-2; pass when the client completes."""
    name = "multinode: fi_pingpong"
    if run.nodes < 2:
        return CheckResult(name, "skip", reason="needs 2 nodes or more")
    if not run.settings.has_libfabric:
        return CheckResult(name, "skip", reason="the image has no libfabric (no libfabric or efa component)")
    server, client = run.members[0], run.members[1]
    provider, endpoint = "tcp", "msg"  # tcp has no dgram endpoint (fi_pingpong's default)
    if run.settings.efa:
        probe = run.run(server, "ls /dev/infiniband/uverbs* >/dev/null 2>&1", timeout_s=10, label="efa-devices")
        if probe.rc == 0:
            provider, endpoint = "efa", "rdm"
        else:
            run.notes.append("the image has EFA but the host has no /dev/infiniband/uverbs*: fi_pingpong over tcp")
    args = f"-p {provider} -e {endpoint}"
    limit = run.left(PINGPONG_TIMEOUT_S)
    started = time.monotonic()
    server_id = run.spawn(server, f"exec fi_pingpong {args}", timeout_s=limit, label="pingpong-server")
    hex_port = f"{PINGPONG_PORT:04X}"
    # Wait for the server's control socket (LISTEN is state 0A in /proc/net/tcp*) so the client can't race it.
    listening = run.run(
        server,
        f"for i in $(seq 200); do grep -qE ':{hex_port} [0-9A-F]+:[0-9A-F]+ 0A' /proc/net/tcp /proc/net/tcp6 "
        "2>/dev/null && exit 0; sleep 0.05; done; exit 1",
        timeout_s=15,
        label="pingpong-listen",
    )
    expected = f"fi_pingpong {args} completes between node-1 and node-2"
    if listening.rc != 0:
        srv = run.wait(server, server_id, timeout_s=1, label="pingpong-server", started=started)
        run.timings["pingpong_s"] = round(time.monotonic() - started, 3)
        reason = f"fi_pingpong server on node-1 never listened on port {PINGPONG_PORT} (exit {srv.rc}):\n{srv.tail()}"
        return CheckResult(name, "fail", expected, "no server", reason=reason, node="node-1,node-2")
    res = run.run(client, f"exec fi_pingpong {args} {server.name}", timeout_s=limit, label="pingpong-client")
    srv = run.wait(server, server_id, timeout_s=10 if res.rc == 0 else 1, label="pingpong-server", started=started)
    duration = time.monotonic() - started
    run.timings["pingpong_s"] = round(duration, 3)
    rows = [
        {
            "bytes": m.group(1),
            "iterations": m.group(2),
            "total": m.group(4),
            "time_s": float(m.group(5)),
            "mb_per_s": float(m.group(6)),
            "usec_per_xfer": float(m.group(7)),
        }
        for m in _PINGPONG_ROW_RE.finditer(res.output)
    ]
    details: dict[str, Any] = {"provider": provider, "endpoint": endpoint, "rows": rows, "exit_code": res.rc}
    if res.rc == 0 and rows:
        first, last = rows[0], rows[-1]
        found = (
            f"{provider}: {first['bytes']} B {first['usec_per_xfer']:g} us/xfer, "
            f"{last['bytes']} B {last['mb_per_s']:g} MB/s"
        )
        return CheckResult(name, "pass", expected, found, node="node-1,node-2", duration_s=duration, details=details)
    if res.timed_out:
        reason = f"fi_pingpong client did not finish within {math.ceil(limit)} s:\n{res.tail()}"
    else:
        reason = (
            f"fi_pingpong client on node-2 failed (exit {res.rc}):\n{res.tail()}\n"
            f"server on node-1 (exit {srv.rc}):\n{srv.tail()}"
        )
    return CheckResult(
        name,
        "fail",
        expected,
        f"exit {res.rc}, {len(rows)} rows",
        reason=reason,
        node="node-1,node-2",
        duration_s=duration,
        details=details,
    )


# --------------------------------------------------------------------------------------------------------
# entry point


def run_multinode(
    image_ref: str,
    manifest: dict[str, Any],
    resolved: Resolved | None,
    nodes: int,
    *,
    client: docker.DockerClient | None = None,
    timeout_s: float = 180,
    sshd_wait_s: float = SSHD_WAIT_S,
    stop_sshd_on: str | None = None,
) -> list[CheckResult]:
    """Start `nodes` containers of image_ref on a private network and check MPI and libfabric across them.

    manifest: the image's /etc/imgbuild/manifest.json (`read_manifest`); its `mpirun`, `runtime`, `platform`
    and `components.sshd` sections drive the run (resolved's recipe fills sections an older image lacks).
    timeout_s bounds the whole check; sshd_wait_s how long node-1 waits for each node's sshd.
    stop_sshd_on: a node name (node-2) whose sshd is killed right after start, to test the failure path.

    Returns per-node results (sshd, allreduce), overall ones (mpirun allreduce, fi_pingpong) and a last
    "multinode: timings" result whose details hold the seconds spent in each phase. Containers, network and
    keys are removed before it returns, also on errors; Ctrl-C raises `Interrupted` after cleaning up.
    """
    if nodes < 1:
        raise VerifyError(f"--nodes must be 1 or more, got {nodes}")
    settings = Settings.from_manifest(manifest, resolved)
    own_client = client is None
    if client is None:
        client = engine.connect()
    began = time.monotonic()
    run = _Run(client, image_ref, settings, nodes, deadline=began + timeout_s)
    results: list[CheckResult] = []
    try:
        _checks(run, results, sshd_wait_s=sshd_wait_s, stop_sshd_on=stop_sshd_on)
    except _API_ERRORS as exc:
        # Mid-run engine trouble (a container gone, the socket closed): a failure naming it, after what passed.
        reason = f"the engine failed mid-run: {_last_line(str(exc))}"
        results.append(CheckResult("multinode: engine", "fail", "the engine answers", "an error", reason=reason))
    except KeyboardInterrupt:
        # The finally below removes everything before this propagates.
        raise Interrupted("multinode check interrupted; its containers, network and keys were removed") from None
    finally:
        t1 = time.monotonic()
        with sigint_deferred("the multi-node check's containers"):
            leftovers = run.cleanup()
        run.timings["cleanup_s"] = round(time.monotonic() - t1, 3)
        run.timings["total_s"] = round(time.monotonic() - began, 3)
        if own_client:
            client.close()
    results += [CheckResult("multinode: note", "skip", reason=note) for note in run.notes]
    if leftovers:
        results.append(
            CheckResult(
                "multinode: cleanup",
                "fail",
                "containers, network and keys removed",
                ", ".join(leftovers),
                reason=f"could not remove: {', '.join(leftovers)} (labelled {LABEL}={run.run_id})",
            )
        )
    results.append(_timings_result(run))
    return results


def _checks(run: _Run, results: list[CheckResult], *, sshd_wait_s: float, stop_sshd_on: str | None) -> None:
    """The run's phases in order; each appends its results as it ends."""
    run.make_keys()
    t0 = time.monotonic()
    expected = f"{run.nodes} containers of {run.image_ref} running"
    try:
        failed = run.start()
    except _API_ERRORS as exc:
        reason = f"the engine refused: {_last_line(str(exc))}"
        failed = [CheckResult("multinode: containers", "fail", expected, "not started", reason=reason)]
    run.timings["container_start_s"] = round(time.monotonic() - t0, 3)
    if failed:
        results += failed
        return
    results.append(
        CheckResult(
            "multinode: containers",
            "pass",
            expected,
            f"{run.nodes} running on network {run.prefix}",
            duration_s=run.timings["container_start_s"],
            details={"network": run.prefix, "containers": [m.container.name for m in run.members]},
        )
    )
    if stop_sshd_on is not None:
        _stop_sshd(run, stop_sshd_on)
    sshd = _sshd_check(run, min(sshd_wait_s, run.left(sshd_wait_s)))
    results += sshd
    results += _allreduce(run, sshd_down=[r.node for r in sshd if r.status != "pass"])
    results.append(_pingpong(run))


def _timings_result(run: _Run) -> CheckResult:
    t = run.timings
    order = ("container_start_s", "sshd_ready_s", "mpirun_s", "pingpong_s", "cleanup_s", "total_s")
    found = ", ".join(f"{k.removesuffix('_s')} {t[k]:.1f} s" for k in order if k in t)
    return CheckResult(
        "multinode: timings",
        "pass",
        found=found,
        duration_s=t.get("total_s", 0.0),
        details={**t, "nodes": run.nodes, "run": run.prefix, "notes": list(run.notes)},
    )


def _stop_sshd(run: _Run, node_name: str) -> None:
    """Test hook: kill sshd on one node once the entrypoint has started it."""
    node = next((m for m in run.members if m.name == node_name), None)
    if node is None:
        raise VerifyError(f"stop_sshd_on={node_name!r}: no such node (node-1..node-{run.nodes})")
    run.run(
        node,
        'for i in $(seq 100); do [ -s /run/sshd.pid ] && break; sleep 0.1; done; kill "$(cat /run/sshd.pid)"',
        timeout_s=15,
        label="stop-sshd",
    )


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


def _tar(files: dict[str, tuple[bytes, int]], *, base: str) -> bytes:
    """A tar of files (relative names go under base, absolute ones stay), for put_archive at /."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(Path(p if p.startswith("/") else f"{base}/{p}").parent) for p in files})
        for d in dirs:
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755 if d == base else 0o700
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            full = path if path.startswith("/") else f"{base}/{path}"
            info = tarfile.TarInfo(full.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _engine_is_local(client: docker.DockerClient) -> bool:
    """Whether the engine sees this machine's folders (a local socket), so the key folder can be bind-mounted."""
    base = str(getattr(client.api, "base_url", ""))
    return base in ("http+docker://localhost", "http+docker://localunixsocket", "http+docker://localnpipe")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text
