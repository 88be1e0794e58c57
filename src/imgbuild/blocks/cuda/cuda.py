"""cuda: the target's CUDA toolkit, where the compiled parts (NCCL from source, nccl-tests, the plugin, GDRCopy) find
nvcc, the headers and cudart. The recipe's top-level `cuda:` section (every nvidia platform has one).

Its pin rule checks the version against the GPU architecture (releases.yaml's `arches`: the oldest CUDA that builds
for it; its `known_bad`: CUDA 13 has no sm_70). releases.yaml also holds each CUDA major's oldest driver, which
`driver` (the host's driver against an image's CUDA) reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from packaging.version import Version

import imgbuild.blocks._releases as releases
from imgbuild.blocks._block import Block, PythonSets, Released, Tracks
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution, Tracked
from imgbuild.blocks._releases import Text
from imgbuild.blocks.python import require_venv
from imgbuild.core import platforms
from imgbuild.core.fields import AbsPath, Strict, pin_validator

# The toolkit's parts a build needs from the cuda-toolkit wheels: nvcc (with crt and nvvm), the CCCL headers
# (thrust, cub, libcu++: nvcc's profile adds include/cccl), cudart (headers, libcudart.so.N, libcudart_static.a).
TOOLKIT_EXTRAS = ("nvcc", "cccl", "cudart")
# CUDA 12's nvidia-cuda-nvcc-cu12 wheel has no nvcc binary (only ptxas and headers): wheels compile from CUDA 13 on.
WHEEL_MIN_CUDA = "13"
# Where pip puts the toolkit's wheels in the builder (--target, outside the venv) before they are laid out as `home`.
WHEEL_TARGET = "/tmp/imgbuild-cuda-wheels"


class Cuda(Strict):
    """The target's CUDA toolkit: the base image's (nvidia/cuda), or the cuda-toolkit wheels PyTorch pins."""

    version: str
    """base: the base image's CUDA (nvidia/cuda's tag); wheel: the cuda-toolkit wheels' release, which must be the one
    PyTorch's wheel pins (torch 2.13.0: cuda-toolkit 13.0.3)."""
    source: Literal["base", "wheel"] = "base"
    """base: the base image brings the toolkit (nvidia/cuda: -devel compiles, -runtime ships); wheel: the cuda-toolkit
    wheels (nvcc, cccl, cudart) in the builder only, laid out as `home` the way nvcc.profile and the makefiles
    expect; the runtime libraries are PyTorch's own CUDA wheels."""
    home: AbsPath = "/usr/local/cuda"
    """CUDA_HOME in the builder."""
    _pin = pin_validator("version")


class CudaDetails(Details):
    """The `cuda` pin: `prefix` is CUDA_HOME (in the builder), with the GPU architecture it compiles for."""

    gpu_arch: str
    gencode: str  # nvcc's -gencode flags for gpu_arch


class CudaRow(releases.Row):
    """A CUDA major release (`version`: 13) and the oldest Linux driver that runs every minor release of it."""

    driver: Text


class Arch(releases.Fact):
    """A GPU architecture: its GPU, and the oldest CUDA whose nvcc builds SASS for it."""

    gpu: Text
    min_cuda: Text


class CudaFile(releases.ReleaseFile):
    component: Literal["cuda"]
    releases: tuple[CudaRow, ...]
    arches: dict[str, Arch]


def release_file() -> CudaFile:
    return releases.component_file("cuda", CudaFile)


def arch(gpu_arch: str) -> Arch:
    """A GPU architecture's row (the recipe schema admits only those the file lists)."""
    return release_file().arches[gpu_arch]


def arches() -> tuple[str, ...]:
    """The GPU architectures the file lists (platform.gpu_arch's values)."""
    return tuple(release_file().arches)


def gencode(gpu_arch: str) -> str:
    """nvcc -gencode for one architecture (SASS for it, no PTX)."""
    num = gpu_arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def driver_floors() -> dict[int, str]:
    """CUDA major -> the oldest driver that runs every minor release of it."""
    return {int(r.version): r.driver for r in release_file().releases}


def _major(version: str) -> int:
    return int(version.split(".")[0])


def toolkit_requirement(version: str) -> str:
    """The requirement that installs the toolkit's compile parts from wheels: the cuda-toolkit metapackage's extras
    (the same metapackage PyTorch's wheel requires, at the release it pins)."""
    return f"cuda-toolkit[{','.join(TOOLKIT_EXTRAS)}]=={version}"


def wheel_dir(pin: Pin) -> str:
    """Where the CUDA wheels of the pin's major release keep bin/, include/ and lib/ below site-packages (or a pip
    --target): nvidia/cu13 (CUDA 13's wheels put every component there)."""
    return f"nvidia/cu{_major(str(pin.version))}"


def runtime_lib(ctx: Context) -> str | None:
    """Where libcudart.so.N is in the runtime image: the base image's CUDA_HOME/lib64, or, with the toolkit from
    wheels, PyTorch's CUDA wheels in the venv (nvidia/cuNN/lib). None without CUDA."""
    pin = ctx.pin("cuda")
    if pin is None:
        return None
    if pin.source == "wheel":
        from imgbuild.blocks.python import site_packages

        py = ctx.pin("python")
        where = site_packages(py) if py is not None else None
        return f"{where}/{wheel_dir(pin)}/lib" if where else None
    return f"{pin.details.prefix}/lib64"


def template_target(ctx: Context) -> str:
    """CUDA's name of the architecture's target directory (targets/x86_64-linux, targets/sbsa-linux), where
    nvcc.profile looks for include/ and lib/."""
    return platforms.CUDA_TARGET[ctx.arch]


class CudaBlock(Block, PythonSets, Released, Tracks):
    name = "cuda"
    options = Cuda
    modes = {"base": "provided", "wheel": "fragment"}
    details = CudaDetails
    build_after = ("python",)  # the toolkit's wheels install with the venv's pip
    tag = (3, "cuda")
    requirements_apart = ("cuda",)
    top_level = True
    template_globals = {
        "cuda_wheel_dir": wheel_dir,
        "cuda_wheel_target": lambda: WHEEL_TARGET,
        "cuda_target_dir": template_target,
        "cuda_runtime_lib": runtime_lib,
    }

    def resolve(self, cuda: Cuda, rs: Resolution) -> Pin:
        p = rs.recipe.platform
        if p.accelerator != "nvidia":
            raise rs.fail("cuda", f"only nvidia platforms take cuda, this one is '{p.accelerator}'")
        assert p.gpu_arch is not None  # the schema guarantees it on nvidia platforms
        row = arch(p.gpu_arch)
        if Version(cuda.version) < Version(row.min_cuda):
            raise rs.fail("cuda.version", f"{p.gpu_arch} ({row.gpu}) needs CUDA >= {row.min_cuda}, got {cuda.version}")
        origin = "recipe"
        if cuda.source == "wheel":
            if _major(cuda.version) < int(WHEEL_MIN_CUDA):
                raise rs.fail(
                    "cuda.source",
                    f"CUDA {cuda.version}'s toolkit wheels have no nvcc binary (nvidia-cuda-nvcc-cu12 carries only "
                    f"ptxas and headers): wheels compile from CUDA {WHEEL_MIN_CUDA} on",
                    hint="use source: base with an nvidia/cuda -devel builder, or CUDA 13",
                )
            require_venv(rs)
            origin = "cuda-toolkit wheels, builder only"
        details = CudaDetails(prefix=cuda.home, gpu_arch=p.gpu_arch, gencode=gencode(p.gpu_arch))
        return Pin(version=cuda.version, source=cuda.source, origin=origin, details=details)

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="cuda")
        if pin.source == "wheel":
            # What was compiled against the toolkit (nccl-tests, the plugin) loads libcudart.so.N from PyTorch's wheels.
            lib = runtime_lib(ctx)
            if lib:
                c.ld_library_path.append(lib)
        return c

    def requirements(self, pin: Pin, ctx: Context) -> dict[str, list[str]]:
        return {"cuda": [toolkit_requirement(str(pin.version))]} if pin.source == "wheel" else {}

    def release_file(self) -> releases.ReleaseFile:
        return release_file()

    def track(self, pin: Pin, resolved: Any, files: Callable[[str], Any]) -> list[Tracked]:
        """`imgbuild outdated`: the toolkit wheels follow PyTorch; a base image's CUDA is checked against the CUDA
        releases PyTorch's wheels are built for (pytorch's releases.yaml)."""
        if pin.source == "wheel":
            return [Tracked("follows", "pytorch", fixed="its toolkit wheels are the cuda-toolkit release PyTorch pins")]
        built_for = sorted({r.cuda for r in files("pytorch").releases}, key=lambda v: Version(v))
        fixed = "CUDA comes with the base image: change cuda.version, base.tag and base.builder_tag together"
        return [Tracked("table", "pytorch", ("cuda", "version"), tuple(built_for), fixed)]


BLOCK = CudaBlock()
