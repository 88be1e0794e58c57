"""`imgbuild verify --nodes N` and the launch line: N containers of the cpu image on a private network, mpirun
(the very line the image's `train` runs) and fi_pingpong across, and every rank's environment.

The docker tests build the cpu recipe for real (the `cpu_image` fixture, seconds with a warm cache) and check
that every run leaves no container, network or key folder behind.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import docker
import pytest

from conftest import UPSTREAM, read_manifest
from imgbuild import blocks, recipe
from imgbuild.checks.results import CheckResult, failures
from imgbuild.core.errors import Interrupted, VerifyError
from imgbuild.engine.containers import Exec
from imgbuild.image import identity, launch, render
from imgbuild.image.manifest import Manifest
from imgbuild.pin import lock
from imgbuild.recipe import MpiRun
from imgbuild.verify import multinode, nodechecks, nodesession, nodeworkloads


def manifest_of(name: str, **over: Any) -> Manifest:
    """The manifest render writes into the image of a shipped recipe (from its lock: no network)."""
    resolved = lock.resolved_for(recipe.load(name))
    text = next(f.content for f in render.plan(resolved).files if f.path == "imgbuild/manifest.json")
    return Manifest.model_validate({**json.loads(text), **over})


# --------------------------------------------------------------------------------------------------------
# plain data: one launch line, from the manifest


def test_the_mpirun_line_comes_from_the_manifest() -> None:
    m = manifest_of("cpu")
    argv = nodesession.mpirun_argv(m, hostfile="/h", ranks=3, program=["/opt/venv/bin/python", "/s.py"], wdir="/w")
    assert argv == [
        "mpirun", "--allow-run-as-root",
        "--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
        "--mca", "btl_tcp_if_exclude", "lo,docker0", "--mca", "oob_tcp_if_exclude", "lo,docker0",
        "--mca", "plm_rsh_no_tree_spawn", "1",
        *(x for name in m.rank_env for x in ("-x", name)),
        "-np", "3", "--hostfile", "/h", "--wdir", "/w", "/opt/venv/bin/python", "/s.py",
    ]  # fmt: skip
    # every variable the image's ENV sets: PATH, the components' and the recipe's
    assert {"PATH", "FI_PROVIDER", "OMPI_MCA_btl_vader_single_copy_mechanism"} <= set(m.rank_env)
    assert set(m.rank_env) == {*m.image_env, *m.env}
    assert (m.ssh_ports, m.slots, m.python) == ((3022,), 1, "/opt/venv/bin/python")
    assert launch.for_manifest(m).env_defaults == ()


def test_other_launcher_ifname_default_and_the_recipes_own_mca() -> None:
    mpirun = MpiRun(
        launcher="/opt/amazon/openmpi/bin/mpirun",
        mca={"btl_tcp_if_exclude": "lo", "plm_rsh_no_tree_spawn": "0"},
        nccl_socket_ifname="^lo,docker",
    )
    line = launch.launch_for(mpirun, ["PATH", "LD_LIBRARY_PATH", "NCCL_SOCKET_IFNAME"], "python3")
    argv = line.mpirun_argv(hostfile="/h", np=16, program=["python3", "/s.py"])
    assert argv[0] == "/opt/amazon/openmpi/bin/mpirun"
    assert argv.count("btl_tcp_if_exclude") == 1 and argv.count("plm_rsh_no_tree_spawn") == 1  # the recipe's win
    assert argv[argv.index("oob_tcp_if_exclude") - 1 :][:3] == ["--mca", "oob_tcp_if_exclude", "lo,docker0"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-x"] == ["PATH", "LD_LIBRARY_PATH", "NCCL_SOCKET_IFNAME"]
    assert "--wdir" not in argv
    torchrun = line.torchrun_argv(
        nnodes=2, nproc_per_node=8, endpoint="algo-1:29500", run_id="job", local_addr="algo-2", program=["t.py"]
    )
    assert torchrun == [
        "python3", "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=8", "--rdzv-backend=c10d",
        "--rdzv-endpoint=algo-1:29500", "--rdzv-id=job", "--local-addr=algo-2", "t.py",
    ]  # fmt: skip
    # The recipe's NCCL_SOCKET_IFNAME is a default: a value the launcher's environment sets wins.
    assert line.env_defaults == (("NCCL_SOCKET_IFNAME", "^lo,docker"),)
    assert line.defaults_for(["PATH"]) == ["NCCL_SOCKET_IFNAME=^lo,docker"]
    assert line.defaults_for(["NCCL_SOCKET_IFNAME"]) == []


@pytest.mark.parametrize("name", ["cpu", "a100", "gaudi-1.15"])
def test_train_reads_the_launch_line_of_its_manifest(name: str) -> None:
    """The data train reads (mpirun.args, torchrun.args, launch-env.conf) is the launch module's, as bash reads it."""
    resolved = lock.resolved_for(recipe.load(name))
    files = {f.path: f.content.decode() for f in render.plan(resolved).files}
    line = launch.for_manifest(render.manifest(resolved, identity.of(resolved)))
    assert files["imgbuild/sagemaker/mpirun.args"].splitlines() == list(line.mpirun)
    torchrun = files["imgbuild/sagemaker/torchrun.args"].splitlines()
    assert torchrun == line.torchrun_template()
    values = {"nnodes": "2", "nproc_per_node": "8", "endpoint": "a:1", "run_id": "r", "local_addr": "b"}
    assert [arg.format(**values) for arg in torchrun] == line.torchrun_argv(
        nnodes=2, nproc_per_node=8, endpoint="a:1", run_id="r", local_addr="b", program=[]
    )
    defaults = files["imgbuild/sagemaker/launch-env.conf"].splitlines()
    assert defaults == [f"{k}={v}" for k, v in line.env_defaults]
    assert bool(defaults) == (name == "a100")  # its recipe's NCCL_SOCKET_IFNAME default


def test_an_image_without_sshd_is_refused() -> None:
    m = manifest_of("cpu")
    components = {k: v for k, v in m.components.items() if k != "sshd"}
    with pytest.raises(VerifyError, match="no sshd"):
        multinode.run_multinode("img:1", m.model_copy(update={"components": components}), 2)


def test_pingpong_table_parses() -> None:
    out = (
        "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
        "64      10      =10      1.2k        0.07s      0.02    3446.50       0.00\n"
        "1m      10      =10      20m         0.08s    273.59    3832.70       0.00\n"
    )
    rows = nodeworkloads._PINGPONG_ROW_RE.findall(out)
    assert [(r[0], r[5], r[6]) for r in rows] == [("64", "0.02", "3446.50"), ("1m", "273.59", "3832.70")]


NCCL_LOGS = UPSTREAM / "nccl-tests"


def test_gpu_shares_are_disjoint_and_need_one_gpu_per_node() -> None:
    assert multinode.gpu_shares(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert multinode.gpu_shares(3, 2) == [[0], [1]]
    assert multinode.gpu_shares(1, 2) == []
    assert multinode.gpu_shares(0, 2) == []


def _log(name: str) -> str:
    path = NCCL_LOGS / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: the tests read the nccl-tests logs from tests/data/upstream/nccl-tests")
    return path.read_text(errors="replace")


@pytest.mark.parametrize(
    ("log", "expect_efa", "status", "why"),
    [
        ("dlami-docs_2x-p4d.24xlarge_nccl-2.23.4_ofi-1.13.2_efa_excerpt.log", True, "pass", ""),
        # The plugin failed and NCCL fell back to sockets: a failure where EFA is expected ...
        ("ec2-p4d.24xlarge_training_nccl-2.27.7_ofi-1.17.1_ofi-init-failed_socket-fallback.log", True, "fail",
         "network: "),
        # ... and only shown, not judged, where sockets are all there is (containers on one host).
        ("eks-mpijob_2x-g4dn_socket_efa-disabled_excerpt.log", False, "pass", ""),
    ],
)  # fmt: skip
def test_nccl_tests_are_judged_by_the_cluster_report(log: str, expect_efa: bool, status: str, why: str) -> None:
    from imgbuild.nccltests.log import parse
    from imgbuild.nccltests.verdict import Expect, judge

    text = _log(log)
    rep = judge(parse(text), Expect(nodes=None), source=log)
    res = nodeworkloads.nccl_tests_result("x", rep, Exec(0, text, 1.0), expect_efa=expect_efa, command="mpirun ...")
    assert res.status == status, res.reason
    assert why in res.reason
    assert res.details["criteria"]["network"].split(":")[0] in ("PASS", "FAIL", "WARN")
    if not expect_efa:
        assert rep.verdict == "FAIL" and "network" in [c.name for c in rep.failed]  # judged away on purpose
    # a run that did not end well fails whatever the log says
    broken = nodeworkloads.nccl_tests_result("x", rep, Exec(1, text, 1.0), expect_efa=expect_efa, command="")
    assert broken.status == "fail" and "all_reduce_perf exit 1" in broken.reason


# --------------------------------------------------------------------------------------------------------
# for real


def _leftovers(client: docker.DockerClient, prefix: str) -> list[str]:
    names = [c.name for c in client.containers.list(all=True, filters={"name": prefix})]
    names += [n.name for n in client.networks.list(filters={"name": prefix})]
    names += glob.glob(os.path.join(tempfile.gettempdir(), f"{prefix}-keys-*"))
    return names


def _by(results: list[CheckResult], name: str) -> list[CheckResult]:
    return [r for r in results if r.name == name]


def _run(client: docker.DockerClient, image: str, nodes: int, **kw: Any) -> list[CheckResult]:
    results = multinode.run_multinode(image, read_manifest(client, image), nodes, client=client, **kw)
    timings = _by(results, "multinode: timings")
    assert len(timings) == 1
    prefix = timings[0].details["run"]
    assert prefix.startswith("imgbuild-verify-")
    assert _leftovers(client, prefix) == []
    text = json.dumps([r.to_json() for r in results])
    assert "PRIVATE KEY" not in text
    return results


@pytest.fixture(scope="module")
def image(cpu_image) -> str:
    return str(cpu_image.refs[0])


def _image_env(client: docker.DockerClient, image: str) -> dict[str, str]:
    env = client.api.inspect_image(image)["Config"]["Env"]
    return dict(item.split("=", 1) for item in env)


@pytest.mark.docker
@pytest.mark.parametrize("nodes", [2, 3])
def test_allreduce_environment_and_pingpong_pass(docker_client, image, nodes: int) -> None:
    results = _run(docker_client, image, nodes)
    assert failures(results) == [], "\n".join(f"{r.name} {r.node}: {r.reason}" for r in failures(results))
    names = [f"node-{k}" for k in range(1, nodes + 1)]
    assert sorted(r.node for r in _by(results, "multinode: sshd") if r.status == "pass") == names
    per_node = _by(results, "multinode: allreduce")
    assert sorted(r.node for r in per_node if r.status == "pass") == names
    want = nodes * (nodes + 1) // 2
    assert all(f"sum {want}" in r.found for r in per_node)
    (overall,) = _by(results, f"multinode: mpirun allreduce ({nodes} nodes)")
    assert overall.status == "pass"
    manifest = read_manifest(docker_client, image)
    wdir = nodesession.WORKDIR
    program = [manifest.python, f"{wdir}/allreduce.py", f"{wdir}/env-names.json"]
    assert overall.details["argv"] == nodesession.mpirun_argv(
        manifest, hostfile=f"{wdir}/hostfile", ranks=nodes, program=program, wdir=wdir
    )
    assert "--mca btl tcp,self" in overall.details["command"] and "-x FI_PROVIDER" in overall.details["command"]
    # Every rank on every node, started by that line, and a plain ssh session on every node, see each variable
    # of the image's ENV (the recipe's env among them) as the image sets it.
    image_env = _image_env(docker_client, image)
    assert {"PATH", "FI_PROVIDER", "OMPI_MCA_btl_vader_single_copy_mechanism"} <= set(image_env)
    (ranks,) = _by(results, "multinode: rank environment")
    assert ranks.status == "pass" and ranks.details["expected"] == image_env
    assert sorted(ranks.details["seen"]) == [f"node-{k} rank {k - 1}" for k in range(1, nodes + 1)]
    assert all(env == image_env for env in ranks.details["seen"].values())
    # Rank 0's mpi4py gather: every node's hostname, every rank on the image's Open MPI (the lock's version).
    (gather,) = _by(results, "multinode: mpi4py gather")
    assert gather.status == "pass" and len(gather.details["gathered"]) == nodes
    assert f"on {nodes} nodes ({', '.join(names)})" in gather.found
    assert all(lib.startswith(f"Open MPI v{manifest.components['openmpi'].version},") for _, lib in
               gather.details["gathered"])  # fmt: skip
    (ssh,) = _by(results, "multinode: ssh environment")
    assert ssh.status == "pass" and sorted(ssh.details["seen"]) == [f"ssh {n}" for n in names]
    assert all(env == image_env for env in ssh.details["seen"].values())
    (pp,) = _by(results, "multinode: fi_pingpong")
    assert pp.status == "pass"
    assert "us/xfer" in pp.found and "MB/s" in pp.found
    assert pp.details["provider"] == "tcp" and pp.details["rows"]
    t = _by(results, "multinode: timings")[0].details
    for key in ("container_start_s", "sshd_ready_s", "mpirun_s", "pingpong_s", "cleanup_s", "total_s"):
        assert t[key] > 0


FAKE_MPIRUN = """#!/usr/bin/python3
import json, sys
print("IMGBUILD-ARGV " + json.dumps(sys.argv[1:]), flush=True)
"""


@pytest.mark.docker
def test_train_runs_the_mpirun_line_verify_runs(docker_client, image) -> None:
    """The image's own `train` (a one-host job), with a fake mpirun first on PATH that prints its arguments:
    they are the arguments `verify --nodes` gives mpirun for the same hosts, ranks, program and folder."""
    script = (
        "mkdir -p /opt/ml/code /tmp/fake && : >/opt/ml/code/job.py && "
        'printf "%s" "$FAKE_MPIRUN" >/tmp/fake/mpirun && chmod +x /tmp/fake/mpirun && unset FAKE_MPIRUN && '
        "PATH=/tmp/fake:$PATH IMGBUILD_HOSTFILE=/tmp/hosts exec train job.py"
    )
    out = docker_client.containers.run(
        image, ["bash", "-c", script], environment={"FAKE_MPIRUN": FAKE_MPIRUN}, remove=True, network_disabled=True
    )
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("IMGBUILD-ARGV ")]
    assert len(lines) == 1, out.decode()
    ran = ["mpirun", *json.loads(lines[0].split(" ", 1)[1])]
    manifest = read_manifest(docker_client, image)
    program = [manifest.python, "/opt/ml/code/job.py"]
    assert ran == nodesession.mpirun_argv(
        manifest, hostfile="/tmp/hosts", ranks=1, program=program, wdir="/opt/ml/code"
    )


@pytest.mark.docker
def test_sshd_down_on_one_node_names_it(docker_client, image, monkeypatch) -> None:
    check = nodechecks._sshd_check

    def stop_sshd_on_node_2_first(s: Any, wait_s: float) -> list[CheckResult]:
        stop = 'for i in $(seq 100); do [ -s /run/sshd.pid ] && break; sleep 0.1; done; kill "$(cat /run/sshd.pid)"'
        assert s.nodes.run(s.nodes.names.index("node-2"), stop, timeout_s=15, label="stop-sshd").rc == 0
        return check(s, wait_s)

    monkeypatch.setattr(nodechecks, "_sshd_check", stop_sshd_on_node_2_first)
    results = _run(docker_client, image, 3, sshd_wait_s=4)
    bad = [r for r in failures(results) if r.name == "multinode: sshd"]
    assert [r.node for r in bad] == ["node-2"]
    assert "sshd on port 3022 of node-2 didn't answer within 4 s" in bad[0].reason
    assert "no sshd process is running" in bad[0].reason
    (overall,) = _by(results, "multinode: mpirun allreduce (3 nodes)")
    assert overall.status == "fail" and "node-2" in overall.reason
    assert {r.status for r in _by(results, "multinode: allreduce")} == {"skip"}
    assert [r.status for r in _by(results, "multinode: ssh environment")] == ["skip"]


@pytest.mark.docker
def test_ctrl_c_removes_everything(docker_client, image, monkeypatch) -> None:
    seen: list[str] = []

    def interrupt(s: Any, **kw: Any) -> list[CheckResult]:
        prefix = s.nodes.containers.prefix
        seen.append(prefix)
        assert len(_leftovers(docker_client, prefix)) == 2 + 1 + 1  # containers, network, key folder
        raise KeyboardInterrupt

    monkeypatch.setattr(nodechecks, "_allreduce", interrupt)
    with pytest.raises(Interrupted):
        multinode.run_multinode(image, read_manifest(docker_client, image), 2, client=docker_client)
    assert seen and _leftovers(docker_client, seen[0]) == []


@pytest.mark.docker
def test_keys_are_copied_in_when_the_engine_cannot_see_this_machine(docker_client, image, monkeypatch) -> None:
    # A remote engine (DOCKER_HOST=tcp://..., ssh://...) can't bind-mount a local folder.
    monkeypatch.setattr(multinode, "_engine_is_local", lambda client: False)
    results = _run(docker_client, image, 2)
    assert failures(results) == [], "\n".join(f"{r.name} {r.node}: {r.reason}" for r in failures(results))


@pytest.mark.docker
def test_a_missing_image_is_a_clear_failure(docker_client) -> None:
    manifest = manifest_of("cpu")
    results = multinode.run_multinode("imgbuild-verify-test/absent:none", manifest, 2, client=docker_client)
    (bad,) = failures(results)
    assert bad.name == "multinode: containers" and "absent" in bad.reason
    assert _leftovers(docker_client, results[-1].details["run"]) == []


def test_rank_lines_that_mpirun_joined_are_split() -> None:
    """mpirun can forward two ranks' lines joined without a newline: both are still read."""
    from imgbuild.verify.nodechecks import _ALLREDUCE_RE, _ENV_RE, _rank_lines

    joined = (
        "IMGBUILD-ALLREDUCE rank=0 size=3 host=a sum=6 expected=6IMGBUILD-ALLREDUCE rank=2 size=3 host=c sum=6 "
        'expected=6\nIMGBUILD-ENV rank=1 host=b {"A": "1"}IMGBUILD-ENV rank=0 host=a {}\n'
    )
    text = _rank_lines(joined)
    assert [m.group(1) for m in _ALLREDUCE_RE.finditer(text)] == ["0", "2"]
    assert [m.group(3) for m in _ENV_RE.finditer(text)] == ['{"A": "1"}', "{}"]
    assert _rank_lines(text) == text


class _Named:
    """Nodes as the gather's judgement sees them: their names only (nothing runs)."""

    def __init__(self, *names: str) -> None:
        self.names = names


def test_the_mpi4py_gather_fails_when_a_node_is_silent_or_runs_another_mpi() -> None:
    s = nodesession.Session(nodes=_Named("node-1", "node-2"), manifest=manifest_of("cpu"), image_env={}, deadline=0.0)  # type: ignore[arg-type]
    lib = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, Mar 23, 2023"

    def judged(gathered: list[list[str]]) -> CheckResult:
        return nodechecks._gathered(s, f"IMGBUILD-GATHER {json.dumps(gathered)}\n", 2)

    good = judged([["node-1", lib], ["node-2", lib]])
    assert good.status == "pass" and good.found == f"2 ranks on 2 nodes (node-1, node-2): {lib}"
    silent = judged([["node-1", lib], ["node-1", lib]])
    assert (silent.status, silent.reason) == ("fail", "no rank on node-2 answered")
    other = judged([["node-1", lib], ["node-2", lib.replace("4.1.4", "4.1.6")]])
    assert (other.status, other.reason) == ("fail", "the ranks run different MPI libraries")
    newer = judged([["node-1", lib.replace("4.1.4", "5.0.7")], ["node-2", lib.replace("4.1.4", "5.0.7")]])
    assert newer.status == "fail" and "5.0.7 is not the pinned 4.1.4" in newer.reason
    nothing = nodechecks._gathered(s, "", 2)
    assert (nothing.status, nothing.reason) == ("fail", "rank 0 printed no gather line")


def test_the_blocks_say_which_node_checks_they_feed() -> None:
    """Each check that depends on the image's blocks is fed by at least one (Block.node_checks), and no block
    declares a check nodechecks does not run; a block that provides another feeds that one's checks too."""
    ids = (nodesession.PINGPONG, nodesession.DDP_MPIRUN, nodesession.DDP_TORCHRUN, nodesession.NCCL_TESTS,
           nodesession.GATHER)  # fmt: skip
    assert {c for b in blocks.REGISTRY for c in b.node_checks} == set(ids)
    assert blocks.feeding(nodesession.PINGPONG) == ("libfabric", "efa")  # efa's installer brings libfabric
    assert [blocks.feeding(c) for c in ids[1:]] == [("pytorch",), ("pytorch",), ("nccl_tests",), ("openmpi",)]


def test_checks_skip_naming_the_blocks_an_image_lacks() -> None:
    manifest = manifest_of("cpu")
    lean = {k: v for k, v in manifest.components.items() if k not in {"libfabric", "efa", "pytorch", "nccl_tests"}}
    s = nodesession.Session(
        nodes=_Named("node-1", "node-2"),  # type: ignore[arg-type]
        manifest=manifest.model_copy(update={"components": lean}),
        image_env={},
        deadline=0.0,
        gpus=True,
    )
    pingpong = nodeworkloads.pingpong(s)
    assert (pingpong.status, pingpong.reason) == ("skip", "the image has no libfabric (no libfabric or efa component)")
    nccl = nodeworkloads.nccl_tests(s, sshd_down=[])
    assert (nccl.status, nccl.reason) == ("skip", "the image has no nccl_tests component")
    assert s.fed(nodesession.DDP_MPIRUN) == [] and s.ddp_program not in s.files()
    assert [p.version for p in nodesession.Session(**{**s.__dict__, "manifest": manifest}).fed(nodesession.GATHER)] == [
        manifest.components["openmpi"].version
    ]


def test_nodechecks_names_no_component() -> None:
    """nodechecks asks the registry (blocks.feeding) which checks an image's blocks feed: it looks no block up by
    name (a key of a `get`, `version`, `details`, `has` or `pin` call, a subscript, an `in` test). Check names
    ('sshd') and libfabric's provider name ('efa') are no lookups."""
    named = []
    modules = (nodechecks, nodesession, nodeworkloads)  # the checks, their session, the workloads
    for node in (n for m in modules for n in ast.walk(ast.parse(Path(m.__file__).read_text()))):
        used: list[ast.expr] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in {"get", "version", "details", "has", "pin"}:
                used = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.Subscript):
            used = [node.slice]
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            used = [node.left]
        named += [(u.lineno, u.value) for u in used if isinstance(u, ast.Constant) and u.value in blocks.BY_NAME]
    assert named == []
