"""Resolver: pins every component and proves compatibility, or says exactly why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from imgbuild import recipe
from imgbuild.blocks.efa import efa_release
from imgbuild.blocks.pytorch import TorchWheel, shipped, torch_wheel
from imgbuild.core.distro import DISTRO
from imgbuild.core.errors import ImgbuildError, ResolveError
from imgbuild.pin.resolver import resolve

TORCH = shipped()  # blocks/pytorch/releases.yaml: version -> what its x86_64 wheel pins


def resolve_text(d: Path, text: str, **kwargs):
    p = d / "r.yaml"
    p.write_text(text)
    return resolve(recipe.load(p), lookup_torch=kwargs.pop("lookup_torch", None))


def resolve_error(d: Path, text: str, **kwargs) -> str:
    with pytest.raises(ResolveError) as info:
        resolve_text(d, text, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("cpu", {"nccl": "2.27.5", "openmpi": "4.1.4", "libfabric": "1.17.0", "python": "3.11"}),
        ("a100", {"nccl": "2.27.5", "pytorch": "2.10.0", "aws_ofi_nccl": "1.22.0", "efa": "1.51.0"}),
        ("v100", {"nccl": "2.27.5", "pytorch": "2.10.0", "aws_ofi_nccl": "1.22.0", "efa": "1.51.0", "cuda": "12.6.3"}),
        ("h100", {"nccl": "2.30.7", "pytorch": "2.15.0", "aws_ofi_nccl": "1.22.0", "cuda": "13.2.2"}),
        ("gaudi-1.15", {"gaudi": "1.15.1", "pytorch": "2.2.0", "efa": "1.29.0", "openmpi": "4.1.6"}),
        (
            "gaudi-1.21",
            {"gaudi": "1.21.4", "pytorch": "2.6.0", "efa": "1.34.0", "libfabric": "1.22.0", "python": "3.10"},
        ),
        ("h200", {"nccl": "2.30.7", "pytorch": "2.15.0", "aws_ofi_nccl": "1.22.0", "efa": "1.51.0", "cuda": "13.2.2"}),
        ("b200", {"nccl": "2.30.7", "pytorch": "2.15.0", "aws_ofi_nccl": "1.22.0", "efa": "1.51.0", "cuda": "13.2.2"}),
        ("gb200", {"nccl": "2.30.7", "pytorch": "2.15.0", "aws_ofi_nccl": "1.22.0", "efa": "1.51.0", "cuda": "13.2.2"}),
        ("b300", {"nccl": "2.30.7", "pytorch": "2.15.0", "aws_ofi_nccl": "1.22.0", "efa": "1.51.0", "cuda": "13.2.2"}),
    ],
)
def test_shipped_recipes_resolve(name: str, expect: dict[str, str]) -> None:
    resolved = resolve(recipe.load(name), lookup_torch=None)
    for component, version in expect.items():
        assert resolved.version(component) == version, component


def test_nccl_is_pytorchs_and_every_pin_is_exact() -> None:
    for name in ("a100", "v100", "h100"):
        resolved = resolve(recipe.load(name), lookup_torch=None)
        torch = TORCH[resolved.version("pytorch") or ""]
        assert resolved.version("nccl") == torch.nccl
        assert "PyTorch" in resolved.pins["nccl"].origin


@pytest.mark.parametrize(("name", "machine"), [("h200", "x86_64"), ("b200", "x86_64"), ("gb200", "aarch64")])
def test_the_newest_instances_get_the_nccl_of_their_architectures_torch_wheel(name: str, machine: str) -> None:
    """torch -> NCCL for the wheel the image installs: gb200's is torch's aarch64 wheel (a CUDA build from 2.11.0),
    read from the aarch64 table, and the lock that ships holds the same pins."""
    from imgbuild.pin import lock

    r = recipe.load(name).recipe
    assert r.platform.arch == (("arm64",) if machine == "aarch64" else ("amd64",))
    assert r.platform.gpu_arch == ("sm_90" if name == "h200" else "sm_100")
    resolved = resolve(recipe.load(name), lookup_torch=None)
    wheel = torch_wheel(resolved.version("pytorch") or "", machine)
    assert wheel is not None and resolved.version("nccl") == wheel.nccl
    locked = lock.resolved_for(recipe.load(name))
    torch = locked.pins["pytorch"].details
    assert torch.nccl == locked.version("nccl") == wheel.nccl and torch.nccl_package == wheel.nccl_package


def test_gb200_with_a_torch_whose_aarch64_wheel_is_a_cpu_build(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: gb200\ncomponents: {pytorch: {version: 2.9.1}}\n")
    assert "torch 2.9.1's wheel for linux/arm64 (aarch64) is a CPU build" in msg
    assert "the first release with a CUDA build for aarch64 is 2.11.0" in msg
    # The same release is fine on x86_64 (b200 is the same GPU on amd64) as far as the wheel goes.
    assert resolve_text(recipe_dir, "extends: b200\ncomponents: {pytorch: {version: 2.11.0}}\n").version("nccl") == (
        "2.28.9"
    )
    assert resolve_text(recipe_dir, "extends: gb200\ncomponents: {pytorch: {version: 2.11.0}}\n").version("nccl") == (
        "2.28.9"
    )


def test_sm_100_needs_cuda_12_8(recipe_dir: Path) -> None:
    text = (
        "extends: b200\nbase: {tag: 12.6.3-runtime-ubuntu22.04, builder_tag: 12.6.3-devel-ubuntu22.04}\n"
        "os: {version: '22.04'}\ncuda: {version: 12.6.3}\ncomponents: {pytorch: {version: 2.7.1}}\n"
    )
    msg = resolve_error(recipe_dir, text)
    assert "sm_100" in msg and "12.8" in msg


def test_sm_103_needs_cuda_12_9_and_a_torch_wheel_with_sm_100_code(recipe_dir: Path) -> None:
    """B300 (sm_103): the CUDA rule wants CUDA 12.9 (the first toolkit that targets 10.3); PyTorch's wheels run there
    through their sm_100 code, which wheels built for CUDA 12.8 and newer carry and cu12.6 wheels do not."""
    ubuntu22 = "os: {version: '22.04'}\n"
    msg = resolve_error(
        recipe_dir,
        "extends: b300\nbase: {tag: 12.8.1-runtime-ubuntu22.04, builder_tag: 12.8.1-devel-ubuntu22.04}\n"
        f"{ubuntu22}cuda: {{version: 12.8.1}}\ncomponents: {{pytorch: {{version: 2.9.1}}}}\n",
    )
    assert "cuda.version" in msg and "sm_103 (B300) needs CUDA >= 12.9, got 12.8.1" in msg
    cuda_12_9 = (
        "extends: b300\nbase: {tag: 12.9.1-runtime-ubuntu22.04, builder_tag: 12.9.1-devel-ubuntu22.04}\n"
        f"{ubuntu22}cuda: {{version: 12.9.1}}\n"
    )
    msg = resolve_error(recipe_dir, cuda_12_9 + "components: {pytorch: {version: 2.7.1}}\n")
    assert "torch 2.7.1 wheels (CUDA 12.6) have no sm_103 kernels, so they don't run on B300" in msg
    assert "use a PyTorch built for CUDA 12.8 or newer" in msg
    assert resolve_text(recipe_dir, cuda_12_9 + "components: {pytorch: {version: 2.9.1}}\n").version("cuda") == "12.9.1"
    # The same CUDA 12.8.1 base is fine for B200 (sm_100 needs 12.8): the rule is the architecture's.
    b200 = (
        "extends: b200\nbase: {tag: 12.8.1-runtime-ubuntu22.04, builder_tag: 12.8.1-devel-ubuntu22.04}\n"
        f"{ubuntu22}cuda: {{version: 12.8.1}}\ncomponents: {{pytorch: {{version: 2.9.1}}}}\n"
    )
    assert resolve_text(recipe_dir, b200).version("cuda") == "12.8.1"


def test_gaudi_warns_about_latest_only_base() -> None:
    resolved = resolve(recipe.load("gaudi-1.15"), lookup_torch=None)
    assert any("publishes only 'latest'" in w for w in resolved.warnings)
    assert resolved.base_ref.endswith(":latest")


def test_gaudi_with_digest_pins_by_digest(recipe_dir: Path) -> None:
    digest = "sha256:" + "ab" * 32
    resolved = resolve_text(recipe_dir, f"extends: gaudi-1.15\nbase: {{digest: '{digest}'}}\n")
    assert resolved.base_ref.endswith("@" + digest) and not resolved.warnings


def test_v100_with_cuda_13(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: v100\ncuda: {version: 13.0.1}\n")
    assert "r.yaml: cuda.version: cuda 13.0.1 with cuda.gpu_arch sm_70 is known bad: CUDA 13 builds for Turing" in msg
    assert "https://docs.nvidia.com/cuda/cuda-features-archive/index.html" in msg


def test_v100_with_a_pytorch_that_has_no_sm70(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: v100\ncomponents: {pytorch: {version: 2.11.0}}\n")
    assert "CUDA 13.0" in msg and "major versions must match" in msg


def test_pytorch_wheel_without_sm70_kernels(recipe_dir: Path) -> None:
    msg = resolve_error(
        recipe_dir,
        "extends: v100\ncomponents: {pytorch: {version: 2.11.1}}\ncuda: {version: 12.8.1}\n",
        lookup_torch=lambda v, m="x86_64": TorchWheel(
            "nvidia-nccl-cu12", "2.28.9", "12.8", ("nvidia-nccl-cu12==2.28.9",)
        ),
    )
    assert "have no sm_70 kernels, so they don't run on V100" in msg


def test_nccl_that_is_not_pytorchs(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: a100\ncomponents: {nccl: {version: 2.26.2}}\n")
    assert "components.nccl.version: 2.26.2 is not the NCCL that PyTorch 2.10.0 pins (nvidia-nccl-cu12==2.27.5)" in msg


def test_plugin_older_than_nccl(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: a100\ncomponents: {aws_ofi_nccl: {source: release, version: 1.11.0}}\n")
    assert "aws-ofi-nccl 1.11.0 was tested with NCCL up to 2.22.3; NCCL 2.27.5 is newer" in msg


def test_plugin_bundle_unknown(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: a100\ncomponents: {efa: {version: 1.44.0}}\n")
    assert "bundled with EFA installer 1.44.0 is not in blocks/efa/releases.yaml" in msg


def test_efa_vs_os(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: h100\ncomponents: {efa: {version: 1.29.0}}\n")
    assert "EFA installer 1.29.0 supports" in msg and "not ubuntu24.04" in msg


def test_gaudi_release_vs_pytorch(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: gaudi-1.15\ncomponents: {pytorch: {version: 2.3.1}}\n")
    assert "Gaudi 1.15.1 ships PyTorch 2.2.0, got 2.3.1" in msg


def test_latest_tag_is_unpinned(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: cpu\nbase: {tag: latest}\n")
    assert "base.tag: 'latest' is not a pinned version" in msg


def test_torch_not_in_table_uses_index_lookup(recipe_dir: Path) -> None:
    seen: list[str] = []

    def lookup(version: str, machine: str = "x86_64") -> TorchWheel:
        seen.append(version)
        return TorchWheel("nvidia-nccl-cu12", "2.27.5", "12.8", TORCH["2.9.1"].cuda_wheels)

    resolved = resolve_text(recipe_dir, "extends: a100\ncomponents: {pytorch: {version: 2.9.9}}\n",
                            lookup_torch=lookup)  # fmt: skip
    assert seen == ["2.9.9"]
    assert resolved.version("nccl") == "2.27.5"
    assert "package index" in resolved.pins["pytorch"].origin
    assert list(resolved.pins["pytorch"].details.cuda_wheels) == list(TORCH["2.9.1"].cuda_wheels)


def test_the_torch_table_pins_its_nccl_among_its_cuda_wheels() -> None:
    """Each shipped release's CUDA wheels hold its NCCL pin and the CUDA it was built for (the runtime's pin, or
    cuda-toolkit's from 2.11 on)."""
    for version, wheel in TORCH.items():
        assert f"{wheel.nccl_package}=={wheel.nccl}" in wheel.cuda_wheels, version
        assert list(wheel.cuda_wheels) == sorted(wheel.cuda_wheels), version
        cuda = [w for w in wheel.cuda_wheels if w.startswith(("nvidia-cuda-runtime", "cuda-toolkit["))]
        assert cuda and cuda[0].split("==")[1].startswith(wheel.cuda + "."), version


def test_a_lock_of_a_release_from_the_index_keeps_its_cuda_wheels(recipe_dir: Path) -> None:
    """A release looked up on the index is locked with its CUDA wheels, and the lock reads back offline."""
    from imgbuild.pin import lock

    def lookup(version: str, machine: str = "x86_64") -> TorchWheel:
        return TorchWheel("nvidia-nccl-cu12", "2.26.2", "12.6", TORCH["2.7.1"].cuda_wheels)

    (recipe_dir / "t.yaml").write_text("extends: pytorch\ncomponents: {pytorch: {version: 2.7.0}}\n")
    loaded = recipe.load(recipe_dir / "t.yaml")
    lock.write(loaded, _contented(resolve(loaded, lookup_torch=lookup)))
    locked = lock.read(loaded)
    assert locked is not None
    assert list(locked.pins["pytorch"].details.cuda_wheels) == list(TORCH["2.7.1"].cuda_wheels)


def test_torch_lookup_failure_is_explained(recipe_dir: Path) -> None:
    def lookup(version: str, machine: str = "x86_64") -> TorchWheel:
        raise ImgbuildError("connection refused")

    msg = resolve_error(recipe_dir, "extends: a100\ncomponents: {pytorch: {version: 2.9.9}}\n", lookup_torch=lookup)
    assert "torch 2.9.9 is not in the shipped table and the index lookup failed: connection refused" in msg


def test_torch_unknown_offline(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: a100\ncomponents: {pytorch: {version: 2.9.9}}\n")
    assert "index lookups are off" in msg


def test_nccl_tests_need_a_built_nccl(recipe_dir: Path) -> None:
    msg = resolve_error(recipe_dir, "extends: cpu\ncomponents: {nccl_tests: {version: 2.16.4}}\n")
    assert "components.nccl_tests" in msg


def test_efa_os_support_follows_the_changelog(recipe_dir: Path) -> None:
    """EFA 1.43.0 removed Ubuntu 20.04; 1.51.0 removed Debian 11 (AWS EFA changelog)."""
    (recipe_dir / "old.yaml").write_text(
        "extends: a100\nbase: {tag: 12.8.1-runtime-ubuntu20.04, builder_tag: 12.8.1-devel-ubuntu20.04}\n"
        "os: {version: '20.04'}\ncomponents: {efa: {version: 1.43.2}}\n"
    )
    with pytest.raises(ResolveError, match=r"EFA installer 1.43.2 supports .*, not ubuntu20.04"):
        resolve(recipe.load(recipe_dir / "old.yaml"), lookup_torch=None)
    (recipe_dir / "deb11.yaml").write_text("extends: cpu\nos: {version: '11'}\ncomponents: {efa: {version: 1.51.0}}\n")
    with pytest.raises(ResolveError, match=r"EFA installer 1.51.0 supports .*, not debian11"):
        resolve(recipe.load(recipe_dir / "deb11.yaml"), lookup_torch=None)


def test_gaudi_115_is_ubuntu_2204_only(recipe_dir: Path) -> None:
    (recipe_dir / "g.yaml").write_text("extends: gaudi-1.15\nos: {version: '20.04'}\n")
    with pytest.raises(ResolveError, match=r"Gaudi 1.15.1 supports ubuntu22.04, got ubuntu20.04"):
        resolve(recipe.load(recipe_dir / "g.yaml"), lookup_torch=None)


def test_gaudi_121_holds_the_recipe_to_its_image(recipe_dir: Path) -> None:
    """Gaudi 1.21.x's image: PyTorch 2.6.0, EFA 1.34.0's libfabric 1.22.0 (no Habana-built one), Ubuntu 22.04 or 24.04;
    each other value is refused naming its key, the file and what the release has."""
    cases = {
        "components: {pytorch: {version: 2.2.0}}": (
            "components.pytorch.version: Gaudi 1.21.4 ships PyTorch 2.6.0, got 2.2.0"
        ),
        "components: {efa: {version: 1.29.0, source: base}}": "Gaudi 1.21.4's image has EFA 1.34.0, got 1.29.0",
        "components: {libfabric: {source: base, version: 1.20.0, prefix: /opt/habanalabs/libfabric-1.20.0}}": (
            "components.libfabric.version: Gaudi 1.21.4's image has libfabric 1.22.0, got 1.20.0"
        ),
        "os: {version: '20.04'}": "Gaudi 1.21.4 supports ubuntu22.04, ubuntu24.04, got ubuntu20.04",
        "components: {gaudi: {version: 1.21.5}}": "is not Gaudi 1.21.5's PyTorch 2.6.0 image",
    }
    for i, (text, expected) in enumerate(cases.items()):
        path = recipe_dir / f"g{i}.yaml"
        path.write_text(f"extends: gaudi-1.21\n{text}\n")
        with pytest.raises(ResolveError) as info:
            resolve(recipe.load(path), lookup_torch=None)
        assert expected in str(info.value) and f"g{i}.yaml" in str(info.value), (text, str(info.value))


def test_gaudi_121_base_efa_is_vouched_for_by_the_gaudi_table(recipe_dir: Path) -> None:
    """EFA 1.34.0 is in no EFA table row: on gaudi-1.21 the Gaudi table records it (no 'unchecked' warning); the same
    installer asked for by a non-Gaudi recipe is still warned about."""
    warned = resolve(recipe.load("gaudi-1.21"), lookup_torch=None).warnings
    assert not any("not in blocks/efa/releases.yaml" in w for w in warned), warned
    assert efa_release("1.34.0") is None, "efa.yaml lists 1.34.0: test the vouching with a release it lacks"
    (recipe_dir / "c.yaml").write_text("extends: cpu\ncomponents: {efa: {version: 1.34.0}}\n")
    warned = resolve(recipe.load(recipe_dir / "c.yaml"), lookup_torch=None).warnings
    assert any("EFA installer 1.34.0 is not in blocks/efa/releases.yaml" in w for w in warned), warned


def test_a_child_of_gaudi_121_may_pin_its_newest_patch(recipe_dir: Path) -> None:
    image = "vault.habana.ai/gaudi-docker/1.21.5/ubuntu22.04/habanalabs/pytorch-installer-2.6.0"
    path = recipe_dir / "g.yaml"
    path.write_text(f"extends: gaudi-1.21\nbase: {{image: {image}}}\ncomponents: {{gaudi: {{version: 1.21.5}}}}\n")
    resolved = resolve(recipe.load(path), lookup_torch=None)
    assert (resolved.version("gaudi"), resolved.version("efa"), resolved.version("pytorch")) == (
        "1.21.5",
        "1.34.0",
        "2.6.0",
    )


def test_plugin_121_needs_gdrcopy_25(recipe_dir: Path) -> None:
    (recipe_dir / "h.yaml").write_text("extends: h100\ncomponents: {gdrcopy: {version: 2.4.4}}\n")
    with pytest.raises(ResolveError, match=r"aws-ofi-nccl 1.22.0 needs GDRCopy >= 2.5, got 2.4.4"):
        resolve(recipe.load(recipe_dir / "h.yaml"), lookup_torch=None)
    (recipe_dir / "n.yaml").write_text("extends: h100\ncomponents: {gdrcopy: null}\n")
    warned = resolve(recipe.load(recipe_dir / "n.yaml"), lookup_torch=None).warnings
    assert any("GDRCopy >= 2.5" in w for w in warned)


def test_mpi4py_needs_python(recipe_dir: Path) -> None:
    (recipe_dir / "m.yaml").write_text("extends: cpu\ncomponents: {python: null, nccl: null, sagemaker: null}\n")
    with pytest.raises(ResolveError, match=r"components.mpi4py: mpi4py needs components.python"):
        resolve(recipe.load(recipe_dir / "m.yaml"), lookup_torch=None)


def test_a_lock_edited_by_hand_is_refused(recipe_dir: Path) -> None:
    import json

    from imgbuild.core.errors import LockError
    from imgbuild.pin import lock

    (recipe_dir / "mine.yaml").write_text("extends: a100\n")
    loaded = recipe.load(recipe_dir / "mine.yaml")
    path = lock.write(loaded, _contented(resolve(loaded, lookup_torch=None)))
    assert lock.read(loaded) is not None
    data = json.loads(path.read_text())
    data["pins"]["nccl"]["version"] = "2.26.2"
    path.write_text(json.dumps(data))
    with pytest.raises(
        LockError, match=r"was edited by hand .*nccl.version: lock '2.26.2', the recipe gives '2.27.5'"
    ) as err:
        lock.read(loaded)
    assert err.value.exit_code == 4 and "mine.lock.json" in str(err.value)


def test_a_lock_of_the_untyped_format_says_older(recipe_dir: Path) -> None:
    """A lock of format 1 (details as strings) is refused as written by an older imgbuild, with the command to
    run."""
    import json

    from imgbuild.core.errors import LockError
    from imgbuild.pin import lock

    (recipe_dir / "mine.yaml").write_text("extends: cpu\n")
    loaded = recipe.load(recipe_dir / "mine.yaml")
    path = lock.write(loaded, _contented(resolve(loaded)))
    data = json.loads(path.read_text())
    data["lock_version"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(LockError, match=r"lock_version: expected 3 \(written by an older imgbuild") as err:
        lock.read(loaded)
    assert err.value.hint == "imgbuild lock " + str(recipe_dir / "mine.yaml")


@pytest.mark.parametrize("version", ["2.9.1", "2.7.0"], ids=["shipped-table", "from-the-index"])
def test_a_lock_without_the_cuda_wheels_is_refused(recipe_dir: Path, version: str) -> None:
    """A pytorch pin without its CUDA wheels cannot be checked offline (from the index) or differs from the table:
    refused, naming the pin, with the command that writes a good lock."""
    import json

    from imgbuild.core.errors import LockError
    from imgbuild.pin import lock

    def lookup(v: str, machine: str = "x86_64") -> TorchWheel:
        return TorchWheel("nvidia-nccl-cu12", "2.26.2", "12.6", TORCH["2.7.1"].cuda_wheels)

    (recipe_dir / "old.yaml").write_text(f"extends: pytorch\ncomponents: {{pytorch: {{version: {version}}}}}\n")
    loaded = recipe.load(recipe_dir / "old.yaml")
    path = lock.write(loaded, _contented(resolve(loaded, lookup_torch=lookup)))
    data = json.loads(path.read_text())
    del data["pins"]["pytorch"]["details"]["cuda_wheels"]
    path.write_text(json.dumps(data))
    with pytest.raises(LockError, match=r"older imgbuild|pytorch.details.cuda_wheels: lock \(\)") as err:
        lock.read(loaded)
    assert "pytorch" in str(err.value) and err.value.hint == "imgbuild lock " + str(recipe_dir / "old.yaml")


def test_an_index_that_cannot_answer_is_exit_7(recipe_dir: Path) -> None:
    from imgbuild.core.errors import IndexLookupError

    def refused(version: str, machine: str = "x86_64") -> TorchWheel:
        raise IndexLookupError(f"torch {version}: connection refused")

    (recipe_dir / "t.yaml").write_text("extends: a100\ncomponents: {pytorch: {version: 2.9.9}}\n")
    with pytest.raises(
        IndexLookupError, match=r"t.yaml: components.pytorch.version: torch 2.9.9 .*connection refused"
    ) as err:
        resolve(recipe.load(recipe_dir / "t.yaml"), lookup_torch=refused)
    assert err.value.exit_code == 7


def test_plugin_1_16_3_was_tested_with_nccl_2_27_7(recipe_dir: Path) -> None:
    """aws-ofi-nccl 1.16.3 (EFA 1.43.2's) names NCCL 2.27.7 in its release notes; 1.16.0 named 2.27.5."""
    nccl_2_27_7 = (
        "extends: a100\ncomponents:\n  efa: {version: 1.43.2}\n  pytorch: null\n"
        "  nccl: {source: build, version: 2.27.7}\n"
    )
    resolved = resolve_text(recipe_dir, nccl_2_27_7)
    assert resolved.pins["aws_ofi_nccl"].details.tested_nccl == "2.27.7"
    msg = resolve_error(recipe_dir, nccl_2_27_7 + "  aws_ofi_nccl: {source: release, version: 1.16.0}\n")
    assert "aws-ofi-nccl 1.16.0 was tested with NCCL up to 2.27.5; NCCL 2.27.7 is newer" in msg


def test_built_plugin_older_than_the_installers_libfabric(recipe_dir: Path) -> None:
    """A plugin built from its release runs on the EFA installer's libfabric: refused when the release was tested
    only with older ones (1.14.x: libfabric 2.1; EFA 1.51.0: 2.7.0amzn2.0), a warning when a side is unknown."""
    # v100 with the PyTorch it shipped before issue 30 (2.7.1, NCCL 2.26.2: what 1.14.2 was tested with)
    built = (
        "extends: v100\ncomponents:\n  pytorch: {version: 2.7.1}\n  aws_ofi_nccl: {source: release, version: 1.14.2}\n"
    )
    msg = resolve_error(recipe_dir, built)
    assert "aws-ofi-nccl 1.14.2 was tested with libfabric up to 2.1.0; EFA installer 1.51.0 brings libfabric " in msg
    assert "use source: efa" in msg
    old_v100 = resolve_text(recipe_dir, built + "  efa: {version: 1.47.0}\n")  # what v100 shipped before
    assert any("EFA installer 1.47.0's libfabric is not in blocks/efa/releases.yaml" in w for w in old_v100.warnings)
    same = resolve_text(
        recipe_dir,
        "extends: a100\ncomponents:\n  efa: {version: 1.43.2}\n  aws_ofi_nccl: {source: release, version: 1.16.3}\n",
    )
    assert not [w for w in same.warnings if "libfabric" in w]


@pytest.mark.parametrize(("name", "version"), [("a100", "2.7.0"), ("v100", "2.7.0"), ("h100", "2.10.0")])
def test_hwloc_is_the_distributions_in_the_cuda_recipes(name: str, version: str) -> None:
    pin = resolve(recipe.load(name), lookup_torch=None).pins["hwloc"]
    assert (pin.version, pin.source) == (version, "distro")
    assert pin.origin.endswith(" package")


def test_hwloc_version_is_checked_against_the_distribution(tmp_path: Path) -> None:
    ok = resolve_text(tmp_path, "extends: cpu\ncomponents: {hwloc: {version: 2.9.0}}\n")
    assert ok.version("hwloc") == DISTRO["debian12"].hwloc == "2.9.0"
    msg = resolve_error(tmp_path, "extends: cpu\ncomponents: {hwloc: {version: 2.8.0}}\n")
    assert "components.hwloc.version" in msg and "debian12 ships hwloc 2.9.0, got 2.8.0" in msg
    with pytest.raises(ImgbuildError, match="source"):
        resolve_text(tmp_path, "extends: cpu\ncomponents: {hwloc: {source: build}}\n")


def _contented(resolved):
    """A resolution with a content record that establishes nothing (every base, download and requirement set the
    blocks need, none pinned): these tests are about the pins a lock holds, not its content (test_lock_content.py
    is); a lock read back must still name each of them (lock._content_diffs)."""
    from imgbuild.pin import record
    from imgbuild.pin.content import Content, Download, ImageDigest

    why = "unestablished: a test's lock"
    content = Content(
        bases={ref: ImageDigest(ref=ref, digest=None, origin=why) for ref in record.bases(resolved)},
        downloads={url: Download(url=url, sha256=None, origin=why) for url in record.downloads(resolved)},
        python=dict.fromkeys(record.requirement_sets(resolved), ()),
    )
    return resolved.model_copy(update={"content": content})


def test_a_release_build_takes_libfabric_from_components_libfabric(recipe_dir: Path) -> None:
    """No EFA installer: the plugin builds against components.libfabric (the distribution's: the bare
    --with-libfabric), and the tested-libfabric rule applies to that libfabric; without either it is refused."""
    from imgbuild.image import render

    plugin = "  aws_ofi_nccl: {source: release, version: 1.21.1}\n"
    no_efa = "extends: h100\ncomponents:\n  efa: null\n  openmpi: {source: distro}\n" + plugin
    msg = resolve_error(recipe_dir, no_efa)
    assert "r.yaml: components.aws_ofi_nccl.source: source: release builds against libfabric" in msg
    assert "components.efa" in msg and "components.libfabric" in msg
    distro = resolve_text(recipe_dir, no_efa + "  libfabric: {source: distro}\n")
    assert not [w for w in distro.warnings if "libfabric" in w]
    text = render.plan(distro).dockerfile
    assert "built against libfabric 1.17.0 (ubuntu24.04 package)." in text
    assert " --with-libfabric --with-cuda=" in text
    newer = no_efa + "  libfabric: {source: base, version: 2.7.0, prefix: /opt/libfabric}\n"
    msg = resolve_error(recipe_dir, newer)
    assert "components.aws_ofi_nccl.version / components.libfabric" in msg
    assert "aws-ofi-nccl 1.21.1 was tested with libfabric up to 2.6.0amzn1.0; components.libfabric" in msg
    assert "brings libfabric 2.7.0" in msg
    efa = resolve_error(recipe_dir, "extends: h100\ncomponents:\n  efa: null\n  openmpi: {source: distro}\n")
    assert "components.aws_ofi_nccl.source: source: efa (the plugin the EFA installer bundles) needs" in efa


def test_the_archive_option_is_the_release_builds_and_left_out_of_locks_that_do_not_set_it(recipe_dir: Path) -> None:
    from imgbuild.blocks.aws_ofi_nccl import PluginDetails

    msg = resolve_error(recipe_dir, "extends: h100\ncomponents:\n  aws_ofi_nccl: {source: efa, archive: tag}\n")
    assert "components.aws_ofi_nccl.archive: applies to source: release" in msg
    base = "extends: h200\ncomponents:\n  efa: {version: 1.50.0}\n  aws_ofi_nccl: {source: release, version: 1.21.1"
    release = resolve_text(recipe_dir, base + "}\n").pins["aws_ofi_nccl"]
    tag = resolve_text(recipe_dir, base + ", archive: tag}\n").pins["aws_ofi_nccl"]
    assert "archive" not in release.model_dump(mode="json")["details"]  # the locks of before read the same
    assert tag.model_dump(mode="json")["details"]["archive"] == "tag"
    assert PluginDetails.model_validate(tag.model_dump(mode="json")["details"]).archive == "tag"
    from imgbuild.image import render

    texts = {name: render.plan(resolve_text(recipe_dir, base + extra)).dockerfile
             for name, extra in (("release", "}\n"), ("tag", ", archive: tag}\n"))}  # fmt: skip
    assert "releases/download/v1.21.1/aws-ofi-nccl-1.21.1.tar.gz" in texts["release"]
    assert "archive/refs/tags/v1.21.1.tar.gz" in texts["tag"]
    for name, text in texts.items():  # one template: the same autogen line, autotools in the builder for tag only
        assert "&& if [ ! -e configure ]; then echo 1.21.1 >.release_version && ./autogen.sh; fi \\\n" in text
        assert ("      automake \\\n" in text) == (name == "tag"), name


# --------------------------------------------------------------------------------------------------------------
# cuda: the toolkit from the base image or from the cuda-toolkit wheels PyTorch pins (debian-cuda)


def test_cuda_from_wheels_needs_cuda_13(recipe_dir: Path) -> None:
    """CUDA 12's nvidia-cuda-nvcc-cu12 wheel has no nvcc binary: wheels compile from CUDA 13 on."""
    (recipe_dir / "cu12.yaml").write_text(
        "extends: debian-cuda\ncuda: {version: 12.8.1, source: wheel}\ncomponents: {pytorch: {version: 2.9.1}}\n"
    )
    with pytest.raises(ResolveError, match=r"cu12\.yaml: cuda\.source: CUDA 12\.8\.1's toolkit wheels have no nvcc"):
        resolve(recipe.load(recipe_dir / "cu12.yaml"), lookup_torch=None)


def test_cuda_from_wheels_is_the_toolkit_release_torch_pins(recipe_dir: Path) -> None:
    (recipe_dir / "other.yaml").write_text("extends: debian-cuda\ncuda: {version: 13.0.2}\n")
    with pytest.raises(ResolveError) as err:
        resolve(recipe.load(recipe_dir / "other.yaml"), lookup_torch=None)
    assert "other.yaml: cuda.version / components.pytorch.version: torch 2.15.0's wheel requires cuda-toolkit " \
        "13.2.2; the toolkit wheels must be that release, got 13.0.2" in str(err.value)  # fmt: skip
    assert err.value.hint == "cuda.version: 13.2.2"
    shipped = resolve(recipe.load("debian-cuda"), lookup_torch=None).pins["cuda"]
    assert (shipped.version, shipped.source) == ("13.2.2", "wheel")
    assert resolve(recipe.load("h100"), lookup_torch=None).pins["cuda"].source == "base"


def test_the_toolkit_set_is_resolved_apart_with_torchs_versions() -> None:
    """The builder's toolkit set (pip --target, apart from the venv) holds its whole closure, at the versions the
    venv's PyTorch sets hold: the shipped lock, what cannot change without a relock."""
    sets = json.loads((REPO / "recipes" / "debian-cuda.lock.json").read_text())["content"]["python"]
    toolkit = {r["name"]: r["version"] for r in sets["cuda"]}
    venv = {r["name"]: r["version"] for name, reqs in sets.items() if name != "cuda" for r in reqs}
    assert {"cuda-toolkit", "nvidia-cuda-nvcc", "nvidia-cuda-cccl", "nvidia-cuda-runtime"} <= set(toolkit)
    shared = set(toolkit) & set(venv)
    assert {"cuda-toolkit", "nvidia-cuda-runtime"} <= shared  # both: the venv keeps its own copy
    # torch 2.15.0's cuda-toolkit pin has no cccl extra, but nvidia-nvshmem-cu13 takes any nvidia-cuda-cccl: the venv's
    # is the toolkit's (resolved first, its versions constraining the venv's), not the newest the index has
    assert "nvidia-cuda-cccl" in shared
    assert {name: toolkit[name] for name in shared} == {name: venv[name] for name in shared}
