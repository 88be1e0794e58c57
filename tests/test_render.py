"""Rendering: golden Dockerfiles for every recipe, determinism across interpreters, layer order, lint, context files."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import REPO, SHIPPED, hadolint
from imgbuild import recipe
from imgbuild.blocks import slug
from imgbuild.blocks.pytorch import shipped
from imgbuild.cli import app
from imgbuild.core.errors import LockError
from imgbuild.image import dockerfile, identity, render
from imgbuild.pin.lock import resolved_for

TORCH = shipped()  # blocks/pytorch/releases.yaml: version -> what its x86_64 wheel pins

GOLDEN = REPO / "tests" / "golden"


def plan_of(name: str) -> render.BuildPlan:
    return render.plan(resolved_for(recipe.load(name)))  # a LockError names the lock and `imgbuild lock NAME`


@pytest.mark.parametrize("name", SHIPPED)
def test_golden_dockerfile(name: str, update_golden: bool) -> None:
    text = plan_of(name).dockerfile
    golden = GOLDEN / f"{name}.Dockerfile"
    if update_golden:
        golden.write_text(text)
    assert golden.exists(), f"no golden file: run pytest --update-golden and review {golden}"
    assert text == golden.read_text(), f"{name}: rendered Dockerfile differs from {golden} (--update-golden)"


# Renders every shipped recipe and the example app (its code folder: what the image holds beyond the lock) from their
# locks, for each architecture, online and offline, into a folder: the Dockerfile, every context file with its mode,
# and the plan's labels, tags and packages as JSON in their own order. No network: a lock is all render reads.
RENDER_EVERYTHING = """
import json, sys
from pathlib import Path
from imgbuild import recipe
from imgbuild.image import render
from imgbuild.pin.lock import resolved_for

out = Path(sys.argv[1])
for ref in sys.argv[2:]:
    resolved = resolved_for(recipe.load(ref))
    for arch in resolved.recipe.platform.arch:
        for offline in (False, True):
            plan = render.plan(resolved, arch=arch, offline=offline)
            folder = out / f"{resolved.name}-{arch}-{'offline' if offline else 'online'}"
            (folder / "context").mkdir(parents=True)
            (folder / "Dockerfile").write_text(plan.dockerfile)
            for f in plan.files:
                path = folder / "context" / f.path
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(f.content)
                path.chmod(f.mode)
            about = [plan.labels, plan.tags, plan.base_images, plan.apt_packages, plan.disk_gb]
            about.append([f.path for f in plan.files])
            (folder / "plan.json").write_text(json.dumps(about))
"""


def rendered_tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mode) for p in folder.rglob("*") if p.is_file()}


def test_render_is_the_same_in_another_interpreter_with_another_hash_seed(tmp_path: Path) -> None:
    """Render is a pure function of its input in every process, not only within one: two interpreters with
    different PYTHONHASHSEEDs (so every set and str-keyed hash table iterates in another order) render every shipped
    recipe and the example app to the same bytes: Dockerfiles, context files (the manifest, requirements, the
    user's code) with their modes, labels and tags. Each compiles its own templates (a state folder of its own)."""
    import random

    seeds = ("0", str(random.randint(1, 2**32 - 1)))
    refs = [*SHIPPED, str(REPO / "examples" / "pytorch-app" / "pytorch-app.yaml")]
    children = []
    for seed in seeds:
        out = tmp_path / f"seed-{seed}"
        env = {
            **os.environ,
            "PYTHONHASHSEED": seed,
            "IMGBUILD_STATE_DIR": str(tmp_path / f"state-{seed}"),
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-c", RENDER_EVERYTHING, str(out), *refs]
        children.append((out, subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
    for _, child in children:
        output = child.communicate(timeout=300)[0].decode()
        assert child.returncode == 0, output
    first, second = (rendered_tree(out) for out, _ in children)
    assert len({p.split("/")[0] for p in first}) == 2 * len(refs) + 2 * 2  # cpu and debian-cuda: amd64 and arm64
    assert sorted(first) == sorted(second), f"PYTHONHASHSEED {seeds}: the context files differ"
    differ = [path for path in first if first[path] != second[path]]
    assert not differ, f"PYTHONHASHSEED {seeds[0]} and {seeds[1]} render these differently: {differ[:10]}"


@pytest.mark.parametrize("name", SHIPPED)
def test_hadolint_clean(name: str) -> None:
    proc = subprocess.run(
        [hadolint(), "--config", str(REPO / ".hadolint.yaml"), "--no-color", "-"],
        input=plan_of(name).dockerfile, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def runtime_stage(text: str) -> str:
    return text.split("# ---- runtime")[1]


def instructions(text: str) -> list[tuple[str, str]]:
    """(stage, instruction) for every instruction, its continuation lines joined and comments left out; the stage is
    the name after `FROM ... AS`."""
    out: list[tuple[str, str]] = []
    stage, current = "", ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        if current.startswith("FROM "):
            stage = current.split(" AS ")[-1] if " AS " in current else ""
        out.append((stage, " ".join(current.split())))
        current = ""
    return out


CA = "--mount=type=secret,id=imgbuild-ca,target=/run/secrets/imgbuild-ca.pem,required=true"
PIP_CACHE = "--mount=type=cache,id=imgbuild-pip,target=/root/.cache/pip,sharing=locked"
UV_CACHE = "--mount=type=cache,id=imgbuild-uv,target=/root/.cache/uv,sharing=locked"
DOWNLOADS = re.compile(r"\b(curl|wget) -|pip install|git clone")  # a command, not a package named curl


def apt_cache(base: str) -> list[str]:
    return [
        f"--mount=type=cache,id=imgbuild-apt-{base}-cache,target=/var/cache/apt,sharing=locked",
        f"--mount=type=cache,id=imgbuild-apt-{base}-lists,target=/var/lib/apt/lists,sharing=locked",
    ]


ALL = [*SHIPPED, *sorted(p.stem for p in (REPO / "tests" / "recipes").glob("*.yaml"))]


def rendered(name: str) -> str:
    if name in SHIPPED:
        return plan_of(name).dockerfile
    from imgbuild.pin.resolver import resolve

    return render.plan(resolve(recipe.load(REPO / "tests" / "recipes" / f"{name}.yaml"), lookup_torch=None)).dockerfile


@pytest.mark.parametrize("name", ALL)
def test_one_buildkit_dialect(name: str) -> None:
    """Every RUN that downloads over TLS mounts the CA secret (required); every apt-get RUN mounts its stage's apt
    caches and leaves the lists alone (they are the cache); every pip install mounts the one pip cache, every uv pip
    install uv's; pip's cache is never turned off; the runtime stage is named `runtime` and its ENV never names the
    secret. No `# syntax` line (Docker 20.10's built-in frontend reads the mounts) and no COPY --chmod."""
    text = rendered(name)
    assert "{{" not in text and "{%" not in text
    assert "# syntax=" not in text
    steps = instructions(text)
    code = "\n".join(i for _, i in steps)
    assert "--chmod" not in code and "PIP_NO_CACHE_DIR" not in code and "--no-cache-dir" not in code
    assert "/var/lib/apt/lists/*" not in code and "update-ca-certificates" not in code and "imgbuild/ca" not in code
    froms = [i for _, i in steps if i.startswith("FROM ")]
    # the last stage is the image: the runtime, or the user's layer after it (app:)
    assert froms[-1].endswith((" AS runtime", " AS app")) and all(" AS " in f for f in froms), froms
    bases = {stage: f.split()[1] for f in froms for stage in [f.split(" AS ")[-1]]}
    for stage, step in steps:
        if not step.startswith("RUN "):
            continue
        local = "--no-index" in step  # pip installs wheels a stage built: nothing to download, nothing to cache
        if DOWNLOADS.search(step) and not local:
            assert CA in step, step
        if "uv pip install" in step:
            assert UV_CACHE in step and PIP_CACHE not in step, step
        elif "pip install" in step and not local:
            assert PIP_CACHE in step, step
        if "apt-get" in step:
            base = bases[stage]
            while base in bases:  # a stage FROM another stage (app-build FROM runtime) shares that stage's base
                base = bases[base]
            name = slug(base)
            assert all(m in step for m in apt_cache(name)), step
    runtime_env = [i for stage, i in steps if stage == "runtime" and i.startswith("ENV ")]
    assert not any("/run/secrets" in e for e in runtime_env), runtime_env


@pytest.mark.parametrize("name", ["a100", "v100", "h100"])
def test_layers_ordered_by_change_rate(name: str) -> None:
    """Python's environment (its packages, the venv, PyTorch's two layers) first, then the OS packages and the rest
    from what changes least to what changes most."""
    text = runtime_stage(plan_of(name).dockerfile)
    marks = ["python3-venv", "/opt/venv /opt/venv", "pytorch.cuda.txt", "pytorch.torch.txt", "dpkg-query",
             "efa_installer.sh", "dpkg --purge libnccl-dev libnccl2", "/opt/nccl-tests", "imgbuild/sshd_config",
             "imgbuild/sagemaker/train", "COPY imgbuild/imgbuild-entrypoint",
             "/etc/imgbuild/manifest.json", "LABEL "]  # fmt: skip
    positions = [text.index(m) for m in marks]
    assert positions == sorted(positions), dict(zip(marks, positions, strict=True))


def _with_os_package(resolved: Any, package: str) -> Any:
    """`resolved` with one more package in the recipe's os.packages (what an early bump changes)."""
    r = resolved.recipe
    os_ = r.os.model_copy(update={"packages": (*r.os.packages, package)})
    return resolved.model_copy(update={"recipe": r.model_copy(update={"os": os_})})


@pytest.mark.parametrize("name", ["pytorch", "a100", "cpu"])
def test_an_os_package_leaves_the_python_layers_as_they_were(name: str) -> None:
    """Adding an OS package changes the runtime stage from its OS-package layer on, never before it: the builder
    stage, the venv and PyTorch's wheels keep their instructions, so BuildKit keeps their layers."""
    resolved = resolved_for(recipe.load(name))
    before = instructions(render.plan(resolved).dockerfile)
    after = instructions(render.plan(_with_os_package(resolved, "less")).dockerfile)
    first = next(i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)
    stage, step = after[first]
    assert stage == "runtime" and step.startswith("RUN ") and "dpkg-query" in step and " less " in step, step
    kept = "\n".join(i for _, i in before[:first])
    assert "/opt/venv /opt/venv" in kept
    if name != "cpu":
        assert "pytorch.torch.txt" in kept


def test_compiled_parts_in_builder_only() -> None:
    from imgbuild.pin.resolver import resolve

    resolved = resolve(recipe.load(REPO / "tests" / "recipes" / "ofi-release.yaml"), lookup_torch=None)
    text = render.plan(resolved).dockerfile
    builder, runtime = text.split("# ---- runtime")
    for tool in ("make ", "./configure", "curl ", "gpg "):
        assert tool in builder and tool not in runtime, tool
    # pip installs only prebuilt wheels in the runtime stage (PyTorch's, the sagemaker block's boto3: no compiler);
    # the rest in the builder.
    assert "imgbuild-wheelhouse nvidia-nccl-cu12==" in builder and "--no-binary=mpi4py --no-build-isolation" in builder
    assert [
        i
        for _, i in instructions(runtime)
        if "pip install" in i and "torch==" not in i and "nvidia-" not in i and "boto3==" not in i
    ] == []
    assert "build-essential" not in runtime
    assert "-gencode=arch=compute_80,code=sm_80" in builder
    assert "rm -rf /opt/amazon/ofi-nccl" in runtime  # one plugin only: the release build


def test_ca_bundle_is_a_build_secret() -> None:
    """Downloads trust the build secret: the builder stage's ENV points every tool at it (that stage is never shipped),
    the runtime stage only the pip commands that mount it; the context carries no CA file."""
    for name in ("cpu", "a100", "pytorch"):
        plan = plan_of(name)
        builder, runtime = plan.dockerfile.split("# ---- runtime")
        for var in ("PIP_CERT", "SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO"):
            assert f'{var}="{dockerfile.CA_SECRET_PATH}"' in builder, var
        assert not any(f.path.startswith("imgbuild/ca") for f in plan.files)
        for _, step in instructions(runtime):
            assert dockerfile.CA_SECRET_PATH not in step or step.startswith(f"RUN {CA} "), step
            if "uv pip install" in step:
                assert f"SSL_CERT_FILE={dockerfile.CA_SECRET_PATH} " in step, step
            elif "pip install" in step:
                assert f"PIP_CERT={dockerfile.CA_SECRET_PATH} " in step, step


def test_gaudi_profile_and_no_builder() -> None:
    text = plan_of("gaudi-1.15").dockerfile
    assert "AS builder" not in text
    assert "FROM vault.habana.ai/gaudi-docker/1.15.1/ubuntu22.04/habanalabs/pytorch-installer-2.2.0:latest" in text
    assert "HCCL_OVER_OFI" not in text.replace("# ", "")  # opt-in only (it forces host-memory staging)
    assert "LIBFABRIC_ROOT=" in text and 'MPI_ROOT="/opt/amazon/openmpi"' in text
    assert "/opt/habanalabs/libfabric-1.20.0/bin" in text


def test_gaudi_121_uses_the_efa_installers_libfabric() -> None:
    """From 1.21 Habana's image has no libfabric of its own: the EFA installer's (/opt/amazon/efa), which the image
    leaves off every path, is put on PATH and the loader path; nothing of 1.15's Habana-built libfabric remains."""
    text = plan_of("gaudi-1.21").dockerfile
    assert "AS builder" not in text
    assert "FROM vault.habana.ai/gaudi-docker/1.21.4/ubuntu22.04/habanalabs/pytorch-installer-2.6.0:latest" in text
    assert "ENV PATH=/opt/amazon/efa/bin:/opt/amazon/openmpi/bin:${PATH}" in text
    assert "ENV LD_LIBRARY_PATH=/opt/amazon/efa/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" in text
    assert 'LIBFABRIC_ROOT="/opt/amazon/efa"' in text and 'MPI_ROOT="/opt/amazon/openmpi"' in text
    assert "/opt/habanalabs/libfabric" not in text and "FI_EFA_FORK_SAFE" not in text
    assert "HCCL_OVER_OFI" not in text.replace("# ", "")


def test_ssh_host_keys_removed_in_the_layer_that_makes_them() -> None:
    layer = next(i for _, i in instructions(runtime_stage(plan_of("cpu").dockerfile)) if "openssh-server" in i)
    assert "apt-get install" in layer and "&& rm -f /etc/ssh/ssh_host_* &&" in layer  # then the SBOM's package record


def test_context_files_and_manifest() -> None:
    plan = plan_of("cpu")
    files = {f.path: f for f in plan.files}
    assert set(files) == {"imgbuild/imgbuild-entrypoint", "imgbuild/manifest.json", "imgbuild/ssh_config",
                          "imgbuild/sshd_config", "imgbuild/sshd/50-sshd.sh", "imgbuild/sshd/sshd.conf",
                          "imgbuild/sagemaker/train", "imgbuild/sagemaker/40-sagemaker.sh",
                          "imgbuild/sagemaker/sagemaker.conf", "imgbuild/sagemaker/mpirun.args",
                          "imgbuild/sagemaker/torchrun.args", "imgbuild/sagemaker/launch-env.conf",
                          "imgbuild/sagemaker/fetch-code", "imgbuild/requirements/nccl.txt",
                          "imgbuild/requirements/python.uv.txt", "imgbuild/requirements/sagemaker.txt"}  # fmt: skip
    assert files["imgbuild/imgbuild-entrypoint"].mode == 0o755 and files["imgbuild/sagemaker/train"].mode == 0o755
    copied = set(re.findall(r"(?:^COPY|\s)(imgbuild/\S+)", plan.dockerfile, re.M))
    copied |= set(re.findall(r"--mount=type=bind,source=(imgbuild/[^,\s]+)", plan.dockerfile))  # requirement sets
    assert copied == set(files)
    manifest = json.loads(files["imgbuild/manifest.json"].content)
    assert manifest["recipe"] == "cpu" and manifest["lock_digest"] == plan.lock_digest
    assert manifest["components"]["nccl"]["version"] == "2.27.5"
    assert manifest["components"]["nccl"]["package"] == "nvidia-nccl-cu12"
    assert manifest["components"]["sshd"]["ports"] == [3022]
    sshd = files["imgbuild/sshd_config"].content.decode()
    assert "Port 3022" in sshd and "PasswordAuthentication no" in sshd
    assert "PermitRootLogin prohibit-password" in sshd


def test_tags_derive_from_the_lock() -> None:
    plan = plan_of("cpu")
    assert plan.tags[0] == f"lock-{plan.lock_digest[:12]}"
    assert plan.tags[1] == "nccl2.27.5-ompi4.1.4"
    assert plan.labels["io.imgbuild.lock-digest"] == plan.lock_digest


def test_locks_are_fresh_and_committed() -> None:
    for name in SHIPPED:
        loaded = recipe.load(name)
        path = loaded.path.with_name(f"{name}.lock.json")
        assert path.exists(), path
        assert resolved_for(loaded).content is not None  # fresh, not edited, pins content


def test_user_recipe_renders_unlocked_only_when_asked(recipe_dir: Path, tmp_path: Path) -> None:
    """A recipe without a lock renders only with --unlocked (a look at an edit before locking it): versions from a
    fresh resolution, no hashes, and says so; plain `render` is exit 4 and writes nothing."""
    p = recipe_dir / "mine.yaml"
    p.write_text("extends: cpu\ncomponents:\n  sshd: {ports: [2222, 3022]}\nenv: {MY_VAR: 'a b'}\n")
    runner = CliRunner()
    refused = runner.invoke(app, ["render", str(p), "-o", str(tmp_path / "locked")])
    assert refused.exit_code == LockError.exit_code, refused.output
    assert "mine.lock.json: no such lock" in refused.stderr and "hint: imgbuild lock " in refused.stderr
    assert not (tmp_path / "locked").exists()
    result = runner.invoke(app, ["render", str(p), "--unlocked", "-o", str(tmp_path / "ctx")])
    assert result.exit_code == 0, result.output
    assert "--unlocked: mine rendered from a fresh resolution, not a lock" in result.stderr
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert 'MY_VAR="a b"' in dockerfile
    assert "--require-hashes" not in dockerfile  # nothing is pinned by content
    assert "Port 2222\nPort 3022" in (tmp_path / "ctx" / "imgbuild" / "sshd_config").read_text()
    assert not (recipe_dir / "mine.lock.json").exists()


NVIDIA = ["a100", "b200", "b300", "gb200", "h100", "h200", "v100"]


@pytest.mark.parametrize("name", NVIDIA)
def test_nvidia_images_ship_on_runtime_with_one_nccl(name: str) -> None:
    plan = plan_of(name)
    builder, runtime = plan.dockerfile.split("# ---- runtime")
    assert re.search(r"^FROM nvidia/cuda:\S+-devel-\S+ AS builder$", builder, re.M)
    assert re.search(r"^FROM nvidia/cuda:\S+-runtime-\S+ AS runtime$", runtime, re.M)
    assert len(plan.base_images) == 2
    # One NCCL: PyTorch's wheel; nccl-tests compile against it; the base's libnccl2 goes in both stages.
    assert "/opt/nccl/" not in plan.dockerfile and "nccl/archive" not in plan.dockerfile
    site = re.search(r"(/opt/venv/lib/python3\.\d+/site-packages)/nvidia/nccl", plan.dockerfile).group(1)
    assert f"NCCL_HOME={site}/nvidia/nccl NVCC_GENCODE" in builder
    assert "dpkg --purge libnccl-dev libnccl2" in builder and "dpkg --purge libnccl-dev libnccl2" in runtime
    ld = re.search(r"^ENV LD_LIBRARY_PATH=(\S+)\$", runtime, re.M).group(1).split(":")
    assert f"{site}/nvidia/nccl/lib" in ld and "/opt/amazon/openmpi/lib" in ld and "/opt/gdrcopy/lib" in ld
    # The plugin dlopens libcudart.so; GDRCopy built in the builder, its library copied; mpi4py against EFA's MPI.
    assert "ln -s libcudart.so.1" in runtime
    gdrcopy = resolved_for(recipe.load(name)).version("gdrcopy")
    assert f"gdrcopy/archive/refs/tags/v{gdrcopy}.tar.gz" in builder
    assert "COPY --from=builder /opt/gdrcopy /opt/gdrcopy" in runtime
    assert re.search(
        r'CFLAGS="-O2 -g0" MPICC=/opt/amazon/openmpi/bin/mpicc /opt/venv/bin/pip install .*--no-binary=mpi4py', builder
    )
    # apt's caches are the stage's own base's: the builder's devel image, the runtime image.
    devel, runtime_base = (slug(b) for b in plan.base_images)
    assert all(m in builder for m in apt_cache(devel)) and all(m in runtime for m in apt_cache(runtime_base))
    assert devel != runtime_base


def test_gb200_renders_for_arm64_with_no_x86_64_path() -> None:
    """gb200 is arm64 only (Grace CPUs): nothing in its Dockerfile, its context or its manifest names x86_64; the
    wheels are the aarch64 ones, the plugin's lib dir the aarch64 triplet's; the bases are multi-arch nvidia/cuda."""
    plan = plan_of("gb200")
    assert "x86_64" not in plan.dockerfile and "amd64" not in plan.dockerfile
    for f in plan.files:
        assert b"x86_64" not in f.content, f.path
    assert "PyTorch pins for Linux aarch64 (CUDA 13.2)" in plan.dockerfile
    assert "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu" in plan.dockerfile
    assert '-gencode=arch=compute_100,code=sm_100"' in plan.dockerfile
    assert [b.split(":")[0] for b in plan.base_images] == ["nvidia/cuda", "nvidia/cuda"]
    # The same recipe for amd64 (what b200 is, on x86) names x86_64 where gb200 names aarch64: the test can fail.
    assert "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu" in plan_of("b200").dockerfile


@pytest.mark.parametrize("name", NVIDIA)
def test_nvidia_run_profile_uses_the_host_network(name: str) -> None:
    runtime = recipe.load(name).recipe.runtime
    assert runtime.network == "host" and runtime.ipc == "host" and runtime.efa_devices


@pytest.mark.parametrize("name", SHIPPED)
def test_every_image_lets_mpirun_run_as_root_and_python_unbuffered(name: str) -> None:
    runtime = runtime_stage(plan_of(name).dockerfile)
    for line in ('OMPI_ALLOW_RUN_AS_ROOT="1"', 'OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"', 'PYTHONUNBUFFERED="1"'):
        assert line in runtime, line


def test_manifest_lists_the_images_env_names() -> None:
    plan = plan_of("a100")
    manifest = json.loads(next(f.content for f in plan.files if f.path == "imgbuild/manifest.json"))
    for name in ("PATH", "LD_LIBRARY_PATH", "NCCL_HOME", "NCCL_NET_PLUGIN", "OMPI_ALLOW_RUN_AS_ROOT"):
        assert name in manifest["image_env"]


@pytest.fixture
def fresh_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A state folder of its own, and the Jinja environment built again (it is cached per process)."""
    state = tmp_path / "state"
    monkeypatch.setenv("IMGBUILD_STATE_DIR", str(state))
    render.environment.cache_clear()
    yield state
    render.environment.cache_clear()


def test_compiled_templates_are_kept_and_an_edited_template_is_compiled_again(
    fresh_environment: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    images = tmp_path / "images"
    shutil.copytree(REPO / "images", images)
    monkeypatch.setenv("IMGBUILD_IMAGES_DIR", str(images))
    first = plan_of("cpu").dockerfile
    cached = sorted((fresh_environment / "jinja").iterdir())
    assert cached, "no compiled template was kept"
    render.environment.cache_clear()
    assert plan_of("cpu").dockerfile == first  # rendered from the kept code
    skeleton = images / "Dockerfile.j2"
    skeleton.write_text(skeleton.read_text() + "# edited after the cache was written\n")
    render.environment.cache_clear()
    assert plan_of("cpu").dockerfile == first + "# edited after the cache was written\n"


def test_compiled_templates_are_never_read_from_a_folder_others_can_write(fresh_environment: Path) -> None:
    folder = fresh_environment / "jinja"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert render._bytecode_cache() is None
    folder.chmod(0o700)
    assert render._bytecode_cache() is not None


@pytest.mark.parametrize("name", SHIPPED)
def test_references_without_templates_are_the_plans(name: str) -> None:
    """`show` and `run` name the image by identity.of(...).refs / ref, which render no template."""
    resolved = resolved_for(recipe.load(name))
    plan = render.plan(resolved)
    assert identity.of(resolved).refs() == plan.image_refs
    assert identity.of(resolved).ref() == plan.image_refs[0]


def _efa_runs(text: str) -> list[str]:
    return [
        line.split("efa_installer.sh ", 1)[1].removesuffix(" \\")
        for line in text.splitlines()
        if "./efa_installer.sh " in line
    ]


def test_efa_installer_flags_on_an_ngc_base(recipe_dir: Path) -> None:
    """EFA >= 1.48 on an nvidia/cuda base takes it for an NGC image: `--disable-build-ngc` (else rdma-core is
    skipped and libfabric1-aws's `ibverbs-providers >= 59` fails) wherever the plugin comes from, `--disable-ngc`
    only when the image uses the installer's plugin; older installers and other bases get neither."""
    from imgbuild.pin.resolver import resolve

    def runs(text: str) -> list[str]:
        path = recipe_dir / "r.yaml"
        path.write_text(text)
        return _efa_runs(render.plan(resolve(recipe.load(path), lookup_torch=None)).dockerfile)

    h100 = _efa_runs(plan_of("h100").dockerfile)
    assert h100 and all(r.endswith("--mpi=openmpi4 --disable-build-ngc --disable-ngc") for r in h100), h100
    assert all("--disable-build-ngc --disable-ngc" in r for r in _efa_runs(plan_of("v100").dockerfile))
    assert all("--disable-build-ngc --disable-ngc" in r for r in _efa_runs(plan_of("a100").dockerfile))  # EFA 1.51.0
    old = runs("extends: a100\ncomponents:\n  efa: {version: 1.43.2}\n")
    assert old and all("ngc" not in r for r in old), old
    built = runs(
        "extends: h100\ncomponents:\n  efa: {version: 1.50.0}\n  aws_ofi_nccl: {source: release, version: 1.21.1}\n"
    )
    assert built and all(r.endswith("--disable-build-ngc") for r in built), built
    other_base = runs("extends: pytorch\ncomponents:\n  efa: {version: 1.50.0}\n")  # debian:bookworm-slim
    assert other_base and all("ngc" not in r for r in other_base), other_base


def test_a_torch_bump_that_keeps_its_cuda_pins_changes_only_the_torch_layer(recipe_dir: Path) -> None:
    """torch 2.9.0 and 2.9.1 pin the same CUDA and NCCL wheels: bumping one to the other changes the torch RUN (and the
    labels) and no other instruction, so the layer of CUDA wheels (about 3 GB) is reused and not pushed again."""
    from imgbuild.pin.resolver import resolve

    assert TORCH["2.9.0"].cuda_wheels == TORCH["2.9.1"].cuda_wheels
    path = recipe_dir / "older.yaml"
    path.write_text("extends: pytorch\ncomponents: {pytorch: {version: 2.9.0}}\n")
    newer_plan = plan_of("pytorch")
    content = resolved_for(recipe.load("pytorch")).content
    assert content is not None
    # the older lock: the same sets but torch 2.9.0 (made-up hash: no index asked)
    torch_set = tuple(
        r.model_copy(update={"version": "2.9.0", "hashes": ("sha256:" + "0" * 64,)}) if r.name == "torch" else r
        for r in content.python["pytorch/torch"]
    )
    older_content = content.model_copy(update={"python": {**content.python, "pytorch/torch": torch_set}})
    older_resolved = resolve(recipe.load(path), lookup_torch=None).model_copy(update={"content": older_content})
    older_plan = render.plan(older_resolved)
    older, newer = instructions(older_plan.dockerfile), instructions(newer_plan.dockerfile)
    assert len(older) == len(newer)
    changed = [(a[1], b[1]) for a, b in zip(older, newer, strict=True) if a != b]
    # every pip RUN names its set's file, not versions: the torch layer changes through its file alone
    assert [b.split(" ", 1)[0] for _, b in changed] == ["LABEL"], changed
    old_files = {f.path: f.content for f in older_plan.files}
    new_files = {f.path: f.content for f in newer_plan.files}
    assert old_files.keys() == new_files.keys()
    differ = {p for p in new_files if old_files[p] != new_files[p] and p.startswith(dockerfile.REQUIREMENTS_CONTEXT)}
    assert differ == {"imgbuild/requirements/pytorch.torch.txt"}, differ  # (the recipe's name is in other files)
    # The runtime stage: the venv, then the CUDA wheels exactly as the lock lists them, then torch.
    runtime = [i for stage, i in newer if stage == "runtime"]
    at = runtime.index("COPY --from=builder /opt/venv /opt/venv")
    assert "source=imgbuild/requirements/pytorch.cuda.txt" in runtime[at + 1]
    cuda = re.findall(r"^(\S+)==(\S+) ", new_files["imgbuild/requirements/pytorch.cuda.txt"].decode(), re.M)
    nccl = [f"{n}=={v}" for r in content.python["nccl"] for n, v in [(r.name, r.version)]]
    assert sorted([f"{n}=={v}" for n, v in cuda] + nccl) == sorted(TORCH["2.9.1"].cuda_wheels)
    assert "nvidia-nccl-cu12==2.27.5" in nccl  # the nccl block's set, installed in the builder's venv
    assert "source=imgbuild/requirements/pytorch.torch.txt" in runtime[at + 2]
    assert b"torch==2.9.1 \\" in new_files["imgbuild/requirements/pytorch.torch.txt"]


def cuda_wheels_of(step: str) -> list[str]:
    """The requirements a `set -- REQ... && pip download ... "$@" && pip install ... "$@"` step installs."""
    words = shlex.split(step.split(" set -- ", 1)[1].split(" && ", 1)[0])
    assert f'--dest {dockerfile.WHEELHOUSE} "$@"' in step and f'--find-links {dockerfile.WHEELHOUSE} "$@"' in step
    return words


def test_torch_cuda_wheels_are_shell_words(recipe_dir: Path) -> None:
    """cuda-toolkit's extras and a range pin (torch 2.12.1's nvidia-cublas<=...,>=...) reach pip as one word each,
    not as a glob or a redirection."""
    from imgbuild.pin.resolver import resolve

    path = recipe_dir / "r.yaml"
    path.write_text("extends: h100\ncomponents: {pytorch: {version: 2.12.1}}\n")
    steps = instructions(render.plan(resolve(recipe.load(path), lookup_torch=None)).dockerfile)
    line = next(i for stage, i in steps if stage == "runtime" and "nvidia-nccl-cu13==" in i)
    assert cuda_wheels_of(line) == list(TORCH["2.12.1"].cuda_wheels)
    assert "'nvidia-cublas<=13.1.1.3,>=13.1.0.3'" in line and "'cuda-toolkit[cudart," in line


class _Shell:
    """A check's host: this machine's shell with a given environment (the ca-bundle-absent command needs no more)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(self, command: str, *args: str) -> Any:
        proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=self.env, check=False)
        return SimpleNamespace(rc=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)


def test_ca_bundle_absent_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """verify's ca-bundle-absent: nothing under /run/secrets but empty mount points (BuildKit leaves an empty
    /run/secrets behind), no folder of extra CA certificates, no variable of the image naming a secret."""
    from imgbuild import checks
    from imgbuild.checks import always

    def result(env: dict[str, str], secrets: Path | None = None) -> Any:
        if secrets is not None:
            monkeypatch.setattr(always, "SECRETS_DIR", str(secrets))
        ctx = checks.CheckContext(host=_Shell({"PATH": "/usr/bin:/bin", **env}), scope="container", components={})
        return checks.ca_bundle_absent(ctx)

    assert result({}).status == "pass"
    leaked = result({"PIP_CERT": dockerfile.CA_SECRET_PATH})
    assert leaked.status == "fail" and "PIP_CERT" in leaked.reason
    secrets = tmp_path / "secrets"
    (secrets / "empty-mount-point").mkdir(parents=True)
    (secrets / "imgbuild-ca.pem").write_text("")
    assert result({}, secrets).status == "pass"
    (secrets / "imgbuild-ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    found = result({}, secrets)
    assert found.status == "fail" and f"{secrets}/imgbuild-ca.pem" in found.reason
