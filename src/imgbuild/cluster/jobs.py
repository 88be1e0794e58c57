"""`imgbuild cluster job RECIPE --engine ENGINE --nodes N [-- COMMAND...]`: a ready-to-apply job for the recipe's
image, running nccl-tests' all_reduce_perf by default (or COMMAND).

Everything comes from the recipe's lock and the image's manifest (the one `render.plan` writes into the image):
the image's content-addressed tag (or `--image URI` for a pushed copy), the devices and slots per node, sshd's
port, the Python, and the mpirun line, which is `imgbuild.launch`'s (the line `train` and `verify --nodes` run).
A pure function of its input (`render_job`); `job_command` is its command line.

Engines:

- `mpijob`: Kubeflow MPI Operator, `kubeflow.org/v2beta1` MPIJob. What the operator does to pods, and how the job
  copes with it:
  - a worker whose container has no command runs `/usr/sbin/sshd -De` instead of the image's entrypoint, and our
    images have no host keys until the entrypoint makes them: workers (and the launcher) run the entrypoint;
  - the operator's key pair is mounted at `sshAuthMountPath`, by default /root/.ssh (read-only, so the
    entrypoint could not install keys there) and elsewhere with mode 0644 (which ssh-keygen and ssh refuse for a
    private key). The job mounts it at SSH_AUTH_MOUNT, which the entrypoint does not read, and hands the private
    key to the entrypoint in IMGBUILD_SSH_PRIVATE_KEY from the operator's Secret (`<name>-ssh`): the entrypoint
    installs it in /root/.ssh (0700/0600, as sshd's StrictModes wants) and authorizes its public half;
  - ssh must reach sshd on the recipe's port (3022), and the operator sets its own OMPI_MCA_plm_rsh_args (after
    any of ours): the port comes from the image's /etc/ssh/ssh_config.d/imgbuild.conf (`Port`), which no
    plm_rsh_args replaces;
  - Open MPI 5 ignores the operator's OMPI_MCA_orte_* variables (its default hostfile among them) and silently
    runs every rank on the launcher: the launch line names the hostfile (/etc/mpi/hostfile) and `-np` itself,
    and PRTE_MCA_prte_keep_fqdn_hostnames keeps the workers' names resolvable for Open MPI 5 as the operator's
    OMPI_MCA_orte_keep_fqdn_hostnames does for Open MPI 4;
  - the launcher starts once every worker's sshd answers (`launcherCreationPolicy: WaitForWorkersReady` and a
    readiness probe on sshd's port).
  Per worker: the recipe's devices (`nvidia.com/gpu`, `habana.ai/gaudi`), `vpc.amazonaws.com/efa` by instance
  type, 2 MiB hugepages (the EFA provider's buffers), memory, a memory-backed /dev/shm, the instance type as node
  selector; `slotsPerWorker` = devices per node.
- `trainjob`: Kubeflow Trainer v2 TrainJob on the `torch-distributed` ClusterTrainingRuntime; `pytorchjob`:
  `kubeflow.org/v1` PyTorchJob (training-operator 1.9). Both run the image's torchrun (`launch.torchrun`), whose
  node count, rank and master come from the PET_* variables the operators set; PyTorch recipes only. Their
  default program is a torch.distributed all_reduce check (nccl-tests need MPI).
- `slurm`: an sbatch script for pyxis/enroot: `srun --mpi=pmix --container-image ...`, one task per device. pyxis
  does not run the image's ENTRYPOINT (no sshd is needed: srun starts every rank through PMIx), and the image's
  ENV wins over the script's exports unless `--container-env` names them: it names every variable it exports
  (NCCL_DEBUG, the launch line's defaults and its MCA settings as OMPI_MCA_* variables).

The default program: nccl-tests' all_reduce_perf where the recipe has nccl-tests; else a small MPI check (mpi4py
allreduce that also checks the ranks ran on every node) where it has mpi4py; else `hostname` on every rank.
NCCL_DEBUG=INFO is set on NVIDIA targets so that `imgbuild cluster report` can tell which network NCCL used.
"""

from __future__ import annotations

import enum
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from imgbuild.errors import RecipeError

if TYPE_CHECKING:
    from imgbuild.launch import Launch
    from imgbuild.manifest import Manifest
    from imgbuild.resolver import Resolved

__all__ = ["ENGINES", "Engine", "JobPlan", "efa_devices", "job_command", "plan_job", "render_job"]


class Engine(str, enum.Enum):
    """Where the job runs."""

    mpijob = "mpijob"
    trainjob = "trainjob"
    pytorchjob = "pytorchjob"
    slurm = "slurm"


ENGINES = tuple(e.value for e in Engine)
TORCH_ENGINES = (Engine.trainjob, Engine.pytorchjob)

# The image (images/Dockerfile.j2, images/files/entrypoint.sh.j2).
ENTRYPOINT = "/usr/local/bin/imgbuild-entrypoint"
SSHD_LOG = "/var/log/imgbuild-sshd.log"  # where the entrypoint's sshd logs (`sshd -E`)

# The MPI Operator (kubeflow/mpi-operator pkg/controller/mpi_job_controller.go).
MPI_OPERATOR_HOSTFILE = "/etc/mpi/hostfile"
SSH_AUTH_MOUNT = "/run/mpi-operator/ssh"  # not /root/.ssh, and not a folder the entrypoint reads keys from
SSH_KEY_SECRET_SUFFIX = "-ssh"  # the operator's Secret `<job>-ssh`, type kubernetes.io/ssh-auth
SSH_KEY_SECRET_KEY = "ssh-privatekey"

# Kubeflow Trainer v2 and training-operator 1.9.
TRAINER_RUNTIME = "torch-distributed"
TRAINER_CONTAINER = "node"  # the runtime's container and replicated job
PYTORCHJOB_CONTAINER = "pytorch"  # the name training-operator looks for
PYTORCHJOB_PORT = ("pytorchjob-port", 23456)

# Kubernetes resources.
EFA_RESOURCE = "vpc.amazonaws.com/efa"
DEVICE_RESOURCE = {"nvidia": "nvidia.com/gpu", "gaudi": "habana.ai/gaudi"}
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HUGEPAGES = ("hugepages-2Mi", "5120Mi")  # libfabric's EFA provider allocates its buffers from 2 MiB hugepages
MEMORY = {"accelerator": "32Gi", "none": "2Gi"}  # per worker, unless --memory

# EFA devices per instance (AWS EC2 User Guide, "Supported instance types" for EFA: maximum EFA interfaces),
# by instance family (the part of the type before the dot).
EFA_DEVICES = {"p3dn": 1, "p4d": 4, "p4de": 4, "p5": 32, "p5e": 32, "p5en": 16, "p6-b200": 8, "dl1": 4}

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 40  # room for the operators' suffixes (`-launcher`, `-worker-N`, `-node-0-N`) in a 63-character name
QUANTITY_RE = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")

HEREDOC_END = "IMGBUILD_PROGRAM_END"

NCCL_TESTS_ARGS = ("-b", "8", "-e", "1G", "-f", "2", "-g", "1")

_PROGRAMS = Path(__file__).with_name("templates")


@cache
def _program_text(name: str) -> str:
    return (_PROGRAMS / name).read_text()


# --------------------------------------------------------------------------------------------------------------
# The plan: what every engine needs, decided once


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
    def device_resource(self) -> str | None:
        return DEVICE_RESOURCE.get(self.accelerator) if self.devices else None


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


# --------------------------------------------------------------------------------------------------------------
# Rendering


def render_job(
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
) -> str:
    """The job's text: a Kubernetes object as YAML (mpijob, trainjob, pytorchjob) or an sbatch script (slurm).
    Byte-for-byte stable for the same input."""
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
    return render_plan(job)


def render_plan(job: JobPlan) -> str:
    if job.engine is Engine.slurm:
        return _sbatch(job)
    obj = {Engine.mpijob: _mpijob, Engine.trainjob: _trainjob, Engine.pytorchjob: _pytorchjob}[job.engine](job)
    return _header(job) + dump_yaml(obj)


def k8s_object(job: JobPlan) -> dict[str, Any]:
    """The Kubernetes object of a job (not for slurm)."""
    if job.engine is Engine.slurm:
        raise ValueError("a slurm job is a script, not a Kubernetes object")
    return {Engine.mpijob: _mpijob, Engine.trainjob: _trainjob, Engine.pytorchjob: _pytorchjob}[job.engine](job)


@cache
def _dumper() -> type:
    """SafeDumper writing multi-line strings (the check programs) as literal blocks, and no anchors: an object
    used twice (the worker's environment) is written twice. yaml is imported here, not when the CLI starts."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)

    Dumper.add_representer(str, text)
    return Dumper


def dump_yaml(obj: Any) -> str:
    """YAML with sorted keys, block style, long lines kept whole."""
    import yaml

    return yaml.dump(obj, Dumper=_dumper(), sort_keys=True, default_flow_style=False, width=10_000)


def _header(job: JobPlan) -> str:
    kind = {
        Engine.mpijob: "MPIJob (kubeflow.org/v2beta1, Kubeflow MPI Operator)",
        Engine.trainjob: f"TrainJob (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2, runtime {TRAINER_RUNTIME})",
        Engine.pytorchjob: "PyTorchJob (kubeflow.org/v1, Kubeflow training-operator 1.9)",
    }[job.engine]
    shape = f"{job.nodes} node(s)" + (f" of {job.instance_type}" if job.instance_type else "")
    lines = [
        f"{kind} for imgbuild recipe '{job.recipe}': {shape}, {job.slots} process(es) per node.",
        f"Runs {job.program_about}.",
        f"Apply: kubectl apply -f FILE; follow: {_follow(job)}",
        *_image_note(job),
    ]
    if job.engine is Engine.mpijob:
        lines.append(
            "Workers run the image's entrypoint (host keys, the operator's key from its Secret, sshd on "
            f"{_ssh_port(job)}), not the operator's `sshd -De`; the launcher names the hostfile and -np itself."
        )
    return "".join(f"# {line}\n" for line in lines)


def _follow(job: JobPlan) -> str:
    report = "imgbuild cluster report" + (f" --instance-type {job.instance_type}" if job.instance_type else "")
    report += f" --nodes {job.nodes}"
    pod = {
        Engine.mpijob: f"job/{job.name}-launcher",
        Engine.trainjob: f"-l jobset.sigs.k8s.io/jobset-name={job.name}",
        Engine.pytorchjob: f"{job.name}-master-0",
    }[job.engine]
    logs = f"kubectl logs -f {pod}"
    if job.program[0].endswith("all_reduce_perf"):
        return f"{logs} | {report}"
    return logs


def _image_note(job: JobPlan) -> list[str]:
    if job.image_pushed:
        return [f"Image: {job.image}"]
    return [
        f"Image: {job.image}, the local build's tag: push it (imgbuild push {job.recipe}) and render with "
        "--image URI so that the cluster can pull it."
    ]


def _ssh_port(job: JobPlan) -> int:
    return job.manifest.ssh_ports[0]  # plan_job refuses an mpijob for an image without sshd


# ---- Kubernetes pieces shared by the three operators


def _env(pairs: Sequence[tuple[str, str]], *extra: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in pairs]
    items += extra
    return sorted(items, key=lambda e: e["name"])


def _resources(job: JobPlan) -> dict[str, Any]:
    """Requests = limits (hugepages require it): devices, EFA, hugepages with EFA, memory."""
    wanted: dict[str, Any] = {}
    if job.device_resource:
        wanted[job.device_resource] = job.devices
    if job.efa:
        wanted[EFA_RESOURCE] = job.efa
        wanted[HUGEPAGES[0]] = HUGEPAGES[1]
    wanted["memory"] = job.memory
    return {"limits": dict(wanted), "requests": dict(wanted)}


def _shm_volume(job: JobPlan) -> dict[str, Any]:
    """NCCL and Open MPI's shared-memory transports need more than the container runtime's 64 MB /dev/shm."""
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if job.shm_size_limit:
        empty_dir["sizeLimit"] = job.shm_size_limit
    return {"name": "dshm", "emptyDir": empty_dir}


SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def _security(job: JobPlan) -> dict[str, Any]:
    return {"securityContext": {"capabilities": {"add": list(job.capabilities)}}} if job.capabilities else {}


def _node_selector(job: JobPlan) -> dict[str, Any]:
    return {"nodeSelector": {INSTANCE_TYPE_LABEL: job.instance_type}} if job.instance_type else {}


def _container(job: JobPlan, name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": job.image, "imagePullPolicy": "IfNotPresent", **fields}


# ---- mpijob


def _mpijob(job: JobPlan) -> dict[str, Any]:
    port = _ssh_port(job)
    key = {
        "name": "IMGBUILD_SSH_PRIVATE_KEY",
        "valueFrom": {"secretKeyRef": {"name": job.name + SSH_KEY_SECRET_SUFFIX, "key": SSH_KEY_SECRET_KEY}},
    }
    # Open MPI 5 (PRRTE) reads neither the operator's OMPI_MCA_orte_* variables nor its default hostfile.
    launcher_env = [*job.env, ("PRTE_MCA_prte_keep_fqdn_hostnames", "1")]
    argv = job.launch.mpirun_argv(hostfile=MPI_OPERATOR_HOSTFILE, np=job.nodes * job.slots, program=list(job.program))
    launcher = _container(job, "launcher", command=[ENTRYPOINT], args=argv, env=_env(launcher_env, key))
    # The worker keeps sshd's log on its output and ends at once when the operator deletes it.
    wait = f"trap 'exit 0' TERM; tail -F {SSHD_LOG} & wait"
    worker = _container(
        job,
        "worker",
        command=[ENTRYPOINT],
        args=["bash", "-c", wait],
        env=_env(job.env, key),
        readinessProbe={"tcpSocket": {"port": port}, "periodSeconds": 2},
        resources=_resources(job),
        volumeMounts=[SHM_MOUNT],
        **_security(job),
    )
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": job.name},
        "spec": {
            "slotsPerWorker": job.slots,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "sshAuthMountPath": SSH_AUTH_MOUNT,
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {"spec": {"containers": [launcher]}},
                },
                "Worker": {
                    "replicas": job.nodes,
                    "restartPolicy": "Never",
                    "template": {
                        "spec": {"containers": [worker], "volumes": [_shm_volume(job)], **_node_selector(job)}
                    },
                },
            },
        },
    }


# ---- trainjob and pytorchjob


def _torchrun(job: JobPlan) -> list[str]:
    """The image's torchrun (launch.py); nodes, node rank and master come from the operators' PET_* variables."""
    return [*job.launch.torchrun, *job.program]


def _trainjob(job: JobPlan) -> dict[str, Any]:
    container_patch = {"name": TRAINER_CONTAINER, "volumeMounts": [SHM_MOUNT], **_security(job)}
    pod_patch = {"containers": [container_patch], "volumes": [_shm_volume(job)], **_node_selector(job)}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": job.name},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": TRAINER_RUNTIME,
            },
            "trainer": {
                "image": job.image,
                "command": _torchrun(job),
                "env": _env(job.env),
                "numNodes": job.nodes,
                "numProcPerNode": job.slots,
                "resourcesPerNode": _resources(job),
            },
            "runtimePatches": [
                {
                    "manager": "imgbuild",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": TRAINER_CONTAINER,
                                        "template": {"spec": {"template": {"spec": pod_patch}}},
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def _pytorchjob(job: JobPlan) -> dict[str, Any]:
    container = _container(
        job,
        PYTORCHJOB_CONTAINER,
        command=_torchrun(job),
        env=_env(job.env),
        ports=[{"name": PYTORCHJOB_PORT[0], "containerPort": PYTORCHJOB_PORT[1]}],
        resources=_resources(job),
        volumeMounts=[SHM_MOUNT],
        **_security(job),
    )
    template = {"spec": {"containers": [container], "volumes": [_shm_volume(job)], **_node_selector(job)}}
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if job.nodes > 1:
        replicas["Worker"] = {"replicas": job.nodes - 1, "restartPolicy": "Never", "template": template}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": job.name},
        "spec": {
            "nprocPerNode": str(job.slots),
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0},
            "pytorchReplicaSpecs": replicas,
        },
    }


# ---- slurm


def mca_pairs(launch: Launch) -> list[tuple[str, str]]:
    """The `--mca KEY VALUE` settings of the launch line, in its order."""
    args, pairs = list(launch.mpirun), []
    for i, arg in enumerate(args):
        if arg == "--mca" and i + 2 < len(args):
            pairs.append((args[i + 1], args[i + 2]))
    return pairs


def pyxis_image(ref: str) -> str:
    """An image reference as pyxis and enroot write it: `REGISTRY#REPOSITORY:TAG` (the registry host, when there
    is one, is separated by '#', not '/')."""
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref


def _sbatch(job: JobPlan) -> str:
    q = shlex.quote
    squashfs = f"imgbuild-{job.recipe}-{job.image.rsplit(':', 1)[-1]}.sqsh"
    defaults = dict(job.launch.env_defaults)
    exports = {k: v for k, v in job.env if k not in defaults}
    # Ranks that srun starts read Open MPI's settings from OMPI_MCA_* variables, not from mpirun's --mca (which
    # wins over the environment under mpirun, so it does here too).
    exports.update((f"OMPI_MCA_{k}", v) for k, v in mca_pairs(job.launch))
    names = [*exports, *defaults]
    lines = [
        "#!/bin/bash",
        f"# sbatch script for imgbuild recipe '{job.recipe}' on Slurm with pyxis/enroot: {job.nodes} node(s)"
        + (f" of {job.instance_type}" if job.instance_type else "")
        + f", {job.slots} task(s) per node.",
        f"# Runs {job.program_about}.",
        "#",
    ]
    if job.image_pushed:
        lines += [
            f"# Image: {job.image}. pyxis imports it on every node at every job; import it once into a squashfs",
            "# file on a shared filesystem and pass that file instead (IMGBUILD_IMAGE=/fsx/... sbatch THIS):",
            f"#   enroot import -o /fsx/{squashfs} docker://{pyxis_image(job.image)}",
        ]
    else:
        lines += [
            f"# Image: {job.image} (the local build). Import it once into a squashfs file on a shared filesystem,",
            "# on the machine that built it, then submit from that folder (or set IMGBUILD_IMAGE=/path/to/file):",
            f"#   enroot import -o {squashfs} dockerd://{job.image}",
            f"# or, once pushed (imgbuild push {job.recipe}): enroot import -o {squashfs} docker://REGISTRY#REPO:TAG",
        ]
    lines += [
        "#",
        "# pyxis does not run the image's ENTRYPOINT (no sshd is needed: srun starts every rank through PMIx), and",
        "# the image's ENV wins over this script's exports unless --container-env names them: it names them all.",
        f"# Submit: sbatch THIS; follow: tail -f {job.name}-JOBID.out"
        + (f" | imgbuild cluster report --nodes {job.nodes}" if job.program[0].endswith("all_reduce_perf") else ""),
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.slots}",
        "#SBATCH --exclusive",
        "#SBATCH --wait-all-nodes=1",
        "#SBATCH --output=%x-%j.out",
    ]
    if job.accelerator == "nvidia":
        lines.append(f"# Where GPUs are a Slurm GRES (AWS ParallelCluster): #SBATCH --gpus-per-node={job.devices}")
    lines += ["set -euo pipefail", ""]
    if job.image_pushed:
        lines.append(f"IMAGE=${{IMGBUILD_IMAGE:-{pyxis_image(job.image)}}}")
    else:
        lines += [
            f"IMAGE=${{IMGBUILD_IMAGE:-${{SLURM_SUBMIT_DIR:-$PWD}}/{squashfs}}}",
            'if [[ "${IMAGE}" == /* && ! -f "${IMAGE}" ]]; then',
            '    echo "no ${IMAGE}: import the image first (enroot import, see the top of this script)" >&2',
            "    exit 1",
            "fi",
        ]
    lines.append("")
    for k, v in exports.items():
        lines.append(f"export {k}={q(v)}")
    if job.launch.env_defaults:
        lines.append("# The launch line's defaults (a value already set wins).")
        lines += job.launch.shell_defaults().rstrip("\n").split("\n")
    # A multi-line argument (the check programs) goes into a variable from a quoted here-document, readable as it is.
    program: list[str] = []
    texts = 0
    for arg in job.program:
        if "\n" in arg and HEREDOC_END not in arg.splitlines():
            texts += 1
            var = f"PROGRAM_{texts}"
            lines += ["", f"{var}=$(cat <<'{HEREDOC_END}'", arg.rstrip("\n"), HEREDOC_END, ")"]
            program.append(f'"${{{var}}}"')
        else:
            program.append(q(arg))
    lines.append("")
    srun = [
        "srun --mpi=pmix",
        '--container-image="${IMAGE}"',
        f"--container-env={','.join(names)}" if names else "",
        "--no-container-mount-home",
        " ".join(program),
    ]
    lines.append(" \\\n    ".join(part for part in srun if part))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# Command line: `imgbuild cluster job`


def job_command(
    recipe: Annotated[str, typer.Argument(help="A shipped recipe's name (see `imgbuild list`) or a YAML file.")],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="COMMAND",
            help="After `--`: what the ranks run instead of the default (nccl-tests all_reduce_perf, else an MPI "
            "check); for trainjob/pytorchjob, torchrun's program (a script and its arguments).",
        ),
    ] = None,
    engine: Annotated[
        Engine,
        typer.Option(
            "--engine", "-e", help="MPI Operator, Trainer v2, training-operator 1.9, or Slurm.", case_sensitive=False
        ),
    ] = Engine.mpijob,
    nodes: Annotated[int, typer.Option("--nodes", "-n", min=1, help="Nodes (workers) the job runs on.")] = 2,
    image: Annotated[
        str | None,
        typer.Option("--image", metavar="URI", help="A pushed copy of the image (default: the lock's local tag)."),
    ] = None,
    instance_type: Annotated[
        str | None,
        typer.Option(
            "--instance-type", help="EC2 instance type of the nodes (default: the recipe's first); sets the EFA count."
        ),
    ] = None,
    efa: Annotated[
        int | None, typer.Option("--efa", min=0, help="EFA devices per node, for an instance type not in the table.")
    ] = None,
    memory: Annotated[
        str | None, typer.Option("--memory", help="Memory per node (Kubernetes quantity; default 32Gi, 2Gi on CPU).")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="The job's name (default imgbuild-RECIPE).")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write the job here instead of stdout.")
    ] = None,
) -> None:
    """Render a ready-to-apply job for the recipe's image: an MPIJob, a TrainJob, a PyTorchJob or an sbatch script
    that runs nccl-tests' all_reduce_perf (or COMMAND) across the nodes."""
    from imgbuild.cli.common import handled

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
    from imgbuild.cli.common import err, warn

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
