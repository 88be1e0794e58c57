"""`imgbuild verify RECIPE --nodes N`: N containers of an image on a private network, talking MPI over ssh.

Everything comes from the image's manifest (manifest.py): the run profile (runprofile.py), the mpirun line
(launch.py, the very line the image's SageMaker `train` runs), sshd's port, the slots per host and the Python.
What a run does, and what it leaves behind (nothing):

1. a fresh ed25519 key pair made for this run only, in a temporary folder that is bind-mounted read-only at
   /run/imgbuild/ssh in every container (the entrypoint installs it); the folder is removed at the end and the
   private key never enters an image or a log;
2. a private bridge network `imgbuild-verify-<run>` (internal: no way out) and containers
   `imgbuild-verify-<run>-node-K` with hostname and network alias `node-K`, started with the image's run
   profile (on the run's network, not the host's) and `sleep infinity` after the image's entrypoint;
3. from node-1, `ssh -p PORT node-K true` until every node's sshd answers (bounded);
4. the image's mpirun line across all nodes, running a small mpi4py allreduce in which rank r contributes r+1
   and every rank checks the sum is n(n+1)/2, and prints every variable of the image's ENV (and the run
   profile's) as it sees it: they must all be what the image sets, on every rank of every node;
5. from node-1, `ssh node-K env` for every node: a plain ssh session (what a rank started over ssh without
   mpirun's `-x` gets) must see the image's ENV as well;
6. fi_pingpong between node-1 (server) and node-2 (client) over libfabric's tcp provider (efa where the image
   has the EFA installer and the host has EFA devices), reporting the latency and bandwidth table.

Containers, network and key folder are removed in a `finally`, also on errors and Ctrl-C (containers.py).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from imgbuild import engine
from imgbuild.containers import LABEL, Containers, Exec
from imgbuild.engine import ENGINE_ERRORS
from imgbuild.errors import Interrupted, VerifyError
from imgbuild.interrupts import sigint_deferred
from imgbuild.launch import Launch, for_manifest
from imgbuild.manifest import Manifest
from imgbuild.report import CheckResult
from imgbuild.runprofile import RunSpec, for_engine, host_efa_devices, run_spec

__all__ = ["KEY_MOUNT", "WORKDIR", "mpirun_argv", "run_multinode"]

KEY_MOUNT = "/run/imgbuild/ssh"
WORKDIR = "/tmp/imgbuild-verify"
HOSTFILE = f"{WORKDIR}/hostfile"
PROGRAM = f"{WORKDIR}/allreduce.py"
ENV_NAMES = f"{WORKDIR}/env-names.json"
PINGPONG_PORT = 47592  # fi_pingpong's default control port (its -B/-P)

SSHD_WAIT_S = 30.0
MPIRUN_TIMEOUT_S = 120.0
PINGPONG_TIMEOUT_S = 60.0

# Each rank prints one line the host parses, and its view of the variables named in argv[1] (a JSON list);
# `sys.exit(3)` makes a wrong sum fail mpirun as well.
ALLREDUCE_PY = """\
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
sys.exit(0 if total == want else 3)
"""

_ALLREDUCE_RE = re.compile(
    r"^IMGBUILD-ALLREDUCE rank=(\d+) size=(\d+) host=(\S+) sum=(-?\d+) expected=(\d+)\s*$", re.MULTILINE
)
_ENV_RE = re.compile(r"^IMGBUILD-ENV rank=(\d+) host=(\S+) (\{.*\})\s*$", re.MULTILINE)
_SSHD_RE = re.compile(r"^SSHD-(READY|DOWN) (\S+) (\d+)(?: (.*))?$", re.MULTILINE)
_PINGPONG_ROW_RE = re.compile(
    r"^\s*(\d+[kmg]?)\s+(\d+[kmg]?)\s+=?(\d+[kmg]?)\s+(\S+)\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
    re.MULTILINE,
)


def mpirun_argv(manifest: Manifest, *, hostfile: str, ranks: int, program: list[str], wdir: str) -> list[str]:
    """The mpirun command this check runs: the image's launch line (`train` renders the same one)."""
    return for_manifest(manifest).mpirun_argv(hostfile=hostfile, np=ranks, program=program, wdir=wdir)


# --------------------------------------------------------------------------------------------------------
# the run


@dataclass
class _Node:
    name: str  # node-K: hostname and network alias
    container: Any  # docker.models.containers.Container


@dataclass
class _Run:
    containers: Containers
    image_ref: str
    manifest: Manifest
    spec: RunSpec
    image_env: dict[str, str]  # what every rank and ssh session must see: the image's ENV and the profile's env
    nodes: int
    deadline: float
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    members: list[_Node] = field(default_factory=list)
    key_dir: Path | None = None

    @property
    def prefix(self) -> str:
        return self.containers.prefix

    @property
    def launch(self) -> Launch:
        return for_manifest(self.manifest)

    @property
    def port(self) -> int:
        return self.manifest.ssh_ports[0]

    def left(self, cap: float) -> float:
        return max(1.0, min(cap, self.deadline - time.monotonic()))

    def hostfile(self) -> str:
        return "".join(f"node-{k} slots={self.manifest.slots}\n" for k in range(1, self.nodes + 1))

    def run(self, node: _Node, script: str, *, timeout_s: float, label: str) -> Exec:
        return self.containers.exec(node.container, script, timeout_s=timeout_s, label=label)

    # ---- setup

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
        failed = []
        for node in sorted(self.members, key=lambda m: int(m.name.split("-")[1])):
            node.container.reload()
            if node.container.status != "running":
                code = node.container.attrs.get("State", {}).get("ExitCode")
                failed.append(
                    CheckResult(
                        name="multinode: container",
                        status="fail",
                        expected="running",
                        found=f"{node.container.status} (exit code {code})",
                        reason=f"{node.name} stopped right after start:\n{self.containers.logs(node.container)}",
                        node=node.name,
                    )
                )
        return failed

    def _start_node(self, k: int, network: str) -> RunSpec:
        """Start node-K with the run's files copied in; the spec it started with (memlock may be dropped)."""
        assert self.key_dir is not None
        name = f"node-{k}"
        files = {
            PROGRAM: (ALLREDUCE_PY.encode(), 0o644),
            HOSTFILE: (self.hostfile().encode(), 0o644),
            ENV_NAMES: (json.dumps(sorted(self.image_env)).encode(), 0o644),
        }
        options: dict[str, Any] = {
            "init": True,  # sshd daemonizes: something must reap its children
            "hostname": name,
            "network": network,
            "networking_config": {network: self.containers.client.api.create_endpoint_config(aliases=[name])},
        }
        client = self.containers.client
        dirs = {}
        if _engine_is_local(client):
            options["volumes"] = {str(self.key_dir): {"bind": KEY_MOUNT, "mode": "ro"}}
        else:
            dirs[KEY_MOUNT] = 0o700
            # A remote engine can't see this machine's folders: copy the run's keys into the container instead
            # (its writable layer, removed with it).
            files |= {
                f"{KEY_MOUNT}/{p.name}": (p.read_bytes(), p.stat().st_mode & 0o777)
                for p in sorted(self.key_dir.iterdir())
            }
        container, spec, note = self.containers.start(
            self.image_ref, ["sleep", "infinity"], name, self.spec, files=files, dirs=dirs, **options
        )
        if note:
            self.notes.append(note)
        self.members.append(_Node(name, container))
        return spec

    def cleanup(self) -> list[str]:
        """Remove everything this run made; returns what could not be removed."""
        left = self.containers.remove_all()
        if self.key_dir is not None:
            shutil.rmtree(self.key_dir, ignore_errors=True)
            if self.key_dir.exists():
                left.append(f"key folder {self.key_dir}")
        return left


# --------------------------------------------------------------------------------------------------------
# the checks


def _sshd_check(run: _Run, wait_s: float) -> list[CheckResult]:
    """From node-1, `ssh -p PORT node-K true` for every node in parallel, until it answers or wait_s passes."""
    port = run.port
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
                f"{_sshd_state(run, node)}\n{node.name} container log:\n{run.containers.logs(node.container)}",
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
    """The image's mpirun line from node-1 across all nodes: one result per node, one overall, and the ranks'
    environment."""
    n, slots = run.nodes, run.manifest.slots
    ranks = n * slots
    want = ranks * (ranks + 1) // 2
    overall_name = f"multinode: mpirun allreduce ({n} nodes)"
    expected = f"{ranks} ranks on {n} nodes, each reporting sum == {want}"
    if sshd_down:
        why = f"sshd not answering on {', '.join(sshd_down)}"
        return [
            *(CheckResult("multinode: allreduce", "skip", reason=why, node=m.name) for m in run.members),
            CheckResult(overall_name, "fail", expected=expected, found="not run", reason=f"mpirun not started: {why}"),
            CheckResult("multinode: rank environment", "skip", reason=why),
        ]
    argv = mpirun_argv(
        run.manifest, hostfile=HOSTFILE, ranks=ranks, program=[run.manifest.python, PROGRAM, ENV_NAMES], wdir=WORKDIR
    )
    script = f"{run.launch.shell_defaults()}exec {shlex.join(argv)}"
    limit = run.left(MPIRUN_TIMEOUT_S)
    res = run.run(run.members[0], script, timeout_s=limit, label="mpirun")
    run.timings["mpirun_s"] = round(res.duration_s, 3)
    lines = [
        (int(m.group(1)), int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5)))
        for m in _ALLREDUCE_RE.finditer(res.output)
    ]
    results = []
    for node in run.members:
        mine = [ln for ln in lines if ln[2] == node.name]
        good = [ln for ln in mine if ln[1] == ranks and ln[3] == want]
        node_expected = f"{slots} rank(s) on {node.name} report sum == {want}"
        found = ", ".join(f"rank {r}: sum {got}" for r, _, _, got, _ in sorted(mine)) or "no output"
        if len(good) == slots and len(mine) == slots:
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
            details={"command": shlex.join(argv), "argv": argv, "hostfile": run.hostfile(), "exit_code": res.rc},
        )
    )
    seen = {
        (m.group(2), int(m.group(1))): json.loads(m.group(3)) for m in _ENV_RE.finditer(res.output)
    }  # (host, rank) -> {name: value}
    results.append(_env_result(run, "multinode: rank environment", "every rank, launched by the image's mpirun "
                               "line", {f"{host} rank {rank}": env for (host, rank), env in sorted(seen.items())},
                               expected_count=ranks))  # fmt: skip
    return results


def _ssh_env(run: _Run) -> CheckResult:
    """From node-1, `ssh node-K env` for every node: plain ssh sessions see the image's ENV too."""
    begin, end = "IMGBUILD-SSHENV-BEGIN", "IMGBUILD-SSHENV-END"
    script = "".join(
        f"echo {begin} {m.name}; ssh -p {run.port} -o BatchMode=yes -o ConnectTimeout=5 {m.name} env </dev/null; "
        f"echo {end} {m.name}\n"
        for m in run.members
    )
    res = run.run(run.members[0], script, timeout_s=run.left(30), label="ssh-env")
    sessions: dict[str, dict[str, str | None]] = {}
    for m in re.finditer(rf"^{begin} (\S+)\n(.*?)^{end} \1$", res.output, re.MULTILINE | re.DOTALL):
        have = dict(line.split("=", 1) for line in m.group(2).splitlines() if "=" in line)
        sessions[f"ssh {m.group(1)}"] = {name: have.get(name) for name in run.image_env}
    return _env_result(run, "multinode: ssh environment", "an ssh session on every node", sessions,
                       expected_count=run.nodes, output=res)  # fmt: skip


def _env_result(
    run: _Run,
    name: str,
    who: str,
    seen: dict[str, dict[str, str | None]],
    *,
    expected_count: int,
    output: Exec | None = None,
) -> CheckResult:
    """Every one of `seen` (who -> its variables) sees each variable exactly as the image sets it."""
    want = run.image_env
    expected = f"{who} sees the image's {len(want)} variables ({', '.join(sorted(want))}) as the image sets them"
    wrong = [
        f"{where}: {var}={value if value is not None else '(unset)'}"
        for where, env in seen.items()
        for var, value in sorted(env.items())
        if value != want[var]
    ]
    missing = expected_count - len(seen)
    details = {"expected": want, "seen": seen}
    if not wrong and not missing:
        return CheckResult(name, "pass", expected, f"{len(seen)} of {expected_count}: all equal", details=details)
    reason = "; ".join(wrong[:8]) + (f" (+{len(wrong) - 8} more)" if len(wrong) > 8 else "")
    if missing:
        tail = f": {output.tail()}" if output is not None else ""
        reason = "; ".join(x for x in (reason, f"{missing} of {expected_count} reported nothing{tail}") if x)
    return CheckResult(name, "fail", expected, f"{len(wrong)} difference(s)", reason=reason, details=details)


def _pingpong(run: _Run) -> CheckResult:
    """fi_pingpong: server on node-1 in the background, client on node-2; pass when the client completes."""
    name = "multinode: fi_pingpong"
    if run.nodes < 2:
        return CheckResult(name, "skip", reason="needs 2 nodes or more")
    comps = run.manifest.components
    if "libfabric" not in comps and "efa" not in comps:
        return CheckResult(name, "skip", reason="the image has no libfabric (no libfabric or efa component)")
    server, client = run.members[0], run.members[1]
    provider, endpoint = "tcp", "msg"  # tcp has no dgram endpoint (fi_pingpong's default)
    efa = comps.get("efa")
    if efa is not None and efa.source == "installer" and run.manifest.runtime.efa_devices:
        probe = run.run(server, "ls /dev/infiniband/uverbs* >/dev/null 2>&1", timeout_s=10, label="efa-devices")
        if probe.rc == 0:
            provider, endpoint = "efa", "rdm"
        else:
            run.notes.append("the image has EFA but the host has no /dev/infiniband/uverbs*: fi_pingpong over tcp")
    args = f"-p {provider} -e {endpoint}"
    limit = run.left(PINGPONG_TIMEOUT_S)
    started = time.monotonic()
    containers = run.containers
    server_id = containers.spawn(server.container, f"exec fi_pingpong {args}", timeout_s=limit, label="pp-server")
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

    def server_result(wait_s: float) -> Exec:
        return containers.wait(server.container, server_id, timeout_s=wait_s, label="pp-server", started=started)

    if listening.rc != 0:
        srv = server_result(1)
        run.timings["pingpong_s"] = round(time.monotonic() - started, 3)
        reason = f"fi_pingpong server on node-1 never listened on port {PINGPONG_PORT} (exit {srv.rc}):\n{srv.tail()}"
        return CheckResult(name, "fail", expected, "no server", reason=reason, node="node-1,node-2")
    res = run.run(client, f"exec fi_pingpong {args} {server.name}", timeout_s=limit, label="pingpong-client")
    srv = server_result(10 if res.rc == 0 else 1)
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
    manifest: Manifest,
    nodes: int,
    *,
    client: docker.DockerClient | None = None,
    timeout_s: float = 180,
    sshd_wait_s: float = SSHD_WAIT_S,
) -> list[CheckResult]:
    """Start `nodes` containers of image_ref on a private network and check MPI and libfabric across them.

    manifest: the image's (`Manifest.parse` of its /etc/imgbuild/manifest.json); its `mpirun`, `runtime`,
    `platform` and `components` drive the run. timeout_s bounds the whole check; sshd_wait_s how long node-1
    waits for each node's sshd.

    Returns per-node results (sshd, allreduce), overall ones (mpirun allreduce, rank and ssh environment,
    fi_pingpong) and a last "multinode: timings" result whose details hold the seconds spent in each phase.
    Containers, network and keys are removed before it returns, also on errors; Ctrl-C raises `Interrupted`
    after cleaning up.
    """
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
    # On the run's own network (for_engine), and without GPUs: this check runs on CPUs.
    spec, notes = for_engine(spec, runtimes=runtimes, has_gpu=False)
    run = _Run(Containers(client), image_ref, manifest, spec, {**env, **dict(spec.env)}, nodes, began + timeout_s)
    run.notes += notes
    results: list[CheckResult] = []
    try:
        _checks(run, results, sshd_wait_s=sshd_wait_s)
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
                reason=f"could not remove: {', '.join(leftovers)} (labelled {LABEL}={run.containers.run_id})",
            )
        )
    results.append(_timings_result(run))
    return results


def _checks(run: _Run, results: list[CheckResult], *, sshd_wait_s: float) -> None:
    """The run's phases in order; each appends its results as it ends."""
    run.make_keys()
    t0 = time.monotonic()
    expected = f"{run.nodes} containers of {run.image_ref} running"
    try:
        failed = run.start()
    except ENGINE_ERRORS as exc:
        reason = f"the engine refused: {engine.reason(exc)}"
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
    sshd = _sshd_check(run, min(sshd_wait_s, run.left(sshd_wait_s)))
    results += sshd
    sshd_down = [r.node for r in sshd if r.status != "pass"]
    results += _allreduce(run, sshd_down=sshd_down)
    if sshd_down:
        results.append(CheckResult("multinode: ssh environment", "skip", reason="sshd not answering everywhere"))
    else:
        results.append(_ssh_env(run))
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
