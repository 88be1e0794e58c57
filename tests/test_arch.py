"""platform.arch: a recipe built for several CPU architectures (issue 19). Pins are one for every architecture; the
render, the wheel lookups and the lock's hashes are per architecture. No engine here: test_multiarch builds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from imgbuild import recipe
from imgbuild.blocks.pytorch import TorchWheel, shipped
from imgbuild.core import platforms
from imgbuild.core.errors import RecipeError, RenderError, ResolveError
from imgbuild.image import identity, render
from imgbuild.pin import digests, lock, pypi
from imgbuild.pin.content import ImageDigest, local_ref
from imgbuild.pin.resolver import resolve
from localindex import Index, make_wheel, torch_wheel_name

TORCH = shipped()  # blocks/pytorch/releases.yaml: version -> what its x86_64 wheel pins


def test_platform_strings() -> None:
    assert [platforms.parse_platform(p) for p in ("linux/arm64", "arm64", "linux/aarch64", "LINUX/AMD64")] == [
        "arm64",
        "arm64",
        "arm64",
        "amd64",
    ]
    for bad in ("linux/riscv64", "windows/amd64", "x86"):
        with pytest.raises(ValueError, match=r"not a platform imgbuild builds for \(known: linux/amd64, linux/arm64\)"):
            platforms.parse_platform(bad)
    assert platforms.multiarch("arm64") == "aarch64-linux-gnu" and platforms.docker_platform("arm64") == "linux/arm64"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("riscv64", "platform.arch: expected amd64 or arm64 (Docker's names; a list for several), got 'riscv64'"),
        (
            "[amd64, x86_64]",
            "platform.arch: expected amd64 or arm64 (Docker's names; a list for several), got 'x86_64'",
        ),
        ("[]", "platform.arch: expected an architecture or a list of them (amd64, arm64), got an empty list"),
        ("[arm64, arm64]", "platform.arch: an architecture is listed twice"),
    ],
)
def test_a_bad_arch_names_the_file_and_the_key(recipe_dir: Path, value: str, message: str) -> None:
    (recipe_dir / "t.yaml").write_text(f"extends: cpu\nplatform: {{accelerator: none, arch: {value}}}\n")
    with pytest.raises(RecipeError) as err:
        recipe.load(recipe_dir / "t.yaml")
    assert "t.yaml" in str(err.value) and message in str(err.value)


def test_one_lock_pins_both_architectures_and_each_render_has_its_own_paths() -> None:
    loaded = recipe.load("cpu")
    resolved = lock.resolved_for(loaded)
    assert resolved.recipe.platform.arch == ("amd64", "arm64")
    amd, arm = render.plan(resolved), render.plan(resolved, arch="arm64")
    assert (amd.arch, arm.arch) == ("amd64", "arm64") and amd.lock_digest == arm.lock_digest
    assert arm.tags == tuple(f"{t}-arm64" for t in amd.tags)
    assert identity.of(resolved).ref("arm64") == arm.image_refs[0]
    # the distro's Open MPI lives in the architecture's multiarch directory; the pin says so once for both
    assert resolved.pins["openmpi"].details.prefix == "/usr/lib/{multiarch}/openmpi"
    manifests = {
        p.arch: json.loads(next(f.content for f in p.files if f.path.endswith("manifest.json"))) for p in (amd, arm)
    }
    assert manifests["amd64"]["components"]["openmpi"]["prefix"] == "/usr/lib/x86_64-linux-gnu/openmpi"
    assert manifests["arm64"]["components"]["openmpi"]["prefix"] == "/usr/lib/aarch64-linux-gnu/openmpi"
    assert manifests["arm64"]["arch"] == "arm64" and "x86_64" not in arm.dockerfile
    # a base made on this machine: each architecture's copy by its own name in the engine
    base = resolved.content.bases[resolved.base_ref] if resolved.content else None
    if base is not None and base.local:
        assert re.search(r"^FROM debian:bookworm-slim-arm64 AS", arm.dockerfile, re.M), arm.dockerfile[:400]
        assert re.search(r"^FROM debian:bookworm-slim AS", amd.dockerfile, re.M)
    # the wheel set holds both architectures' hashes: pip takes the one it installs
    nccl = resolved.content.python["nccl"][0] if resolved.content else None
    assert nccl is not None and len(nccl.hashes) == 2


def test_a_registry_digest_serves_every_architecture_and_a_local_base_has_a_name_per_architecture() -> None:
    resolved = lock.resolved_for(recipe.load("cpu"))
    assert resolved.content is not None
    digest = "sha256:" + "a" * 64
    pulled = resolved.content.model_copy(
        update={
            "bases": {"debian:bookworm-slim": ImageDigest(ref="debian:bookworm-slim", digest=digest, origin="registry")}
        }
    )
    with_digest = resolved.model_copy(update={"content": pulled})
    for arch in ("amd64", "arm64"):
        assert render.pinned_ref(with_digest, "debian:bookworm-slim", arch) == f"debian:bookworm-slim@{digest}"
    assert local_ref("debian:bookworm-slim", "arm64") == "debian:bookworm-slim-arm64"
    assert local_ref("debian:bookworm-slim", "amd64") == "debian:bookworm-slim"
    assert local_ref("localhost:5000/base", "arm64") == "localhost:5000/base:latest-arm64"
    # a digest names the recipe's image, not another architecture's copy (it was read as a tag: base@sha256:...-arm64)
    assert local_ref(f"host:5000/base:1@{digest}", "arm64") == "host:5000/base:1-arm64"
    assert local_ref(f"debian@{digest}", "arm64") == "debian:latest-arm64"
    assert digests.same_repository("debian:bookworm-slim", "docker.io/library/debian")
    assert digests.same_repository("host:5000/base:1", "host:5000/base")
    assert not digests.same_repository("host:5000/base", "host:5001/base")
    assert not digests.same_repository("debian", "not a reference")


def test_an_architecture_the_recipe_does_not_list_is_refused_with_the_fix() -> None:
    resolved = lock.resolved_for(recipe.load("pytorch"))
    with pytest.raises(RenderError) as err:
        render.plan(resolved, arch="arm64")
    assert "pytorch is built for linux/amd64, not linux/arm64" in str(err.value)
    assert "add arm64 to platform.arch" in (err.value.hint or "")


def test_torch_before_the_first_aarch64_cuda_build_is_refused_naming_it(recipe_dir: Path) -> None:
    (recipe_dir / "t.yaml").write_text("extends: pytorch\nplatform: {accelerator: none, arch: [amd64, arm64]}\n")
    with pytest.raises(ResolveError) as err:
        resolve(recipe.load(recipe_dir / "t.yaml"), lookup_torch=None)
    text = str(err.value)
    assert "t.yaml: components.pytorch.version / platform.arch" in text
    assert "torch 2.9.1's wheel for linux/arm64 (aarch64) is a CPU build" in text
    assert "first release with a CUDA build for aarch64 is 2.11.0" in text


def test_torch_with_aarch64_cuda_wheels_pins_the_same_nccl_on_both(recipe_dir: Path) -> None:
    (recipe_dir / "t.yaml").write_text(
        "extends: pytorch\nplatform: {accelerator: none, arch: [amd64, arm64]}\n"
        "components: {pytorch: {version: 2.13.0}}\n"
    )
    resolved = resolve(recipe.load(recipe_dir / "t.yaml"), lookup_torch=None)
    assert resolved.version("nccl") == "2.29.7" and resolved.pins["nccl"].details.package == "nvidia-nccl-cu13"


def test_a_release_not_in_the_table_is_read_for_the_targets_machine(recipe_dir: Path) -> None:
    seen: list[tuple[str, str]] = []

    def lookup(version: str, machine: str) -> TorchWheel:
        seen.append((version, machine))
        return TORCH["2.13.0"]

    (recipe_dir / "t.yaml").write_text(
        "extends: pytorch\nplatform: {accelerator: none, arch: arm64}\ncomponents: {pytorch: {version: 2.14.0}}\n"
    )
    resolved = resolve(recipe.load(recipe_dir / "t.yaml"), lookup_torch=lookup)
    assert seen == [("2.14.0", "aarch64")] and resolved.version("nccl") == "2.29.7"


def test_the_index_picks_the_wheel_of_the_machine_asked_for(index: Index, tmp_path: Path) -> None:
    """torch 2.9-like: the aarch64 wheel names NCCL only for x86_64 (a CPU build); the x86_64 wheel pins it."""
    requires = [
        'nvidia-nccl-cu12==2.27.5; platform_system == "Linux" and platform_machine == "x86_64"',
        'nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux" and platform_machine == "x86_64"',
    ]
    for platform in ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64"):
        name = torch_wheel_name("9.9.0", platform)
        index.add_wheel("torch", name, make_wheel(tmp_path, name, requires, junk=4096))
    x86 = pypi.torch_pins("9.9.0", index=index.simple)
    assert (x86.nccl_version, x86.cuda_version) == ("2.27.5", "12.8") and "x86_64" in x86.wheel_filename
    assert x86.cuda_wheels == ("nvidia-cuda-runtime-cu12==12.8.90", "nvidia-nccl-cu12==2.27.5")
    with pytest.raises(pypi.IndexLookupError, match=r"aarch64\.whl\): Requires-Dist names no nvidia-nccl"):
        pypi.torch_pins("9.9.0", index=index.simple, machine="aarch64")
    only_x86 = torch_wheel_name("9.9.1", "manylinux_2_28_x86_64")
    index.add_wheel("torch", only_x86, make_wheel(tmp_path, only_x86, requires, junk=4096))
    with pytest.raises(pypi.IndexLookupError, match=r"torch 9.9.1: no Linux aarch64 \(or pure-Python\) wheel"):
        pypi.torch_pins("9.9.1", index=index.simple, machine="aarch64")


def test_render_and_show_take_the_platform() -> None:
    from typer.testing import CliRunner

    from imgbuild.cli import app

    runner = CliRunner()
    arm = runner.invoke(app, ["render", "cpu", "--platform", "linux/arm64"])
    assert arm.exit_code == 0, arm.output
    assert "FROM debian:bookworm-slim-arm64 AS runtime" in arm.output
    refused = runner.invoke(app, ["render", "pytorch", "--platform", "linux/arm64"])
    assert refused.exit_code == 6 and "pytorch is built for linux/amd64, not linux/arm64" in refused.output
    bad = runner.invoke(app, ["render", "cpu", "--platform", "linux/s390x"])
    assert bad.exit_code == 2 and "linux/s390x" in bad.output and "--platform" in bad.output
    shown = json.loads(runner.invoke(app, ["show", "cpu", "--json"]).output)
    assert shown["platforms"] == ["linux/amd64", "linux/arm64"]
