"""`imgbuild cluster job`: every engine's job for every shipped recipe validates against the operator's CRD
(openAPIV3Schema, from the shared data) and Kubernetes' own schemas (kubernetes-validate, offline), sbatch scripts
pass shellcheck, golden files, what each job must do about its operator, and (Docker) the cpu MPIJob run through
an emulation of the MPI Operator's pods: its Secret, hostfile, environment and sshd-instead-of-entrypoint rule.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
import tarfile
import time
import uuid
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer
import yaml
from typer.testing import CliRunner

from conftest import REPO, UPSTREAM
from imgbuild import recipe
from imgbuild.cli.cluster import job_command
from imgbuild.cluster import jobs
from imgbuild.core import paths
from imgbuild.core.errors import RecipeError
from imgbuild.core.instances import efa_devices, instance_arch, instance_env, mnnvl, mnnvl_domain_nodes, table
from imgbuild.image import render
from imgbuild.image.launch import for_manifest
from imgbuild.nccltests import command
from imgbuild.pin import lock
from imgbuild.pin.resolver import resolve

DATA = UPSTREAM
K8S = DATA / "k8s"
GOLDEN = REPO / "tests" / "golden" / "jobs"
K8S_VERSION = "1.32"  # Kubernetes' schemas the pod templates are checked against (kubernetes-validate, bundled)

SHIPPED = recipe.shipped_names()
CRDS = {
    jobs.Engine.mpijob: ("mpi-operator_kubeflow.org_mpijobs.yaml", "v2beta1"),
    jobs.Engine.trainjob: ("trainer-v2.3.0_trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
    jobs.Engine.pytorchjob: ("training-operator-v1.9.4_kubeflow.org_pytorchjobs.yaml", "v1"),
}
TORCH_RUNTIME = "trainer-v2.3.0_runtime_torch_distributed.yaml"
# The other objects a job's file may hold (NVLink across instances: k8s.k8s_objects), by kind.
KIND_CRDS = {
    "ComputeDomain": ("dra-driver-nvidia-gpu-v0.4.0_resource.nvidia.com_computedomains.yaml", "v1beta1"),
    "TrainingRuntime": ("trainer-v2.3.0_trainer.kubeflow.org_trainingruntimes.yaml", "v1alpha1"),
}


def k8s_file(name: str) -> Path:
    path = K8S / name
    if not path.is_file():
        pytest.fail(f"shared data missing: {path} (the CRDs in tests/data/upstream/k8s, see its README.md)")
    return path


@cache
def k8s_doc(name: str) -> Any:
    """An upstream file's YAML, read once per process, with libyaml where PyYAML has it (the CRDs are up to a few
    MB: the pure-Python loader took seconds for each); callers copy what they change."""
    return yaml.load(k8s_file(name).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def resolved(name: str) -> Any:
    return lock.resolved_for(recipe.load(name))


def has_pytorch(name: str) -> bool:
    return "pytorch" in resolved(name).pins


def plan(recipe_name: str, engine: jobs.Engine | str, nodes: int = 2, /, **kw: Any) -> jobs.JobPlan:
    return jobs.plan_job(resolved(recipe_name), engine, nodes, **kw)


def obj(recipe_name: str, engine: jobs.Engine | str, nodes: int = 2, /, **kw: Any) -> dict[str, Any]:
    return jobs.k8s_object(plan(recipe_name, engine, nodes, **kw))


COMBOS = [
    (name, engine)
    for name in SHIPPED
    for engine in jobs.Engine
    if engine not in jobs.TORCH_ENGINES or has_pytorch(name)
]
K8S_COMBOS = [(n, e) for n, e in COMBOS if e is not jobs.Engine.slurm]


# --------------------------------------------------------------------------------------------------------------
# Schemas


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that refuses unknown fields, as the API server does under
    `kubectl apply`'s default field validation (Strict), except where the CRD preserves unknown fields."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _strict(schema["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_strict(s) for s in schema[key]]
    return out


@cache
def crd_schema(file: str, version: str) -> dict[str, Any]:
    doc = k8s_doc(file)
    for v in doc["spec"]["versions"]:
        if v["name"] == version:
            return dict(v["schema"]["openAPIV3Schema"])
    pytest.fail(f"{file}: no version {version}")


def crd(engine: jobs.Engine) -> dict[str, Any]:
    return crd_schema(*CRDS[engine])


_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}  # id(schema) -> (schema, its strict validator)


def _validate(schema: dict[str, Any], instance: dict[str, Any]) -> None:
    """`instance` against `schema` made strict (`_strict`), its validator made once per schema (the CRDs' schemas
    are cached objects)."""
    known = _VALIDATORS.get(id(schema))
    if known is None or known[0] is not schema:
        known = _VALIDATORS[id(schema)] = (schema, jsonschema.Draft4Validator(_strict(schema)))
    errors = sorted(known[1].iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:10])


def validate_crd(engine: jobs.Engine, instance: dict[str, Any]) -> None:
    _validate(crd(engine), instance)


def validate_kind(instance: dict[str, Any]) -> None:
    """An object other than the job against its kind's CRD (KIND_CRDS), apiVersion included."""
    file, version = KIND_CRDS[instance["kind"]]
    group = k8s_doc(file)["spec"]["group"]
    assert instance["apiVersion"] == f"{group}/{version}"
    _validate(crd_schema(file, version), instance)


def documents(recipe_name: str, engine: jobs.Engine | str, nodes: int = 2, /, **kw: Any) -> list[dict[str, Any]]:
    """The objects of the file `imgbuild cluster job` writes, as kubectl reads them."""
    return list(yaml.safe_load_all(jobs.render_job(resolved(recipe_name), engine, nodes, **kw)))


def validate_pod_template(template: dict[str, Any]) -> None:
    import kubernetes_validate

    doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "imgbuild"}, "template": template}
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"pod template refused by Kubernetes {K8S_VERSION}'s schema: {exc}")


def trainer_pod(job: dict[str, Any], runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod template Trainer makes of the runtime (torch-distributed, or the job's own TrainingRuntime) for a
    TrainJob: the trainer's image, command, env and resources (where it sets them) on the runtime's `node`
    container, then the TrainJob's runtimePatches."""
    ref = job["spec"]["runtimeRef"]
    if runtime is None:
        assert ref["kind"] == "ClusterTrainingRuntime", "a TrainingRuntime of the job's own comes with it"
        runtime = k8s_doc(TORCH_RUNTIME)
    runtime = json.loads(json.dumps(runtime))  # a copy: the patches below change it
    assert (ref["kind"], ref["name"]) == (runtime["kind"], runtime["metadata"]["name"])
    node = next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    pod = node["template"]["spec"]["template"]
    spec = pod["spec"]
    trainer = job["spec"]["trainer"]
    container = next(c for c in spec["containers"] if c["name"] == jobs.TRAINER_CONTAINER)
    container.update(image=trainer["image"], command=trainer["command"], env=trainer["env"])
    if "resourcesPerNode" in trainer:
        container["resources"] = trainer["resourcesPerNode"]
    for patch in job["spec"]["runtimePatches"]:
        for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            assert rj["name"] in {j["name"] for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
            pod_patch = rj["template"]["spec"]["template"]["spec"]
            for cpatch in pod_patch.get("containers", []):
                target = [c for c in spec["containers"] if c["name"] == cpatch["name"]]
                assert target, f"runtimePatches name container {cpatch['name']!r}, which the runtime lacks"
                for key, value in cpatch.items():
                    if key != "name":
                        target[0][key] = [*target[0].get(key, []), *value] if isinstance(value, list) else value
            for key in ("volumes",):
                spec[key] = [*spec.get(key, []), *pod_patch.get(key, [])]
            if "nodeSelector" in pod_patch:
                spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **pod_patch["nodeSelector"]}
            if "affinity" in pod_patch:
                spec["affinity"] = pod_patch["affinity"]
    return dict(pod)


def pod_templates(engine: jobs.Engine, job: dict[str, Any]) -> list[dict[str, Any]]:
    if engine is jobs.Engine.mpijob:
        return [r["template"] for r in job["spec"]["mpiReplicaSpecs"].values()]
    if engine is jobs.Engine.pytorchjob:
        return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    return [trainer_pod(job)]


def pod_templates_of(engine: jobs.Engine, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod templates of a job's file (its last object is the job; a TrainingRuntime before it is its runtime)."""
    job = objects[-1]
    if engine is jobs.Engine.trainjob:
        runtime = next((o for o in objects if o["kind"] == "TrainingRuntime"), None)
        return [trainer_pod(job, runtime)]
    return pod_templates(engine, job)


@pytest.mark.parametrize(("name", "engine"), K8S_COMBOS)
def test_job_validates_against_the_crd_and_kubernetes(name: str, engine: jobs.Engine) -> None:
    objects = documents(name, engine)
    assert objects[-1] == obj(name, engine)
    validate_crd(engine, objects[-1])
    for other in objects[:-1]:
        validate_kind(other)
    for template in pod_templates_of(engine, objects):
        validate_pod_template(template)


def test_the_validators_refuse_what_the_cluster_would() -> None:
    """The strict CRD schema and Kubernetes' schema both catch a misspelt field and a wrong type."""
    job = obj("a100", "mpijob")
    job["spec"]["slotPerWorker"] = 8
    with pytest.raises(AssertionError, match="slotPerWorker"):
        validate_crd(jobs.Engine.mpijob, job)
    job = obj("a100", "mpijob")
    job["spec"]["slotsPerWorker"] = "8"
    with pytest.raises(AssertionError, match="slotsPerWorker"):
        validate_crd(jobs.Engine.mpijob, job)
    template = obj("a100", "mpijob")["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    template["spec"]["containers"][0]["readinesProbe"] = template["spec"]["containers"][0].pop("readinessProbe")
    with pytest.raises(pytest.fail.Exception, match="readinesProbe"):
        validate_pod_template(template)


def test_the_only_cel_rules_on_create_hold() -> None:
    """x-kubernetes-validations (CEL) are not JSON Schema: every rule of the three CRDs that applies on create
    (no oldSelf) is listed here, and the rendered names satisfy it."""
    rules: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            rules.update(r["rule"] for r in node.get("x-kubernetes-validations", []) if "oldSelf" not in r["rule"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for engine in CRDS:
        walk(crd(engine))
    for file, version in KIND_CRDS.values():  # the ComputeDomain's only rule is `self == oldSelf` (an update's)
        walk(crd_schema(file, version))
    name_rules = {"self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')", "size(self.metadata.name) <= 63"}
    other = {
        "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')",  # initializer storageUri: unused
        "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']",  # managedBy: unused
        "has(self.lastUpdatedTime)",  # status
    }
    # The TrainingRuntime's (the job's own, for NVLink across instances), each checked on it below.
    runtime_rules = {
        "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
        "self.replicatedJobs.exists(x, has(x.dependsOn)))",  # no startupPolicy
        "!self.exists(c, c == 'node')",  # a list of names the runtime does not set
        "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1",
        "self >= 1",  # mlPolicy.numNodes
        "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)",  # no templates
    }
    assert rules == name_rules | other | runtime_rules
    for name in SHIPPED:
        job_name = plan(name, "mpijob").name
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job_name) and len(job_name) <= 63
    runtime = documents("gb200", "trainjob")[1]
    assert runtime["kind"] == "TrainingRuntime"
    spec = runtime["spec"]
    assert "startupPolicy" not in spec["template"]["spec"] and list(spec["mlPolicy"]) == ["numNodes", "torch"]
    assert spec["mlPolicy"]["numNodes"] >= 1 and "podGroupPolicy" not in spec


# --------------------------------------------------------------------------------------------------------------
# Golden files and shellcheck


def golden_path(name: str, engine: jobs.Engine) -> Path:
    return GOLDEN / f"{name}.{engine.value}.{'sbatch' if engine is jobs.Engine.slurm else 'yaml'}"


@pytest.mark.parametrize(("name", "engine"), COMBOS)
def test_golden_job(name: str, engine: jobs.Engine, update_golden: bool) -> None:
    text = jobs.render_job(resolved(name), engine, 2)
    golden = golden_path(name, engine)
    if update_golden:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden file: run pytest --update-golden and review {golden}"
    assert text == golden.read_text(), f"{name} {engine.value}: rendered job differs from {golden} (--update-golden)"
    assert text == jobs.render_job(resolved(name), engine, 2), "rendering is not deterministic"


def test_no_golden_file_is_left_over() -> None:
    expected = {golden_path(n, e).name for n, e in COMBOS}
    assert {p.name for p in GOLDEN.iterdir()} <= expected


def shellcheck() -> str:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.fail("shellcheck is not installed (apt-get install -y shellcheck; scripts/setup.sh)")
    return exe


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("pushed", [False, True])
def test_sbatch_passes_shellcheck(name: str, pushed: bool) -> None:
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/imgbuild/x:lock-0123456789ab" if pushed else None
    text = jobs.render_job(resolved(name), "slurm", 2, image=image)
    proc = subprocess.run(
        [shellcheck(), "--shell=bash", "--severity=style", "-"], input=text, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_shellcheck_is_not_a_rubber_stamp() -> None:
    text = jobs.render_job(resolved("cpu"), "slurm", 2).replace('"${IMAGE}"', "$IMAGE")
    proc = subprocess.run([shellcheck(), "--shell=bash", "-"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "SC2086" in proc.stdout


# --------------------------------------------------------------------------------------------------------------
# What each job does about its operator


def container(template: dict[str, Any]) -> dict[str, Any]:
    return template["spec"]["containers"][0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@pytest.mark.parametrize("name", SHIPPED)
def test_mpijob_works_with_what_the_operator_does(name: str) -> None:
    p = plan(name, "mpijob", 3)
    job = jobs.k8s_object(p)
    spec = job["spec"]
    launcher = container(spec["mpiReplicaSpecs"]["Launcher"]["template"])
    worker = container(spec["mpiReplicaSpecs"]["Worker"]["template"])
    manifest, _ = jobs.image_manifest(resolved(name))
    # The operator replaces a command-less worker's entrypoint with `sshd -De`: both run the image's entrypoint.
    assert worker["command"] == launcher["command"] == ["/usr/local/bin/imgbuild-entrypoint"]
    assert f'ENTRYPOINT ["{paths.ENTRYPOINT}"]' in render.plan(resolved(name)).dockerfile
    # Keys: not mounted over /root/.ssh (read-only there) nor where the entrypoint reads keys from; the private key
    # comes from the operator's Secret through IMGBUILD_SSH_PRIVATE_KEY, which the entrypoint installs.
    assert spec["sshAuthMountPath"] not in ("/root/.ssh", "/run/imgbuild/ssh", "/opt/ml/input/data/ssh")
    secret = {"secretKeyRef": {"name": f"{p.name}-ssh", "key": "ssh-privatekey"}}
    assert env_of(worker)["IMGBUILD_SSH_PRIVATE_KEY"] == env_of(launcher)["IMGBUILD_SSH_PRIVATE_KEY"] == secret
    files = {f.path: f.content.decode() for f in render.plan(resolved(name)).files}
    assert "IMGBUILD_SSH_PRIVATE_KEY" in files["imgbuild/sshd/50-sshd.sh"]
    # sshd's port: the readiness probe, and the image's ssh client config (which the operator's plm_rsh_args,
    # "-o ConnectionAttempts=10", does not override).
    port = manifest.ssh_ports[0]
    assert worker["readinessProbe"]["tcpSocket"]["port"] == port
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert re.search(rf"^Host \*\n(\s+.*\n)*?\s+Port {port}$", files["imgbuild/ssh_config"], re.MULTILINE)
    # The launch line is launch.py's, with the operator's hostfile and every rank named (Open MPI 5 reads
    # neither the operator's default hostfile nor its slot count).
    argv = for_manifest(manifest).mpirun_argv(hostfile="/etc/mpi/hostfile", np=3 * manifest.slots, program=p.program)
    assert launcher["args"] == argv
    assert spec["slotsPerWorker"] == manifest.slots == p.slots
    assert env_of(launcher)["PRTE_MCA_prte_keep_fqdn_hostnames"] == "1"
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    # /dev/shm in memory.
    volumes = {v["name"]: v for v in spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]}
    mount = next(m for m in worker["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert volumes[mount["name"]]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize(
    ("name", "instance_type", "resources"),
    [
        ("cpu", None, {"memory": "2Gi"}),
        ("v100", None, {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 1, "hugepages-2Mi": "5120Mi", "memory": "32Gi"}),
        ("a100", None, {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 4, "hugepages-2Mi": "5120Mi", "memory": "32Gi"}),
        ("a100", "p4de.24xlarge", {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 4, "hugepages-2Mi": "5120Mi",
                                   "memory": "32Gi"}),
        ("h100", None, {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32, "hugepages-2Mi": "5120Mi", "memory": "32Gi"}),
        ("h100", "p5en.48xlarge", {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 16, "hugepages-2Mi": "5120Mi",
                                   "memory": "32Gi"}),
        ("h100", "p5e.48xlarge", {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32, "hugepages-2Mi": "5120Mi",
                                  "memory": "32Gi"}),
        ("gaudi-1.15", None, {"habana.ai/gaudi": 8, "vpc.amazonaws.com/efa": 4, "hugepages-2Mi": "5120Mi",
                              "memory": "32Gi"}),
        ("gaudi-1.21", None, {"habana.ai/gaudi": 8, "vpc.amazonaws.com/efa": 4, "hugepages-2Mi": "5120Mi",
                              "memory": "32Gi"}),
        ("h200", None, {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 16, "hugepages-2Mi": "5120Mi", "memory": "32Gi"}),
        ("b200", None, {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 8, "hugepages-2Mi": "5120Mi", "memory": "32Gi"}),
        ("gb200", None, {"nvidia.com/gpu": 4, "vpc.amazonaws.com/efa": 4, "hugepages-2Mi": "5120Mi", "memory": "32Gi"}),
        ("b300", None, {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 16, "hugepages-2Mi": "5120Mi", "memory": "32Gi"}),
    ],
)  # fmt: skip
def test_worker_resources_follow_recipe_and_instance_type(
    name: str, instance_type: str | None, resources: dict[str, Any]
) -> None:
    job = obj(name, "mpijob", instance_type=instance_type)
    template = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    wanted_resources = {"limits": resources, "requests": resources}
    if plan(name, "mpijob", instance_type=instance_type).mnnvl:  # the ComputeDomain's channel (NVLink across trays)
        wanted_resources["claims"] = [{"name": "compute-domain-channel"}]
    assert container(template)["resources"] == wanted_resources
    wanted = instance_type or (resolved(name).recipe.platform.instance_types or [None])[0]
    arch = resolved(name).recipe.platform.arch
    selector = {"node.kubernetes.io/instance-type": wanted} if wanted else {}
    if len(arch) == 1:
        selector["kubernetes.io/arch"] = arch[0]
    assert template["spec"].get("nodeSelector") == (selector or None)


ARCH_IN = {"key": "kubernetes.io/arch", "operator": "In"}


@pytest.mark.parametrize(
    ("name", "instance_type", "arch"),
    [("gb200", "p6e-gb200.36xlarge", "arm64"), ("b200", "p6-b200.48xlarge", "amd64"),
     ("h200", "p5en.48xlarge", "amd64"), ("a100", "p4d.24xlarge", "amd64")],
)  # fmt: skip
def test_every_engine_pins_the_image_architecture(name: str, instance_type: str, arch: str) -> None:
    """One architecture: `kubernetes.io/arch` next to the instance type in every pod an engine makes, and the sbatch
    script says it (Slurm has no standard feature for it)."""
    wanted = {"node.kubernetes.io/instance-type": instance_type, "kubernetes.io/arch": arch}
    for engine in jobs.Engine:
        if engine is jobs.Engine.slurm:
            text = jobs.render_job(resolved(name), engine, 2)
            assert f"# Architecture: linux/{arch} only" in text and f"--constraint={arch}" in text
            assert "\n#SBATCH --constraint" not in text  # a comment: the site names its features
            continue
        if engine in jobs.TORCH_ENGINES and not has_pytorch(name):
            continue
        objects = documents(name, engine)
        job = objects[-1]
        for template in pod_templates_of(engine, objects):
            replicas = job["spec"].get("mpiReplicaSpecs", {})
            launcher = engine is jobs.Engine.mpijob and template == replicas["Launcher"]["template"]
            # The MPI launcher runs the image too (its architecture), on any instance type (it needs no GPU).
            expected = {"kubernetes.io/arch": arch} if launcher else wanted
            assert template["spec"]["nodeSelector"] == expected, engine
            # No nodeAffinity (one architecture); gb200's GPU pods keep to one NVLink domain with a podAffinity.
            assert set(template["spec"].get("affinity", {})) <= {"podAffinity"}


def test_a_multi_architecture_image_may_run_on_either() -> None:
    """cpu is built for amd64 and arm64 under one tag (an image index): its pods are not pinned to one
    architecture, and may not land on one the index lacks (a required nodeAffinity In the list)."""
    assert resolved("cpu").recipe.platform.arch == ("amd64", "arm64")
    for engine in (jobs.Engine.mpijob,):
        for template in pod_templates(engine, obj("cpu", engine)):
            spec = template["spec"]
            assert "kubernetes.io/arch" not in spec.get("nodeSelector", {})
            required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert required["nodeSelectorTerms"] == [{"matchExpressions": [{**ARCH_IN, "values": ["amd64", "arm64"]}]}]
            validate_pod_template(template)
    job = obj("cpu", "mpijob", instance_type="c7g.16xlarge")  # a Graviton type: the index has its arm64 image
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["nodeSelector"] == {"node.kubernetes.io/instance-type": "c7g.16xlarge"} and "affinity" in worker
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert "nodeSelector" not in launcher and launcher["affinity"] == worker["affinity"]
    text = jobs.render_job(resolved("cpu"), "slurm", 2)
    assert "# Architectures: linux/amd64, linux/arm64 (one image index)" in text


@pytest.mark.parametrize(
    ("name", "instance_type", "message"),
    [
        ("b200", "p6e-gb200.36xlarge", r"--instance-type p6e-gb200\.36xlarge: p6e-gb200\.36xlarge has arm64 CPUs; "
                                       r"the image is built for amd64"),
        ("gb200", "p6-b200.48xlarge", r"--instance-type p6-b200\.48xlarge: p6-b200\.48xlarge has amd64 CPUs; the "
                                      r"image is built for arm64"),
        ("gb200", "p5en.48xlarge", r"p5en\.48xlarge carries NVIDIA H200 \(sm_90\), which cannot run code built for "
                                   r"sm_100"),
    ],
)  # fmt: skip
def test_an_instance_type_of_another_architecture_is_refused(name: str, instance_type: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message) as caught:
        plan(name, "mpijob", instance_type=instance_type)
    if "CPUs" in message:
        assert "never be scheduled" in str(caught.value)


def test_efa_for_an_unknown_instance_type_is_asked_for() -> None:
    with pytest.raises(RecipeError, match=r"--instance-type: no EFA device count known for instance type 'g5\.48x"):
        plan("a100", "mpijob", instance_type="g5.48xlarge")
    p = plan("a100", "mpijob", instance_type="g5.48xlarge", efa=1)
    assert p.efa == 1
    none = obj("a100", "mpijob", instance_type="g5.48xlarge", efa=0)
    limits = container(none["spec"]["mpiReplicaSpecs"]["Worker"]["template"])["resources"]["limits"]
    assert "vpc.amazonaws.com/efa" not in limits and "hugepages-2Mi" not in limits


def test_gaudi_gets_its_devices_from_the_device_plugin_not_the_run_profile() -> None:
    worker = container(obj("gaudi-1.15", "mpijob")["spec"]["mpiReplicaSpecs"]["Worker"]["template"])
    env = env_of(worker)
    assert "HABANA_VISIBLE_DEVICES" not in env  # `all` would hand every Gaudi of the node to the pod
    assert env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    assert worker["securityContext"] == {"capabilities": {"add": ["SYS_NICE"]}}


@pytest.mark.parametrize("name", SHIPPED)
def test_default_programs(name: str) -> None:
    res = resolved(name)
    manifest, _ = jobs.image_manifest(res)
    p = plan(name, "mpijob", 4)
    if "nccl_tests" in res.pins:
        args = command.args(p.instance_type)
        assert p.program == (f"{manifest.components['nccl_tests'].details.prefix}/all_reduce_perf", *args)
        assert "NCCL_DEBUG" in dict(p.env)
    elif "mpi4py" in res.pins:
        assert p.program[:2] == (manifest.python, "-c") and p.program[-1] == "4"
        assert "has no nccl-tests" in p.program_about
    else:
        assert p.program == ("hostname",) and "neither nccl-tests nor mpi4py" in p.program_about
    if has_pytorch(name):
        t = plan(name, "trainjob", 4)
        assert t.program[0] == "--no-python" and t.program[-2:] == (res.recipe.platform.accelerator, "4")


def test_the_command_after_dashes_replaces_the_program() -> None:
    job = obj("a100", "mpijob", command=["python3", "/opt/ml/code/train.py", "--epochs", "2"])
    args = container(job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])["args"]
    assert args[-4:] == ["python3", "/opt/ml/code/train.py", "--epochs", "2"]
    assert args[-8:-4] == ["-np", "16", "--hostfile", "/etc/mpi/hostfile"]
    t = obj("a100", "trainjob", command=["/opt/ml/code/train.py", "--epochs", "2"])
    assert t["spec"]["trainer"]["command"][-3:] == ["/opt/ml/code/train.py", "--epochs", "2"]


@pytest.mark.parametrize("engine", jobs.TORCH_ENGINES)
def test_torch_engines_refuse_recipes_without_pytorch(engine: jobs.Engine) -> None:
    with pytest.raises(RecipeError, match=rf"recipe 'cpu' has no components.pytorch: the {engine.value} engine"):
        plan("cpu", engine)


@pytest.mark.parametrize("name", [n for n in SHIPPED if has_pytorch(n)])
def test_torch_jobs_run_the_images_torchrun(name: str) -> None:
    manifest, _ = jobs.image_manifest(resolved(name))
    torchrun = list(for_manifest(manifest).torchrun)
    t = obj(name, "trainjob", 3)
    own = plan(name, "trainjob", 3).mnnvl  # NVLink across trays: the job's own runtime, torch-distributed + claim
    assert t["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime" if own else "ClusterTrainingRuntime",
        "name": t["metadata"]["name"] if own else "torch-distributed",
    }
    trainer = t["spec"]["trainer"]
    assert trainer["command"][: len(torchrun)] == torchrun
    assert trainer["numNodes"] == 3 and trainer["numProcPerNode"] == manifest.slots
    # The runtime's container is the one patched (Trainer refuses a patch for a container the runtime lacks).
    pod = pod_templates_of(jobs.Engine.trainjob, documents(name, "trainjob", 3))[0]
    assert container(pod)["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    pj = obj(name, "pytorchjob", 3)["spec"]
    assert pj["pytorchReplicaSpecs"]["Master"]["replicas"] == 1 and pj["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    c = container(pj["pytorchReplicaSpecs"]["Master"]["template"])
    assert c["name"] == "pytorch" and c["command"][: len(torchrun)] == torchrun
    assert pj["nprocPerNode"] == str(manifest.slots)
    assert "Worker" not in obj(name, "pytorchjob", 1)["spec"]["pytorchReplicaSpecs"]


@pytest.mark.parametrize("name", SHIPPED)
def test_sbatch_names_every_export_in_container_env(name: str) -> None:
    text = jobs.render_job(resolved(name), "slurm", 3)
    p = plan(name, "slurm", 3)
    exported = set(re.findall(r"^export (\w+)", text, re.MULTILINE))
    named = set(re.search(r"--container-env=(\S+)", text).group(1).split(",")) if exported else set()  # type: ignore[union-attr]
    assert exported and exported == named
    assert f"#SBATCH --nodes=3\n#SBATCH --ntasks-per-node={p.slots}\n" in text
    assert "srun --mpi=pmix" in text and '--container-image="${IMAGE}"' in text
    # The recipe's mpirun --mca settings reach the ranks srun starts as OMPI_MCA_* variables.
    for key, value in jobs.mca_pairs(p.launch):
        assert f"export OMPI_MCA_{key}=" in text, key
        assert re.search(rf"^export OMPI_MCA_{key}=['\"]?{re.escape(value)}['\"]?$", text, re.MULTILINE)


def test_pyxis_image_reference() -> None:
    assert jobs.pyxis_image("123.dkr.ecr.us-east-1.amazonaws.com/imgbuild/a100:t") == (
        "123.dkr.ecr.us-east-1.amazonaws.com#imgbuild/a100:t"
    )
    assert jobs.pyxis_image("localhost:5000/a:b") == "localhost:5000#a:b"
    assert jobs.pyxis_image("nvcr.io/nvidia/pytorch:24.01-py3") == "nvcr.io#nvidia/pytorch:24.01-py3"
    assert jobs.pyxis_image("ubuntu:22.04") == "ubuntu:22.04"
    assert jobs.pyxis_image("imgbuild/a100:lock-1") == "imgbuild/a100:lock-1"
    assert jobs.pyxis_image("host:5000/repo") == "host:5000#repo"
    assert jobs.pyxis_image("localhost/x") == "localhost#x"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"name": "Bad_Name"}, "job name: expected a DNS label"),
        ({"name": "x" * 41}, "at most 40 characters"),
        ({"memory": "lots"}, "--memory: expected a Kubernetes quantity such as 32Gi or 64000Mi, got 'lots'"),
        ({"nodes": 0}, "--nodes must be 1 to 33554431, got 0"),
        ({"nodes": 2**31}, "--nodes must be 1 to 33554431"),
        ({"efa": 33}, "--efa: expected 0 to 32 EFA devices per node, got 33"),
        ({"image": "x\n$(id)"}, "--image: expected a Docker image reference"),
        ({"instance_type": "p5.48xlarge\n"}, "--instance-type: expected an EC2 instance type"),
        ({"command": ["--mca", "x"]}, "COMMAND: expected a program"),
    ],
)
def test_bad_input_is_named(kw: dict[str, Any], message: str) -> None:
    nodes = kw.pop("nodes", 2)
    with pytest.raises(RecipeError, match=re.escape(message)):
        plan("cpu", "mpijob", nodes, **kw)


def test_default_name_is_a_dns_label() -> None:
    assert jobs.job_name("gaudi-1.15") == "imgbuild-gaudi-1-15"
    assert jobs.job_name("My_Recipe" + "x" * 60).startswith("imgbuild-my-recipe") and len(jobs.job_name("a" * 99)) <= 40


# --------------------------------------------------------------------------------------------------------------
# Command line


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def cluster() -> None:
        """Test mount of the command (cli/cluster.py registers it on the real sub-app)."""

    app.command("job")(job_command)
    return app


def test_cli_renders_to_stdout_and_file(cli: typer.Typer, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["job", "a100", "--engine", "mpijob", "--nodes", "2"])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(res.stdout)["kind"] == "MPIJob"
    assert res.stdout == jobs.render_job(resolved("a100"), "mpijob", 2)
    out = tmp_path / "job.yaml"
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/imgbuild/a100:v1"
    args = ["job", "a100", "-e", "pytorchjob", "-n", "3", "--image", uri, "-o", str(out), "--", "train.py", "--lr", "1"]
    res = runner.invoke(cli, args)
    assert res.exit_code == 0, res.output
    job = yaml.safe_load(out.read_text())
    c = container(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    assert c["image"] == uri and c["command"][-3:] == ["train.py", "--lr", "1"]


def test_cli_refuses_clearly(cli: typer.Typer) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["job", "cpu", "--engine", "trainjob"])
    assert res.exit_code == RecipeError.exit_code
    assert "recipe 'cpu' has no components.pytorch" in res.output
    res = runner.invoke(cli, ["job", "cpu", "--engine", "kubejob"])
    assert res.exit_code == 2 and "kubejob" in res.output
    res = runner.invoke(cli, ["job", "cpu", "--nodes", "0"])
    assert res.exit_code == 2


# --------------------------------------------------------------------------------------------------------------
# Slurm as AWS runs it, jobs that run as far as the report judges, the recipe's instance types


def test_sbatch_srun_as_aws_runs_it() -> None:
    """srun leaves tasks unbound (mpirun's --bind-to none) and PMIx on its hash store, named for the container."""
    text = jobs.render_job(resolved("h100"), "slurm", 2)
    srun = text[text.index("\nsrun ") + 1 :]
    assert re.match(r"srun --mpi=pmix --cpu-bind=none \\\n", srun), srun
    assert "\nexport PMIX_MCA_gds=hash\n" in text
    assert "PMIX_MCA_gds" in re.search(r"--container-env=(\S+)", text).group(1).split(",")  # type: ignore[union-attr]


def report_line(text: str) -> list[str]:
    """The `imgbuild cluster report ...` words of a job's follow line (its comment header)."""
    line = next(line for line in text.splitlines() if "| imgbuild cluster report" in line)
    return shlex.split(line.split("| ", 1)[1])


@pytest.mark.parametrize("engine", ["slurm", "mpijob"])
def test_the_follow_line_judges_the_log_for_the_jobs_instance_type(engine: str, tmp_path: Path) -> None:
    """The report line printed with a job, run as it is on a p5 log that names neither instance type nor nodes,
    judges bandwidth for the job's instance type up to the size the job runs to."""
    from imgbuild.cli import app

    text = jobs.render_job(resolved("h100"), engine, 2)
    words = report_line(text)
    assert words[:3] == ["imgbuild", "cluster", "report"] and "--instance-type" in words
    log = UPSTREAM / "nccl-tests" / "awsome-dt-readme_2x-p5.48xlarge_slurm_table-only.log"
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, [*words[1:], str(log), "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["instance_type"] == "p5.48xlarge" and data["nodes"] == 2
    judged = [c for c in data["criteria"] if c["name"].startswith("bandwidth ")]
    assert judged and all(c["status"] == "PASS" for c in judged), judged
    assert "bandwidth 16 GiB" in {c["name"] for c in judged}


def _bytes(size: str) -> int:
    """An nccl-tests size argument (16G, 512M, 8) in bytes."""
    m = re.fullmatch(r"(\d+)([KMG]?)", size)
    assert m, size
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


LARGE = ["p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"]


@pytest.mark.parametrize(
    ("name", "instance_type"),
    [(n, t) for n in SHIPPED if "nccl_tests" in resolved(n).pins for t in resolved(n).recipe.platform.instance_types]
    + [("h100", t) for t in LARGE]
    + [("a100", "g5.48xlarge")],
)
@pytest.mark.parametrize("engine", ["mpijob", "slurm"])
def test_jobs_run_as_far_as_the_report_judges(name: str, instance_type: str, engine: str) -> None:
    from imgbuild.nccltests import expected

    p = plan(name, engine, instance_type=instance_type, efa=None if efa_devices(instance_type) else 1)
    assert p.runs_all_reduce_perf
    args = list(p.program[1:])
    end = _bytes(args[args.index("-e") + 1])
    assert end >= expected.max_judged_size(instance_type) and end >= 1 << 30
    assert _bytes(args[args.index("-b") + 1]) == 8 and args[args.index("-f") + 1] == "2"
    assert end & (end - 1) == 0, "the doubling from -b 8 must land on -e"
    if instance_type.split(".")[0] in ("p5", "p5e", "p5en"):
        assert end == 16 << 30  # what AWS's p5 nccl-tests jobs run (-e 16G)
    text = jobs.render_plan(p)
    assert f"all_reduce_perf -b 8 -e {args[args.index('-e') + 1]} " in text or f"- -e\n    - {args[3]}" in text


REFUSED = [
    ("gaudi-1.15", "p4d.24xlarge", "p4d.24xlarge carries NVIDIA A100, not gaudi", "dl1.24xlarge"),
    ("a100", "dl1.24xlarge", "dl1.24xlarge carries Intel Gaudi, not nvidia", "p4d.24xlarge, p4de.24xlarge"),
    (
        "v100",
        "p5.48xlarge",
        "p5.48xlarge carries NVIDIA H100 (sm_90), which cannot run code built for sm_70",
        "p3dn.24xlarge",
    ),
    (
        "a100",
        "p5.48xlarge",
        "p5.48xlarge carries NVIDIA H100 (sm_90), which cannot run code built for sm_80",
        "p4d.24xlarge",
    ),
    (
        "h100",
        "p6-b200.48xlarge",
        "p6-b200.48xlarge carries NVIDIA B200 (sm_100), which cannot run code built for sm_90",
        "p5.48xlarge",
    ),
    (
        "h100",
        "p4d.24xlarge",
        "p4d.24xlarge carries NVIDIA A100 (sm_80), which cannot run code built for sm_90",
        "p5.48xlarge",
    ),
    ("h100", "trn1.32xlarge", "trn1.32xlarge carries AWS Trainium, not nvidia", "p5.48xlarge"),
    ("a100", "c5.large", "imgbuild does not know which accelerator c5.large carries", "p4d.24xlarge"),
]


@pytest.mark.parametrize(("name", "instance_type", "why", "listed"), REFUSED)
def test_a_recipe_is_refused_on_an_instance_type_without_its_accelerator(
    name: str, instance_type: str, why: str, listed: str
) -> None:
    """Through the CLI, every engine: exit 3 (a well-formed type the recipe cannot run on), naming the recipe's
    instance types; a pod asking for habana.ai/gaudi on a p4d would never schedule."""
    from imgbuild.cli import app

    for engine in ("mpijob", "slurm"):
        res = CliRunner().invoke(app, ["cluster", "job", name, "-e", engine, "--instance-type", instance_type])
        assert res.exit_code == RecipeError.exit_code, res.output
        message = " ".join(res.output.split())
        assert f"--instance-type {instance_type}: {why}" in message, message
        assert f"recipe '{name}'" in message and f"runs on {listed}" in message, message
        assert "apiVersion" not in res.stdout and "#!/bin/bash" not in res.stdout


def test_p6_b300_through_the_cli() -> None:
    """`cluster job --instance-type p6-b300.48xlarge`: 16 EFA devices (17 network cards, card 0 ENA only) and 8 GPUs
    for b300; a B200 image (sm_100 code) runs there too, as B300 (10.3) runs 10.0 code; an H100 image (sm_90) does
    not."""
    from imgbuild.cli import app

    for name in ("b300", "b200"):
        res = CliRunner().invoke(app, ["cluster", "job", name, "-e", "mpijob", "--instance-type", "p6-b300.48xlarge"])
        assert res.exit_code == 0, res.output
        job = next(d for d in yaml.safe_load_all(res.stdout) if d and d.get("kind") == "MPIJob")
        worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
        limits = container(worker)["resources"]["limits"]
        assert (limits["vpc.amazonaws.com/efa"], limits["nvidia.com/gpu"]) == (16, 8), name
        assert worker["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == "p6-b300.48xlarge"
        validate_crd(jobs.Engine.mpijob, job)
    res = CliRunner().invoke(app, ["cluster", "job", "h100", "-e", "mpijob", "--instance-type", "p6-b300.48xlarge"])
    assert res.exit_code == RecipeError.exit_code
    message = " ".join(res.output.split())
    assert "p6-b300.48xlarge carries NVIDIA B300 (sm_103), which cannot run code built for sm_90" in message


@pytest.mark.parametrize(
    ("name", "instance_type"),
    [("a100", "p4de.24xlarge"), ("a100", "g5.48xlarge"), ("h100", "p5en.48xlarge"), ("h100", "p5e.48xlarge"),
     ("v100", "p3.16xlarge"), ("cpu", "p4d.24xlarge"), ("cpu", "c5.large"), ("pytorch", "g6.12xlarge")],
)  # fmt: skip
def test_a_recipe_runs_where_its_accelerator_is(name: str, instance_type: str) -> None:
    efa = None if efa_devices(instance_type) else 0
    job = obj(name, "mpijob", instance_type=instance_type, efa=efa)
    selector = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"]
    arch = resolved(name).recipe.platform.arch
    assert selector == {
        "node.kubernetes.io/instance-type": instance_type,
        **({"kubernetes.io/arch": arch[0]} if len(arch) == 1 else {}),
    }


def test_instance_families_agree_with_the_recipes_and_the_efa_table() -> None:
    """Every shipped recipe's instance types carry its accelerator by the table too, and every family with EFA
    devices in the table says what it carries."""
    from imgbuild.cluster import jobplan

    for name in SHIPPED:
        platform = resolved(name).recipe.platform
        for t in platform.instance_types:
            stripped = platform.model_copy(update={"instance_types": ()})
            assert jobs.accelerator_mismatch(stripped, t) is None, (name, t)
            assert jobplan.arch_mismatch(platform, t) is None, (name, t)
            assert instance_arch(t) in platform.arch, (name, t)
    assert efa_devices("p6-b200.48xlarge") == 8 and efa_devices("p5en.48xlarge") == 16
    assert efa_devices("p6e-gb200.36xlarge") == 4 and efa_devices("p6-b300.48xlarge") == 16
    assert efa_devices("p6e-gb300.36xlarge") is None  # no count read in a public source: a job names --efa N
    assert instance_arch("p6e-gb200.36xlarge") == "arm64" and instance_arch("p5.48xlarge") == "amd64"
    assert instance_arch("c7g.16xlarge") is None  # not a family imgbuild knows: not checked


def test_a_child_recipe_can_name_another_instance_type(tmp_path: Path) -> None:
    """The way out the error's hint names: a recipe that lists the type runs on it (it says so, as data)."""
    child = tmp_path / "h100-b200.yaml"
    child.write_text(f"extends: {REPO / 'recipes' / 'h100.yaml'}\nplatform:\n  instance_types: [p6-b200.48xlarge]\n")
    res = resolve(recipe.load(str(child)).concrete(), lookup_torch=None)  # no lock: the job plan needs none
    p = jobs.plan_job(res, "mpijob", 2)
    assert p.instance_type == "p6-b200.48xlarge" and p.efa == 8


# --------------------------------------------------------------------------------------------------------------
# NVLink across instances (GB200 NVL72 across trays): ComputeDomain, claims, one NVLink domain, NCCL, IMEX


def gpu_pods(engine: jobs.Engine, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod templates that run the image on GPUs (not the MPI launcher)."""
    job = objects[-1]
    if engine is jobs.Engine.mpijob:
        return [job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]]
    return pod_templates_of(engine, objects)


@pytest.mark.parametrize("engine", [*jobs.TORCH_ENGINES, jobs.Engine.mpijob])
def test_gb200_jobs_claim_a_compute_domain_and_keep_to_one_nvlink_domain(engine: jobs.Engine) -> None:
    """As AWS's EKS guide and GB200 sample jobs: a ComputeDomain per job first in the file, each GPU pod claiming
    its channel (the template the domain's driver makes), and a required podAffinity on the pods' own label over
    nvidia.com/gpu.clique."""
    objects = documents("gb200", engine, 3)
    domain, job = objects[0], objects[-1]
    assert domain["kind"] == "ComputeDomain" and domain["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert domain["metadata"]["name"] == job["metadata"]["name"] == "imgbuild-gb200"
    assert domain["spec"]["numNodes"] == 3
    template_name = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert template_name == "imgbuild-gb200-channel"
    pods = gpu_pods(engine, objects)
    assert pods
    for pod in pods:
        spec = pod["spec"]
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in spec["resourceClaims"]}
        assert claims == {"compute-domain-channel": template_name}
        c = next(c for c in spec["containers"] if c["name"] in ("worker", "pytorch", "node"))
        assert c["resources"]["claims"] == [{"name": "compute-domain-channel"}]
        limits = c["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == 4 and limits["vpc.amazonaws.com/efa"] == 4  # the EKS guide's 4 EFA
        (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        (expr,) = term["labelSelector"]["matchExpressions"]
        assert expr["operator"] == "In" and pod["metadata"]["labels"][expr["key"]] in expr["values"]
        assert env_of(c)["NCCL_MNNVL_ENABLE"] == "1" and env_of(c)["NCCL_NVLS_ENABLE"] == "1"
    if engine is jobs.Engine.mpijob:  # the launcher runs mpirun only: no GPU, no claim, anywhere of its architecture
        launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
        assert "resourceClaims" not in launcher and "affinity" not in launcher
    if engine is jobs.Engine.trainjob:  # Trainer v2.3.0 would drop a claim given in resourcesPerNode
        runtime = objects[1]
        assert runtime["kind"] == "TrainingRuntime" and runtime["metadata"]["name"] == "imgbuild-gb200"
        assert job["spec"]["runtimeRef"] == {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "TrainingRuntime",
            "name": "imgbuild-gb200",
        }
        assert "resourcesPerNode" not in job["spec"]["trainer"]
        assert len(objects) == 3
    else:
        assert len(objects) == 2


@pytest.mark.parametrize("nodes", [19, 10000])
@pytest.mark.parametrize("engine", [*jobs.ENGINES])
def test_a_gb200_job_larger_than_one_nvlink_domain_is_refused(engine: str, nodes: int) -> None:
    """Every pod of a gb200 job keeps to one NVLink domain, which holds at most 18 trays (an NVL72 UltraServer): a job
    of more nodes never schedules, so it is refused (exit 3) saying why and what to do; 18 nodes are written."""
    from imgbuild.cli import app

    res = CliRunner().invoke(app, ["cluster", "job", "gb200", "-e", engine, "--nodes", str(nodes)])
    assert res.exit_code == RecipeError.exit_code, res.output
    text = " ".join(res.output.split())
    assert f"--nodes {nodes}: every node of a p6e-gb200.36xlarge job must be in one NVLink domain" in text
    assert "at most 18 instances" in text and "hint: --nodes 18 or fewer, or one job per NVLink domain" in text
    assert CliRunner().invoke(app, ["cluster", "job", "gb200", "-e", engine, "--nodes", "18"]).exit_code == 0


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "gb200"])
def test_jobs_without_nvlink_across_instances_claim_nothing(name: str) -> None:
    for engine in (e for n, e in K8S_COMBOS if n == name):
        objects = documents(name, engine)
        assert len(objects) == 1, (name, engine)
        text = json.dumps(objects)
        assert "resourceClaims" not in text and "gpu.clique" not in text and "NCCL_MNNVL_ENABLE" not in text
    assert "IMEX" not in jobs.render_job(resolved(name), "slurm", 2)


def test_the_compute_domain_validator_refuses_what_the_cluster_would() -> None:
    domain = documents("gb200", "mpijob")[0]
    validate_kind(domain)
    del domain["spec"]["channel"]["resourceClaimTemplate"]
    with pytest.raises(AssertionError, match="resourceClaimTemplate"):
        validate_kind(domain)
    domain = documents("gb200", "mpijob")[0]
    domain["spec"]["numNodes"] = -1
    with pytest.raises(AssertionError, match="numNodes"):
        validate_kind(domain)
    runtime = documents("gb200", "trainjob")[1]
    runtime["spec"]["mlPolicy"]["torchh"] = {}
    with pytest.raises(AssertionError, match="torchh"):
        validate_kind(runtime)


def test_an_instance_type_with_nvlink_across_instances_is_data() -> None:
    """The rule keys on jobplan's table: a job for the same image on another type has no domain; --instance-type
    p6e-gb200 (the recipe's own) has one."""

    assert mnnvl("p6e-gb200.36xlarge") and not mnnvl("p6-b200.48xlarge") and not mnnvl(None)
    assert mnnvl("p6e-gb300.36xlarge") and mnnvl_domain_nodes("p6e-gb300.36xlarge") == 18
    assert instance_env(["p5.48xlarge", "p6e-gb200.36xlarge"]) == dict(table().mnnvl_env)
    assert instance_env(["p5.48xlarge"]) == {}
    assert plan("gb200", "mpijob").mnnvl and not plan("b200", "mpijob").mnnvl


@pytest.mark.parametrize("engine", [*jobs.TORCH_ENGINES, jobs.Engine.mpijob])
def test_a_p6e_gb300_job_gets_the_nvlink_domain_through_the_same_rule(engine: jobs.Engine) -> None:
    """p6e-gb300 is a row of core/instances.yaml: a gb200 image (sm_100 code runs on GB300's sm_103, arm64 both) on
    it gets the ComputeDomain, the channel claim, the clique affinity and the NCCL environment, with no code of its
    own; its EFA count was not found, so the job names --efa N (refused without, naming the known families)."""
    from imgbuild.cli import app

    args = ["cluster", "job", "gb200", "-e", engine.value, "--instance-type", "p6e-gb300.36xlarge"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == RecipeError.exit_code, refused.output
    text = " ".join(refused.output.split())
    assert "--instance-type: no EFA device count known for instance type 'p6e-gb300.36xlarge'" in text
    assert "p6e-gb200" in text and "hint: pass --efa N (0 for none)" in text
    objects = documents("gb200", engine, 3, instance_type="p6e-gb300.36xlarge", efa=2)
    domain, job = objects[0], objects[-1]
    validate_kind(domain)
    validate_crd(engine, job)
    assert domain["kind"] == "ComputeDomain" and domain["spec"]["numNodes"] == 3
    for pod in gpu_pods(engine, objects):
        c = next(c for c in pod["spec"]["containers"] if c["name"] in ("worker", "pytorch", "node"))
        assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == 2
        (term,) = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        assert env_of(c)["NCCL_MNNVL_ENABLE"] == "1" and env_of(c)["NCCL_NVLS_ENABLE"] == "1"
    too_many = CliRunner().invoke(app, [*args, "--efa", "2", "--nodes", "19"])
    assert too_many.exit_code == RecipeError.exit_code
    assert "every node of a p6e-gb300.36xlarge job must be in one NVLink domain" in " ".join(too_many.output.split())


def test_gb200_image_sets_the_nccl_nvlink_variables_and_a_recipe_value_wins(tmp_path: Path) -> None:
    """The image's ENV (the golden Dockerfile shows it) and the job both carry NCCL_MNNVL_ENABLE and
    NCCL_NVLS_ENABLE, and mpirun passes them to every rank (-x); a child recipe's `env` wins in both."""
    manifest, _ = jobs.image_manifest(resolved("gb200"))
    assert {"NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE"} <= set(manifest.image_env)
    dockerfile = render.plan(resolved("gb200")).dockerfile
    assert 'NCCL_MNNVL_ENABLE="1"' in dockerfile and 'NCCL_NVLS_ENABLE="1"' in dockerfile, "not in the image's ENV"
    argv = plan("gb200", "mpijob").launch.mpirun
    assert "NCCL_MNNVL_ENABLE" in argv and argv[argv.index("NCCL_MNNVL_ENABLE") - 1] == "-x"
    h100, _ = jobs.image_manifest(resolved("h100"))
    assert "NCCL_MNNVL_ENABLE" not in h100.image_env
    child = tmp_path / "gb200-no-mnnvl.yaml"
    child.write_text(f"extends: {REPO / 'recipes' / 'gb200.yaml'}\nenv:\n  NCCL_MNNVL_ENABLE: '0'\n")
    res = resolve(recipe.load(str(child)).concrete(), lookup_torch=None)
    p = jobs.plan_job(res, "mpijob", 2)
    assert dict(p.env)["NCCL_MNNVL_ENABLE"] == "0" and dict(p.env)["NCCL_NVLS_ENABLE"] == "1"
    assert 'NCCL_MNNVL_ENABLE="0"' in render.plan(res).dockerfile


def test_gb200_sbatch_says_what_imex_needs_and_checks_the_channel(tmp_path: Path) -> None:
    text = jobs.render_job(resolved("gb200"), "slurm", 2)
    header = text.split("set -euo pipefail")[0]
    for words in (
        "IMEX channel",
        "/dev/nvidia-caps-imex-channels/channel0",
        "insufficient permission",
        "prolog",
        "https://docs.aws.amazon.com/pcs/latest/userguide/capacity-blocks-nvidia-imex.html",
    ):
        assert words in header, words
    check = 'srun --ntasks="${SLURM_JOB_NUM_NODES}" --ntasks-per-node=1 test -c /dev/nvidia-caps-imex-channels/channel0'
    assert check in text and text.index(check) < text.index("srun --mpi=pmix")
    assert "export NCCL_MNNVL_ENABLE=1" in text and "export NCCL_NVLS_ENABLE=1" in text
    one_node = jobs.render_job(resolved("gb200"), "slurm", 1)
    assert "IMEX channel" in one_node and "test -c" not in one_node  # one tray's NVLink needs no IMEX
    # The check runs: a node without the channel stops the script before any rank (a fake srun runs it here).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "ran"
    (bin_dir / "srun").write_text(
        f'#!/bin/bash\necho "$*" >> {ran}\nif [[ "$*" == *"test -c"* ]]; then exit 1; fi\nexit 0\n'
    )
    (bin_dir / "srun").chmod(0o755)
    image = tmp_path / "image.sqsh"
    image.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "IMGBUILD_IMAGE": str(image), "SLURM_JOB_NUM_NODES": "2"}
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and "no IMEX channel" in res.stderr
    assert "--mpi=pmix" not in ran.read_text()


# --------------------------------------------------------------------------------------------------------------
# What a user types that lands in a script, a job or a log


def cli_output(res: Any) -> str:
    return " ".join(res.output.split())


HOSTILE = ["x\nid", "a$(id)", "a`id`", "-oProxyCommand=id", "a;id", "a b", "a'b", 'a"b', "", "a\r", "a\x00b",
           "a#b", "a|id", "a&&id", "a\u2028b"]  # fmt: skip


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(
    ("option", "expected"),
    [("--image", "expected a Docker image reference"), ("--instance-type", "expected an EC2 instance type"),
     ("--name", "expected a DNS label"), ("--memory", "expected a Kubernetes quantity")],
)  # fmt: skip
@pytest.mark.parametrize("engine", ["slurm", "mpijob"])
def test_cluster_job_refuses_hostile_values(engine: str, option: str, expected: str, value: str) -> None:
    """Exit 2 (usage: a malformed value), naming the option and what it expects; nothing written."""
    from imgbuild.cli import app

    res = CliRunner().invoke(app, ["cluster", "job", "cpu", "-e", engine, f"{option}={value}"])
    assert res.exit_code == 2, res.output
    message = cli_output(res)
    assert f"Invalid value for '{option}'" in message and expected in message, message
    assert "#!/bin/bash" not in res.output and "apiVersion" not in res.output


@pytest.mark.parametrize(
    ("args", "option"),
    [(["--nodes", str(2**31)], "'--nodes'"), (["--nodes", "0"], "'--nodes'"), (["--efa", "1000"], "'--efa'"),
     (["--efa", "-1"], "'--efa'"), (["--", "--mca", "x", "y"], "'COMMAND'"), (["--", "-x"], "'COMMAND'")],
)  # fmt: skip
def test_cluster_job_refuses_counts_and_commands_the_engines_would_not_take(args: list[str], option: str) -> None:
    from imgbuild.cli import app

    res = CliRunner().invoke(app, ["cluster", "job", "cpu", *args])
    assert res.exit_code == 2, res.output
    assert f"Invalid value for {option}" in cli_output(res), res.output


HOSTILE_HOSTS = [v for v in HOSTILE if v and v.strip() == v] + [
    "a,-oProxyCommand=id",
    "fe80::1%$(id)",
    "a..b",
    "-a",
    "a-",
]


@pytest.mark.parametrize("value", HOSTILE_HOSTS)
def test_cluster_test_refuses_hostile_hosts_before_any_ssh(value: str) -> None:
    from imgbuild.cli import app

    res = CliRunner().invoke(app, ["cluster", "test", "--hosts", f"10.0.0.1,{value}", "--recipe", "cpu"])
    assert res.exit_code == 2, res.output
    message = cli_output(res)
    assert "Invalid value for '--hosts'" in message and ("expected a host name" in message or "twice" in message)


@pytest.mark.parametrize(("option", "value"), [("--user", "-oProxyCommand=id"), ("--user", "root\nid"),
                                               ("--image", "x$(id)")])  # fmt: skip
def test_cluster_test_refuses_hostile_user_and_image(option: str, value: str) -> None:
    from imgbuild.cli import app

    res = CliRunner().invoke(app, ["cluster", "test", "--hosts", "10.0.0.1,10.0.0.2", option, value])
    assert res.exit_code == 2, res.output
    assert f"Invalid value for '{option}'" in cli_output(res), res.output


def test_run_live_refuses_a_host_that_would_be_an_option() -> None:
    """The library call refuses it too (before ssh is looked for)."""
    from imgbuild.cluster import live
    from imgbuild.core.errors import VerifyError

    with pytest.raises(VerifyError, match="--hosts: expected a host name"):
        live.run_live(["10.0.0.1", "-oProxyCommand=id"])


@pytest.mark.parametrize(
    "value",
    ["node-1", "node-1.cluster.local", "10.0.0.1", "::1", "fd00::1", "a" * 63, "ip-10-0-0-1.ec2.internal."],
)
def test_host_names_that_are_legal(value: str) -> None:
    from imgbuild.core import validate

    assert validate.host(value) == value


@pytest.mark.parametrize(
    "value",
    ["debian", "imgbuild/a100:lock-0123456789ab", "localhost:5000/a/b_c__d-e.f:V1.2_3-rc1",
     "123456789012.dkr.ecr.us-east-1.amazonaws.com/imgbuild/a100:pt2.9.1-cuda12.8.1",
     "[fd00::1]:5000/x/y:z", "nvcr.io/nvidia/pytorch:24.01-py3", "a@sha256:" + "0" * 64,
     "a:b@sha256:" + "f" * 64],
)  # fmt: skip
def test_image_references_that_are_legal(value: str) -> None:
    from imgbuild.core import validate

    assert validate.image_ref(value) == value


@pytest.mark.parametrize(
    "value",
    ["Upper", "a/Upper", "a:", "a:-tag", ":tag", "a//b", "a/", "/a", "a:" + "t" * 129, "a@sha256:00", "a" * 300,
     "-a", "a:b:c", "a@b"],
)  # fmt: skip
def test_image_references_that_are_not(value: str) -> None:
    from imgbuild.core import validate

    with pytest.raises(ValueError, match="expected a Docker image reference"):
        validate.image_ref(value)


def test_recipes_take_the_same_instance_type_grammar(tmp_path: Path) -> None:
    """A recipe's platform.instance_types reach the same jobs: the same grammar (one dot; `ml.` is SageMaker's)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {REPO / 'recipes' / 'a100.yaml'}\nplatform:\n  instance_types: [ml.p4d.24xlarge]\n")
    with pytest.raises(RecipeError, match=r"platform\.instance_types\.0.*expected an EC2 instance type FAMILY\.SIZE"):
        recipe.load(str(bad))


# Legal values that a careless writer would break: shell and YAML metacharacters in the command after `--`, a
# program text (a here-document in the sbatch script) holding its own terminator, and the longest image forms.
TRICKY_IMAGE = "localhost:5000/team__x/img-a.b:V1_2.3-rc@sha256:" + "ab" * 32
TRICKY_COMMAND = [
    "/opt/ml/code/train.py", "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "it's", 'say "hi"', "a b\tc",
    "#not-a-comment",
    "; rm -rf /", "*", "~", "yes", "null", "0x1F", "1e3", ": x", "- item", "&anchor", "*alias", "!tag", "%x", "@x",
    " lead", "trail ", "", "ünï", "\\", "--lr=1",
    "line 1\nIMGBUILD_PROGRAM_END\n$(touch /tmp/pwned) ) `x`\n",
    "print('a')\nprint(\"$HOME\")\n)\n",
    "cr\r\nlf",
]  # fmt: skip


def test_tricky_values_reach_the_sbatch_script_intact(tmp_path: Path) -> None:
    """bash -n and shellcheck pass, and the script, run with a stand-in srun, hands srun the very words."""
    text = jobs.render_job(resolved("cpu"), "slurm", 2, image=TRICKY_IMAGE, command=TRICKY_COMMAND)
    for argv in (["bash", "-n"], [shellcheck(), "--shell=bash", "--severity=style", "-"]):
        proc = subprocess.run(argv, input=text, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf \'%s\\0\' "$@" > "$SRUN_ARGS"\n')
    (bin_dir / "srun").chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SRUN_ARGS": str(tmp_path / "args"), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    words = (tmp_path / "args").read_bytes().decode().split("\0")[:-1]
    # Here-documents end their text with one newline: a word's trailing newlines are the program text's own.
    assert [w.rstrip("\n") for w in words[-len(TRICKY_COMMAND) :]] == [w.rstrip("\n") for w in TRICKY_COMMAND]
    assert words[:2] == ["--mpi=pmix", "--cpu-bind=none"]
    assert f"--container-image={jobs.pyxis_image(TRICKY_IMAGE)}" in words
    assert not (tmp_path / "pwned").exists() and not Path("/tmp/pwned").exists()


@pytest.mark.parametrize("engine", ["mpijob", "pytorchjob", "trainjob"])
def test_tricky_values_reach_the_kubernetes_object_intact(engine: str) -> None:
    """The YAML parses back to the very image and words, and still validates."""
    command = TRICKY_COMMAND[1:] if engine == "mpijob" else TRICKY_COMMAND
    name = "pytorch" if engine != "mpijob" else "cpu"
    text = jobs.render_job(resolved(name), engine, 2, image=TRICKY_IMAGE, command=command)
    job = yaml.safe_load(text)
    assert job == jobs.k8s_object(plan(name, engine, 2, image=TRICKY_IMAGE, command=command))
    validate_crd(jobs.Engine(engine), job)
    for template in pod_templates(jobs.Engine(engine), job):
        validate_pod_template(template)
        assert container(template)["image"] == TRICKY_IMAGE
    if engine == "mpijob":
        launcher = container(job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"])
        assert launcher["args"][-len(command) :] == command
    if engine == "pytorchjob":
        master = container(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
        assert master["command"][-len(command) :] == command
    if engine == "trainjob":
        assert job["spec"]["trainer"]["image"] == TRICKY_IMAGE
        assert job["spec"]["trainer"]["command"][-len(command) :] == command


# --------------------------------------------------------------------------------------------------------------
# The cpu MPIJob on an emulation of the MPI Operator (Docker)

NAMESPACE = "default"


def _operator_key() -> tuple[str, str]:
    """A key pair as the operator makes it (newSSHAuthSecret): ECDSA P-521, the private half as PEM
    'EC PRIVATE KEY' (x509.MarshalECPrivateKey), the public half as an authorized_keys line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode() + "\n"


def _tar(files: dict[str, tuple[str, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, (text, mode) in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class OperatorEmulation:
    """Pods as the MPI Operator v2beta1 makes them from an MPIJob (pkg/controller/mpi_job_controller.go), as Docker
    containers on one private network: the Secret's items (id_rsa, id_rsa.pub, authorized_keys) at
    sshAuthMountPath with mode 0600 under /root/.ssh and the default 0644 elsewhere, `/usr/sbin/sshd -De` for a
    worker container without command and args, the operator's environment appended after the job's, the hostfile
    at /etc/mpi/hostfile, pod hostnames `<job>-worker-N` reachable as `<job>-worker-N.<job>.<ns>.svc`."""

    def __init__(self, client: Any, job: dict[str, Any], image: str) -> None:
        self.client, self.job, self.image = client, job, image
        self.name = job["metadata"]["name"]
        self.prefix = f"imgbuild-test-{uuid.uuid4().hex[:8]}"
        self.private, self.public = _operator_key()
        self.containers: list[Any] = []
        self.network = client.networks.create(f"{self.prefix}-net", driver="bridge", internal=True)

    def secret_files(self) -> dict[str, tuple[str, int]]:
        mount = self.job["spec"].get("sshAuthMountPath", "/root/.ssh")
        mode = 0o600 if mount == "/root/.ssh" else 0o644
        return {
            f"{mount}/id_rsa": (self.private, mode),
            f"{mount}/id_rsa.pub": (self.public, mode),
            f"{mount}/authorized_keys": (self.public, mode),
        }

    def env(self, c: dict[str, Any], operator_env: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for e in c.get("env", []):
            if "value" in e:
                out[e["name"]] = e["value"]
            else:
                ref = e["valueFrom"]["secretKeyRef"]
                assert ref["name"] == f"{self.name}-ssh", f"{e['name']}: no such Secret {ref['name']}"
                out[e["name"]] = {"ssh-privatekey": self.private, "ssh-publickey": self.public}[ref["key"]]
        out.update(operator_env)  # appended after the job's: the operator's value wins
        return out

    def pod(self, role: str, hostname: str, operator_env: dict[str, str], extra: dict[str, tuple[str, int]]) -> Any:
        template = self.job["spec"]["mpiReplicaSpecs"][role.capitalize()]["template"]
        c = template["spec"]["containers"][0]
        command, args = c.get("command"), c.get("args")
        if role == "worker" and not command and not args:
            command = ["/usr/sbin/sshd", "-De"]
        shm = next((v["emptyDir"].get("sizeLimit") for v in template["spec"].get("volumes", []) if v["name"] == "dshm"),
                   None)  # fmt: skip
        container = self.client.containers.create(
            self.image,
            entrypoint=command,
            command=args,
            environment=self.env(c, operator_env),
            hostname=hostname,
            name=f"{self.prefix}-{hostname}",
            network=self.network.name,
            shm_size=shm.replace("Gi", "g").replace("Mi", "m") if shm else "64m",
            labels={"imgbuild-test": self.prefix},
        )
        self.containers.append(container)
        # The network alias the headless Service gives the pod.
        self.network.disconnect(container)
        self.network.connect(container, aliases=[hostname, f"{hostname}.{self.name}.{NAMESPACE}.svc"])
        container.put_archive("/", _tar({**self.secret_files(), **extra}))
        container.start()
        return container

    def worker(self, i: int) -> Any:
        return self.pod("worker", f"{self.name}-worker-{i}", {"K_MPI_JOB_ROLE": "worker"}, {})

    def launcher(self, workers: int) -> Any:
        slots = self.job["spec"]["slotsPerWorker"]
        hostfile = "".join(
            f"{self.name}-worker-{i}.{self.name}.{NAMESPACE}.svc slots={slots}\n" for i in range(workers)
        )
        env = {
            "K_MPI_JOB_ROLE": "launcher",
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_orte_set_default_slots": str(slots),
            "NVIDIA_VISIBLE_DEVICES": "",
            "NVIDIA_DRIVER_CAPABILITIES": "",
        }
        return self.pod("launcher", f"{self.name}-launcher", env, {"/etc/mpi/hostfile": (hostfile, 0o444)})

    def ready(self, container: Any, port: int, timeout_s: float = 30) -> None:
        """The readiness probe: a TCP connection to the port, from inside the pod."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            container.reload()
            if container.status != "running":
                pytest.fail(f"{container.name} stopped: {container.logs().decode(errors='replace')[-2000:]}")
            probe = container.exec_run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"])
            if probe.exit_code == 0:
                return
            time.sleep(0.5)
        pytest.fail(
            f"{container.name}: nothing listens on {port} after {timeout_s}s: {container.logs().decode()[-2000:]}"
        )

    def close(self) -> None:
        for c in self.containers:
            c.remove(force=True)
        self.network.remove()


@pytest.fixture
def emulation(docker_client: Any, cpu_image: Any) -> Any:
    made: list[OperatorEmulation] = []

    def start(job: dict[str, Any]) -> OperatorEmulation:
        e = OperatorEmulation(docker_client, job, cpu_image.image_id)
        made.append(e)
        return e

    yield start
    for e in made:
        e.close()
    assert not docker_client.containers.list(all=True, filters={"label": "imgbuild-test"}), "containers left behind"


@pytest.mark.docker
def test_cpu_mpijob_runs_across_the_operators_pods(emulation: Any) -> None:
    p = plan("cpu", "mpijob", 2)
    job = jobs.k8s_object(p)
    port = p.manifest.ssh_ports[0]
    e = emulation(job)
    workers = [e.worker(i) for i in range(2)]
    for w in workers:
        e.ready(w, port)
    launcher = e.launcher(2)
    status = launcher.wait(timeout=180)
    log = launcher.logs().decode(errors="replace")
    assert status["StatusCode"] == 0, log[-4000:]
    assert "imgbuild-mpi-check: 2 ranks on 2 hosts (imgbuild-cpu-worker-0, imgbuild-cpu-worker-1), 2 expected" in log
    # The operator's key was installed by the entrypoint and sshd accepted it (the worker's output is sshd's log,
    # followed by `tail -F`, which may print it a moment after mpirun is done).
    deadline = time.monotonic() + 15
    while "Accepted publickey for root" not in (seen := workers[0].logs().decode(errors="replace")):
        assert time.monotonic() < deadline, seen
        time.sleep(0.5)


@pytest.mark.docker
def test_the_operators_defaults_would_not_start_our_image(emulation: Any) -> None:
    """Why the job sets a command and moves the keys: with the operator's defaults (no command: `sshd -De`; keys at
    /root/.ssh) the worker's sshd has no host keys and exits, so it never becomes ready."""
    job = jobs.k8s_object(plan("cpu", "mpijob", 1))
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    del worker["command"], worker["args"]
    del job["spec"]["sshAuthMountPath"]
    w = emulation(job).worker(0)
    status = w.wait(timeout=60)
    assert status["StatusCode"] != 0
    assert "no hostkeys available" in w.logs().decode(errors="replace")
