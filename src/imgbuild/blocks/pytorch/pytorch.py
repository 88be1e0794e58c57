"""pytorch: PyTorch from the package index (the default Linux wheels: they carry CUDA and NCCL) or the base image.

The NCCL block takes PyTorch's NCCL pin, so the NCCL of the image is the one PyTorch was built with. The lock keeps
the CUDA wheels (details.cuda_wheels, space-separated requirements), so the first layer's RUN is the same text for
every release that pins the same wheels (2.9.0 and 2.9.1, say): a torch patch bump re-sends only the torch layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from packaging.version import Version
from pydantic import Field

import imgbuild.blocks._releases as releases
from imgbuild import probes
from imgbuild.blocks._block import Block, PythonDists, PythonSets, Released, Tracks
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution, Tracked
from imgbuild.blocks._releases import Text
from imgbuild.blocks.cuda import arch as cuda_arch
from imgbuild.blocks.python import require_venv
from imgbuild.checks import CheckContext, Ran, check, compare, fail, passed, skip
from imgbuild.checks.results import CheckResult
from imgbuild.core import platforms
from imgbuild.core.errors import ImgbuildError, IndexLookupError
from imgbuild.core.fields import Strict, pin_validator
from imgbuild.core.paths import display


@dataclass(frozen=True)
class TorchWheel:
    """What the default Linux wheel of a PyTorch release pins on one machine: its NCCL wheel, the CUDA it is built
    for, and its CUDA and NCCL requirements as its Requires-Dist states them (markers evaluated and dropped, sorted)."""

    nccl_package: str
    nccl: str
    cuda: str
    cuda_wheels: tuple[str, ...]


class TorchRow(releases.Row):
    """A PyTorch release's x86_64 wheel pins; `aarch64`: its aarch64 wheel was read and pins the same (a CUDA build)."""

    nccl_package: Text
    nccl: Text
    cuda: Text
    cuda_wheels: tuple[Text, ...] = Field(min_length=1)
    aarch64: bool = False

    def wheel(self) -> TorchWheel:
        return TorchWheel(self.nccl_package, self.nccl, self.cuda, tuple(self.cuda_wheels))


class TorchFile(releases.ReleaseFile):
    component: Literal["pytorch"]
    aarch64_cuda_from: Text  # the first release whose aarch64 wheel is a CUDA build
    releases: tuple[TorchRow, ...]


def release_file() -> TorchFile:
    return releases.component_file("pytorch", TorchFile)


def _rows(machine: str) -> list[TorchRow]:
    """The releases releases.yaml records a wheel of for Linux on `machine` (aarch64: those marked `aarch64`)."""
    return [r for r in release_file().releases if machine == "x86_64" or r.aarch64]


def torch_wheel(version: str, machine: str) -> TorchWheel | None:
    """releases.yaml's record of torch `version`'s wheel for Linux on `machine` (None: not listed for it)."""
    rows = [r for r in _rows(machine) if r.version == version]
    return rows[0].wheel() if rows else None


def listed(machine: str) -> list[str]:
    """The releases releases.yaml records for `machine`."""
    return [r.version for r in _rows(machine)]


def shipped() -> dict[str, TorchWheel]:
    """Every release releases.yaml records, with what its x86_64 wheel pins."""
    return {r.version: r.wheel() for r in release_file().releases}


def torch_cpu_only(version: str, machine: str) -> bool:
    """Whether torch `version`'s wheel for Linux on `machine` is known to be a CPU build (aarch64 before
    releases.yaml's aarch64_cuda_from)."""
    try:
        return machine == "aarch64" and Version(version) < Version(release_file().aarch64_cuda_from)
    except ValueError:
        return False


def torch_wheel_has_arch(torch: str, cuda: str, arch: str) -> bool:
    """Whether the default wheel of `torch` (built for `cuda`) carries kernels for `arch`.

    cu12.1-12.6 wheels include sm_70; cu12.8 wheels dropped it in 2.11; cu13 wheels never had it. sm_103 (B300) is in
    no wheel's list: PyTorch builds its cu12.8 wheels for "7.0;7.5;8.0;8.6;9.0;10.0;12.0" (pytorch/pytorch
    .ci/manywheel/build_cuda.sh, read here up to its 12.9 entry, the same list +PTX) and a torch 2.11.0+cu130 wheel
    reports sm_75/80/86/90/100/120 (a third party's reading of torch.cuda.get_arch_list()). B300 runs them through
    their sm_100 code: CUDA runs code built for compute capability X.y on X.z with z >= y (accelerator_mismatch in
    cluster/jobplan.py keeps the same rule), except the arch-specific sm_100a (NVIDIA's blog "Blackwell and CUDA 12.9
    introduce family-specific architecture features"); an fbgemm-gpu wheel with only sm_100a cubins fails on B300
    with "no kernel image is available" (pytorch/FBGEMM issue 6151), where torch 2.12.1+cu130's own
    torch.zeros(..., device="cuda") ran first. So sm_103 is taken as present where sm_100 is (CUDA 12.8 wheels and
    newer): inferred, not run on a B300 here. Every other architecture is taken as present: that the cu12.8 and cu13
    wheels carry sm_100 (B200, GB200) is inferred likewise, and so are sm_75 to sm_90 in every wheel listed.
    """
    if arch == "sm_103":
        return Version(cuda) >= Version("12.8")
    if arch != "sm_70":
        return True
    major, minor = (int(x) for x in cuda.split(".")[:2])
    if major >= 13:
        return False
    if (major, minor) >= (12, 8):
        return Version(torch) < Version("2.11")
    return True


class PyTorch(Strict):
    """PyTorch: pip from the configured index (the default wheels), or already in the base image."""

    source: Literal["pip", "base"] = "pip"
    """pip: pip-installs it into the venv in the runtime stage, in two layers: the CUDA and NCCL wheels the release
    pins, then `torch==VERSION` (and numpy) | base: the base image has it (Gaudi)."""
    version: str
    """The release; its wheel's pins (CUDA, nvidia-nccl-cuXX, every CUDA wheel) come from the shipped table, else from
    the wheel's METADATA on the index."""
    numpy: str | None = "2.2.6"
    """The numpy installed beside torch (without it torch warns "Failed to initialize NumPy"); null for none."""
    _pin = pin_validator("version", "numpy")


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _toolkit_rule(version: str, wheel: TorchWheel, toolkit: str, rs: Resolution) -> None:
    """With CUDA's toolkit from wheels (`cuda.source: wheel`), what compiles in the builder must be the CUDA release the
    image runs: the cuda-toolkit version torch's wheel requires."""
    from packaging.requirements import Requirement

    pinned = next(
        (
            str(s.version)
            for r in wheel.cuda_wheels
            if (q := Requirement(r)).name == "cuda-toolkit"
            for s in q.specifier
        ),
        None,
    )
    if pinned is None:
        raise rs.fail(
            "cuda.source / components.pytorch.version",
            f"torch {version}'s wheel requires no cuda-toolkit release (its CUDA wheels: "
            f"{', '.join(wheel.cuda_wheels)}), so the toolkit wheels cannot be matched to it",
            hint="use source: base",
        )
    if pinned != toolkit:
        raise rs.fail(
            "cuda.version / components.pytorch.version",
            f"torch {version}'s wheel requires cuda-toolkit {pinned}; the toolkit wheels must be that release, "
            f"got {toolkit}",
            hint=f"cuda.version: {pinned}",
        )


def _wheel(version: str, machine: str, rs: Resolution) -> tuple[TorchWheel, str]:
    """What torch `version`'s wheel for Linux on `machine` pins, and where that was read: releases.yaml, else the
    package index (rs.lookup("pytorch")). A release whose wheel for the machine is a CPU build is refused, naming the
    first release with a CUDA build there."""
    arch = {m: a for a, m in platforms.MACHINE.items()}[machine]
    cpu_only = (
        f"torch {version}'s wheel for linux/{arch} ({machine}) is a CPU build (no CUDA, no NCCL); the first release "
        f"with a CUDA build for {machine} is {release_file().aarch64_cuda_from}"
    )
    if torch_cpu_only(version, machine):
        raise rs.fail("components.pytorch.version / platform.arch", cpu_only)
    wheel = torch_wheel(version, machine)
    if wheel is not None:
        return wheel, f"torch {version} wheel (shipped table)"
    lookup = rs.lookup("pytorch")
    if lookup is None:
        known = listed(machine)
        raise rs.fail(
            "components.pytorch.version",
            f"torch {version}{'' if machine == 'x86_64' else f' ({machine})'} is not in the shipped table and "
            "index lookups are off",
            hint=f"known releases: {', '.join(known)}",
        )
    try:
        wheel = lookup(version, machine)
    except IndexLookupError as exc:
        if "names no nvidia-nccl" in exc.message and machine != "x86_64":
            raise rs.fail("components.pytorch.version / platform.arch", cpu_only) from None
        # the index could not answer: exit 7, not a version conflict
        raise IndexLookupError(
            f"{display(rs.path)}: components.pytorch.version: torch {version} is not in the shipped table "
            f"and the index lookup failed: {exc.message}",
            hint=exc.hint,
        ) from None
    except ImgbuildError as exc:
        raise rs.fail(
            "components.pytorch.version",
            f"torch {version} is not in the shipped table and the index lookup failed: {exc}",
        ) from None
    return wheel, f"torch {version} wheel METADATA (package index)"


class PyTorchDetails(Details):
    """A pip-installed PyTorch's pin: what its wheel pins (its CUDA, its NCCL wheel, every CUDA wheel it requires,
    read from the wheel's METADATA or the shipped table) and the numpy the recipe asks for. A PyTorch that comes
    with the base image has none of them."""

    cuda: str | None = None
    nccl_package: str | None = None
    nccl: str | None = None
    cuda_wheels: tuple[str, ...] = ()
    numpy: str | None = None

    def wheel(self) -> TorchWheel | None:
        """The wheel's pins as the resolver's table has them (what a lock's pin says, without the network)."""
        if not (self.nccl_package and self.nccl and self.cuda and self.cuda_wheels):
            return None
        return TorchWheel(self.nccl_package, self.nccl, self.cuda, self.cuda_wheels)


# Measured for torch 2.9.1 on BuildKit (pip's downloads 4.0 GB, the two runtime layers 4.14 + 2.56 GB): the engine
# needs about 16 GB free for a build with an empty pip cache: the wheels kept in the pip cache mount (4.0 GB, once
# per machine), pip's temporary copy of what one step downloads (up to 3.3 GB, the CUDA wheels) and the layers while
# they are written and committed (6.7 GB); no builder-stage copy of torch any more. With the wheels already cached a
# rebuild needs the layers alone (about 7 GB), but the check cannot know that, so it asks for the cold figure.
PIP_BUILD_DISK_GB = 16.0


class PytorchBlock(Block, PythonSets, PythonDists, Released, Tracks):
    name = "pytorch"
    options = PyTorch
    modes = {"pip": "fragment", "base": "provided"}
    details = PyTorchDetails
    requirements_stage = "runtime"
    after = ("python",)
    tag = (2, "pt")
    node_checks = ("ddp (mpirun)", "ddp (torchrun)")  # a DistributedDataParallel training across the nodes
    under_os_packages = True  # its wheels need only the venv: an OS package or EFA bump leaves their 7 GB cached

    def resolve(self, t: PyTorch, rs: Resolution) -> Pin:
        if t.source == "base":
            return Pin(version=t.version, source="base", origin="base image", details=PyTorchDetails())
        require_venv(rs)
        wheel, origin = None, ""
        for arch in rs.recipe.platform.arch:  # the same pins on every architecture, or the recipe is refused
            found, where = _wheel(t.version, platforms.MACHINE[arch], rs)
            if wheel is not None and found != wheel:
                raise rs.fail(
                    "components.pytorch.version / platform.arch",
                    f"torch {t.version}'s wheels pin different CUDA or NCCL wheels on {rs.recipe.platform.arch[0]} "
                    f"({wheel.nccl_package} {wheel.nccl}, CUDA {wheel.cuda}) and {arch} ({found.nccl_package} "
                    f"{found.nccl}, CUDA {found.cuda}): one image index cannot hold both",
                    hint="build the architectures from separate recipes",
                )
            wheel, origin = found, origin or where
        assert wheel is not None
        p, cuda = rs.recipe.platform, rs.recipe.cuda
        if p.accelerator == "nvidia":
            assert cuda is not None and p.gpu_arch is not None
            if _major(wheel.cuda) != _major(cuda.version):
                raise rs.fail(
                    "components.pytorch.version / cuda.version",
                    f"torch {t.version} wheels are built for CUDA {wheel.cuda}, the base has CUDA "
                    f"{cuda.version}: the major versions must match",
                )
            if cuda.source == "wheel":
                _toolkit_rule(t.version, wheel, cuda.version, rs)
            if not torch_wheel_has_arch(t.version, wheel.cuda, p.gpu_arch):
                gpu = cuda_arch(p.gpu_arch).gpu
                raise rs.fail(
                    "components.pytorch.version / platform.gpu_arch",
                    f"torch {t.version} wheels (CUDA {wheel.cuda}) have no {p.gpu_arch} kernels, so they "
                    f"don't run on {gpu}",
                    hint="V100 needs a PyTorch built for CUDA 12.6 or older (e.g. 2.7.1)"
                    if p.gpu_arch == "sm_70"
                    else "use a PyTorch built for CUDA 12.8 or newer",
                )
        details = PyTorchDetails(
            cuda=wheel.cuda,
            nccl_package=wheel.nccl_package,
            nccl=wheel.nccl,
            cuda_wheels=wheel.cuda_wheels,
            numpy=t.numpy,
        )
        return Pin(version=t.version, source="pip", origin=origin, details=details)

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        return Contribution(name="pytorch", build_disk_gb=PIP_BUILD_DISK_GB if pin.source == "pip" else 0.0)

    def requirements(self, pin: Pin, ctx: Context) -> dict[str, list[str]]:
        """Two layers (pip): the CUDA and NCCL wheels the release pins, then torch and numpy (their closure less what
        the first layer and the sets before it hold)."""
        if pin.source != "pip":
            return {}
        d = pin.typed(PyTorchDetails)
        return {
            "pytorch/cuda": list(d.cuda_wheels),
            "pytorch/torch": [f"torch=={pin.version}", *([f"numpy=={d.numpy}"] if d.numpy else [])],
        }

    # a base image's torch (Habana's): requirement sets resolve against it and never install PyPI's over it
    def python_dists(self, pin: Pin) -> Mapping[str, str]:
        return {"torch": pin.version} if pin.source == "base" and pin.version else {}

    def release_file(self) -> releases.ReleaseFile:
        return release_file()

    def track(self, pin: Pin, resolved: Any, files: Callable[[str], Any]) -> list[Tracked]:
        """`imgbuild outdated`: torch's releases on the package index, and numpy's beside it."""
        if pin.source != "pip":
            return [Tracked("base", fixed="comes with the base image")]
        numpy = pin.typed(PyTorchDetails).numpy
        index = Tracked("index", "torch", keys=("components", "pytorch", "version"))
        return [
            index,
            *(
                [Tracked("index", "numpy", ("components", "pytorch", "numpy"), component="numpy", current=numpy)]
                if numpy
                else []
            ),
        ]


BLOCK = PytorchBlock()


def torch_probe(ctx: CheckContext) -> tuple[Any, Ran]:
    return ctx.once("torch", lambda: ctx.python_json(probes.text("torch_nccl.py"), timeout_s=120))


@check("pytorch-version", "pytorch")
def pytorch_version(ctx: CheckContext) -> CheckResult:
    """torch imports and is the pinned release (local version labels such as +cu128 are ignored)."""
    data, ran = torch_probe(ctx)
    if data is None:
        return fail(f"import torch: {ran.why()}", expected=ctx.version("pytorch") or "torch")
    found = str(data["version"])
    expected = ctx.version("pytorch")
    base = re.match(r"\d+(\.\d+)*", found)
    result = compare(expected, base.group(0) if base else found, "torch", full=found, cuda=data.get("cuda"))
    gpu = "a GPU" if data.get("cuda_available") else "no GPU"
    return replace(result, reason=result.reason or f"imports; torch.cuda sees {gpu}")


# The GPU checks through torch: registered with the platform's (they run for every image, after its other checks,
# and skip without a GPU or without PyTorch).
GPU_TIMEOUT_S = 240


def _without_gpu_or_torch(ctx: CheckContext) -> CheckResult | None:
    """Why a GPU check through torch does not run here (no GPU passed in, or no PyTorch in the image), else None."""
    if not ctx.gpu:
        return skip(ctx.gpu_reason)
    if not ctx.has("pytorch"):
        return skip("PyTorch is not in the image")
    return None


@check("gpu-torch-cuda", "platform")
def gpu_torch_cuda(ctx: CheckContext) -> CheckResult:
    """torch.cuda.is_available() with the GPUs passed in."""
    if (skipped := _without_gpu_or_torch(ctx)) is not None:
        return skipped
    code = "import json, torch; print(json.dumps([torch.cuda.is_available(), torch.cuda.device_count()]))"
    data, ran = ctx.python_json(code, timeout_s=120)
    if data is None:
        return fail(f"import torch: {ran.why()}", expected="available")
    if not data[0]:
        return fail("torch.cuda.is_available() is False", expected="available", found="not available")
    return passed("available", f"{data[1]} device(s)")


@check("gpu-nccl-allreduce", "platform")
def gpu_nccl_allreduce(ctx: CheckContext) -> CheckResult:
    """A one-GPU NCCL all_reduce through torch.distributed (world_size 1, nccl backend)."""
    if (skipped := _without_gpu_or_torch(ctx)) is not None:
        return skipped
    data, ran = ctx.python_json(probes.text("gpu_allreduce.py"), timeout_s=GPU_TIMEOUT_S)
    if data is None:
        return fail(f"all_reduce failed: {ran.why()}", expected="2.0")
    if data["value"] != 2.0:
        return fail(f"all_reduce of 2.0 over one rank gave {data['value']}", expected="2.0", found=str(data["value"]))
    return passed("2.0", "2.0", "nccl backend, world_size 1")
