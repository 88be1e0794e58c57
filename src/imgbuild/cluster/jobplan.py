"""A cluster job decided before any engine's format is written: `plan_job(resolved, engine, nodes, ...)` ->
`JobPlan`. jobs.py renders a plan (k8s.py, slurm.py); `imgbuild cluster job` (cli/cluster.py) is its command line.

Everything comes from the recipe's lock and the image's manifest (the one `render.plan` writes into the image):
the image's content-addressed tag (or `--image URI` for a pushed copy), the devices and slots per node, the EFA
devices by instance type, the Python, the run profile's environment and capabilities, and the launch line, which
is `imgbuild.image.launch`'s (the line `train` and `verify --nodes` run). A pure function of its input.

The default program: nccl-tests' all_reduce_perf where the recipe has nccl-tests (`nccltests.command`'s line, the
one the nccl-tests check of `verify --nodes` runs); else a small MPI check (mpi4py allreduce that also checks the
ranks ran on every node) where it has mpi4py; else `hostname` on every rank. The torch engines (trainjob,
pytorchjob) run a torch.distributed all_reduce check (nccl-tests need MPI).
NCCL_DEBUG=INFO is set on NVIDIA targets so that `imgbuild cluster report` can tell which network NCCL used.
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.core.errors import RecipeError

if TYPE_CHECKING:
    from imgbuild.image.launch import Launch
    from imgbuild.image.manifest import Manifest
    from imgbuild.pin.resolver import Resolved
    from imgbuild.recipe import Platform, Recipe


class Engine(str, enum.Enum):
    """Where the job runs."""

    mpijob = "mpijob"
    trainjob = "trainjob"
    pytorchjob = "pytorchjob"
    slurm = "slurm"


ENGINES = tuple(e.value for e in Engine)
TORCH_ENGINES = (Engine.trainjob, Engine.pytorchjob)

MEMORY = {"accelerator": "32Gi", "none": "2Gi"}  # per worker, unless --memory

# The instance families imgbuild knows (their accelerator, CPU architecture, EFA devices per node, NVLink domain) are
# data: core/instances.yaml, read through core.instances. A recipe for an accelerator runs on the instance types its
# platform.instance_types lists, and on those whose accelerator is its own and can run its code
# (`accelerator_mismatch`); anything else is refused before a job that would never schedule (a pod asking for
# habana.ai/gaudi on a p4d) or never start (an sm_70 nccl-tests on an H100) is written.


NAME_MAX = 40  # room for the operators' suffixes (`-launcher`, `-worker-N`, `-node-0-N`) in a 63-character name
# Kubernetes counts replicas in int32 and Open MPI ranks (-np nodes x slots) in a C int: with at most 64 slots per
# node (platform.devices_per_node), this many nodes keeps both in range. Slurm's node count is 32 bits too.
CLIQUE_LABEL = "nvidia.com/gpu.clique"  # GPU Feature Discovery's label: nodes of one NVLink domain share its value
NODES_MAX = (2**31 - 1) // 64

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
    mnnvl: bool  # NVLink across instances (MNNVL_FAMILIES): the pods claim a ComputeDomain named after the job
    arch: tuple[str, ...]  # the CPU architectures the image is built for (platform.arch): where pods may run
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

    @property
    def report_command(self) -> str:
        """The `imgbuild cluster report` line that judges the job's log, with the instance type and node count the
        job runs on (the log may name neither)."""
        return shlex.join(
            ["imgbuild", "cluster", "report"]
            + (["--instance-type", self.instance_type] if self.instance_type else [])
            + ["--nodes", str(self.nodes)]
        )


def target_instance(recipe: Recipe) -> tuple[str, int] | None:
    """The recipe's target host for `imgbuild run --print`: the first of its platform.instance_types whose number of
    EFA devices is in the table, with that number; None when none is."""
    from imgbuild.core import instances

    for instance_type in recipe.platform.instance_types:
        count = instances.efa_devices(instance_type)
        if count is not None:
            return instance_type, count
    return None


def arch_mismatch(platform: Platform, instance_type: str) -> str | None:
    """Why an instance type cannot run an image of `platform` for its CPU architecture (None: it can, or its
    architecture is not known here): an arm64 image never starts on an x86 instance, nor the reverse."""
    from imgbuild.core import instances

    arch = instances.instance_arch(instance_type)
    if arch is None or arch in platform.arch:
        return None
    return f"{instance_type} has {arch} CPUs; the image is built for {', '.join(platform.arch)} (platform.arch)"


def _sm(arch: str) -> tuple[int, int]:
    """sm_90 -> (9, 0), sm_103 -> (10, 3): a compute capability."""
    number = int(arch.removeprefix("sm_"))
    return number // 10, number % 10


def accelerator_mismatch(platform: Platform, instance_type: str) -> str | None:
    """Why an instance type cannot run an image of `platform` (None: it can). A recipe without an accelerator runs
    anywhere; one with an accelerator runs on the instance types it lists, and on a family of
    core/instances.yaml with its accelerator whose GPUs run its code: CUDA code built for sm_XY (imgbuild builds
    SASS only, no PTX) runs on the same major architecture X at minor Y or later."""
    from imgbuild.core import instances

    if platform.accelerator == "none" or instance_type in platform.instance_types:
        return None
    known = instances.family(instance_type)
    if known is None:
        return f"imgbuild does not know which accelerator {instance_type} carries"
    kind, arch, device = known.accelerator, known.gpu_arch, known.device
    if kind != platform.accelerator:
        return f"{instance_type} carries {device}, not {platform.accelerator}"
    if kind == "nvidia" and arch and platform.gpu_arch:
        (want_major, want_minor), (has_major, has_minor) = _sm(platform.gpu_arch), _sm(arch)
        if has_major != want_major or has_minor < want_minor:
            return f"{instance_type} carries {device} ({arch}), which cannot run code built for {platform.gpu_arch}"
    return None


def job_name(recipe_name: str) -> str:
    """The default job name: imgbuild-RECIPE as a DNS label."""
    slug = re.sub(r"[^a-z0-9]+", "-", recipe_name.lower()).strip("-")
    return f"imgbuild-{slug}"[:NAME_MAX].rstrip("-")


def image_manifest(resolved: Resolved) -> tuple[Manifest, str]:
    """The manifest the recipe's image carries (render writes it into the image) and the image's lock tag: both of
    one reading of its identity (identity.of, once)."""
    from imgbuild.image import identity, render

    named = identity.of(resolved)
    return render.manifest(resolved, named), named.ref()


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
    from imgbuild.core import instances, validate
    from imgbuild.engine.runprofile import run_spec
    from imgbuild.image.launch import for_manifest

    engine = Engine(engine)
    r = resolved.recipe
    where = f"recipe '{r.name}'"
    # The command line refuses these first, as usage errors (cli/cluster.py); here they guard every other caller.
    if not 1 <= nodes <= NODES_MAX:
        raise RecipeError(f"{where}: --nodes must be 1 to {NODES_MAX}, got {nodes}")
    if efa is not None and not 0 <= efa <= instances.efa_max():
        raise RecipeError(f"--efa: expected 0 to {instances.efa_max()} EFA devices per node, got {efa}")
    name = name or job_name(r.name)
    _check("job name", validate.dns_label, name, NAME_MAX)
    if memory is not None:
        _check("--memory", validate.quantity, memory)
    if image is not None:
        _check("--image", validate.image_ref, image)
    if instance_type is not None:
        _check("--instance-type", validate.instance_type, instance_type)
    _check("COMMAND", program_words, command)
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
    if instance_type is not None:
        why = accelerator_mismatch(r.platform, instance_type)
        if why is not None:
            listed = r.platform.instance_types
            runs_on = f"runs on {', '.join(listed)}" if listed else "lists no platform.instance_types"
            raise RecipeError(
                f"--instance-type {instance_type}: {why}; {where} ({r.platform.accelerator}"
                + (f" {r.platform.gpu_arch}" if r.platform.gpu_arch else "")
                + f") {runs_on}",
                hint=(f"pass --instance-type {listed[0]}, or " if listed else "")
                + f"list the type in a child recipe's platform.instance_types (extends: {r.name})",
            )
        why = arch_mismatch(r.platform, instance_type)
        if why is not None:
            source = (
                f"{where}: platform.instance_types"
                if instance_type in r.platform.instance_types
                else f"--instance-type {instance_type}"
            )
            raise RecipeError(
                f"{source}: {why}: its pods would never be scheduled",
                hint=f"build the image for {instances.instance_arch(instance_type)} (platform.arch in a child recipe, "
                f"extends: {r.name}), or pick an instance type of {', '.join(r.platform.arch)}",
            )
    if efa is None:
        if r.platform.accelerator == "none":
            efa = 0  # the CPU images talk TCP (libfabric's tcp provider)
        elif instance_type is None:
            efa = 0
        else:
            known = instances.efa_devices(instance_type)
            if known is None:
                source = (
                    f"{where}: platform.instance_types"
                    if instance_type in r.platform.instance_types
                    else "--instance-type"
                )
                raise RecipeError(
                    f"{source}: no EFA device count known for instance type '{instance_type}' (known families: "
                    f"{', '.join(instances.efa_known())})",
                    hint="pass --efa N (0 for none)",
                )
            efa = known

    devices = r.platform.devices_per_node if r.platform.accelerator != "none" else 0
    launch = for_manifest(manifest)
    program, about = _program(engine, resolved, manifest, nodes, command, instance_type)
    spec = run_spec(r.runtime, ())
    env = dict(_device_plugin_free(spec.env))
    if r.platform.accelerator == "nvidia":
        env["NCCL_DEBUG"] = "INFO"  # `imgbuild cluster report` reads which network NCCL picked from it
    from imgbuild.core.instances import instance_env, mnnvl, mnnvl_domain_nodes

    nvlink = r.platform.accelerator == "nvidia" and mnnvl(instance_type)
    domain = mnnvl_domain_nodes(instance_type) if nvlink else None
    if domain is not None and nodes > domain:
        raise RecipeError(
            f"{where}: --nodes {nodes}: every node of a {instance_type} job must be in one NVLink domain (the pods'"
            f" podAffinity on {CLIQUE_LABEL}, the job's IMEX channel), and one holds at most {domain} instances (the"
            " largest UltraServer): the job would never be scheduled",
            hint=f"--nodes {domain} or fewer, or one job per NVLink domain",
        )
    if nvlink:  # as the image does (render.image_env), the recipe's own value of a variable wins
        env.update({k: manifest.env.get(k, v) for k, v in instance_env(filter(None, [instance_type])).items()})
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
        mnnvl=nvlink,
        arch=tuple(r.platform.arch),
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


def _check(what: str, check: Callable[..., object], value: Any, *args: Any) -> None:
    try:
        check(value, *args)
    except ValueError as exc:
        raise RecipeError(f"{what}: {exc}") from None


def program_words(command: Sequence[str]) -> Sequence[str]:
    """The command after `--`: its first word is a program (a name or a path), never an option of the launcher
    it is handed to (mpirun, torchrun); no word holds a NUL (no argv, shell or YAML string can)."""
    if command and command[0].startswith("-"):
        raise ValueError(
            f"expected a program (a name or a path) first, got {command[0]!r}: a word starting with '-' would be "
            "read as an option of mpirun or torchrun"
        )
    if any("\0" in word for word in command):
        raise ValueError("expected words without NUL characters")
    return command


def _device_plugin_free(env: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The run profile's environment without what a Kubernetes device plugin or Slurm sets per allocation
    (`HABANA_VISIBLE_DEVICES=all` would hand every device of the node to each pod)."""
    return [(k, v) for k, v in env if not k.endswith("_VISIBLE_DEVICES")]


def _quantity(docker_size: str) -> str:
    """A docker size (1g, 512m, 100k, 1073741824) as a Kubernetes quantity (1Gi, 512Mi, 100Ki, 1073741824)."""
    number, unit = re.fullmatch(r"(\d+)([bkmg]?)", docker_size).groups()  # type: ignore[union-attr]
    return number + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit]


def _program(
    engine: Engine,
    resolved: Resolved,
    manifest: Manifest,
    nodes: int,
    command: Sequence[str],
    instance_type: str | None,
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
        from imgbuild.nccltests import command as nccl_tests

        argv = nccl_tests.all_reduce_perf(tests.details.prefix, instance_type)
        return argv, f"nccl-tests all_reduce_perf {shlex.join(argv[1:])}"
    if "mpi4py" in manifest.components:
        return (
            (manifest.python, "-c", _program_text("mpi_check.py"), str(nodes)),
            "an MPI check (mpi4py allreduce, ranks on every node): this recipe has no nccl-tests",
        )
    return ("hostname",), "hostname on every rank: this recipe has neither nccl-tests nor mpi4py"
