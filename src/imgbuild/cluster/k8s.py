"""The Kubernetes objects of a cluster job (`k8s_object(plan)`, `k8s_text(plan)`): an MPIJob, a TrainJob or a
PyTorchJob for the image of a `JobPlan` (jobplan.py), as YAML with a comment header saying how to apply and follow it.

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
  type, 2 MiB hugepages (the EFA provider's buffers), memory, a memory-backed /dev/shm, the instance type and the
  image's CPU architecture (`kubernetes.io/arch`) as node selector; `slotsPerWorker` = devices per node.
- `trainjob`: Kubeflow Trainer v2 TrainJob on the `torch-distributed` ClusterTrainingRuntime; `pytorchjob`:
  `kubeflow.org/v1` PyTorchJob (training-operator 1.9). Both run the image's torchrun (`launch.torchrun`), whose
  node count, rank and master come from the PET_* variables the operators set.

NVLink across instances (GB200 NVL72 across trays, `JobPlan.mnnvl`, core/instances.yaml's mnnvl), as AWS's EKS guide
("Use P6e-GB200 UltraServers with Amazon EKS": "It is a best practice to create a ComputeDomain per workload job") and
its GB200 sample jobs do: a ComputeDomain (`resource.nvidia.com/v1beta1`, NVIDIA's DRA driver,
NVIDIA/k8s-dra-driver-gpu) named after the job comes first in the file; its driver makes the ResourceClaimTemplate
`<job>-channel` and the IMEX daemons on the nodes of the pods that claim it. Every GPU pod claims it
(`resourceClaims` + the container's `resources.claims`) and keeps to one NVLink domain (a required podAffinity on
the job's own pods, topologyKey `nvidia.com/gpu.clique`, the label NVIDIA's GPU Feature Discovery puts on each
node). `numNodes` is the job's node count, right for every driver: from 25.8.0 with the feature gate
IMEXDaemonsWithDNSNames (on by default) it only feeds the domain's status and 0 would do (the CRD's description, the
EKS guide); before 25.8.0, or with the gate off, the driver holds the pods until that many IMEX daemons joined; and
CRDs up to v25.12.0 require the field. A TrainJob of Trainer v2.3.0 cannot add a claim to its pods
(runtimePatches have no resourceClaims, and `resourcesPerNode` keeps only limits and requests:
pkg/runtime/core/trainingruntime.go; DRA is kubeflow/trainer KEP-2782, PR #4027): it gets a TrainingRuntime of its
own, named after the job, that is `torch-distributed` plus the claim and the node's resources, and sets no
`resourcesPerNode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from imgbuild.blocks.sshd import SSHD_LOG
from imgbuild.cluster.jobplan import CLIQUE_LABEL, Engine, JobPlan

# The image (images/Dockerfile.j2, images/files/entrypoint.sh.j2).
ENTRYPOINT = "/usr/local/bin/imgbuild-entrypoint"

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
ARCH_LABEL = "kubernetes.io/arch"  # the kubelet's well-known label: amd64, arm64 (Go's GOARCH, Docker's names)
HUGEPAGES = ("hugepages-2Mi", "5120Mi")  # libfabric's EFA provider allocates its buffers from 2 MiB hugepages
SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}
JOB_LABEL = "imgbuild-job"  # on the pods that run the image with GPUs: what their podAffinity selects

# NVIDIA's DRA driver (NVIDIA/k8s-dra-driver-gpu, deployments/helm/dra-driver-nvidia-gpu/crds/
# resource.nvidia.com_computedomains.yaml) and what AWS's jobs name its parts (see the module's docstring).
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
CHANNEL_CLAIM = "compute-domain-channel"  # the pods' name for their claim
CHANNEL_TEMPLATE_SUFFIX = "-channel"  # the ResourceClaimTemplate the driver makes: <ComputeDomain>-channel
TRAINER_FRAMEWORK_LABEL = ("trainer.kubeflow.org/framework", "torch")  # as torch-distributed's metadata
TRAINER_ANCESTOR_LABEL = ("trainer.kubeflow.org/trainjob-ancestor-step", "trainer")  # where Trainer puts the trainer


def k8s_object(job: JobPlan) -> dict[str, Any]:
    """The Kubernetes object of a job (not for slurm)."""
    if job.engine is Engine.slurm:
        raise ValueError("a slurm job is a script, not a Kubernetes object")
    return {Engine.mpijob: _mpijob, Engine.trainjob: _trainjob, Engine.pytorchjob: _pytorchjob}[job.engine](job)


def k8s_objects(job: JobPlan) -> list[dict[str, Any]]:
    """Every object the job's file holds, in the order `kubectl apply` creates them: the ComputeDomain and (TrainJob)
    the TrainingRuntime where the job runs NVLink across instances, then the job."""
    objects = []
    if job.mnnvl:
        objects.append(compute_domain(job))
        if job.engine is Engine.trainjob:
            objects.append(_training_runtime(job))
    return [*objects, k8s_object(job)]


def k8s_text(job: JobPlan) -> str:
    """The job's objects as YAML documents under a comment header: what it is, what it runs, how to apply and follow
    it."""
    return _header(job) + "---\n".join(dump_yaml(o) for o in k8s_objects(job))


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
        Engine.trainjob: "TrainJob (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2, runtime "
        + (f"{job.name}, below" if job.mnnvl else TRAINER_RUNTIME)
        + ")",
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
    if job.mnnvl:
        first = f"the ComputeDomain {job.name} ({COMPUTE_DOMAIN_API}) comes"
        if job.engine is Engine.trainjob:
            first = first.removesuffix(" comes") + (
                f" and the TrainingRuntime {job.name} (torch-distributed with the claim and the resources) come"
            )
        lines += [
            f"NVLink across instances: {first} first. Needs NVIDIA's DRA driver with ComputeDomains enabled "
            "(AWS's EKS guide for P6e-GB200: 25.8.0 or later).",
            f"Every GPU pod claims the domain's IMEX channel and keeps to one NVLink domain ({CLIQUE_LABEL}); "
            "kubectl delete -f FILE removes the domain with the job.",
        ]
    return "".join(f"# {line}\n" for line in lines)


def _follow(job: JobPlan) -> str:
    pod = {
        Engine.mpijob: f"job/{job.name}-launcher",
        Engine.trainjob: f"-l jobset.sigs.k8s.io/jobset-name={job.name}",
        Engine.pytorchjob: f"{job.name}-master-0",
    }[job.engine]
    logs = f"kubectl logs -f {pod}"
    if job.runs_all_reduce_perf:
        return f"{logs} | {job.report_command}"
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
    """Requests = limits (hugepages require it): devices, EFA, hugepages with EFA, memory; and the ComputeDomain's
    channel where the job runs NVLink across instances."""
    wanted: dict[str, Any] = {}
    device = DEVICE_RESOURCE.get(job.accelerator) if job.devices else None
    if device:
        wanted[device] = job.devices
    if job.efa:
        wanted[EFA_RESOURCE] = job.efa
        wanted[HUGEPAGES[0]] = HUGEPAGES[1]
    wanted["memory"] = job.memory
    claims = {"claims": [{"name": CHANNEL_CLAIM}]} if job.mnnvl else {}
    return {"limits": dict(wanted), "requests": dict(wanted), **claims}


def channel_template(job: JobPlan) -> str:
    """The ResourceClaimTemplate of the job's ComputeDomain (its driver makes it)."""
    return job.name + CHANNEL_TEMPLATE_SUFFIX


def compute_domain(job: JobPlan) -> dict[str, Any]:
    """The job's ComputeDomain: an IMEX domain that follows the pods that claim its channel (module docstring)."""
    return {
        "apiVersion": COMPUTE_DOMAIN_API,
        "kind": "ComputeDomain",
        "metadata": {"name": job.name},
        "spec": {"numNodes": job.nodes, "channel": {"resourceClaimTemplate": {"name": channel_template(job)}}},
    }


def _claims(job: JobPlan) -> dict[str, Any]:
    """A GPU pod's claim on the ComputeDomain's channel (none without NVLink across instances)."""
    if not job.mnnvl:
        return {}
    return {"resourceClaims": [{"name": CHANNEL_CLAIM, "resourceClaimTemplateName": channel_template(job)}]}


def _gpu_pod_metadata(job: JobPlan) -> dict[str, Any]:
    """The label the GPU pods' podAffinity selects (only where there is one)."""
    return {"metadata": {"labels": {JOB_LABEL: job.name}}} if job.mnnvl else {}


def _shm_volume(job: JobPlan) -> dict[str, Any]:
    """NCCL and Open MPI's shared-memory transports need more than the container runtime's 64 MB /dev/shm."""
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if job.shm_size_limit:
        empty_dir["sizeLimit"] = job.shm_size_limit
    return {"name": "dshm", "emptyDir": empty_dir}


def _security(job: JobPlan) -> dict[str, Any]:
    return {"securityContext": {"capabilities": {"add": list(job.capabilities)}}} if job.capabilities else {}


def _node_selector(job: JobPlan, *, instance_type: bool = True) -> dict[str, Any]:
    """Where the pods may run: the instance type (not for the MPI launcher, which needs no accelerator), and the CPU
    architecture the image is built for (`kubernetes.io/arch`, from platform.arch), which every pod that runs the
    image needs, the launcher too. An image of one architecture pins it in the nodeSelector (an arm64 image on an x86
    node fails with `exec format error`); a multi-architecture image (one tag, an image index: cpu is amd64 and
    arm64) runs on a node of any architecture it was built for, said as a required nodeAffinity `In` its list rather
    than pinned to one: the scheduler may use either kind of node, and never one the index lacks. The GPU pods of a
    job with NVLink across instances (`instance_type`, with `job.mnnvl`) run in one NVLink domain: a required
    podAffinity on the job's GPU pods with topologyKey nvidia.com/gpu.clique (the first pod matches its own
    selector, so it schedules anywhere)."""
    selector = {INSTANCE_TYPE_LABEL: job.instance_type} if job.instance_type and instance_type else {}
    affinity: dict[str, Any] = {}
    if job.mnnvl and instance_type:
        term = {
            "labelSelector": {"matchExpressions": [{"key": JOB_LABEL, "operator": "In", "values": [job.name]}]},
            "topologyKey": CLIQUE_LABEL,
        }
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    if len(job.arch) == 1:
        return {**({"affinity": affinity} if affinity else {}), "nodeSelector": {**selector, ARCH_LABEL: job.arch[0]}}
    arch = {"matchExpressions": [{"key": ARCH_LABEL, "operator": "In", "values": list(job.arch)}]}
    affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [arch]}}
    return {"affinity": affinity, **({"nodeSelector": selector} if selector else {})}


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
                    "template": {"spec": {"containers": [launcher], **_node_selector(job, instance_type=False)}},
                },
                "Worker": {
                    "replicas": job.nodes,
                    "restartPolicy": "Never",
                    "template": {
                        **_gpu_pod_metadata(job),
                        "spec": {
                            "containers": [worker],
                            "volumes": [_shm_volume(job)],
                            **_claims(job),
                            **_node_selector(job),
                        },
                    },
                },
            },
        },
    }


# ---- trainjob and pytorchjob


def _torchrun(job: JobPlan) -> list[str]:
    """The image's torchrun (launch.py); nodes, node rank and master come from the operators' PET_* variables."""
    return [*job.launch.torchrun, *job.program]


def _training_runtime(job: JobPlan) -> dict[str, Any]:
    """The job's own TrainingRuntime (NVLink across instances, see the module's docstring): `torch-distributed`
    (Trainer v2.3.0's manifests/base/runtimes/torch_distributed.yaml) with the node container's resources, the
    ComputeDomain's channel among them, and the pod's claim on it."""
    node = _container(job, TRAINER_CONTAINER, resources=_resources(job))
    del node["imagePullPolicy"]
    pod = {**_gpu_pod_metadata(job), "spec": {"containers": [node], **_claims(job)}}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": job.name, "labels": dict([TRAINER_FRAMEWORK_LABEL])},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": TRAINER_CONTAINER,
                            "template": {
                                "metadata": {"labels": dict([TRAINER_ANCESTOR_LABEL])},
                                "spec": {"template": pod},
                            },
                        }
                    ]
                }
            },
        },
    }


def _trainjob(job: JobPlan) -> dict[str, Any]:
    container_patch = {"name": TRAINER_CONTAINER, "volumeMounts": [SHM_MOUNT], **_security(job)}
    pod_patch = {"containers": [container_patch], "volumes": [_shm_volume(job)], **_node_selector(job)}
    # The job's own runtime carries the resources where Trainer would drop the claim from resourcesPerNode.
    own_runtime = job.mnnvl
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": job.name},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "TrainingRuntime" if own_runtime else "ClusterTrainingRuntime",
                "name": job.name if own_runtime else TRAINER_RUNTIME,
            },
            "trainer": {
                "image": job.image,
                "command": _torchrun(job),
                "env": _env(job.env),
                "numNodes": job.nodes,
                "numProcPerNode": job.slots,
                **({} if own_runtime else {"resourcesPerNode": _resources(job)}),
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
    template = {
        **_gpu_pod_metadata(job),
        "spec": {"containers": [container], "volumes": [_shm_volume(job)], **_claims(job), **_node_selector(job)},
    }
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
