"""The workloads run across nodes, checks 4 to 6 of nodechecks.py: fi_pingpong between two nodes (`pingpong`),
a DistributedDataParallel training launched by mpirun and by torchrun (`ddp_mpirun`, `ddp_torchrun`), and
nccl-tests' all_reduce_perf judged by `imgbuild.nccltests.verdict` (`nccl_tests`, `nccl_tests_result`)."""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from typing import Any

from imgbuild.checks.results import CheckResult
from imgbuild.engine.containers import Exec
from imgbuild.verify.nodesession import (
    DDP_MPIRUN,
    DDP_TIMEOUT_S,
    DDP_TORCHRUN,
    NCCL_TESTS,
    NCCL_TESTS_TIMEOUT_S,
    PINGPONG,
    PINGPONG_PORT,
    PINGPONG_TIMEOUT_S,
    Session,
    lacking,
    mpirun_argv,
    with_defaults,
)

__all__ = ["ddp_mpirun", "ddp_torchrun", "nccl_tests", "nccl_tests_result", "pingpong"]

_DDP_RE = re.compile(r'^(\{"ddp": .*\})\s*$', re.MULTILINE)
_PINGPONG_ROW_RE = re.compile(
    r"^\s*(\d+[kmg]?)\s+(\d+[kmg]?)\s+=?(\d+[kmg]?)\s+(\S+)\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
    re.MULTILINE,
)


def pingpong(s: Session) -> CheckResult:
    """fi_pingpong: server on node 1 in the background, client on node 2; pass when the client completes."""
    name = s.name(PINGPONG)
    if s.n < 2:
        return CheckResult(name, "skip", reason="needs 2 nodes or more")
    if not s.fed(PINGPONG):
        return CheckResult(name, "skip", reason=lacking(PINGPONG))
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


def ddp_mpirun(s: Session, *, sshd_down: list[str]) -> CheckResult:
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


def ddp_torchrun(s: Session, *, sshd_down: list[str]) -> CheckResult:
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


def nccl_tests(s: Session, *, sshd_down: list[str]) -> CheckResult:
    """nccl-tests' all_reduce_perf across the nodes with the image's mpirun line, judged by nccltests.verdict."""
    name = s.name(NCCL_TESTS)
    if not s.gpus:
        return CheckResult(name, "skip", reason="no GPUs on the nodes (or the image is not for NVIDIA GPUs)")
    fed = s.fed(NCCL_TESTS)
    if not fed:
        return CheckResult(name, "skip", reason=lacking(NCCL_TESTS))
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
