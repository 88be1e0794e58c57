"""SageMaker bring-your-own-container contract: the rendered `train` and entrypoint, then jobs simulated with real
containers of the cpu image (one per host, named algo-1..N on a private network, each with its own
resourceconfig.json, the job's code, model and output folders bind-mounted, and a per-test ssh key pair)."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import sm_code
from conftest import SHIPPED, Host, Job, ssh_key_pair
from imgbuild import recipe
from imgbuild.blocks import TEMPLATE_DIR, sagemaker
from imgbuild.blocks.sshd import SSHD_LOG
from imgbuild.core import paths
from imgbuild.image import render
from imgbuild.pin.lock import lock_or_fresh, resolved_for

# --------------------------------------------------------------------------------------------------------------
# Rendering (no engine)


def context_files(ref: str | Path) -> dict[str, str]:
    resolved, _ = lock_or_fresh(recipe.load(ref), lookup_torch=None)  # a user's recipe here has no lock
    return {f.path: f.content.decode() for f in render.plan(resolved).files}


STATIC = {  # context path -> the static script it is (tests/test_scripts.py lints and runs them)
    "imgbuild/imgbuild-entrypoint": paths.images_dir() / "files" / "imgbuild-entrypoint",
    "imgbuild/sshd/50-sshd.sh": TEMPLATE_DIR / "sshd" / "files" / "50-sshd.sh",
    "imgbuild/sagemaker/train": TEMPLATE_DIR / "sagemaker" / "files" / "train",
    "imgbuild/sagemaker/40-sagemaker.sh": TEMPLATE_DIR / "sagemaker" / "files" / "40-sagemaker.sh",
}


def conf(text: str) -> dict[str, str]:
    pairs = [line.partition("=") for line in text.splitlines()]
    assert all(key and sep for key, sep, _ in pairs), text
    return {key: value for key, _, value in pairs}


@pytest.mark.parametrize("name", SHIPPED)
def test_scripts_are_static_and_their_data_plain(name: str) -> None:
    """Every image gets the same scripts; what differs is data (KEY=VALUE, one argument per line), no shell code."""
    files = context_files(name)
    for path, source in STATIC.items():
        assert path not in files or files[path] == source.read_text(), path
    assert "imgbuild/imgbuild-entrypoint" in files
    for path, text in files.items():
        if path.endswith(".conf"):
            assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", key) for key in conf(text)), (path, text)


@pytest.mark.parametrize(
    ("name", "slots", "ifname_vars", "mca"),
    [
        ("cpu", 1, "NCCL_SOCKET_IFNAME", ["--mca", "pml", "ob1"]),
        ("a100", 8, "NCCL_SOCKET_IFNAME", ["--mca", "pml", "^cm,ucx"]),
        ("gaudi-1.15", 8, "NCCL_SOCKET_IFNAME,HCCL_SOCKET_IFNAME",
         ["--mca", "btl_vader_single_copy_mechanism", "none"]),
        ("gaudi-1.21", 8, "NCCL_SOCKET_IFNAME,HCCL_SOCKET_IFNAME",
         ["--mca", "btl_vader_single_copy_mechanism", "none"]),
    ],
)  # fmt: skip
def test_train_data_of_the_recipe(name: str, slots: int, ifname_vars: str, mca: list[str]) -> None:
    files = context_files(name)
    data = conf(files["imgbuild/sagemaker/sagemaker.conf"])
    assert (data["SLOTS"], data["IFNAME_VARS"], data["SSH_PORTS"], data["LAUNCHER"]) == (
        str(slots),
        ifname_vars,
        "3022,22",
        "mpirun",
    )
    assert (data["FAILURE"], data["JOB_DONE"], data["SSHD_LOG"]) == (sagemaker.FAILURE, sagemaker.JOB_DONE, SSHD_LOG)
    args = files["imgbuild/sagemaker/mpirun.args"].splitlines()
    assert any(args[i : i + 3] == mca for i in range(len(args)))
    assert "lo,docker0" in args and "--allow-run-as-root" in args


def test_default_program_is_the_apps() -> None:
    """sagemaker.conf's DEFAULT_PROGRAM: the app block's program_path (train runs it when the job names none)."""
    from conftest import REPO

    assert conf(context_files("cpu")["imgbuild/sagemaker/sagemaker.conf"])["DEFAULT_PROGRAM"] == ""
    example = REPO / "examples" / "pytorch-app" / "pytorch-app.yaml"
    resolved = resolved_for(recipe.load(example))
    program = resolved.pins["app"].details.program_path
    assert program and program.endswith("train.py")
    assert conf(context_files(example)["imgbuild/sagemaker/sagemaker.conf"])["DEFAULT_PROGRAM"] == program


def test_torchrun_launcher_and_no_sagemaker(recipe_dir: Path) -> None:
    mine = recipe_dir / "mine.yaml"
    mine.write_text("extends: cpu\ncomponents:\n  sagemaker: {launcher: torchrun, ssh_port: 2222}\n")
    data = conf(context_files(mine)["imgbuild/sagemaker/sagemaker.conf"])
    assert (data["LAUNCHER"], data["SSH_PORTS"], data["SSH_SAGEMAKER_PORT"]) == ("torchrun", "3022,2222", "2222")
    plain = recipe_dir / "plain.yaml"
    plain.write_text("extends: cpu\ncomponents:\n  sagemaker: null\n")
    files = context_files(plain)
    assert not [path for path in files if path.startswith("imgbuild/sagemaker/")]
    assert "imgbuild/sshd/50-sshd.sh" in files


# --------------------------------------------------------------------------------------------------------------
# Jobs on the engine

ALLREDUCE = """\
import json
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
hosts = comm.gather(socket.gethostname(), root=0)
if comm.rank == 0:
    with open("/opt/ml/model/result.json", "w") as f:
        json.dump({"size": comm.size, "sum": total, "hosts": hosts}, f)
print(f"rank {comm.rank} of {comm.size} on {socket.gethostname()}: sum {total}", flush=True)
"""

FAILING = """\
import sys

from mpi4py import MPI

MPI.COMM_WORLD.Barrier()
sys.exit(3)
"""


@pytest.fixture
def sm_job(sagemaker_job: Any, cpu_image: Any) -> Any:
    """A simulated SageMaker job of the cpu image (conftest.sagemaker_job), running ALLREDUCE unless told otherwise."""

    def start(count: int, *, script: str = ALLREDUCE, **options: Any) -> Job:
        return sagemaker_job(cpu_image.refs[0], count, script=script, **options)  # type: ignore[no-any-return]

    return start


def finish(job: Job, timeout: float = 180) -> tuple[int, list[int], float]:
    """The leader's exit status, the workers', and how long the leader took."""
    started = time.monotonic()
    leader = job.wait(job.hosts[0], timeout)
    took = time.monotonic() - started
    workers = [job.wait(h, 60) for h in job.hosts[1:]]
    return leader, workers, took


def explain(job: Job) -> str:
    return "\n".join(f"---- {h.name}\n{job.logs(h)}" for h in job.hosts)


@pytest.mark.docker
@pytest.mark.parametrize(("count", "keys"), [(2, "channel"), (3, "env")])
def test_job_runs_across_hosts(sm_job: Any, count: int, keys: str) -> None:
    # Three hosts pass the program as arguments after `train`, two through SAGEMAKER_PROGRAM.
    job = sm_job(count, keys=keys, args=("job.py",) if count == 3 else ())
    leader, workers, took = finish(job)
    logs = explain(job)
    assert leader == 0, logs
    assert workers == [0] * (count - 1), logs
    result = json.loads((job.hosts[0].model / "result.json").read_text())
    assert result == {"size": count, "sum": count * (count + 1) // 2,
                      "hosts": [f"algo-{i}" for i in range(1, count + 1)]}  # fmt: skip
    leader_log = job.logs(job.hosts[0])
    assert "sshd listening on 3022,22" in leader_log  # SageMaker mode adds 22
    assert not [h.name for h in job.hosts if (h.output / "failure").exists()], logs  # no stray reason anywhere
    print(f"{count} hosts: leader done in {took:.1f}s")


TOPOLOGY_RANKS = """\
import json
import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
seen = comm.gather([socket.gethostname(), os.environ.get("SM_TOPOLOGY")], root=0)
if comm.rank == 0:
    with open("/opt/ml/model/result.json", "w") as f:
        json.dump(seen, f)
"""


@pytest.mark.docker
def test_topology_puts_each_capacity_units_ranks_together(sm_job: Any) -> None:
    """resourceconfig's topology (GB200 UltraServers): mpirun's ranks fill capacity unit cu-a (algo-1, algo-3), then
    cu-b (algo-2), and every rank sees the topology as SM_TOPOLOGY."""
    topology = [
        {"hostName": "algo-1", "capacityUnitId": "cu-a"},
        {"hostName": "algo-2", "capacityUnitId": "cu-b"},
        {"hostName": "algo-3", "capacityUnitId": "cu-a"},
    ]
    job = sm_job(3, script=TOPOLOGY_RANKS, topology=topology)
    leader, workers, _ = finish(job)
    logs = explain(job)
    assert (leader, workers) == (0, [0, 0]), logs
    seen = json.loads((job.hosts[0].model / "result.json").read_text())
    assert [host for host, _ in seen] == ["algo-1", "algo-3", "algo-2"], logs
    assert {json.dumps(json.loads(t)) for _, t in seen} == {json.dumps(topology)}, logs
    assert "topology: 2 capacity unit(s): cu-a (algo-1 algo-3), cu-b (algo-2)" in job.logs(job.hosts[0])


# Script mode: the code as SDK 2.x ships it (Estimator(source_dir=...)): sourcedir.tar.gz in S3, named by the
# sagemaker_submit_directory hyperparameter, with the program in sagemaker_program. Every rank imports the wheel its
# requirements.txt installs and a module of the code, so each host must have fetched both before mpirun starts.
FETCHED = """\
import json
import socket

import imgbuild_probe_dep
from mpi4py import MPI

from helper import WORD

comm = MPI.COMM_WORLD
values = comm.gather([socket.gethostname(), imgbuild_probe_dep.VALUE, WORD], root=0)
if comm.rank == 0:
    with open("/opt/ml/model/result.json", "w") as f:
        json.dump(values, f)
"""


def s3_job(sm_job: Any, s3: Any, count: int, archive: bytes | None, key: str = "job/source/sourcedir.tar.gz") -> Job:
    """A job whose code is `archive` at s3://<a fresh bucket>/`key` (None: nothing uploaded there)."""
    bucket = s3.bucket()
    uri = s3.put(bucket, key, archive) if archive is not None else f"s3://{bucket}/{key}"
    return sm_job(  # type: ignore[no-any-return]
        count, script="", mount_code=False, env={**s3.env(), "SAGEMAKER_PROGRAM": ""},
        hyperparameters={"sagemaker_submit_directory": uri, "sagemaker_program": "fetched.py", "epochs": "2"},
    )  # fmt: skip


@pytest.mark.docker
def test_code_from_s3_runs_on_every_host_with_its_requirements(sm_job: Any, bridge_s3: Any) -> None:
    code = sm_code.sourcedir({"fetched.py": FETCHED, "helper.py": "WORD = 'fetched'\n"}, with_dep=True)
    job = s3_job(sm_job, bridge_s3, 2, code)
    leader, workers, took = finish(job)
    logs = explain(job)
    assert (leader, workers) == (0, [0]), logs
    result = json.loads((job.hosts[0].model / "result.json").read_text())
    assert result == [["algo-1", 42, "fetched"], ["algo-2", 42, "fetched"]], logs
    for host in job.hosts:
        assert "installing requirements.txt" in job.logs(host), logs
    print(f"2 hosts, code from S3: leader done in {took:.1f}s")


@pytest.mark.docker
@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("missing-key", 82, "sagemaker_submit_directory {uri}: no such object (NoSuchKey)"),
        ("escaping-member", 88,
         "sagemaker_submit_directory {uri}: unsafe archive member '../escaped.py': leaves the code folder; "
         "nothing was unpacked"),
        ("failing-requirements", 90,
         "pip install -r requirements.txt failed (exit 1): ERROR: No matching distribution found for "
         "imgbuild-no-such-dist==9"),
    ],
    ids=["missing-key", "escaping-member", "failing-requirements"],
)  # fmt: skip
def test_code_fetch_failures_are_the_jobs_reason(
    sm_job: Any, bridge_s3: Any, case: str, status: int, reason: str
) -> None:
    archive = {
        "missing-key": None,
        "escaping-member": sm_code.tar_gz([("fetched.py", b""), ("../escaped.py", b"")]),
        "failing-requirements": sm_code.sourcedir({"fetched.py": "", "requirements.txt": sm_code.BAD_REQUIREMENTS}),
    }[case]
    job = s3_job(sm_job, bridge_s3, 1, archive)
    leader, _, _ = finish(job)
    logs = explain(job)
    assert leader == status, logs
    (config,) = [json.loads(p.read_text()) for p in job.hosts[0].output.parent.glob("config/hyperparameters.json")]
    uri = json.loads(config["sagemaker_submit_directory"])
    assert (job.hosts[0].output / "failure").read_text() == reason.format(uri=uri) + "\n", logs


@pytest.mark.docker
def test_failing_program_fails_the_job(sm_job: Any) -> None:
    job = sm_job(2, script=FAILING, keys="dir")
    leader, workers, _ = finish(job)
    logs = explain(job)
    assert leader != 0, logs
    # Workers end with the leader's status (docker compose takes the job's from whichever container exits
    # first), and only the leader reports the reason.
    assert workers == [leader], logs
    failure = (job.hosts[0].output / "failure").read_text()
    assert "program 'job.py' exited with status" in failure, failure
    assert not (job.hosts[1].output / "failure").exists(), logs


FAILING_WITH_REASON = """\
import sys

with open("/opt/ml/output/failure", "w") as f:
    f.write("loss became NaN at step 7")
sys.exit(2)
"""


@pytest.mark.docker
def test_reason_the_program_wrote_is_kept(sm_job: Any) -> None:
    # SageMaker's contract: the algorithm may write its own reason to /opt/ml/output/failure.
    job = sm_job(1, script=FAILING_WITH_REASON)
    leader, _, _ = finish(job)
    assert leader != 0, explain(job)
    assert (job.hosts[0].output / "failure").read_text() == "loss became NaN at step 7", explain(job)


@pytest.mark.docker
def test_missing_peer_times_out_clearly(sm_job: Any) -> None:
    job = sm_job(3, absent=("algo-3",), env={"IMGBUILD_PEER_TIMEOUT": "15"})
    leader, workers, took = finish(job, timeout=120)
    logs = explain(job)
    assert leader != 0, logs
    assert took < 60, f"took {took:.0f}s\n{logs}"
    assert "timed out after 15s waiting for sshd on 1 of 2 peer(s): algo-3" in job.logs(job.hosts[0]), logs
    assert "algo-3" in (job.hosts[0].output / "failure").read_text()
    assert workers == [leader], logs  # told by the leader that the job is over, and how it ended
    assert not (job.hosts[1].output / "failure").exists(), logs


@pytest.mark.docker
def test_worker_gives_up_when_the_leader_never_comes(sm_job: Any) -> None:
    job = sm_job(2, absent=("algo-1",), env={"IMGBUILD_LEADER_TIMEOUT": "5"})
    (worker,) = job.hosts
    assert job.wait(worker, 60) != 0, explain(job)
    assert "the leader algo-1 did not reach this host within 5s" in job.logs(worker)
    assert "algo-1" in (worker.output / "failure").read_text()


@pytest.mark.docker
def test_entrypoint_outside_sagemaker(docker_client: Any, cpu_image: Any) -> None:
    out = docker_client.containers.run(
        cpu_image.refs[0], ["bash", "-c", "wc -l </root/.ssh/authorized_keys; cat /etc/ssh/imgbuild.d/ports.conf"],
        remove=True, stdout=True, stderr=True,
    ).decode()  # fmt: skip
    assert "sshd listening on 3022\n" in out  # no 22 unless the command is `train`
    assert "no authorized key given" in out
    assert out.splitlines()[-1] == "0"  # nothing authorized: no key ever comes from the image


SLEEPY = """\
import time

from mpi4py import MPI

MPI.COMM_WORLD.Barrier()
print("started", flush=True)
time.sleep(600)
"""


def wait_for_log(job: Job, host: Host, text: str, timeout: float = 60) -> None:
    wait_for_container_log(job.client, host.container_id, text, timeout)


@pytest.mark.docker
def test_stopped_leader_ends_the_job(sm_job: Any) -> None:
    job = sm_job(2, script=SLEEPY)
    leader, worker = job.hosts
    wait_for_log(job, leader, "started")
    job.client.api.stop(leader.container_id, timeout=30)  # SIGTERM, as SageMaker's StopTrainingJob
    assert job.wait(leader, 5) == 143, explain(job)
    assert job.wait(worker, 30) == 143, explain(job)  # told by the leader on its way out
    assert "stopped by a signal" in (leader.output / "failure").read_text()
    assert not (worker.output / "failure").exists(), explain(job)


@pytest.mark.docker
def test_worker_stopped_after_the_leader_is_done_ends_as_the_leader(sm_job: Any) -> None:
    # Local mode's docker compose stops (SIGTERM) the other containers as soon as the leader's has exited, and
    # merges every host's /opt/ml/output: a stopped worker must neither change the status nor the reason. The
    # leader's done marker is written here as the leader's exit writes it, then the worker is stopped at once
    # (it looks for the marker once a second, so the signal nearly always comes first).
    job = sm_job(2, script=SLEEPY)
    leader, worker = job.hosts
    wait_for_log(job, leader, "started")
    done = f"echo 3 >{sagemaker.JOB_DONE}.tmp && mv {sagemaker.JOB_DONE}.tmp {sagemaker.JOB_DONE}"
    exec_id = job.client.api.exec_create(worker.container_id, ["sh", "-c", done])["Id"]
    job.client.api.exec_start(exec_id)
    job.client.api.stop(worker.container_id, timeout=30)
    assert job.wait(worker, 5) == 3, explain(job)
    assert not (worker.output / "failure").exists(), explain(job)
    print("worker's way out:", job.logs(worker).strip().splitlines()[-1])


ENV_PROGRAM = ("env",)  # a command on PATH: train runs it as the program, and its output is the job's log


@pytest.mark.docker
def test_missing_interface_falls_back_to_the_default_route(sm_job: Any) -> None:
    # SDK 3.x local mode writes network_interface_name `ethwe`, which a container on a compose network lacks.
    job = sm_job(1, args=ENV_PROGRAM, interface="ethwe", env={"IMGBUILD_LAUNCHER": "none"})
    leader, _, _ = finish(job)
    log = job.logs(job.hosts[0])
    assert leader == 0, log
    assert "names network interface 'ethwe', which this host does not have: using 'eth0'" in log
    assert "NCCL_SOCKET_IFNAME=eth0\n" in log.replace("\r", "")


@pytest.mark.docker
def test_missing_interface_without_a_route_sets_nothing(sm_job: Any) -> None:
    job = sm_job(1, args=ENV_PROGRAM, interface="ethwe", env={"IMGBUILD_LAUNCHER": "none"}, isolated=True)
    leader, _, _ = finish(job)
    log = job.logs(job.hosts[0])
    assert leader == 0, log
    assert "and there is no default route: leaving NCCL_SOCKET_IFNAME unset" in log
    assert "NCCL_SOCKET_IFNAME=" not in log


@pytest.mark.docker
def test_worker_notices_a_lost_leader(sm_job: Any) -> None:
    job = sm_job(2, script=SLEEPY)
    leader, worker = job.hosts
    wait_for_log(job, leader, "started")
    job.client.api.kill(leader.container_id)  # SIGKILL: no chance to tell anyone
    assert job.wait(worker, 90) != 0, explain(job)
    assert "the leader algo-1 went away" in (worker.output / "failure").read_text()


# --------------------------------------------------------------------------------------------------------------
# The environment of ssh sessions (what mpirun's daemons and ranks on the other hosts get)

# Values sshd_config must carry through its quoting, and one it cannot (a newline): left out with a warning.
TRICKY = {
    "IMGBUILD_TEST_QUOTES": "a \"quoted\" 'value' with $HOME, %h, # and a tab\there",
    "IMGBUILD_TEST_BACKSLASHES": "C:\\path\\ and a trailing \\",
    "IMGBUILD_TEST_EMPTY": "",
    "IMGBUILD_TEST_UNICODE": "gr\u00fc\u00df \u20ac",
}
UNCARRIABLE = {"IMGBUILD_TEST_NEWLINE": "two\nlines"}


def exec_in(client: Any, container_id: str, cmd: list[str]) -> tuple[int, str]:
    exec_id = client.api.exec_create(container_id, cmd)["Id"]
    out = client.api.exec_start(exec_id).decode(errors="replace")
    return int(client.api.exec_inspect(exec_id)["ExitCode"]), out


@pytest.mark.docker
def test_ssh_sessions_get_the_whole_environment(docker_client: Any, cpu_image: Any, tmp_path: Path) -> None:
    import docker.errors

    image = cpu_image.refs[0]
    image_env = dict(e.split("=", 1) for e in docker_client.api.inspect_image(image)["Config"]["Env"])
    assert {"PATH", "FI_PROVIDER"} <= image_env.keys()
    keys = ssh_key_pair(docker_client, image, tmp_path / "ssh")
    network = f"imgbuild-sshenv-{uuid.uuid4().hex[:10]}"
    docker_client.api.create_network(network, driver="bridge", labels={"io.imgbuild.test": "sagemaker"})
    ids: list[str] = []
    try:
        for name in ("node1", "node2"):
            container = docker_client.api.create_container(
                image, command=["sleep", "600"], name=f"{network}-{name}", hostname=name,
                environment={"IMGBUILD_SSH_DIR": "/run/job-keys", **TRICKY, **UNCARRIABLE},
                labels={"io.imgbuild.test": "sagemaker"},
                host_config=docker_client.api.create_host_config(
                    binds={str(keys): {"bind": "/run/job-keys", "mode": "ro"}}, network_mode=network
                ),
                networking_config=docker_client.api.create_networking_config(
                    {network: docker_client.api.create_endpoint_config(aliases=[name])}
                ),
            )  # fmt: skip
            ids.append(container["Id"])
            docker_client.api.start(container["Id"])
        expected = {**image_env, **TRICKY}
        for cid in ids:
            wait_for_container_log(docker_client, cid, "sshd listening on")
        node1, node2 = ids
        logs = docker_client.api.logs(node1).decode(errors="replace")
        assert "not passing IMGBUILD_TEST_NEWLINE to ssh sessions: sshd_config cannot carry a newline" in logs

        # What sshd itself parsed from its configuration: one `setenv NAME=value` line per variable.
        rc, out = exec_in(docker_client, node1, ["/usr/sbin/sshd", "-T"])
        assert rc == 0, out
        setenv = dict(line.split(" ", 1)[1].split("=", 1) for line in out.splitlines() if line.startswith("setenv "))
        assert {k: setenv.get(k) for k in expected} == expected
        assert "IMGBUILD_TEST_NEWLINE" not in setenv

        # What a session started over ssh from another host sees (NUL-separated: values may hold anything).
        rc, out = exec_in(docker_client, node2, ["bash", "-c", "ssh node1 env -0 | base64 -w0"])
        assert rc == 0, out
        remote = dict(v.split("=", 1) for v in base64.b64decode(out).decode().split("\0") if v)
        assert {k: remote.get(k) for k in expected} == expected
        assert "IMGBUILD_TEST_NEWLINE" not in remote
    finally:
        for cid in ids:
            with contextlib.suppress(docker.errors.APIError):
                docker_client.api.remove_container(cid, force=True)
        with contextlib.suppress(docker.errors.APIError):
            docker_client.api.remove_network(network)


def wait_for_container_log(client: Any, container_id: str, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in (log := client.api.logs(container_id).decode(errors="replace")):
        assert time.monotonic() < deadline, f"no {text!r} within {timeout}s\n{log}"
        time.sleep(0.3)


# `python -m torch.distributed.run` run from /opt/ml/code (train's working folder, first on sys.path under -m)
# imports this torch: it prints the options train gave torchrun instead of starting anything.
FAKE_TORCHRUN = {
    "torch/__init__.py": "",
    "torch/distributed/__init__.py": "",
    # It stays up a while: a host that ended at once would take its sshd with it before the other one saw it.
    "torch/distributed/run.py": (
        'import json, sys, time\nprint("IMGBUILD-ARGV " + json.dumps(sys.argv[1:]), flush=True)\ntime.sleep(20)\n'
    ),
}


@pytest.mark.docker
def test_torchrun_publishes_the_hosts_sagemaker_name(sm_job: Any, docker_client: Any, cpu_image: Any) -> None:
    """IMGBUILD_LAUNCHER=torchrun on two SageMaker hosts: each host's torchrun line is the launch module's, with
    `--local-addr` = its resourceconfig.json `current_host` (rank 0 publishes it as the rendezvous master; the
    container's own hostname need not resolve on SageMaker)."""
    from imgbuild.core.paths import MANIFEST_PATH
    from imgbuild.image import launch
    from imgbuild.image.manifest import Manifest

    job = sm_job(2, script="", files=FAKE_TORCHRUN, env={"IMGBUILD_LAUNCHER": "torchrun"})
    leader, workers, _ = finish(job, 120)
    logs = explain(job)
    assert leader == 0 and workers == [0], logs
    raw = docker_client.containers.run(cpu_image.refs[0], ["cat", MANIFEST_PATH], remove=True, entrypoint=[])
    manifest = Manifest.parse(raw, cpu_image.refs[0])
    for host in job.hosts:
        lines = [ln for ln in job.logs(host).splitlines() if ln.startswith("IMGBUILD-ARGV ")]
        assert len(lines) == 1, logs
        ran = json.loads(lines[0].split(" ", 1)[1])
        options = launch.Launch.torchrun_options(
            nnodes=2, nproc_per_node=manifest.slots, endpoint="algo-1:29500", run_id="imgbuild", local_addr=host.name
        )
        assert ran[: len(options)] == options, (host.name, ran)
        assert ran[len(options) :] == ["/opt/ml/code/job.py"], (host.name, ran)
