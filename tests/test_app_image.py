"""The example user image (examples/pytorch-app: `extends: pytorch` with requirements, a C++ extension built against
the image's torch, NCCL and MPI, and code) for real: built by `imgbuild build`, verified through the CLI across 2
containers, and run as a 2-host job by the SageMaker Python SDK 2.x's local mode with `source_dir`, as a user runs
it. Its refusal of a conflicting requirement at lock time is in tests/test_app.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from test_app import EXAMPLE
from test_pytorch_image import statuses, verify_json
from test_sagemaker import ssh_key_pair
from test_sagemaker_sdk import DRIVER, members

pytestmark = pytest.mark.docker

APP_CHECKS = ("app-distributions", "app-imports", "app-built-links", "app-code")


@pytest.fixture(scope="session")
def app_image(docker_client: Any) -> Any:
    """The example built by `imgbuild build` on the pytorch stack (its layers come from the engine's cache)."""
    from imgbuild import build
    from imgbuild.pin import lock

    return build.build(*lock.for_ref(str(EXAMPLE)), ca_bundle=build.ca_bundle_from(None))


def test_verify_checks_the_users_layer_and_the_stack(app_image: Any, tmp_path: Path) -> None:
    code, output, data = verify_json([str(EXAMPLE), "--nodes", "2"], tmp_path)
    assert code == 0, output
    got = statuses(data)
    wanted = (*APP_CHECKS, "pytorch-version", "torch-loaded-nccl", "one-nccl", "multinode: ddp (mpirun)")
    assert {name: got.get(name) for name in wanted} == dict.fromkeys(wanted, "pass"), output
    results = {r["name"]: r for r in data["results"] if not r["node"]}
    links = results["app-built-links"]
    assert "libnccl" in links["found"] and "libmpi" in links["found"], links
    assert any(so.endswith(".so") and "imgbuild_example" in so for so in links["details"]["extensions"]), links
    assert "einops==0.8.1" in results["app-distributions"]["found"]


def test_the_example_trains_as_a_two_host_sagemaker_job_with_source_dir(
    app_image: Any, docker_client: Any, tmp_path: Path
) -> None:
    """SDK 2.x local mode: `Estimator(image_uri=..., source_dir=code, entry_point="train.py", instance_count=2)`;
    train on each host takes the code from sagemaker_submit_directory, the leader runs it under the image's mpirun
    line across both, and model.tar.gz holds rank 0's result."""
    sdk = Path(os.environ.get("IMGBUILD_SAGEMAKER_SDK_VENV", "/opt/imgbuild/sagemaker-sdk2")) / "bin" / "python"
    if not sdk.exists():
        pytest.fail(f"no SageMaker Python SDK at {sdk} (run scripts/setup.sh)")
    image = str(app_image.refs[0])
    code, output, root = tmp_path / "code", tmp_path / "output", tmp_path / "local-mode"
    shutil.copytree(EXAMPLE.parent / "code", code)
    output.mkdir()
    root.mkdir()
    keys = ssh_key_pair(docker_client, image, tmp_path / "ssh")
    try:
        proc = subprocess.run(
            [str(sdk), str(DRIVER), "--image", image, "--hosts", "2", "--code", str(code), "--program", "train.py",
             "--ssh", str(keys), "--output", str(output), "--root", str(root), "--env", "IMGBUILD_PEER_TIMEOUT=120"],
            capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, "SAGEMAKER_SUPPRESS_V2_WARNING": "1"},
        )  # fmt: skip
    finally:
        for c in docker_client.api.containers(all=True, filters={"label": "com.docker.compose.project.working_dir"}):
            if c["Labels"]["com.docker.compose.project.working_dir"].startswith(f"{root}/"):
                docker_client.api.remove_container(c["Id"], force=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert json.loads(proc.stdout.strip().splitlines()[-1])["raised"] is None, log
    result = json.loads(members(output / "model.tar.gz")["result.json"])
    assert result["world_size"] == 2 and result["parameters_agree"], result
    major, minor, patch = result["torch_nccl"]
    assert result["extension_nccl"] == major * 10000 + minor * 100 + patch, result  # the one NCCL, both ways
    assert result["einops"] == "0.8.1" and "Open MPI" in result["extension_mpi"], result
