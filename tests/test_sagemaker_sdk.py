"""The cpu image under the SageMaker Python SDK's local mode, the client users run: 2-host jobs through
`Estimator(..., instance_type="local").fit()`, which writes each host's /opt/ml/input/config, starts the hosts
with docker-compose (`up --abort-on-container-exit`: the first container to exit stops the others and gives
the job its status), then merges every host's /opt/ml/model and /opt/ml/output into model.tar.gz and
output.tar.gz (a later host's file replaces an earlier one's).

SDK 2.x (`sagemaker<3`): its local mode starts the containers with the `train` command as SageMaker does,
and runs offline with dummy credentials, a region and file:// paths. It lives in its own virtual environment
(scripts/setup.sh makes it; IMGBUILD_SAGEMAKER_SDK_VENV overrides where), since it pins versions this
project's environment must not be held to; tests/sagemaker_local_job.py is what runs there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from test_sagemaker import ALLREDUCE, ssh_key_pair

# The same default as scripts/setup.sh, which makes it.
SDK_VENV = Path(os.environ.get("IMGBUILD_SAGEMAKER_SDK_VENV", "/opt/imgbuild/sagemaker-sdk2"))
DRIVER = Path(__file__).with_name("sagemaker_local_job.py")
NETWORK = "sagemaker-local"  # the network local mode's compose file names (SDK 2.x, outside Studio)


@dataclass
class LocalJob:
    raised: str | None  # what fit() raised, None when the job succeeded
    model: dict[str, bytes]  # model.tar.gz, by member name
    output: dict[str, bytes]  # output.tar.gz, by member name
    log: str


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


@pytest.fixture
def sdk_python() -> Path:
    python = SDK_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no SageMaker Python SDK at {SDK_VENV} (run scripts/setup.sh, or set IMGBUILD_SAGEMAKER_SDK_VENV)")
    if (
        shutil.which("docker-compose") is None
        and subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode
    ):
        pytest.fail("SageMaker local mode needs docker-compose (run scripts/setup.sh: Debian's docker-compose)")
    return python


@pytest.fixture
def local_job(docker_client: Any, cpu_image: Any, sdk_python: Path, tmp_path: Path, request: pytest.FixtureRequest):
    """Runs a job in local mode; removes its containers (compose leaves them stopped) and the network."""
    import docker.errors

    image = cpu_image.refs[0]
    root = tmp_path / "local-mode"
    root.mkdir()
    keys = ssh_key_pair(docker_client, image, tmp_path / "ssh")
    network_existed = bool(docker_client.api.networks(names=[NETWORK]))

    def cleanup() -> None:
        for c in docker_client.api.containers(all=True, filters={"label": "com.docker.compose.project.working_dir"}):
            if c["Labels"]["com.docker.compose.project.working_dir"].startswith(f"{root}/"):
                with contextlib.suppress(docker.errors.APIError):  # already gone
                    docker_client.api.remove_container(c["Id"], force=True)
        if not network_existed:
            with contextlib.suppress(docker.errors.APIError):  # in use by a job of someone else's
                docker_client.api.remove_network(NETWORK)

    request.addfinalizer(cleanup)

    def run(script: str, hosts: int = 2) -> LocalJob:
        code, output = tmp_path / "code", tmp_path / "output"
        code.mkdir()
        output.mkdir()
        (code / "job.py").write_text(script)
        proc = subprocess.run(
            [str(sdk_python), str(DRIVER), "--image", image, "--hosts", str(hosts), "--code", str(code),
             "--program", "job.py", "--ssh", str(keys), "--output", str(output), "--root", str(root),
             "--env", "IMGBUILD_PEER_TIMEOUT=60"],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "SAGEMAKER_SUPPRESS_V2_WARNING": "1"},
        )  # fmt: skip
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log
        outcome = json.loads(proc.stdout.strip().splitlines()[-1])
        assert (output / "model.tar.gz").exists() and (output / "output.tar.gz").exists(), log
        return LocalJob(outcome["raised"], members(output / "model.tar.gz"), members(output / "output.tar.gz"), log)

    return run


@pytest.mark.docker
@pytest.mark.slow
def test_two_host_job_succeeds_and_writes_its_model(local_job: Any) -> None:
    job = local_job(ALLREDUCE)
    assert job.raised is None, job.log
    result = json.loads(job.model["result.json"])
    assert (result["size"], result["sum"]) == (2, 3), job.log
    assert "failure" not in job.output, f"stray failure reason: {job.output['failure']!r}\n{job.log}"


FAILS_ON_ITS_OWN = """\
import sys

from mpi4py import MPI

MPI.COMM_WORLD.Barrier()
sys.exit(3 if MPI.COMM_WORLD.rank == 0 else 0)
"""

FAILS_WITH_A_REASON = """\
import sys

from mpi4py import MPI

MPI.COMM_WORLD.Barrier()
if MPI.COMM_WORLD.rank == 0:
    with open("/opt/ml/output/failure", "w") as f:
        f.write("loss became NaN at step 7")
    sys.exit(3)
"""


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (FAILS_ON_ITS_OWN, b"program 'job.py' exited with status 3 (see the job's log)\n"),
        (FAILS_WITH_A_REASON, b"loss became NaN at step 7"),  # SageMaker's contract: the program's own reason
    ],
    ids=["exit-status", "written-reason"],
)
def test_failing_job_reports_the_programs_reason(local_job: Any, script: str, reason: bytes) -> None:
    job = local_job(script)
    assert job.raised is not None and "exited with code: 3" in job.raised, job.log
    assert job.output.get("failure") == reason, job.log
