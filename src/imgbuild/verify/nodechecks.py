"""Checks across the nodes of a multi-node job, run by `imgbuild verify --nodes` (multinode.py, containers on
this host) and `imgbuild cluster test` (cluster/live.py, containers already running on real hosts).

The checks (`run_checks`) run through a `Nodes` executor, which runs bash scripts on node K and copies files to
every node: multinode's `DockerNodes` (docker exec) or `imgbuild.cluster.live`'s ssh executor. Launchers always
start on the first node. Everything comes from the image's manifest (manifest.py): the mpirun and torchrun lines
(launch.py, the very lines the image's SageMaker `train` runs), sshd's port, the slots per host, the Python.

The checks, in order:

1. from node 1, `ssh -p PORT NODE hostname` until every node's sshd answers (bounded);
2. the image's mpirun line across all nodes, running a small mpi4py allreduce in which rank r contributes r+1
   and every rank checks the sum is n(n+1)/2, and prints every variable of the image's ENV (and the run
   profile's) as it sees it: they must all be what the image sets, on every rank of every node; rank 0 then
   gathers every rank's hostname and MPI library (`MPI.Get_library_version`): every node must answer, all ranks
   with one library, the image's Open MPI;
3. from node 1, `ssh NODE env` for every node: a plain ssh session (what a rank started over ssh without
   mpirun's `-x` gets) must see the image's ENV as well;
4. fi_pingpong between node 1 (server) and node 2 (client) over libfabric's tcp provider (efa where the image
   has the EFA installer and the nodes have EFA devices), reporting the latency and bandwidth table;
5. where the image has PyTorch: a DistributedDataParallel training (probes/ddp_train.py; gloo on CPUs, nccl on
   GPUs) launched by the image's mpirun line, then by torchrun on every node (master: node 1); the model's
   parameters must be identical on every rank afterwards; each launcher's time is reported;
6. where the nodes have GPUs and the image has nccl-tests: all_reduce_perf across the nodes with the mpirun
   line and NCCL_DEBUG=INFO, judged by `imgbuild.nccltests.verdict` (results, NCCL version = the lock's, network).

Checks 2 (the gather), 4, 5 and 6 depend on the image's blocks: each block names the checks it feeds
(`Block.node_checks`), and this module asks the registry (`blocks.feeding`) which run on an image and whom a skip
names; it looks no component up by name (tests/test_multinode.py checks that).

One module over 500 lines: the six checks are one sequence (`run_checks`) over one `Session`, sharing its
files, output patterns and result builders (`_env_result`, `_ddp_result`); split in two, each half would
import the other's private functions.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from imgbuild import probes
from imgbuild.blocks import Pin, feeding
from imgbuild.blocks.sshd import SSHD_LOG
from imgbuild.checks import compare
from imgbuild.checks.results import CheckResult
from imgbuild.engine.containers import Exec
from imgbuild.image.launch import Launch, for_manifest
from imgbuild.image.manifest import Manifest

__all__ = [
    "WORKDIR",
    "Nodes",
    "Session",
    "mpirun_argv",
    "nccl_tests_result",
    "run_checks",
    "timings_result",
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


_ALLREDUCE_RE = re.compile(
    r"^IMGBUILD-ALLREDUCE rank=(\d+) size=(\d+) host=(\S+) sum=(-?\d+) expected=(\d+)\s*$", re.MULTILINE
)
# mpirun forwards each rank's output in pieces: two ranks' lines can arrive joined ("...expected=6IMGBUILD-...").
_MARKS_RE = re.compile(r"(?<!\n)(?=IMGBUILD-(?:ENV rank=|ALLREDUCE rank=|GATHER \[))")


def _rank_lines(output: str) -> str:
    """The ranks' marker lines, each on a line of its own."""
    return _MARKS_RE.sub("\n", output)


_ENV_RE = re.compile(r"^IMGBUILD-ENV rank=(\d+) host=(\S+) (\{.*\})\s*$", re.MULTILINE)
_GATHER_RE = re.compile(r"^IMGBUILD-GATHER (\[.*\])\s*$", re.MULTILINE)
_OPEN_MPI_RE = re.compile(r"Open MPI v(\d[^,\s]*)")
_SSHD_RE = re.compile(r"^SSHD-(READY|DOWN) (\S+) (\d+)(?: (.*))?$", re.MULTILINE)
_DDP_RE = re.compile(r'^(\{"ddp": .*\})\s*$', re.MULTILINE)
_PINGPONG_ROW_RE = re.compile(
    r"^\s*(\d+[kmg]?)\s+(\d+[kmg]?)\s+=?(\d+[kmg]?)\s+(\S+)\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
    re.MULTILINE,
)


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


def run_checks(s: Session, *, sshd_wait_s: float = SSHD_WAIT_S) -> list[CheckResult]:
    """Every check of the module's docstring, in order, through the session's nodes."""
    t = time.monotonic()
    s.nodes.put_files(s.files())
    s.timings["files_s"] = round(time.monotonic() - t, 3)
    results = []
    sshd = _sshd_check(s, min(sshd_wait_s, s.left(sshd_wait_s)))
    results += sshd
    down = [r.node for r in sshd if r.status != "pass"]
    results += _allreduce(s, sshd_down=down)
    if down:
        results.append(CheckResult(s.name("ssh environment"), "skip", reason="sshd not answering everywhere"))
    else:
        results.append(_ssh_env(s))
    results.append(_pingpong(s))
    if s.fed(DDP_MPIRUN):
        results.append(_ddp_mpirun(s, sshd_down=down))
    if s.fed(DDP_TORCHRUN):
        results.append(_ddp_torchrun(s, sshd_down=down))
    results.append(_nccl_tests(s, sshd_down=down))
    return results


def timings_result(s: Session, run: str, nodes: int) -> CheckResult:
    """The last result of a run: the seconds spent in each phase (and each launcher's DDP time)."""
    t = s.timings
    order = ("container_start_s", "sshd_ready_s", "mpirun_s", "pingpong_s", "ddp_mpirun_s", "ddp_torchrun_s",
             "nccl_tests_s", "cleanup_s", "total_s")  # fmt: skip
    found = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {t[k]:.1f} s" for k in order if k in t)
    return CheckResult(
        s.name("timings"),
        "pass",
        found=found,
        duration_s=t.get("total_s", 0.0),
        details={**t, "nodes": nodes, "run": run, "notes": list(s.notes)},
    )


# --------------------------------------------------------------------------------------------------------
# the checks


def _lacking(check: str) -> str:
    """Why `check` skips on an image without the blocks that feed it, named from the registry: 'the image has no
    nccl_tests component', 'the image has no libfabric (no libfabric or efa component)'."""
    names = feeding(check)
    if len(names) == 1:
        return f"the image has no {names[0]} component"
    return f"the image has no {names[0]} (no {' or '.join(names)} component)"


def _sshd_check(s: Session, wait_s: float) -> list[CheckResult]:
    """From node 1, `ssh -p PORT NODE hostname` for every node in parallel, until it answers or wait_s passes."""
    port = s.port
    hosts = " ".join(shlex.quote(name) for name in s.nodes.names)
    limit_ms = int(wait_s * 1000)
    script = f"""
check() {{
    local h=$1 start now err
    start=$(date +%s%3N)
    while :; do
        if err=$(ssh -p {port} -o BatchMode=yes -o ConnectTimeout=3 "$h" hostname 2>&1 </dev/null); then
            echo "SSHD-READY $h $(( $(date +%s%3N) - start )) $(printf '%s' "$err" | tr -d '\\r' | tail -n1)"
            return
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
    res = s.nodes.run(0, script, timeout_s=wait_s + 10, label="sshd")
    s.timings["sshd_ready_s"] = round(res.duration_s, 3)
    seen = {m.group(2): m for m in _SSHD_RE.finditer(res.output)}
    results = []
    first = s.nodes.names[0]
    for k, node in enumerate(s.nodes.names):
        m = seen.get(node)
        expected = f"ssh -p {port} {node} answers from {first} within {wait_s:g} s"
        if m and m.group(1) == "READY":
            hostname = (m.group(4) or "").strip()
            if hostname:
                s.hostnames[node] = hostname
            results.append(
                CheckResult(
                    s.name("sshd"),
                    "pass",
                    expected=expected,
                    found=f"answered on port {port} after {int(m.group(3)) / 1000:.1f} s (hostname {hostname})",
                    node=node,
                    duration_s=int(m.group(3)) / 1000,
                    details={"port": port, "hostname": hostname},
                )
            )
            continue
        last = (m.group(4) or "").strip() if m else ""
        why = f"last ssh error: {last}" if last else f"{first}'s check said nothing (exit {res.rc}): {res.tail()}"
        more = s.nodes.diagnose(k)
        results.append(
            CheckResult(
                s.name("sshd"),
                "fail",
                expected=expected,
                found="no answer",
                reason=f"sshd on port {port} of {node} didn't answer within {wait_s:g} s ({why})\n"
                f"{_sshd_state(s, k)}" + (f"\n{more}" if more else ""),
                node=node,
                duration_s=int(m.group(3)) / 1000 if m else res.duration_s,
                details={"port": port, "last_error": last},
            )
        )
    return results


def _sshd_state(s: Session, k: int) -> str:
    """Whether an sshd process runs on node k, and the end of its log: what a user needs to see first."""
    res = s.nodes.run(
        k,
        "if grep -qx sshd /proc/[0-9]*/comm 2>/dev/null; then echo 'an sshd process is running';"
        " else echo 'no sshd process is running'; fi\n"
        f"tail -n 5 {SSHD_LOG} 2>/dev/null | sed 's/^/sshd log: /'",
        timeout_s=10,
        label="sshd-state",
    )
    return f"on {s.nodes.names[k]}: {res.output.strip() or f'(no answer, exit {res.rc})'}"


def _allreduce(s: Session, *, sshd_down: list[str]) -> list[CheckResult]:
    """The image's mpirun line from node 1 across all nodes: one result per node, one overall, and the ranks'
    environment."""
    n, slots = s.n, s.per_node
    ranks = n * slots
    want = ranks * (ranks + 1) // 2
    overall_name = s.name(f"mpirun allreduce ({n} nodes)")
    expected = f"{ranks} ranks on {n} nodes, each reporting sum == {want}"
    if sshd_down:
        why = f"sshd not answering on {', '.join(sshd_down)}"
        return [
            *(CheckResult(s.name("allreduce"), "skip", reason=why, node=name) for name in s.nodes.names),
            CheckResult(overall_name, "fail", expected=expected, found="not run", reason=f"mpirun not started: {why}"),
            CheckResult(s.name("rank environment"), "skip", reason=why),
        ]
    argv = mpirun_argv(
        s.manifest, hostfile=s.hostfile, ranks=ranks, program=[s.manifest.python, s.program, s.env_names],
        wdir=s.workdir,
    )  # fmt: skip
    script = f"exec {shlex.join(with_defaults(s, argv))}"
    limit = s.left(MPIRUN_TIMEOUT_S)
    res = s.nodes.run(0, script, timeout_s=limit, label="mpirun")
    s.timings["mpirun_s"] = round(res.duration_s, 3)
    output = _rank_lines(res.output)
    lines = [
        (int(m.group(1)), int(m.group(2)), s.node_of(int(m.group(1)), m.group(3)), int(m.group(4)), m.group(3))
        for m in _ALLREDUCE_RE.finditer(output)
    ]
    results = []
    for node in s.nodes.names:
        mine = [ln for ln in lines if ln[2] == node]
        good = [ln for ln in mine if ln[1] == ranks and ln[3] == want]
        node_expected = f"{slots} rank(s) on {node} report sum == {want}"
        found = ", ".join(f"rank {r}: sum {got} (host {h})" for r, _, _, got, h in sorted(mine)) or "no output"
        if len(good) == slots and len(mine) == slots:
            results.append(CheckResult(s.name("allreduce"), "pass", node_expected, found, node=node))
        else:
            why = "a wrong sum" if mine else f"no allreduce line from {node}"
            results.append(
                CheckResult(
                    s.name("allreduce"), "fail", node_expected, found, reason=f"{why} (mpirun exit {res.rc})", node=node
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
            details={"command": shlex.join(argv), "argv": argv, "hostfile": s.hostfile_text(), "exit_code": res.rc},
        )
    )
    seen = {
        (s.node_of(int(m.group(1)), m.group(2)), int(m.group(1))): json.loads(m.group(3))
        for m in _ENV_RE.finditer(output)
    }  # (node, rank) -> {name: value}
    results.append(_env_result(s, s.name("rank environment"), "every rank, launched by the image's mpirun line",
                               {f"{node} rank {rank}": env for (node, rank), env in sorted(seen.items())},
                               expected_count=ranks))  # fmt: skip
    results.append(_gathered(s, output, ranks))
    return results


def _gathered(s: Session, output: str, ranks: int) -> CheckResult:
    """Rank 0's mpi4py gather of every rank's hostname and MPI library (`MPI.Get_library_version`): every node
    answers, all with one MPI library, the image's Open MPI."""
    name = s.name(GATHER)
    mpi = s.fed(GATHER)
    pinned = mpi[0].version if mpi else None
    expected = f"rank 0 gathers {ranks} ranks from {s.n} nodes, one MPI library" + (
        f" (Open MPI {pinned})" if pinned else ""
    )
    m = _GATHER_RE.search(output)
    if m is None:
        return CheckResult(name, "fail", expected, "nothing gathered", reason="rank 0 printed no gather line")
    gathered = json.loads(m.group(1))
    by_node: dict[str, set[str]] = {}
    for rank, (host, library) in enumerate(gathered):
        by_node.setdefault(s.node_of(rank, host), set()).add(library)
    libraries = sorted({lib for libs in by_node.values() for lib in libs})
    found = f"{len(gathered)} ranks on {len(by_node)} nodes ({', '.join(sorted(by_node))}): {' | '.join(libraries)}"
    details = {"gathered": gathered}
    silent = [node for node in s.nodes.names if node not in by_node]
    if silent or len(gathered) != ranks:
        why = f"no rank on {', '.join(silent)} answered" if silent else f"{len(gathered)} of {ranks} ranks answered"
        return CheckResult(name, "fail", expected, found, reason=why, details=details)
    if len(libraries) != 1:
        return CheckResult(name, "fail", expected, found, reason="the ranks run different MPI libraries",
                           details=details)  # fmt: skip
    version = _OPEN_MPI_RE.search(libraries[0])
    judged = compare(pinned, version.group(1) if version else None, "Open MPI library the ranks run")
    return replace(judged, name=name, expected=expected, found=found, details=details)


def _ssh_env(s: Session) -> CheckResult:
    """From node 1, `ssh NODE env` for every node: plain ssh sessions see the image's ENV too."""
    begin, end = "IMGBUILD-SSHENV-BEGIN", "IMGBUILD-SSHENV-END"
    script = "".join(
        f"echo {begin} {name}; ssh -p {s.port} -o BatchMode=yes -o ConnectTimeout=5 {shlex.quote(name)} env "
        f"</dev/null; echo {end} {name}\n"
        for name in s.nodes.names
    )
    res = s.nodes.run(0, script, timeout_s=s.left(30), label="ssh-env")
    sessions: dict[str, dict[str, str | None]] = {}
    for m in re.finditer(rf"^{begin} (\S+)\n(.*?)^{end} \1$", res.output, re.MULTILINE | re.DOTALL):
        have = dict(line.split("=", 1) for line in m.group(2).splitlines() if "=" in line)
        sessions[f"ssh {m.group(1)}"] = {name: have.get(name) for name in s.image_env}
    return _env_result(s, s.name("ssh environment"), "an ssh session on every node", sessions,
                       expected_count=s.n, output=res)  # fmt: skip


def _env_result(
    s: Session,
    name: str,
    who: str,
    seen: dict[str, dict[str, str | None]],
    *,
    expected_count: int,
    output: Exec | None = None,
) -> CheckResult:
    """Every one of `seen` (who -> its variables) sees each variable exactly as the image sets it."""
    want = s.image_env
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


def _pingpong(s: Session) -> CheckResult:
    """fi_pingpong: server on node 1 in the background, client on node 2; pass when the client completes."""
    name = s.name(PINGPONG)
    if s.n < 2:
        return CheckResult(name, "skip", reason="needs 2 nodes or more")
    if not s.fed(PINGPONG):
        return CheckResult(name, "skip", reason=_lacking(PINGPONG))
    server, client = s.nodes.names[0], s.nodes.names[1]
    where = f"{server},{client}"
    provider, endpoint = ("efa", "rdm") if s.expect_efa else ("tcp", "msg")  # tcp has no dgram endpoint
    args = f"-p {provider} -e {endpoint}"
    limit = s.left(PINGPONG_TIMEOUT_S)
    started = time.monotonic()
    handle = s.nodes.spawn(0, f"exec fi_pingpong {args}", timeout_s=limit, label="pp-server")
    hex_port = f"{PINGPONG_PORT:04X}"
    # Wait for the server's control socket (LISTEN is state 0A in /proc/net/tcp*) so the client can't race it.
    listening = s.nodes.run(
        0,
        f"for i in $(seq 200); do grep -qE ':{hex_port} [0-9A-F]+:[0-9A-F]+ 0A' /proc/net/tcp /proc/net/tcp6 "
        "2>/dev/null && exit 0; sleep 0.05; done; exit 1",
        timeout_s=15,
        label="pingpong-listen",
    )
    expected = f"fi_pingpong {args} completes between {server} and {client}"
    if listening.rc != 0:
        srv = s.nodes.wait(handle, timeout_s=1)
        s.timings["pingpong_s"] = round(time.monotonic() - started, 3)
        reason = f"fi_pingpong server on {server} never listened on port {PINGPONG_PORT} (exit {srv.rc}):\n{srv.tail()}"
        return CheckResult(name, "fail", expected, "no server", reason=reason, node=where)
    res = s.nodes.run(1, f"exec fi_pingpong {args} {shlex.quote(server)}", timeout_s=limit, label="pingpong-client")
    srv = s.nodes.wait(handle, timeout_s=10 if res.rc == 0 else 1)
    duration = time.monotonic() - started
    s.timings["pingpong_s"] = round(duration, 3)
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
        return CheckResult(name, "pass", expected, found, node=where, duration_s=duration, details=details)
    if res.timed_out:
        reason = f"fi_pingpong client did not finish within {math.ceil(limit)} s:\n{res.tail()}"
    else:
        reason = (
            f"fi_pingpong client on {client} failed (exit {res.rc}):\n{res.tail()}\n"
            f"server on {server} (exit {srv.rc}):\n{srv.tail()}"
        )
    return CheckResult(
        name, "fail", expected, f"exit {res.rc}, {len(rows)} rows", reason=reason, node=where, duration_s=duration,
        details=details,
    )  # fmt: skip


def _ddp_mpirun(s: Session, *, sshd_down: list[str]) -> CheckResult:
    """ddp_train.py under the image's mpirun line, started on node 1 (as `train` starts it)."""
    name = s.name(DDP_MPIRUN)
    if sshd_down:
        return CheckResult(name, "fail", found="not run", reason=f"sshd not answering on {', '.join(sshd_down)}")
    argv = mpirun_argv(
        s.manifest, hostfile=s.hostfile, ranks=s.n * s.per_node, program=[s.manifest.python, s.ddp_program],
        wdir=s.workdir,
    )  # fmt: skip
    limit = s.left(DDP_TIMEOUT_S)
    res = s.nodes.run(0, f"exec {shlex.join(with_defaults(s, argv))}", timeout_s=limit, label="ddp-mpirun")
    s.timings["ddp_mpirun_s"] = round(res.duration_s, 3)
    return _ddp_result(s, name, "mpirun", [res], res.duration_s, limit, {"command": shlex.join(argv), "argv": argv})


def _ddp_torchrun(s: Session, *, sshd_down: list[str]) -> CheckResult:
    """ddp_train.py under torchrun on every node (node rank = position, master = node 1), as `train` runs it with
    IMGBUILD_LAUNCHER=torchrun: the launch module's torchrun line."""
    name = s.name(DDP_TORCHRUN)
    if sshd_down:
        return CheckResult(name, "fail", found="not run", reason=f"sshd not answering on {', '.join(sshd_down)}")
    argvs = [
        s.launch.torchrun_argv(
            nnodes=s.n,
            nproc_per_node=s.per_node,
            endpoint=f"{s.nodes.names[0]}:{s.master_port}",
            run_id=s.run_id,
            local_addr=s.nodes.names[k],  # the name the other nodes reach node k by, as the endpoint's
            program=[s.ddp_program],
        )
        for k in range(s.n)
    ]
    limit = s.left(DDP_TIMEOUT_S)
    started = time.monotonic()
    handles = [
        s.nodes.spawn(
            k,
            f"cd {shlex.quote(s.workdir)} && exec {shlex.join(with_defaults(s, argv))}",
            timeout_s=limit,
            label=f"ddp-torchrun-{k}",
        )
        for k, argv in enumerate(argvs)
    ]
    outs = [s.nodes.wait(h, timeout_s=limit) for h in handles]
    duration = time.monotonic() - started
    s.timings["ddp_torchrun_s"] = round(duration, 3)
    return _ddp_result(s, name, "torchrun", outs, duration, limit, {"commands": [shlex.join(a) for a in argvs]})


def _ddp_result(
    s: Session, name: str, launcher: str, outs: list[Exec], duration: float, limit: float, details: dict[str, Any]
) -> CheckResult:
    """Pass when every process exited 0 and rank 0 (on node 1) says the parameters agree on all ranks of all nodes."""
    ranks = s.n * s.per_node
    expected = f"{ranks} ranks on {s.n} nodes train {launcher}-launched DDP; parameters identical on every rank"
    m = _DDP_RE.search(outs[0].output)
    data: dict[str, Any] = json.loads(m.group(1)) if m else {}
    details = {**details, "result": data, "exit_codes": [o.rc for o in outs]}
    bad = [(s.nodes.names[k], o) for k, o in enumerate(outs) if o.rc != 0]
    hosts = data.get("hosts") or []
    if not bad and data.get("ddp") == "ok" and data.get("world_size") == ranks and len(hosts) == s.n:
        found = (
            f"{ranks} ranks, {data.get('backend')}, parameters identical after {data.get('steps')} steps; "
            f"{duration:.1f} s ({data.get('seconds')} s in torch.distributed)"
        )
        return CheckResult(name, "pass", expected, found, duration_s=duration, details=details)
    if bad:
        where, o = bad[0]
        if o.timed_out:
            reason = f"{launcher} on {where} did not finish within {math.ceil(limit)} s; last lines:\n{o.tail()}"
        else:
            reason = f"{launcher} on {where} failed (exit {o.rc}); last lines:\n{o.tail()}"
        found = f"exit {o.rc} on {where}"
    elif not data:
        reason, found = f"rank 0 printed no result; last lines:\n{outs[0].tail()}", "no result"
    elif data.get("ddp") != "ok":
        reason, found = f"parameter checksums differ across ranks: {data.get('checksums')}", "parameters differ"
    else:
        found = f"{data.get('world_size')} ranks on {len(hosts)} hosts"
        reason = f"expected {ranks} ranks on {s.n} hosts, the training ran on {', '.join(hosts) or 'none'}"
    return CheckResult(name, "fail", expected, found, reason=reason, duration_s=duration, details=details)


def _nccl_tests(s: Session, *, sshd_down: list[str]) -> CheckResult:
    """nccl-tests' all_reduce_perf across the nodes with the image's mpirun line, judged by nccltests.verdict."""
    name = s.name(NCCL_TESTS)
    if not s.gpus:
        return CheckResult(name, "skip", reason="no GPUs on the nodes (or the image is not for NVIDIA GPUs)")
    fed = s.fed(NCCL_TESTS)
    if not fed:
        return CheckResult(name, "skip", reason=_lacking(NCCL_TESTS))
    if sshd_down:
        return CheckResult(name, "fail", found="not run", reason=f"sshd not answering on {', '.join(sshd_down)}")
    from imgbuild.nccltests import command, verdict
    from imgbuild.nccltests.log import parse

    types = s.manifest.platform.instance_types
    instance_type = types[0] if len(types) == 1 and s.expect_efa else None
    ranks = s.n * s.per_node
    # The jobs' line: as far as the verdict judges on that instance type (16 GiB on p5 and later, else 1 GiB).
    program = ["env", "NCCL_DEBUG=INFO", *command.all_reduce_perf(fed[0].details.prefix, instance_type)]
    argv = mpirun_argv(s.manifest, hostfile=s.hostfile, ranks=ranks, wdir=s.workdir, program=program)
    limit = s.left(NCCL_TESTS_TIMEOUT_S)
    res = s.nodes.run(0, f"exec {shlex.join(with_defaults(s, argv))}", timeout_s=limit, label="nccl-tests")
    s.timings["nccl_tests_s"] = round(res.duration_s, 3)
    expect = verdict.Expect.of_pins(
        s.version, instance_type=instance_type, nodes=s.n, plugin=s.expect_efa, efa=s.expect_efa
    )
    rep = verdict.judge(parse(res.output), expect, source=f"all_reduce_perf on {', '.join(s.nodes.names)}")
    return nccl_tests_result(name, rep, res, expect_efa=s.expect_efa, command=shlex.join(argv))


def nccl_tests_result(name: str, rep: Any, res: Exec, *, expect_efa: bool, command: str) -> CheckResult:
    """A check result from an nccltests.verdict report. Without EFA to expect (containers on one host, or instances
    without EFA devices), the 'network' criterion is shown, not judged: sockets are all there is."""
    judged = [c for c in rep.criteria if expect_efa or c.name != "network"]
    failed = [c for c in judged if c.status == "FAIL"]
    warned = [c for c in judged if c.status == "WARN"]
    rows = {c.name: f"{c.status}: {c.found}" for c in rep.criteria}
    efa = ", EFA, the published bus bandwidth" if expect_efa else ""
    expected = f"all_reduce_perf: #wrong 0, the image's NCCL{efa}"
    details = {"command": command, "exit_code": res.rc, "verdict": rep.verdict, "criteria": rows}
    big = [r for t in rep.log.tables for r in t.rows]
    found = f"{rep.verdict}; {', '.join(rep.log.network.used) or 'network not named'}; " + (
        f"{big[-1].out_of_place.busbw:g} GB/s bus bandwidth at {big[-1].size} B" if big else "no results"
    )
    if res.rc != 0 or failed:
        why = "; ".join(f"{c.name}: {c.reason}" for c in failed)
        if res.rc != 0:
            why = "; ".join(x for x in (f"all_reduce_perf exit {res.rc}: {res.tail()}", why) if x)
        return CheckResult(name, "fail", expected, found, reason=why, duration_s=res.duration_s, details=details)
    note = "; ".join(f"to check: {c.name}: {c.reason}" for c in warned)
    return CheckResult(name, "pass", expected, found, reason=note, duration_s=res.duration_s, details=details)
