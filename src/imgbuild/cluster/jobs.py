"""A ready-to-apply job for a recipe's image, running nccl-tests' all_reduce_perf by default (or COMMAND): what
`imgbuild cluster job RECIPE --engine ENGINE --nodes N [-- COMMAND...]` (cli/cluster.py) writes.

`render_job` is a pure function of its input: jobplan.py decides the job (`plan_job` -> `JobPlan`: image, devices,
EFA, environment, program, launch line), then one engine's format is written:

- `mpijob` (Kubeflow MPI Operator), `trainjob` (Kubeflow Trainer v2), `pytorchjob` (training-operator 1.9):
  Kubernetes objects as YAML, k8s.py (what each operator does to pods, and how the job copes with it);
- `slurm`: an sbatch script for pyxis/enroot, slurm.py.

The names the other modules define are importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from imgbuild.cluster.jobplan import (
    ENGINES,
    TORCH_ENGINES,
    Engine,
    JobPlan,
    accelerator_mismatch,
    image_manifest,
    job_name,
    plan_job,
)
from imgbuild.cluster.k8s import TRAINER_CONTAINER, k8s_object, k8s_text
from imgbuild.cluster.slurm import mca_pairs, pyxis_image, sbatch

if TYPE_CHECKING:
    from imgbuild.pin.resolver import Resolved

__all__ = [
    "ENGINES",
    "TORCH_ENGINES",
    "TRAINER_CONTAINER",
    "Engine",
    "JobPlan",
    "accelerator_mismatch",
    "image_manifest",
    "job_name",
    "k8s_object",
    "mca_pairs",
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
