"""sagemaker: the SageMaker training contract (bring your own container): the /opt/ml tree and `train` on PATH.

Recipe options (`components.sagemaker`):
    launcher   mpirun (default): the leader runs the program under the recipe's mpirun line across the hosts |
               torchrun: every host runs torchrun (node rank = position in `hosts`)
    ssh_port   22 (default): the port the SageMaker training toolkit checks peers on (sshd listens there too)
`train` (files/sagemaker/train) and its entrypoint hook (files/sagemaker/40-sagemaker.sh) are static scripts; what
differs between images is data `config` writes into /etc/imgbuild: sagemaker.conf (KEY=VALUE), and the launch lines
of imgbuild.spec.launch (mpirun.args, torchrun.args: one argument per line; launch-env.conf: NAME=VALUE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from imgbuild.blocks._core import Block, Details, Pin, Resolution
from imgbuild.checks import CONTAINER, CheckContext, check, fail, passed
from imgbuild.checks.results import CheckResult
from imgbuild.core import paths
from imgbuild.spec.launch import for_manifest
from imgbuild.spec.schema import Port, Strict

if TYPE_CHECKING:
    from imgbuild.image.manifest import Manifest

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
HOSTFILE = "/tmp/imgbuild-hostfile"  # train's MPI hostfile (IMGBUILD_HOSTFILE)
TRAIN = "/usr/local/bin/train"


class SageMaker(Strict):
    """SageMaker training contract: the /opt/ml tree and a `train` executable on PATH."""

    launcher: Literal["mpirun", "torchrun"] = "mpirun"
    ssh_port: Port = 22


class SageMakerDetails(Details):
    """The contract's pin: how `train` launches the program and the port the training toolkit checks."""

    launcher: Literal["mpirun", "torchrun"]
    ssh_port: Port


def resolve(sm: SageMaker, rs: Resolution) -> Pin:
    if rs.options("sshd") is None:
        raise rs.fail("components.sagemaker", "SageMaker multi-node jobs need components.sshd")
    return Pin(
        version=None,
        source="imgbuild",
        origin="recipe",
        details=SageMakerDetails(launcher=sm.launcher, ssh_port=sm.ssh_port),
    )


def lines(values: list[str] | tuple[str, ...], what: str) -> str:
    """One value per line (what the scripts read with `mapfile -t` or `read`): a value with a line break cannot be."""
    for value in values:
        if "\n" in value or "\r" in value:
            raise ValueError(f"{what}: {value!r} holds a line break")
    return "".join(f"{v}\n" for v in values)


def config(pin: Pin, manifest: Manifest) -> dict[str, str]:
    """The data train and the entrypoint hook read (context path -> text): sagemaker.conf, the launch lines."""
    launch = for_manifest(manifest)
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
        "SSH_KEY_DIR": paths.SSH_KEY_DIR,
        "LEADER_SEEN": LEADER_SEEN,
        "JOB_DONE": JOB_DONE,
        "HOSTFILE": HOSTFILE,
        "SSHD_LOG": paths.SSHD_LOG,
        "ENTRYPOINT": paths.ENTRYPOINT,
        "TRAIN": TRAIN,
    }
    return {
        "imgbuild/sagemaker/sagemaker.conf": lines([f"{k}={v}" for k, v in conf.items()], "sagemaker.conf"),
        "imgbuild/sagemaker/mpirun.args": lines(launch.mpirun, "the mpirun line"),
        "imgbuild/sagemaker/torchrun.args": lines(launch.torchrun_template(), "the torchrun line"),
        "imgbuild/sagemaker/launch-env.conf": lines([f"{k}={v}" for k, v in launch.env_defaults], "mpirun env"),
    }


BLOCK = Block(
    name="sagemaker",
    options=SageMaker,
    modes={"imgbuild": "fragment"},
    resolve=resolve,
    details=SageMakerDetails,
    files=(
        ("imgbuild/sagemaker/train", "files/sagemaker/train", 0o755),
        ("imgbuild/sagemaker/40-sagemaker.sh", "files/sagemaker/40-sagemaker.sh", 0o644),
    ),
    data=config,
    template_globals={"sagemaker_paths": lambda: {"tree": TREE, "train": TRAIN}},
)


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
