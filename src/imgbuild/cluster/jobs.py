"""`imgbuild cluster job RECIPE --engine ENGINE --nodes N [-- COMMAND...]`: a ready-to-apply job for the recipe's
image, running nccl-tests' all_reduce_perf by default (or COMMAND).

`render_job` is a pure function of its input: jobplan.py decides the job (`plan_job` -> `JobPlan`: image, devices,
EFA, environment, program, launch line), then one engine's format is written:

- `mpijob` (Kubeflow MPI Operator), `trainjob` (Kubeflow Trainer v2), `pytorchjob` (training-operator 1.9):
  Kubernetes objects as YAML, k8s.py (what each operator does to pods, and how the job copes with it);
- `slurm`: an sbatch script for pyxis/enroot, slurm.py.

`job_command` is its command line. The names the other modules define are importable from here too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from imgbuild import validate
from imgbuild.cluster.jobplan import (
    EFA_MAX,
    ENGINES,
    NAME_MAX,
    NODES_MAX,
    TORCH_ENGINES,
    Engine,
    JobPlan,
    accelerator_mismatch,
    efa_devices,
    image_manifest,
    job_name,
    nccl_tests_args,
    plan_job,
    program_words,
)
from imgbuild.cluster.k8s import TRAINER_CONTAINER, k8s_object, k8s_text
from imgbuild.cluster.slurm import mca_pairs, pyxis_image, sbatch
from imgbuild.errors import RecipeError

if TYPE_CHECKING:
    from imgbuild.resolver import Resolved

__all__ = [
    "ENGINES",
    "TORCH_ENGINES",
    "TRAINER_CONTAINER",
    "Engine",
    "JobPlan",
    "accelerator_mismatch",
    "efa_devices",
    "image_manifest",
    "job_command",
    "job_name",
    "k8s_object",
    "mca_pairs",
    "nccl_tests_args",
    "plan_job",
    "pyxis_image",
    "render_job",
    "render_plan",
]


def render_job(resolved: Resolved, engine: Engine | str, nodes: int, **options: Any) -> str:
    """The job's text: a Kubernetes object as YAML (mpijob, trainjob, pytorchjob) or an sbatch script (slurm).
    Byte-for-byte stable for the same input. `options` are `plan_job`'s (image, instance_type, command, name, efa,
    memory)."""
    return render_plan(plan_job(resolved, engine, nodes, **options))


def render_plan(job: JobPlan) -> str:
    return sbatch(job) if job.engine is Engine.slurm else k8s_text(job)


# --------------------------------------------------------------------------------------------------------------
# Command line: `imgbuild cluster job`
#
# A malformed value (its grammar, its range) is a usage error naming the option (exit 2), refused before the recipe
# is read; a well-formed one that the recipe cannot run with (an engine without PyTorch, an instance type without
# the recipe's accelerator, no known EFA count) is plan_job's RecipeError (exit 3).


def _command_words(words: list[str] | None) -> list[str] | None:
    try:
        program_words(words or ())
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return words


def job_command(
    recipe: Annotated[str, typer.Argument(help="A shipped recipe's name (see `imgbuild list`) or a YAML file.")],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="COMMAND",
            help="After `--`: what the ranks run instead of the default (nccl-tests all_reduce_perf, else an MPI "
            "check); for trainjob/pytorchjob, torchrun's program (a script and its arguments).",
            callback=_command_words,
        ),
    ] = None,
    engine: Annotated[
        Engine,
        typer.Option(
            "--engine", "-e", help="MPI Operator, Trainer v2, training-operator 1.9, or Slurm.", case_sensitive=False
        ),
    ] = Engine.mpijob,
    nodes: Annotated[
        int, typer.Option("--nodes", "-n", min=1, max=NODES_MAX, help="Nodes (workers) the job runs on.")
    ] = 2,
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            metavar="URI",
            help="A pushed copy of the image (default: the lock's local tag).",
            callback=validate.option(validate.image_ref),
        ),
    ] = None,
    instance_type: Annotated[
        str | None,
        typer.Option(
            "--instance-type",
            help="EC2 instance type of the nodes (default: the recipe's first; one that carries the recipe's "
            "accelerator); sets the EFA count and how far nccl-tests runs.",
            callback=validate.option(validate.instance_type),
        ),
    ] = None,
    efa: Annotated[
        int | None,
        typer.Option("--efa", min=0, max=EFA_MAX, help="EFA devices per node, for an instance type not in the table."),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            "--memory",
            help="Memory per node (Kubernetes quantity; default 32Gi, 2Gi on CPU).",
            callback=validate.option(validate.quantity),
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help=f"The job's name (default imgbuild-RECIPE; a DNS label of at most {NAME_MAX} characters).",
            callback=validate.option(lambda v: validate.dns_label(v, NAME_MAX)),
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write the job here instead of stdout.")
    ] = None,
) -> None:
    """Render a ready-to-apply job for the recipe's image: an MPIJob, a TrainJob, a PyTorchJob or an sbatch script
    that runs nccl-tests' all_reduce_perf (or COMMAND) across the nodes."""
    from imgbuild.console import handled

    handled(_job)(recipe, list(command or ()), engine, nodes, image, instance_type, efa, memory, name, output)


def _job(
    ref: str,
    command: list[str],
    engine: Engine,
    nodes: int,
    image: str | None,
    instance_type: str | None,
    efa: int | None,
    memory: str | None,
    name: str | None,
    output: Path | None,
) -> None:
    from imgbuild import lock, recipe
    from imgbuild.console import err, warn

    loaded = recipe.load(ref).concrete()
    resolved, _ = lock.resolved_for(loaded, lookup_torch=None)
    warn(resolved)
    job = plan_job(
        resolved,
        engine,
        nodes,
        image=image,
        instance_type=instance_type,
        command=command,
        name=name,
        efa=efa,
        memory=memory,
    )
    text = render_plan(job)
    if not job.image_pushed:
        err().print(
            f"imgbuild: note: {job.image} is the local build's tag; push it (imgbuild push {job.recipe}) and "
            "pass --image URI so that the cluster can pull it",
            markup=False,
        )
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text)
    except OSError as exc:
        raise RecipeError(f"{output}: cannot write the job: {exc.strerror}") from None
    err().print(f"imgbuild: wrote {output} ({job.engine.value}, {job.nodes} nodes)", markup=False)
