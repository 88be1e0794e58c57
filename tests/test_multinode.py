"""`imgbuild verify --nodes N`: N containers of the cpu image on a private network, mpirun and fi_pingpong across.

The docker tests build the cpu recipe for real (the `cpu_image` fixture, seconds with a warm cache) and check
that every run leaves no container, network or key folder behind.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from typing import Any

import docker
import pytest

from imgbuild import multinode
from imgbuild.errors import Interrupted, VerifyError
from imgbuild.report import CheckResult, failures

CPU_MPIRUN = {
    "launcher": "mpirun",
    "mca": {"pml": "ob1", "btl": "tcp,self"},
    "exclude_interfaces": ["lo", "docker0"],
    "nccl_socket_ifname": None,
    "extra_args": ["--allow-run-as-root"],
}


def _manifest(**over: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "components": {"sshd": {"ports": [3022]}, "python": {"venv": "/opt/venv"}, "libfabric": {}},
        "mpirun": CPU_MPIRUN,
        "platform": {"devices_per_node": 1},
        "runtime": {"shm_size": "1g", "memlock_unlimited": True},
    }
    m.update(over)
    return m


# --------------------------------------------------------------------------------------------------------
# plain data: the mpirun command line comes from the manifest


def test_mpirun_argv_comes_from_the_manifest() -> None:
    s = multinode.Settings.from_manifest(_manifest(), None)
    argv = s.mpirun_argv("/h", 3, "/opt/venv/bin/python", "/s.py")
    assert argv == [
        "mpirun", "--allow-run-as-root", "--hostfile", "/h", "-np", "3",
        "--mca", "btl", "tcp,self", "--mca", "pml", "ob1",
        "--mca", "btl_tcp_if_exclude", "lo,docker0", "--mca", "oob_tcp_if_exclude", "lo,docker0",
        "/opt/venv/bin/python", "/s.py",
    ]  # fmt: skip
    assert (s.port, s.slots, s.shm_size, s.python) == (3022, 1, "1g", "/opt/venv/bin/python")


def test_mpirun_argv_other_launcher_ifname_and_explicit_excludes() -> None:
    mpirun = {
        "launcher": "/opt/amazon/openmpi/bin/mpirun",
        "mca": {"btl_tcp_if_exclude": "lo"},
        "exclude_interfaces": ["lo", "docker0"],
        "nccl_socket_ifname": "^lo,docker",
        "extra_args": [],
    }
    m = _manifest(mpirun=mpirun, platform={"devices_per_node": 8})
    m["components"]["python"] = {"venv": None}
    s = multinode.Settings.from_manifest(m, None)
    argv = s.mpirun_argv("/h", 16, s.python, "/s.py")
    assert argv[0] == "/opt/amazon/openmpi/bin/mpirun"
    assert argv.count("btl_tcp_if_exclude") == 1  # the recipe's own value wins
    assert argv[argv.index("oob_tcp_if_exclude") - 1 :][:3] == ["--mca", "oob_tcp_if_exclude", "lo,docker0"]
    assert argv[argv.index("-x") :][:2] == ["-x", "NCCL_SOCKET_IFNAME=^lo,docker"]
    assert (s.slots, s.python) == (8, "python3")


def test_an_image_without_sshd_is_refused() -> None:
    m = _manifest()
    del m["components"]["sshd"]
    with pytest.raises(VerifyError, match="no sshd"):
        multinode.Settings.from_manifest(m, None)


def test_pingpong_table_parses() -> None:
    out = (
        "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n"
        "64      10      =10      1.2k        0.07s      0.02    3446.50       0.00\n"
        "1m      10      =10      20m         0.08s    273.59    3832.70       0.00\n"
    )
    rows = multinode._PINGPONG_ROW_RE.findall(out)
    assert [(r[0], r[5], r[6]) for r in rows] == [("64", "0.02", "3446.50"), ("1m", "273.59", "3832.70")]


def test_sections_an_older_manifest_lacks_come_from_the_recipe() -> None:
    from imgbuild import build

    _, resolved, _ = build.prepare("cpu")  # from recipes/cpu.lock.json: no network
    m = _manifest()
    for key in ("mpirun", "runtime", "platform"):
        del m[key]
    s = multinode.Settings.from_manifest(m, resolved)
    assert s == multinode.Settings.from_manifest(_manifest(), None)


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
    manifest = multinode.read_manifest(client, image)
    results = multinode.run_multinode(image, manifest, None, nodes, client=client, **kw)
    timings = _by(results, "multinode: timings")
    assert len(timings) == 1
    prefix = timings[0].details["run"]
    assert prefix.startswith(multinode.NAME_PREFIX)
    assert _leftovers(client, prefix) == []
    text = json.dumps([r.to_json() for r in results])
    assert "PRIVATE KEY" not in text
    return results


@pytest.fixture(scope="module")
def image(cpu_image) -> str:
    return str(cpu_image.refs[0])


@pytest.mark.docker
@pytest.mark.slow
def test_read_manifest(docker_client, image) -> None:
    m = multinode.read_manifest(docker_client, image)
    assert m["recipe"] == "cpu"
    assert m["components"]["sshd"]["ports"] == [3022]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("nodes", [2, 3])
def test_allreduce_and_pingpong_pass(docker_client, image, nodes: int) -> None:
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
    assert "--mca btl tcp,self" in overall.details["command"]
    assert "--mca oob_tcp_if_exclude lo,docker0" in overall.details["command"]
    (pp,) = _by(results, "multinode: fi_pingpong")
    assert pp.status == "pass"
    assert "us/xfer" in pp.found and "MB/s" in pp.found
    assert pp.details["provider"] == "tcp" and pp.details["rows"]
    t = _by(results, "multinode: timings")[0].details
    for key in ("container_start_s", "sshd_ready_s", "mpirun_s", "pingpong_s", "cleanup_s", "total_s"):
        assert t[key] > 0


@pytest.mark.docker
@pytest.mark.slow
def test_sshd_down_on_one_node_names_it(docker_client, image) -> None:
    results = _run(docker_client, image, 3, sshd_wait_s=4, stop_sshd_on="node-2")
    bad = [r for r in failures(results) if r.name == "multinode: sshd"]
    assert [r.node for r in bad] == ["node-2"]
    assert "sshd on port 3022 of node-2 didn't answer within 4 s" in bad[0].reason
    assert "no sshd process is running" in bad[0].reason
    (overall,) = _by(results, "multinode: mpirun allreduce (3 nodes)")
    assert overall.status == "fail" and "node-2" in overall.reason
    assert {r.status for r in _by(results, "multinode: allreduce")} == {"skip"}


@pytest.mark.docker
@pytest.mark.slow
def test_ctrl_c_removes_everything(docker_client, image, monkeypatch) -> None:
    seen: list[str] = []

    def interrupt(run: Any, **kw: Any) -> list[CheckResult]:
        seen.append(run.prefix)
        assert len(_leftovers(docker_client, run.prefix)) == 2 + 1 + 1  # containers, network, key folder
        raise KeyboardInterrupt

    monkeypatch.setattr(multinode, "_allreduce", interrupt)
    manifest = multinode.read_manifest(docker_client, image)
    with pytest.raises(Interrupted):
        multinode.run_multinode(image, manifest, None, 2, client=docker_client)
    assert seen and _leftovers(docker_client, seen[0]) == []


@pytest.mark.docker
@pytest.mark.slow
def test_keys_are_copied_in_when_the_engine_cannot_see_this_machine(docker_client, image, monkeypatch) -> None:
    # A remote engine (DOCKER_HOST=tcp://..., ssh://...) can't bind-mount a local folder.
    monkeypatch.setattr(multinode, "_engine_is_local", lambda client: False)
    results = _run(docker_client, image, 2)
    assert failures(results) == [], "\n".join(f"{r.name} {r.node}: {r.reason}" for r in failures(results))


@pytest.mark.docker
def test_a_missing_image_is_a_clear_failure(docker_client) -> None:
    results = multinode.run_multinode("imgbuild-verify-test/absent:none", _manifest(), None, 2, client=docker_client)
    (bad,) = failures(results)
    assert bad.name == "multinode: containers" and "absent" in bad.reason
    assert _leftovers(docker_client, results[-1].details["run"]) == []
