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

The checks share one `Session` (nodesession.py: the nodes, the manifest, the deadline, the launch lines); this
module runs them in order and holds the checks of MPI and ssh (1 to 3); nodeworkloads.py the workloads (4 to 6:
fi_pingpong, DDP, nccl-tests).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from dataclasses import replace

from imgbuild.blocks.sshd import SSHD_LOG
from imgbuild.checks.results import CheckResult
from imgbuild.checks.verdicts import compare
from imgbuild.engine.containers import Exec
from imgbuild.verify.nodesession import (
    DDP_MPIRUN,
    DDP_TORCHRUN,
    GATHER,
    MPIRUN_TIMEOUT_S,
    SSHD_WAIT_S,
    Session,
    mpirun_argv,
    with_defaults,
)
from imgbuild.verify.nodeworkloads import ddp_mpirun, ddp_torchrun, nccl_tests, pingpong

__all__ = ["run_checks", "timings_result"]

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
    results.append(pingpong(s))
    if s.fed(DDP_MPIRUN):
        results.append(ddp_mpirun(s, sshd_down=down))
    if s.fed(DDP_TORCHRUN):
        results.append(ddp_torchrun(s, sshd_down=down))
    results.append(nccl_tests(s, sshd_down=down))
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
# the checks of MPI and ssh


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
