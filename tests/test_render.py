"""Rendering: golden Dockerfiles for every recipe, determinism, layer order, lint, context files."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SHIPPED, hadolint
from imgbuild import recipe, render
from imgbuild.lock import resolved_for

GOLDEN = REPO / "tests" / "golden"


def plan_of(name: str) -> render.BuildPlan:
    resolved, how = resolved_for(recipe.load(name), lookup_torch=None)
    assert how == "lock", f"{name} has no fresh lock: run `imgbuild lock {name}`"
    return render.plan(resolved)


@pytest.mark.parametrize("name", SHIPPED)
def test_golden_dockerfile(name: str, update_golden: bool) -> None:
    text = plan_of(name).dockerfile
    golden = GOLDEN / f"{name}.Dockerfile"
    if update_golden:
        golden.write_text(text)
    assert golden.exists(), f"no golden file: run pytest --update-golden and review {golden}"
    assert text == golden.read_text(), f"{name}: rendered Dockerfile differs from {golden} (--update-golden)"


@pytest.mark.parametrize("name", SHIPPED)
def test_render_is_deterministic(name: str) -> None:
    a, b = plan_of(name), plan_of(name)
    assert a.dockerfile == b.dockerfile and a.files == b.files and a.tags == b.tags


@pytest.mark.parametrize("name", SHIPPED)
def test_hadolint_clean(name: str) -> None:
    proc = subprocess.run(
        [hadolint(), "--config", str(REPO / ".hadolint.yaml"), "--no-color", "-"],
        input=plan_of(name).dockerfile, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", SHIPPED)
def test_classic_builder_only(name: str) -> None:
    text = plan_of(name).dockerfile
    assert "--mount" not in text and "--chmod" not in text and "# syntax=" not in text
    assert "{{" not in text and "{%" not in text


def runtime_stage(text: str) -> str:
    return text.split("# ---- runtime")[1]


@pytest.mark.parametrize("name", ["a100", "v100", "h100"])
def test_layers_ordered_by_change_rate(name: str) -> None:
    text = runtime_stage(plan_of(name).dockerfile)
    marks = ["apt-get install", "efa_installer.sh", "COPY --from=builder /opt/nccl ", "/opt/nccl-tests",
             "/opt/venv /opt/venv", "imgbuild/sshd_config", "imgbuild/train", "imgbuild-entrypoint",
             "/etc/imgbuild/manifest.json", "LABEL "]  # fmt: skip
    positions = [text.index(m) for m in marks]
    assert positions == sorted(positions), dict(zip(marks, positions, strict=True))


def test_compiled_parts_in_builder_only() -> None:
    text = plan_of("v100").dockerfile
    builder, runtime = text.split("# ---- runtime")
    for tool in ("make ", "./configure", "curl ", "pip install", "gpg "):
        assert tool in builder and tool not in runtime, tool
    assert "build-essential" not in runtime
    assert "-gencode=arch=compute_70,code=sm_70" in builder
    assert "rm -rf /opt/amazon/ofi-nccl" in runtime  # one plugin only: the release build


def test_ca_bundle_only_in_builder() -> None:
    for name in ("cpu", "a100"):
        builder, runtime = plan_of(name).dockerfile.split("# ---- runtime")
        assert "imgbuild/ca/" in builder and "imgbuild/ca" not in runtime


def test_gaudi_profile_and_no_builder() -> None:
    text = plan_of("gaudi-1.15").dockerfile
    assert "AS builder" not in text
    assert "FROM vault.habana.ai/gaudi-docker/1.15.1/ubuntu22.04/habanalabs/pytorch-installer-2.2.0:latest" in text
    assert 'HCCL_OVER_OFI="1"' in text and "LIBFABRIC_ROOT=" in text
    assert "/opt/habanalabs/libfabric-1.20.0/bin" in text


def test_ssh_host_keys_removed_in_the_layer_that_makes_them() -> None:
    text = runtime_stage(plan_of("cpu").dockerfile)
    layer = text[text.index("RUN apt-get update") :].split("\n\n")[0]
    assert "openssh-server" in layer and "rm -f /etc/ssh/ssh_host_*" in layer


def test_context_files_and_manifest() -> None:
    plan = plan_of("cpu")
    files = {f.path: f for f in plan.files}
    assert set(files) == {"imgbuild/ca/README", "imgbuild/entrypoint.sh", "imgbuild/manifest.json",
                          "imgbuild/ssh_config", "imgbuild/sshd_config", "imgbuild/train"}  # fmt: skip
    assert files["imgbuild/entrypoint.sh"].mode == 0o755 and files["imgbuild/train"].mode == 0o755
    copied = set(re.findall(r"^COPY (imgbuild/\S+)", plan.dockerfile, re.M))
    assert {p.rstrip("/") for p in copied} == {p for p in files if not p.startswith("imgbuild/ca/")} | {"imgbuild/ca"}
    manifest = json.loads(files["imgbuild/manifest.json"].content)
    assert manifest["recipe"] == "cpu" and manifest["lock_digest"] == plan.lock_digest
    assert manifest["components"]["nccl"]["version"] == "2.21.5"
    assert manifest["components"]["nccl"]["package"] == "nvidia-nccl-cu12"
    assert manifest["components"]["sshd"]["ports"] == [3022]
    sshd = files["imgbuild/sshd_config"].content.decode()
    assert "Port 3022" in sshd and "PasswordAuthentication no" in sshd
    assert "PermitRootLogin prohibit-password" in sshd


def test_tags_derive_from_the_lock() -> None:
    plan = plan_of("cpu")
    assert plan.tags[0] == f"lock-{plan.lock_digest[:12]}"
    assert plan.tags[1] == "nccl2.21.5-ompi4.1.4"
    assert plan.labels["io.imgbuild.lock-digest"] == plan.lock_digest


def test_locks_are_fresh_and_committed() -> None:
    for name in SHIPPED:
        loaded = recipe.load(name)
        path = loaded.path.with_name(f"{name}.lock.json")
        assert path.exists(), path
        _, how = resolved_for(loaded, lookup_torch=None)
        assert how == "lock"


def test_user_recipe_renders(recipe_dir: Path) -> None:
    p = recipe_dir / "mine.yaml"
    p.write_text("extends: cpu\ncomponents:\n  sshd: {ports: [2222, 3022]}\nenv: {MY_VAR: 'a b'}\n")
    resolved, how = resolved_for(recipe.load(p), lookup_torch=None)
    assert how == "resolved"
    plan = render.plan(resolved)
    assert 'MY_VAR="a b"' in plan.dockerfile
    sshd = next(f for f in plan.files if f.path == "imgbuild/sshd_config").content.decode()
    assert "Port 2222\nPort 3022" in sshd
