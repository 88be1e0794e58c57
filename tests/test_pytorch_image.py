"""The `pytorch` image for real: built once (about 4 GB of wheels; minutes), verified through the CLI in one
container and across 2 (DDP under the image's mpirun line and under torchrun), a simulated 2-host SageMaker job
training with each launcher, and `imgbuild cluster test` over ssh on running containers of it.

Everything here needs the image, so everything here is marked docker and slow; in CI (CI=true) a missing engine
fails these tests instead of skipping them.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from imgbuild import probes
from imgbuild.checks.results import CheckResult, failures
from imgbuild.cli import app
from test_sagemaker import explain

pytestmark = pytest.mark.docker

TORCH_CHECKS = ("pytorch-version", "torch-nccl-version", "torch-loaded-nccl", "one-nccl", "nccl-runtime-version")
DDP_CHECKS = ("multinode: ddp (mpirun)", "multinode: ddp (torchrun)")


@pytest.fixture(scope="session")
def pytorch_image(docker_client: Any) -> Any:
    """The pytorch recipe built by `imgbuild build` (the engine's cache makes a rebuild seconds); `build` checks
    the engine's free disk first and fails with the figures when it is short."""
    from imgbuild import build
    from imgbuild.pin import lock

    return build.build(*lock.for_ref("pytorch"), ca_bundle=build.ca_bundle_from(None))


def verify_json(args: list[str], tmp_path: Path) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / f"verify-{uuid.uuid4().hex[:6]}.json"
    res = CliRunner().invoke(app, ["verify", *args, "--json", str(out)])
    return res.exit_code, res.output, json.loads(out.read_text()) if out.exists() else {}


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {r["name"]: r["status"] for r in data["results"] if not r["node"]}


def test_verify_checks_torch_and_its_nccl(pytorch_image: Any, tmp_path: Path) -> None:
    code, output, data = verify_json(["pytorch"], tmp_path)
    assert code == 0, output
    got = statuses(data)
    assert {name: got.get(name) for name in TORCH_CHECKS} == dict.fromkeys(TORCH_CHECKS, "pass"), output
    assert data["image"] == str(pytorch_image.refs[0])


def test_verify_nodes_trains_with_both_launchers(pytorch_image: Any, tmp_path: Path) -> None:
    code, output, data = verify_json(["pytorch", "--nodes", "2"], tmp_path)
    assert code == 0, output
    got = statuses(data)
    assert {name: got.get(name) for name in (*TORCH_CHECKS, *DDP_CHECKS)} == dict.fromkeys(
        (*TORCH_CHECKS, *DDP_CHECKS), "pass"
    ), output
    results = {r["name"]: r for r in data["results"]}
    for name, launcher in zip(DDP_CHECKS, ("mpirun", "torchrun"), strict=True):
        ddp = results[name]["details"]["result"]
        assert ddp["ddp"] == "ok" and ddp["launcher"] == launcher and ddp["backend"] == "gloo"
        assert ddp["world_size"] == 2 and ddp["hosts"] == ["node-1", "node-2"]
        assert len(set(ddp["checksums"])) == 1
    # mpirun: the image's launch line, as train runs it
    assert results["multinode: ddp (mpirun)"]["details"]["argv"][0] == "mpirun"
    assert "-x" in results["multinode: ddp (mpirun)"]["details"]["argv"]
    timings = results["multinode: timings"]["details"]
    assert timings["ddp_mpirun_s"] > 0 and timings["ddp_torchrun_s"] > 0
    print(f"2-node DDP: mpirun {timings['ddp_mpirun_s']:.1f} s, torchrun {timings['ddp_torchrun_s']:.1f} s")


# --------------------------------------------------------------------------------------------------------
# SageMaker: `docker run IMAGE train` on two hosts, each with its resourceconfig.json, running ddp_train.py


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_sagemaker_job_trains_ddp_with_each_launcher(sagemaker_job: Any, pytorch_image: Any, launcher: str) -> None:
    job = sagemaker_job(
        str(pytorch_image.refs[0]),
        2,
        script=probes.text("ddp_train.py"),
        program="ddp_train.py",
        env={"IMGBUILD_LAUNCHER": launcher, "IMGBUILD_PEER_TIMEOUT": "120"},
    )
    codes = [job.wait(host, 600) for host in job.hosts]
    logs = [job.logs(host) for host in job.hosts]
    shown = explain(job)
    assert codes == [0, 0], shown
    lines = [ln for ln in logs[0].splitlines() if ln.startswith('{"ddp"')]
    assert len(lines) == 1, shown
    result = json.loads(lines[0])
    assert result["ddp"] == "ok" and result["launcher"] == launcher, shown
    assert result["world_size"] == 2 and result["hosts"] == [h.name for h in job.hosts]
    assert f"launcher {launcher}" in logs[0]


# --------------------------------------------------------------------------------------------------------
# imgbuild cluster test on running containers of the image


def test_cluster_test_trains_over_ssh(docker_client: Any, pytorch_image: Any) -> None:
    from imgbuild.cluster import live
    from test_cluster_live import Running

    r = Running(docker_client, str(pytorch_image.refs[0]), 2)
    try:
        report = live.run_live(r.hosts, key=r.key)
    finally:
        assert r.run.cleanup() == []
    results: list[CheckResult] = report.results
    assert failures(results) == [], "\n".join(f"{x.name} [{x.node}]: {x.reason}" for x in failures(results))
    done = {x.name: x for x in results}
    for launcher in ("mpirun", "torchrun"):
        ddp = done[f"cluster: ddp ({launcher})"]
        assert ddp.status == "pass" and ddp.details["result"]["hosts"] == ["node-1", "node-2"]
    torchrun = done["cluster: ddp (torchrun)"].details["commands"][0].split()
    assert "--rdzv-backend=c10d" in torchrun and torchrun.count(f"--rdzv-endpoint={r.hosts[0]}:29500") == 1
    assert done["cluster: nccl-tests all_reduce_perf"].status == "skip"  # no GPU here
