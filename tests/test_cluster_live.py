"""`imgbuild cluster test --hosts ...`: the multi-node checks over ssh on containers that are already running.

The containers are started as `verify --nodes` starts them (multinode's own starter: a private network, a key
pair made for the run and mounted in every node); this machine then reaches them by their addresses with that
key, through the real OpenSSH client, as a user reaches the hosts of a cluster. The pytorch image's run is in
tests/test_pytorch_image.py (it builds that image).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import read_manifest
from imgbuild.checks.results import CheckResult, failures
from imgbuild.cli import app
from imgbuild.cluster import live
from imgbuild.engine.containers import Containers
from imgbuild.engine.runprofile import for_engine, run_spec
from imgbuild.verify import multinode, nodesession


class Running:
    """Containers of an image running as on the hosts of a cluster: their addresses and the run's key."""

    def __init__(self, client: Any, image: str, nodes: int) -> None:
        self.manifest = read_manifest(client, image)
        spec, _ = for_engine(run_spec(self.manifest.runtime, []), runtimes=[], has_gpu=False)
        self.run = multinode._Run(Containers(client), image, spec, nodes, [])
        self.run.make_keys()
        assert self.run.start() == []
        self.hosts = []
        for _, container in self.run.members:
            container.reload()
            self.hosts.append(container.attrs["NetworkSettings"]["Networks"][self.run.prefix]["IPAddress"])
        assert self.run.key_dir is not None
        self.key = self.run.key_dir / "id_ed25519"
        self.image = image

    def exec(self, k: int, script: str) -> str:
        res = self.run.containers.exec(self.run.members[k][1], script, timeout_s=30, label="test")
        assert res.rc == 0, res.output
        return res.output


@pytest.fixture
def running(docker_client: Any) -> Iterator[Any]:
    """Start N containers of an image (removed afterwards, with the key folder)."""
    started: list[Running] = []

    def start(image: str, nodes: int = 2) -> Running:
        r = Running(docker_client, image, nodes)
        started.append(r)
        return r

    yield start
    for r in started:
        assert r.run.cleanup() == []


def by(results: list[CheckResult], name: str) -> list[CheckResult]:
    return [r for r in results if r.name == name]


def explain(results: list[CheckResult]) -> str:
    return "\n".join(f"{r.name} [{r.node}]: {r.reason}" for r in failures(results))


@pytest.mark.docker
def test_the_cpu_image_passes_over_ssh(cpu_image: Any, running: Any) -> None:
    r = running(str(cpu_image.refs[0]), 2)
    report = live.run_live(r.hosts, key=r.key)
    results = report.results
    assert failures(results) == [], explain(results)
    assert [x.node for x in by(results, "cluster: image")] == r.hosts
    assert {x.details["hostname"] for x in by(results, "cluster: sshd")} == {"node-1", "node-2"}
    (overall,) = by(results, "cluster: mpirun allreduce (2 nodes)")
    assert overall.status == "pass" and overall.details["hostfile"] == "".join(f"{h} slots=1\n" for h in r.hosts)
    # The launch line is the image's (train's), run from the first host with a hostfile of the given hosts.
    workdir = overall.details["argv"][overall.details["argv"].index("--wdir") + 1]
    assert workdir.startswith("/tmp/imgbuild-cluster-")
    assert overall.details["argv"] == nodesession.mpirun_argv(
        r.manifest, hostfile=f"{workdir}/hostfile", ranks=2,
        program=[r.manifest.python, f"{workdir}/allreduce.py", f"{workdir}/env-names.json"], wdir=workdir,
    )  # fmt: skip
    # Every rank and ssh session saw the container's environment: the image's ENV among it.
    (ranks,) = by(results, "cluster: rank environment")
    assert {"PATH", "FI_PROVIDER", "OMPI_MCA_btl_vader_single_copy_mechanism"} <= set(ranks.details["expected"])
    assert sorted(ranks.details["seen"]) == [f"{r.hosts[0]} rank 0", f"{r.hosts[1]} rank 1"]
    assert by(results, "cluster: ssh environment")[0].status == "pass"
    assert by(results, "cluster: fi_pingpong")[0].status == "pass"
    # No PyTorch in the cpu image, no GPU here: those checks are not there / skipped, saying why.
    assert not by(results, "cluster: ddp (mpirun)")
    (nccl,) = by(results, "cluster: nccl-tests all_reduce_perf")
    assert nccl.status == "skip" and "no GPUs" in nccl.reason
    # Nothing left on the hosts.
    assert r.exec(0, "ls -d /tmp/imgbuild-cluster-* 2>/dev/null | wc -l").strip() == "0"
    assert report.timings["total_s"] > 0


@pytest.mark.docker
def test_the_cli_fails_naming_what_broke(cpu_image: Any, running: Any, tmp_path: Path) -> None:
    """Through the real CLI: exit 0 and a JSON report on a good cluster, exit 11 naming the check when a node's
    environment differs (a variable changed in the container's own environment, as a wrong `docker run -e` does)."""
    image = str(cpu_image.refs[0])
    r = running(image, 2)
    out = tmp_path / "report.json"
    args = ["cluster", "test", "--hosts", ",".join(r.hosts), "--ssh-key", str(r.key), "--recipe", "cpu"]
    ok = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert ok.exit_code == 0, ok.output
    data = json.loads(out.read_text())
    assert data["ok"] and data["recipe"] == "cpu"
    assert any(x["name"] == "cluster: mpirun allreduce (2 nodes)" and x["status"] == "pass" for x in data["results"])
    # sshd's SetEnv is the environment ssh sessions (and mpirun's remote daemons) get: change one on node 2.
    # (sshd reads its configuration again on SIGHUP; sessions already open keep theirs)
    r.exec(1, """sed -i 's/PYTHONUNBUFFERED="1"/PYTHONUNBUFFERED="0"/' $(grep -rl 'PYTHONUNBUFFERED=' /etc/ssh/) && """
              'kill -HUP "$(cat /run/sshd.pid)" && sleep 1')  # fmt: skip
    changed = r.exec(1, "grep -rho 'PYTHONUNBUFFERED=[^ ]*' /etc/ssh/ | head -1")
    if '"0"' not in changed:
        pytest.fail(f"could not change PYTHONUNBUFFERED in node 2's sshd configuration: {changed!r}")
    t0 = time.monotonic()
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 11, bad.output
    checks = len(data["results"])  # the same checks as the good run's
    assert f"1 of {checks} checks failed: cluster: ssh environment" in " ".join(bad.output.split()), bad.output
    assert time.monotonic() - t0 < 60
    # Another recipe's image expected: each host is named.
    other = CliRunner().invoke(app, ["cluster", "test", "--hosts", ",".join(r.hosts), "--ssh-key", str(r.key),
                                     "--recipe", "pytorch"])  # fmt: skip
    assert other.exit_code == 11 and "cluster: image" in other.output


def test_hosts_are_checked_before_anything_runs(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "300"})
    twice = runner.invoke(app, ["cluster", "test", "--hosts", "a,a", "--port", "3022"])
    assert twice.exit_code == 11 and "names a host twice" in twice.output
    both = runner.invoke(app, ["cluster", "test", "--hosts", "a", "--recipe", "cpu", "--image", "x:1"])
    assert both.exit_code == 2 and "not both" in both.output
    missing = runner.invoke(app, ["cluster", "test", "--hosts", "a", "--ssh-key", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such file" in missing.output


def test_an_unreachable_host_is_named(tmp_path: Path) -> None:
    # 192.0.2.0/24 is TEST-NET-1: nothing answers there.
    with pytest.raises(Exception, match=r"cannot reach 192\.0\.2\.1 .* over ssh on port 3999") as exc:
        live.run_live(["192.0.2.1"], port=3999, timeout_s=5, connect_wait_s=0)
    assert type(exc.value).__name__ == "VerifyError"


def test_ssh_folder_goes_even_when_a_master_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ssh -O exit` timing out on one host neither stops the others' nor leaves the run's ssh folder behind."""
    import subprocess

    nodes = live.SshNodes(["h1", "h2"], port=3022, user="root", key=None)
    asked: list[str] = []

    def hung(argv: list[str], **kwargs: Any) -> Any:
        asked.append(argv[-1])
        raise subprocess.TimeoutExpired(argv, kwargs.get("timeout", 0))

    monkeypatch.setattr(live.subprocess, "run", hung)
    nodes.close()
    assert asked == ["h1", "h2"] and not nodes.dir.exists()
