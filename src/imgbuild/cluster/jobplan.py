"""A cluster job decided before any engine's format is written: `plan_job(resolved, engine, nodes, ...)` ->
`JobPlan`. jobs.py renders a plan (k8s.py, slurm.py) and is its command line.

Everything comes from the recipe's lock and the image's manifest (the one `render.plan` writes into the image):
the image's content-addressed tag (or `--image URI` for a pushed copy), the devices and slots per node, the EFA
devices by instance type, the Python, the run profile's environment and capabilities, and the launch line, which
is `imgbuild.launch`'s (the line `train` and `verify --nodes` run). A pure function of its input.

The default program: nccl-tests' all_reduce_perf where the recipe has nccl-tests; else a small MPI check (mpi4py
allreduce that also checks the ranks ran on every node) where it has mpi4py; else `hostname` on every rank. The
torch engines (trainjob, pytorchjob) run a torch.distributed all_reduce check (nccl-tests need MPI).
NCCL_DEBUG=INFO is set on NVIDIA targets so that `imgbuild cluster report` can tell which network NCCL used.
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import RecipeError

if TYPE_CHECKING:
    from imgbuild.launch import Launch
    from imgbuild.manifest import Manifest
    from imgbuild.resolver import Resolved


class Engine(str, enum.Enum):
    """Where the job runs."""

    mpijob = "mpijob"
    trainjob = "trainjob"
    pytorchjob = "pytorchjob"
    slurm = "slurm"


ENGINES = tuple(e.value for e in Engine)
TORCH_ENGINES = (Engine.trainjob, Engine.pytorchjob)

MEMORY = {"accelerator": "32Gi", "none": "2Gi"}  # per worker, unless --memory

# EFA devices per instance (AWS EC2 User Guide, "Supported instance types" for EFA: maximum EFA interfaces),
# by instance family (the part of the type before the dot).
EFA_DEVICES = {"p3dn": 1, "p4d": 4, "p4de": 4, "p5": 32, "p5e": 32, "p5en": 16, "p6-b200": 8, "dl1": 4}

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 40  # room for the operators' suffixes (`-launcher`, `-worker-N`, `-node-0-N`) in a 63-character name
QUANTITY_RE = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")

NCCL_TESTS_ARGS = ("-b", "8", "-e", "1G", "-f", "2", "-g", "1")

_PROGRAMS = Path(__file__).with_name("templates")


@cache
def _program_text(name: str) -> str:
    return (_PROGRAMS / name).read_text()


@dataclass(frozen=True)
class JobPlan:
    """One job, decided before any engine's format is written."""

    engine: Engine
    name: str
    recipe: str
    nodes: int
    slots: int  # ranks (MPI) or processes (torchrun) per node
    image: str
    image_pushed: bool  # False: the local build's tag (a cluster cannot pull it before it is pushed)
    instance_type: str | None
    efa: int
    accelerator: str
    devices: int  # accelerator devices per node (0: none)
    memory: str
    program: tuple[str, ...]
    program_about: str
    env: tuple[tuple[str, str], ...]  # the job's environment for every rank, sorted by name
    capabilities: tuple[str, ...]
    shm_size_limit: str | None
    manifest: Manifest
    launch: Launch

    @property
    def runs_all_reduce_perf(self) -> bool:
        """Whether the ranks run nccl-tests' all_reduce_perf, whose log `imgbuild cluster report` judges."""
        return self.program[0].endswith("all_reduce_perf")


def efa_devices(instance_type: str) -> int | None:
    """EFA devices an instance type has (None: not in the table)."""
    return EFA_DEVICES.get(instance_type.split(".", 1)[0])


def job_name(recipe_name: str) -> str:
    """The default job name: imgbuild-RECIPE as a DNS label."""
    slug = re.sub(r"[^a-z0-9]+", "-", recipe_name.lower()).strip("-")
    return f"imgbuild-{slug}"[:NAME_MAX].rstrip("-")


def image_manifest(resolved: Resolved) -> tuple[Manifest, str]:
    """The manifest the recipe's image carries (render writes it into the image) and the image's lock tag."""
    from imgbuild import render

    return render.manifest(resolved), render.image_ref(resolved)


def plan_job(
    resolved: Resolved,
    engine: Engine | str,
    nodes: int,
    *,
    image: str | None = None,
    instance_type: str | None = None,
    command: Sequence[str] = (),
    name: str | None = None,
    efa: int | None = None,
    memory: str | None = None,
) -> JobPlan:
    """Decide a job: RecipeError when the recipe cannot run on that engine or an input is invalid (named)."""
    from imgbuild.launch import for_manifest
    from imgbuild.runprofile import run_spec

    engine = Engine(engine)
    r = resolved.recipe
    where = f"recipe '{r.name}'"
    if nodes < 1:
        raise RecipeError(f"{where}: --nodes must be 1 or more, got {nodes}")
    name = name or job_name(r.name)
    if not NAME_RE.match(name) or len(name) > NAME_MAX:
        raise RecipeError(
            f"job name '{name}': expected a DNS label (a-z, 0-9 and '-', starting with a letter) of at most "
            f"{NAME_MAX} characters"
        )
    if memory is not None and not QUANTITY_RE.match(memory):
        raise RecipeError(f"--memory '{memory}': expected a Kubernetes quantity such as 32Gi or 64000Mi")
    manifest, lock_tag = image_manifest(resolved)
    if engine in TORCH_ENGINES and "pytorch" not in resolved.pins:
        raise RecipeError(
            f"{where} has no components.pytorch: the {engine.value} engine runs torchrun",
            hint="use --engine mpijob or --engine slurm for this image",
        )
    if engine is Engine.mpijob and not manifest.ssh_ports:
        raise RecipeError(f"{where} has no components.sshd: the MPI Operator reaches workers over ssh")

    if instance_type is None and r.platform.instance_types:
        instance_type = r.platform.instance_types[0]
    if efa is None:
        if r.platform.accelerator == "none":
            efa = 0  # the CPU images talk TCP (libfabric's tcp provider)
        elif instance_type is None:
            efa = 0
        else:
            known = efa_devices(instance_type)
            if known is None:
                source = (
                    f"{where}: platform.instance_types"
                    if instance_type in r.platform.instance_types
                    else "--instance-type"
                )
                raise RecipeError(
                    f"{source}: no EFA device count known for instance type '{instance_type}' (known families: "
                    f"{', '.join(sorted(EFA_DEVICES))})",
                    hint="pass --efa N (0 for none)",
                )
            efa = known

    devices = r.platform.devices_per_node if r.platform.accelerator != "none" else 0
    launch = for_manifest(manifest)
    program, about = _program(engine, resolved, manifest, nodes, command)
    spec = run_spec(r.runtime, ())
    env = dict(_device_plugin_free(spec.env))
    if r.platform.accelerator == "nvidia":
        env["NCCL_DEBUG"] = "INFO"  # `imgbuild cluster report` reads which network NCCL picked from it
    env.update(launch.env_defaults)
    return JobPlan(
        engine=engine,
        name=name,
        recipe=r.name,
        nodes=nodes,
        slots=manifest.slots,
        image=image or lock_tag,
        image_pushed=image is not None,
        instance_type=instance_type,
        efa=efa,
        accelerator=r.platform.accelerator,
        devices=devices,
        memory=memory or MEMORY["none" if r.platform.accelerator == "none" else "accelerator"],
        program=program,
        program_about=about,
        env=tuple(sorted(env.items())),
        capabilities=tuple(c.upper() for c in spec.cap_add),
        shm_size_limit=_quantity(spec.shm_size) if spec.shm_size else None,
        manifest=manifest,
        launch=launch,
    )


def _device_plugin_free(env: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The run profile's environment without what a Kubernetes device plugin or Slurm sets per allocation
    (`HABANA_VISIBLE_DEVICES=all` would hand every device of the node to each pod)."""
    return [(k, v) for k, v in env if not k.endswith("_VISIBLE_DEVICES")]


def _quantity(docker_size: str) -> str:
    """A docker size (1g, 512m, 100k, 1073741824) as a Kubernetes quantity (1Gi, 512Mi, 100Ki, 1073741824)."""
    number, unit = re.fullmatch(r"(\d+)([bkmg]?)", docker_size).groups()  # type: ignore[union-attr]
    return number + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit]


def _program(
    engine: Engine, resolved: Resolved, manifest: Manifest, nodes: int, command: Sequence[str]
) -> tuple[tuple[str, ...], str]:
    """What the ranks run, and a line saying what it is."""
    if command:
        return tuple(command), "the command given after --"
    if engine in TORCH_ENGINES:
        accel = resolved.recipe.platform.accelerator
        check = ("--no-python", manifest.python, "-c", _program_text("torch_check.py"), accel, str(nodes))
        return check, "a torch.distributed all_reduce check (nccl-tests need MPI: use --engine mpijob for them)"
    tests = manifest.components.get("nccl_tests")
    if tests is not None:
        prefix = tests.prefix or "/opt/nccl-tests"
        about = f"nccl-tests all_reduce_perf {shlex.join(NCCL_TESTS_ARGS)}"
        return (f"{prefix}/all_reduce_perf", *NCCL_TESTS_ARGS), about
    if "mpi4py" in manifest.components:
        return (
            (manifest.python, "-c", _program_text("mpi_check.py"), str(nodes)),
            "an MPI check (mpi4py allreduce, ranks on every node): this recipe has no nccl-tests",
        )
    return ("hostname",), "hostname on every rank: this recipe has neither nccl-tests nor mpi4py"
