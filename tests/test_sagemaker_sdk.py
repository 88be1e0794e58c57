"""The cpu image under the SageMaker Python SDK's local mode, the client users run: 2-host jobs through
`Estimator(..., instance_type="local").fit()`, which writes each host's /opt/ml/input/config, starts the hosts
with docker-compose (`up --abort-on-container-exit`: the first container to exit stops the others and gives
the job its status), then merges every host's /opt/ml/model and /opt/ml/output into model.tar.gz and
output.tar.gz (a later host's file replaces an earlier one's).

SDK 2.x (`sagemaker<3`): its local mode starts the containers with the `train` command as SageMaker does,
and runs offline with dummy credentials, a region and file:// paths. It lives in its own virtual environment
(scripts/setup.sh makes it; IMGBUILD_SAGEMAKER_SDK_VENV overrides where), since it pins versions this
project's environment must not be held to; tests/sagemaker_local_job.py is what runs there.

The job runs on any image: `local_job_for(IMAGE)` (a fixture's factory) gives the runner for that image;
`local_job` is the cpu image's. The code is mounted (local_code) unless the run is given an S3 server
(tests/sm_code.py): then the SDK uploads source_dir as sourcedir.tar.gz and `train` fetches it on every host.
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

import sm_code
from test_sagemaker import ALLREDUCE, FETCHED, ssh_key_pair

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
def local_job_for(docker_client: Any, sdk_python: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """`local_job_for(image)` -> `run(script, hosts=2, *, files=None, program="job.py", env=None, s3=None,
    requirements=False)`, which runs one local-mode job of `image` and returns its LocalJob. `files` are more files
    of source_dir (relative path -> text); `s3` (an sm_code.S3 the containers reach) sends the code through S3 (a
    fresh bucket) instead of mounting it; `requirements` adds requirements.txt naming a wheel shipped in
    source_dir's wheels/ (sm_code.REQUIREMENTS). Every job's containers (compose leaves them stopped) and the
    network are removed at the end."""
    import docker.errors

    roots: list[Path] = []
    network_existed = bool(docker_client.api.networks(names=[NETWORK]))

    def cleanup() -> None:
        for c in docker_client.api.containers(all=True, filters={"label": "com.docker.compose.project.working_dir"}):
            if any(c["Labels"]["com.docker.compose.project.working_dir"].startswith(f"{root}/") for root in roots):
                with contextlib.suppress(docker.errors.APIError):  # already gone
                    docker_client.api.remove_container(c["Id"], force=True)
        if not network_existed:
            with contextlib.suppress(docker.errors.APIError):  # in use by a job of someone else's
                docker_client.api.remove_network(NETWORK)

    request.addfinalizer(cleanup)

    def for_image(image: str) -> Any:
        def run(
            script: str,
            hosts: int = 2,
            *,
            files: dict[str, str] | None = None,
            program: str = "job.py",
            env: dict[str, str] | None = None,
            s3: sm_code.S3 | None = None,
            requirements: bool = False,
        ) -> LocalJob:
            work = tmp_path / f"job-{len(roots)}"
            root, code, output = work / "local-mode", work / "code", work / "output"
            for d in (root, code, output):
                d.mkdir(parents=True)
            roots.append(root)
            keys = ssh_key_pair(docker_client, image, work / "ssh")
            (code / program).write_text(script)
            for rel, text in (files or {}).items():
                sm_code.write(code / rel, text.encode())
            if requirements:
                name, wheel = sm_code.wheel()
                sm_code.write(code / "wheels" / name, wheel)
                (code / "requirements.txt").write_text(sm_code.REQUIREMENTS)
            environment = {"IMGBUILD_PEER_TIMEOUT": "60", **(env or {})}
            argv = [str(sdk_python), str(DRIVER), "--image", image, "--hosts", str(hosts), "--code", str(code),
                    "--program", program, "--ssh", str(keys), "--output", str(output), "--root", str(root),
                    *(a for k, v in environment.items() for a in ("--env", f"{k}={v}"))]  # fmt: skip
            if s3 is not None:
                argv += ["--s3-endpoint", s3.endpoint, "--bucket", s3.bucket()]
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=300, check=False,
                env={**os.environ, "SAGEMAKER_SUPPRESS_V2_WARNING": "1"},
            )  # fmt: skip
            log = proc.stdout + proc.stderr
            assert proc.returncode == 0, log
            outcome = json.loads(proc.stdout.strip().splitlines()[-1])
            assert (output / "model.tar.gz").exists() and (output / "output.tar.gz").exists(), log
            return LocalJob(outcome["raised"], members(output / "model.tar.gz"), members(output / "output.tar.gz"), log)

        return run

    return for_image


@pytest.fixture
def local_job(local_job_for: Any, cpu_image: Any) -> Any:
    """A local-mode job of the cpu image (local_job_for)."""
    return local_job_for(cpu_image.refs[0])


@pytest.mark.docker
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


@pytest.mark.docker
def test_two_host_job_with_source_dir_through_s3(local_job: Any, bridge_s3: Any) -> None:
    """Estimator(source_dir=..., entry_point=...) with local_code off: the SDK uploads sourcedir.tar.gz to the S3
    endpoint (moto on the host's docker0 address), and each host's train downloads it, installs its
    requirements.txt (a wheel shipped in it) and the leader runs the program across both."""
    job = local_job(FETCHED, program="fetched.py", files={"helper.py": "WORD = 'fetched'\n"}, s3=bridge_s3,
                    requirements=True)  # fmt: skip
    assert job.raised is None, job.log
    ranks = json.loads(job.model["result.json"])  # [hostname, the wheel's VALUE, the code's WORD] of each rank
    assert [(value, word) for _, value, word in ranks] == [(42, "fetched")] * 2, job.log
    assert len({host for host, _, _ in ranks}) == 2, job.log  # one rank on each host (local mode's container ids)
    assert "sagemaker_submit_directory: s3://" in job.log and "/source/sourcedir.tar.gz" in job.log, job.log
    assert job.log.count("imgbuild-fetch-code: requirements.txt installed") == 2, job.log  # on each host
    assert "failure" not in job.output, job.log
