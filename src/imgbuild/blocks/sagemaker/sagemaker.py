"""sagemaker: the SageMaker training contract (bring your own container): the /opt/ml tree and `train` on PATH.

`train` (sagemaker/files/train), the code fetcher it runs on every host (sagemaker/files/fetch-code: script mode's
source_dir from S3, a local path or the `code` channel, then requirements.txt) and its entrypoint hook
(sagemaker/files/40-sagemaker.sh) are static scripts; what differs between images is data `config` writes into
/etc/imgbuild: sagemaker.conf (KEY=VALUE), and the launch lines of imgbuild.image.launch (mpirun.args,
torchrun.args: one argument per line; launch-env.conf: NAME=VALUE).
"""

from __future__ import annotations

from typing import Literal

from imgbuild.blocks._block import Block, ImageFacts, LaunchLines, PythonSets, ShipsFiles
from imgbuild.blocks._core import Context, Details, Pin, Resolution
from imgbuild.blocks.sshd import SSH_KEY_DIR, SSHD_LOG
from imgbuild.checks import CONTAINER, CheckContext, check, compare, fail, passed
from imgbuild.checks.results import CheckResult
from imgbuild.core import paths
from imgbuild.core.fields import Port, Strict, pin_validator

# The SageMaker tree (the contract's paths) and what train keeps in /tmp; the scripts get them from sagemaker.conf.
OPT_ML = "/opt/ml"
CODE_DIR = f"{OPT_ML}/code"
MODEL_DIR = f"{OPT_ML}/model"
CONFIG_DIR = f"{OPT_ML}/input/config"
DATA_DIR = f"{OPT_ML}/input/data"
OUTPUT_DIR = f"{OPT_ML}/output"
TREE = (CODE_DIR, MODEL_DIR, CONFIG_DIR, DATA_DIR, OUTPUT_DIR)  # made in the image; sagemaker-contract checks it
RESOURCECONFIG = f"{CONFIG_DIR}/resourceconfig.json"
HYPERPARAMETERS = f"{CONFIG_DIR}/hyperparameters.json"
FAILURE = f"{OUTPUT_DIR}/failure"  # the job's failure reason
SSH_CHANNEL = f"{DATA_DIR}/ssh"  # the input channel `ssh`: the job's key pair
LEADER_SEEN = "/tmp/imgbuild-leader-seen"  # on a worker: the leader reached it over ssh
JOB_DONE = "/tmp/imgbuild-job-done"  # on a worker: the leader's exit status, once the job is over
WORKER_READY = "/tmp/imgbuild-worker-ready"  # on a worker: its code is fetched (the leader's ssh probe checks it)
HOSTFILE = "/tmp/imgbuild-hostfile"  # train's MPI hostfile (IMGBUILD_HOSTFILE)
TRAIN = "/usr/local/bin/train"
FETCH_CODE = "/usr/local/lib/imgbuild/fetch-code"  # train runs it with the image's Python on every host
CODE_CHANNEL = f"{DATA_DIR}/code"  # the input channel `code` (SDK 3.x ModelTrainer's source_code)
# boto3 for fetch-code's S3 downloads: the newest release when this default was set.
BOTO3 = "1.44.5"


class SageMaker(Strict):
    """SageMaker training contract: the /opt/ml tree and a `train` executable on PATH."""

    launcher: Literal["mpirun", "torchrun"] = "mpirun"
    """mpirun: the leader runs the program under the recipe's mpirun line across the hosts | torchrun: every host runs
    torchrun (node rank = position in `hosts`)."""
    ssh_port: Port = 22
    """The port the SageMaker training toolkit checks peers on (sshd listens there too)."""
    boto3: str | None = BOTO3
    """The boto3 release pip installs into the venv (requirement set `sagemaker`), which fetch-code needs to download
    `sagemaker_submit_directory` from S3; null for none. An image whose python block has no venv (gaudi) gets none
    whatever this says."""
    _pin = pin_validator("boto3")


class SageMakerDetails(Details):
    """The contract's pin: how `train` launches the program, the port the training toolkit checks, and the boto3
    fetch-code downloads the job's code from S3 with (None: the image has none)."""

    launcher: Literal["mpirun", "torchrun"]
    ssh_port: Port
    boto3: str | None = None


def lines(values: list[str] | tuple[str, ...], what: str) -> str:
    """One value per line (what the scripts read with `mapfile -t` or `read`): a value with a line break cannot be."""
    for value in values:
        if "\n" in value or "\r" in value:
            raise ValueError(f"{what}: {value!r} holds a line break")
    return "".join(f"{v}\n" for v in values)


def default_program(manifest: ImageFacts) -> str:
    """The image's own program (the app block's details' program_path), "" when it has none."""
    app = manifest.details("app")
    program = getattr(app, "program_path", None) if app is not None else None
    return str(program) if program else ""


class SageMakerBlock(Block, PythonSets, ShipsFiles):
    name = "sagemaker"
    options = SageMaker
    modes = {"imgbuild": "fragment"}
    details = SageMakerDetails
    files = (
        ("imgbuild/sagemaker/train", "sagemaker/files/train", 0o755),
        ("imgbuild/sagemaker/fetch-code", "sagemaker/files/fetch-code", 0o755),
        ("imgbuild/sagemaker/40-sagemaker.sh", "sagemaker/files/40-sagemaker.sh", 0o644),
    )
    requirements_stage = "runtime"
    template_globals = {"sagemaker_paths": lambda: {"tree": TREE, "train": TRAIN, "fetch_code": FETCH_CODE}}

    def resolve(self, sm: SageMaker, rs: Resolution) -> Pin:
        if rs.options("sshd") is None:
            raise rs.fail("components.sagemaker", "SageMaker multi-node jobs need components.sshd")
        py = rs.options("python")
        venv = py is not None and py.venv is not None  # boto3 is pip-installed into the venv, or not at all
        return Pin(
            version=None,
            source="imgbuild",
            origin="recipe",
            details=SageMakerDetails(launcher=sm.launcher, ssh_port=sm.ssh_port, boto3=sm.boto3 if venv else None),
        )

    def data(self, pin: Pin, manifest: ImageFacts, launch: LaunchLines) -> dict[str, str]:
        """The data train and the entrypoint hook read (context path -> text): sagemaker.conf, the launch lines."""
        details = pin.typed(SageMakerDetails)
        ssh_port = details.ssh_port
        ssh_ports = [*manifest.ssh_ports, *([ssh_port] if ssh_port not in manifest.ssh_ports else [])]
        gaudi = manifest.platform.accelerator == "gaudi"
        conf = {
            "RECIPE": manifest.recipe,
            "PYTHON": manifest.python,
            "LAUNCHER": details.launcher,
            "SLOTS": str(manifest.slots),
            "SSH_PORTS": ",".join(map(str, ssh_ports)),  # every port peers may use: sshd's, then SageMaker's
            "SSH_SAGEMAKER_PORT": str(ssh_port),
            # set to the job's network interface (NCCL and HCCL read them as a prefix)
            "IFNAME_VARS": "NCCL_SOCKET_IFNAME,HCCL_SOCKET_IFNAME" if gaudi else "NCCL_SOCKET_IFNAME",
            "RESOURCECONFIG": RESOURCECONFIG,
            "HYPERPARAMETERS": HYPERPARAMETERS,
            "CODE_DIR": CODE_DIR,
            "FAILURE": FAILURE,
            "SSH_CHANNEL": SSH_CHANNEL,
            "SSH_KEY_DIR": SSH_KEY_DIR,
            "LEADER_SEEN": LEADER_SEEN,
            "JOB_DONE": JOB_DONE,
            "WORKER_READY": WORKER_READY,
            "HOSTFILE": HOSTFILE,
            "SSHD_LOG": SSHD_LOG,
            "ENTRYPOINT": paths.ENTRYPOINT,
            "TRAIN": TRAIN,
            "FETCH_CODE": FETCH_CODE,
            "CODE_CHANNEL": CODE_CHANNEL,
            # the program when the job names none (the app block's program_path, baked into the image)
            "DEFAULT_PROGRAM": default_program(manifest),
        }
        return {
            "imgbuild/sagemaker/sagemaker.conf": lines([f"{k}={v}" for k, v in conf.items()], "sagemaker.conf"),
            "imgbuild/sagemaker/mpirun.args": lines(launch.mpirun, "the mpirun line"),
            "imgbuild/sagemaker/torchrun.args": lines(launch.torchrun_template(), "the torchrun line"),
            "imgbuild/sagemaker/launch-env.conf": lines([f"{k}={v}" for k, v in launch.env_defaults], "mpirun env"),
        }

    def requirements(self, pin: Pin, ctx: Context) -> dict[str, list[str]]:
        """boto3 (fetch-code's S3 client) into the venv, in the runtime stage: none without a venv or with boto3
        null."""
        boto3 = pin.typed(SageMakerDetails).boto3
        py = ctx.details("python")
        if boto3 is None or py is None or not py.venv:
            return {}
        return {"sagemaker": [f"boto3=={boto3}"]}


BLOCK = SageMakerBlock()


@check("sagemaker-contract", "sagemaker", scopes=CONTAINER)
def sagemaker_contract(ctx: CheckContext) -> CheckResult:
    """The SageMaker tree (/opt/ml/{code,model,input/config,input/data,output}) and `train` on PATH."""
    ran = ctx.run(
        f'for d in {" ".join(TREE)}; do [ -d "$d" ] || echo "missing $d"; done; '
        't="$(command -v train)"; if [ -z "$t" ]; then echo "missing train"; '
        'elif [ ! -x "$t" ]; then echo "not executable $t"; else echo "train $t"; fi'
    )
    problems = [line for line in ran.out.splitlines() if line.startswith(("missing", "not executable"))]
    train = next((line.split(" ", 1)[1] for line in ran.out.splitlines() if line.startswith("train ")), "")
    expected = "/opt/ml tree, train on PATH"
    if problems:
        return fail("; ".join(problems), expected, train or "no train")
    return passed(expected, f"train: {train}")


@check("sagemaker-fetch-code", "sagemaker", scopes=CONTAINER)
def sagemaker_fetch_code(ctx: CheckContext) -> CheckResult:
    """train's code fetcher is in the image, with the pinned boto3 (for s3:// code) importable by the image's Python."""
    ran = ctx.run(f"test -f {FETCH_CODE} && echo present")
    if "present" not in ran.out:
        return fail(f"no {FETCH_CODE}", "fetch-code", "none")
    details = ctx.details("sagemaker")
    boto3 = getattr(details, "boto3", None)
    if boto3 is None:
        return passed("fetch-code", "fetch-code; no boto3 pinned (s3:// code cannot be fetched: exit 86)")
    data, ran = ctx.python_json("import json, boto3; print(json.dumps({'version': boto3.__version__}))")
    if data is None:
        return fail(f"import boto3: {ran.why()}", expected=f"boto3 {boto3}")
    return compare(boto3, str(data["version"]), "boto3")
