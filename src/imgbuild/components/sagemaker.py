"""sagemaker: the SageMaker training contract (bring your own container): the /opt/ml tree and `train` on PATH.

Recipe options (`components.sagemaker`):
    launcher   mpirun (default): the leader runs the program under the recipe's mpirun line across the hosts |
               torchrun: every host runs torchrun (node rank = position in `hosts`)
    ssh_port   22 (default): the port the SageMaker training toolkit checks peers on (sshd listens there too)
`train` is rendered from images/files/train.j2 with the launch line from imgbuild.launch.
"""

from __future__ import annotations

from typing import Literal

from imgbuild.checks import CONTAINER, CheckContext, check, fail, passed
from imgbuild.components._core import Block, Details, Pin, Resolution
from imgbuild.report import CheckResult
from imgbuild.schema import Port, Strict


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


BLOCK = Block(
    name="sagemaker",
    options=SageMaker,
    modes={"imgbuild": "fragment"},
    resolve=resolve,
    details=SageMakerDetails,
    files=(("imgbuild/train", "files/train.j2", 0o755),),
)


@check("sagemaker-contract", "sagemaker", scopes=CONTAINER)
def sagemaker_contract(ctx: CheckContext) -> CheckResult:
    """The SageMaker tree (/opt/ml/{code,model,input/config,input/data,output}) and `train` on PATH."""
    dirs = ["/opt/ml/code", "/opt/ml/model", "/opt/ml/input/config", "/opt/ml/input/data", "/opt/ml/output"]
    ran = ctx.run(
        f'for d in {" ".join(dirs)}; do [ -d "$d" ] || echo "missing $d"; done; '
        't="$(command -v train)"; if [ -z "$t" ]; then echo "missing train"; '
        'elif [ ! -x "$t" ]; then echo "not executable $t"; else echo "train $t"; fi'
    )
    problems = [line for line in ran.out.splitlines() if line.startswith(("missing", "not executable"))]
    train = next((line.split(" ", 1)[1] for line in ran.out.splitlines() if line.startswith("train ")), "")
    expected = "/opt/ml tree, train on PATH"
    if problems:
        return fail("; ".join(problems), expected, train or "no train")
    return passed(expected, f"train: {train}")
