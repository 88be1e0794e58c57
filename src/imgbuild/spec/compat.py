"""The shipped compatibility tables the resolver proves recipes against.

Sources: PyTorch wheel METADATA (Requires-Dist), NVIDIA/nccl's plugin loader, HabanaAI/Setup_and_Install, Debian and
Ubuntu package archives. Entries marked "inferred" were not read in a source; the resolver treats them as facts, so
correct them here when a source says otherwise. The releases of the components built from their publishers'
artifacts (EFA installer, aws-ofi-nccl, nccl-tests, GDRCopy) are data files their blocks own: blocks/releases/.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class TorchWheel:
    """What the default Linux x86_64 wheel of a PyTorch release pins.

    cuda_wheels: its CUDA and NCCL requirements (the `nvidia-*` ones and, from 2.11, `cuda-toolkit[...]`), as its
    Requires-Dist states them for Linux x86_64 (markers evaluated and dropped), sorted. The image installs them in a
    layer before torch's own, so a torch release that keeps them rebuilds only the torch layer.
    """

    nccl_package: str
    nccl: str
    cuda: str
    cuda_wheels: tuple[str, ...]


def _pins(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Read from each release's manylinux x86_64 wheel METADATA on the package index (imgbuild.pin.pypi.torch_pins).
# 2.9.0 and 2.9.1 pin the same CUDA and NCCL wheels (their Requires-Dist differ only in triton 3.5.0 / 3.5.1): a torch
# patch bump that rebuilds only the torch layer. So do 2.12.0 / 2.12.1 and 2.14.0 / 2.14.1 (not in the table).
# 2.15.0 is built for CUDA 13.2 (cuda-toolkit==13.2.2), not 13.0 as this table said before its wheels were read.
_CU128_NCCL_2_27_5 = _pins(
    "nvidia-cublas-cu12==12.8.4.1 nvidia-cuda-cupti-cu12==12.8.90 nvidia-cuda-nvrtc-cu12==12.8.93 "
    "nvidia-cuda-runtime-cu12==12.8.90 nvidia-cudnn-cu12==9.10.2.21 nvidia-cufft-cu12==11.3.3.83 "
    "nvidia-cufile-cu12==1.13.1.3 nvidia-curand-cu12==10.3.9.90 nvidia-cusolver-cu12==11.7.3.90 "
    "nvidia-cusparse-cu12==12.5.8.93 nvidia-cusparselt-cu12==0.7.1 nvidia-nccl-cu12==2.27.5 "
    "nvidia-nvjitlink-cu12==12.8.93 nvidia-nvshmem-cu12==3.3.20 nvidia-nvtx-cu12==12.8.90"
)

TORCH: dict[str, TorchWheel] = {
    "2.1.2": TorchWheel(
        "nvidia-nccl-cu12",
        "2.18.1",
        "12.1",
        _pins(
            "nvidia-cublas-cu12==12.1.3.1 nvidia-cuda-cupti-cu12==12.1.105 nvidia-cuda-nvrtc-cu12==12.1.105 "
            "nvidia-cuda-runtime-cu12==12.1.105 nvidia-cudnn-cu12==8.9.2.26 nvidia-cufft-cu12==11.0.2.54 "
            "nvidia-curand-cu12==10.3.2.106 nvidia-cusolver-cu12==11.4.5.107 nvidia-cusparse-cu12==12.1.0.106 "
            "nvidia-nccl-cu12==2.18.1 nvidia-nvtx-cu12==12.1.105"
        ),
    ),
    "2.2.2": TorchWheel(
        "nvidia-nccl-cu12",
        "2.19.3",
        "12.1",
        _pins(
            "nvidia-cublas-cu12==12.1.3.1 nvidia-cuda-cupti-cu12==12.1.105 nvidia-cuda-nvrtc-cu12==12.1.105 "
            "nvidia-cuda-runtime-cu12==12.1.105 nvidia-cudnn-cu12==8.9.2.26 nvidia-cufft-cu12==11.0.2.54 "
            "nvidia-curand-cu12==10.3.2.106 nvidia-cusolver-cu12==11.4.5.107 nvidia-cusparse-cu12==12.1.0.106 "
            "nvidia-nccl-cu12==2.19.3 nvidia-nvtx-cu12==12.1.105"
        ),
    ),
    "2.3.1": TorchWheel(
        "nvidia-nccl-cu12",
        "2.20.5",
        "12.1",
        _pins(
            "nvidia-cublas-cu12==12.1.3.1 nvidia-cuda-cupti-cu12==12.1.105 nvidia-cuda-nvrtc-cu12==12.1.105 "
            "nvidia-cuda-runtime-cu12==12.1.105 nvidia-cudnn-cu12==8.9.2.26 nvidia-cufft-cu12==11.0.2.54 "
            "nvidia-curand-cu12==10.3.2.106 nvidia-cusolver-cu12==11.4.5.107 nvidia-cusparse-cu12==12.1.0.106 "
            "nvidia-nccl-cu12==2.20.5 nvidia-nvtx-cu12==12.1.105"
        ),
    ),
    "2.4.1": TorchWheel(
        "nvidia-nccl-cu12",
        "2.20.5",
        "12.1",
        _pins(
            "nvidia-cublas-cu12==12.1.3.1 nvidia-cuda-cupti-cu12==12.1.105 nvidia-cuda-nvrtc-cu12==12.1.105 "
            "nvidia-cuda-runtime-cu12==12.1.105 nvidia-cudnn-cu12==9.1.0.70 nvidia-cufft-cu12==11.0.2.54 "
            "nvidia-curand-cu12==10.3.2.106 nvidia-cusolver-cu12==11.4.5.107 nvidia-cusparse-cu12==12.1.0.106 "
            "nvidia-nccl-cu12==2.20.5 nvidia-nvtx-cu12==12.1.105"
        ),
    ),
    "2.5.1": TorchWheel(
        "nvidia-nccl-cu12",
        "2.21.5",
        "12.4",
        _pins(
            "nvidia-cublas-cu12==12.4.5.8 nvidia-cuda-cupti-cu12==12.4.127 nvidia-cuda-nvrtc-cu12==12.4.127 "
            "nvidia-cuda-runtime-cu12==12.4.127 nvidia-cudnn-cu12==9.1.0.70 nvidia-cufft-cu12==11.2.1.3 "
            "nvidia-curand-cu12==10.3.5.147 nvidia-cusolver-cu12==11.6.1.9 nvidia-cusparse-cu12==12.3.1.170 "
            "nvidia-nccl-cu12==2.21.5 nvidia-nvjitlink-cu12==12.4.127 nvidia-nvtx-cu12==12.4.127"
        ),
    ),
    "2.6.0": TorchWheel(
        "nvidia-nccl-cu12",
        "2.21.5",
        "12.4",
        _pins(
            "nvidia-cublas-cu12==12.4.5.8 nvidia-cuda-cupti-cu12==12.4.127 nvidia-cuda-nvrtc-cu12==12.4.127 "
            "nvidia-cuda-runtime-cu12==12.4.127 nvidia-cudnn-cu12==9.1.0.70 nvidia-cufft-cu12==11.2.1.3 "
            "nvidia-curand-cu12==10.3.5.147 nvidia-cusolver-cu12==11.6.1.9 nvidia-cusparse-cu12==12.3.1.170 "
            "nvidia-cusparselt-cu12==0.6.2 nvidia-nccl-cu12==2.21.5 nvidia-nvjitlink-cu12==12.4.127 "
            "nvidia-nvtx-cu12==12.4.127"
        ),
    ),
    "2.7.1": TorchWheel(
        "nvidia-nccl-cu12",
        "2.26.2",
        "12.6",
        _pins(
            "nvidia-cublas-cu12==12.6.4.1 nvidia-cuda-cupti-cu12==12.6.80 nvidia-cuda-nvrtc-cu12==12.6.77 "
            "nvidia-cuda-runtime-cu12==12.6.77 nvidia-cudnn-cu12==9.5.1.17 nvidia-cufft-cu12==11.3.0.4 "
            "nvidia-cufile-cu12==1.11.1.6 nvidia-curand-cu12==10.3.7.77 nvidia-cusolver-cu12==11.7.1.2 "
            "nvidia-cusparse-cu12==12.5.4.2 nvidia-cusparselt-cu12==0.6.3 nvidia-nccl-cu12==2.26.2 "
            "nvidia-nvjitlink-cu12==12.6.85 nvidia-nvtx-cu12==12.6.77"
        ),
    ),
    "2.8.0": TorchWheel(
        "nvidia-nccl-cu12",
        "2.27.3",
        "12.8",
        _pins(
            "nvidia-cublas-cu12==12.8.4.1 nvidia-cuda-cupti-cu12==12.8.90 nvidia-cuda-nvrtc-cu12==12.8.93 "
            "nvidia-cuda-runtime-cu12==12.8.90 nvidia-cudnn-cu12==9.10.2.21 nvidia-cufft-cu12==11.3.3.83 "
            "nvidia-cufile-cu12==1.13.1.3 nvidia-curand-cu12==10.3.9.90 nvidia-cusolver-cu12==11.7.3.90 "
            "nvidia-cusparse-cu12==12.5.8.93 nvidia-cusparselt-cu12==0.7.1 nvidia-nccl-cu12==2.27.3 "
            "nvidia-nvjitlink-cu12==12.8.93 nvidia-nvtx-cu12==12.8.90"
        ),
    ),
    "2.9.0": TorchWheel("nvidia-nccl-cu12", "2.27.5", "12.8", _CU128_NCCL_2_27_5),
    "2.9.1": TorchWheel("nvidia-nccl-cu12", "2.27.5", "12.8", _CU128_NCCL_2_27_5),
    "2.10.0": TorchWheel(
        "nvidia-nccl-cu12",
        "2.27.5",
        "12.8",
        _pins(
            "nvidia-cublas-cu12==12.8.4.1 nvidia-cuda-cupti-cu12==12.8.90 nvidia-cuda-nvrtc-cu12==12.8.93 "
            "nvidia-cuda-runtime-cu12==12.8.90 nvidia-cudnn-cu12==9.10.2.21 nvidia-cufft-cu12==11.3.3.83 "
            "nvidia-cufile-cu12==1.13.1.3 nvidia-curand-cu12==10.3.9.90 nvidia-cusolver-cu12==11.7.3.90 "
            "nvidia-cusparse-cu12==12.5.8.93 nvidia-cusparselt-cu12==0.7.1 nvidia-nccl-cu12==2.27.5 "
            "nvidia-nvjitlink-cu12==12.8.93 nvidia-nvshmem-cu12==3.4.5 nvidia-nvtx-cu12==12.8.90"
        ),
    ),
    "2.11.0": TorchWheel(
        "nvidia-nccl-cu13",
        "2.28.9",
        "13.0",
        _pins(
            "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2 "
            "nvidia-cudnn-cu13==9.19.0.56 nvidia-cusparselt-cu13==0.8.0 nvidia-nccl-cu13==2.28.9 "
            "nvidia-nvshmem-cu13==3.4.5"
        ),
    ),
    "2.12.1": TorchWheel(
        "nvidia-nccl-cu13",
        "2.29.7",
        "13.0",
        _pins(
            "cuda-toolkit[cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2 "
            "nvidia-cublas<=13.1.1.3,>=13.1.0.3 nvidia-cudnn-cu13==9.20.0.48 nvidia-cusparselt-cu13==0.8.1 "
            "nvidia-nccl-cu13==2.29.7 nvidia-nvshmem-cu13==3.4.5"
        ),
    ),
    "2.13.0": TorchWheel(
        "nvidia-nccl-cu13",
        "2.29.7",
        "13.0",
        _pins(
            "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3 "
            "nvidia-cudnn-cu13==9.20.0.48 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.29.7 "
            "nvidia-nvshmem-cu13==3.4.5"
        ),
    ),
    "2.14.1": TorchWheel(
        "nvidia-nccl-cu13",
        "2.30.7",
        "13.0",
        _pins(
            "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3 "
            "nvidia-cudnn-cu13==9.24.0.43 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 "
            "nvidia-nvshmem-cu13==3.4.5"
        ),
    ),
    "2.15.0": TorchWheel(
        "nvidia-nccl-cu13",
        "2.30.7",
        "13.2",
        _pins(
            "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.2.2 "
            "nvidia-cudnn-cu13==9.26.0.51 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 "
            "nvidia-nvshmem-cu13==3.7.2"
        ),
    ),
}


# Linux aarch64 (linux/arm64) wheels, read from each release's manylinux_2_28_aarch64 cp311 wheel METADATA on the
# package index (2026-11): through 2.10 they are CPU builds (2.9.1's is 99 MiB; its NCCL and CUDA requirements carry
# `platform_machine == "x86_64"` markers); from 2.11.0 they are CUDA builds that pin the same CUDA and NCCL wheels as
# the x86_64 wheel of the release (checked for 2.11.0, 2.13.0 and 2.15.0; 2.15.0's is 461 MiB). A release in neither
# list is read from the index for the target's machine.
FIRST_AARCH64_CUDA_TORCH = "2.11.0"
TORCH_AARCH64: dict[str, TorchWheel] = {v: TORCH[v] for v in ("2.11.0", "2.13.0", "2.15.0")}


def torch_wheel(version: str, machine: str) -> TorchWheel | None:
    """The shipped table's record of torch `version`'s wheel for Linux on `machine` (None: not in the table)."""
    return TORCH.get(version) if machine == "x86_64" else TORCH_AARCH64.get(version)


def torch_cpu_only(version: str, machine: str) -> bool:
    """Whether torch `version`'s wheel for Linux on `machine` is known to be a CPU build (aarch64 before
    FIRST_AARCH64_CUDA_TORCH)."""
    try:
        return machine == "aarch64" and Version(version) < Version(FIRST_AARCH64_CUDA_TORCH)
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
    wheels carry sm_100 (B200, GB200) is inferred likewise, and so are sm_75 to sm_90 in every wheel the table lists.
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


# aws-ofi-nccl keeps backward compatibility down to this NCCL from 1.10.0 on (its RELEASENOTES.md); what each release
# was tested with is in blocks/aws_ofi_nccl/releases.yaml.
PLUGIN_OLDEST_NCCL = "2.17.1"

# NCCL series -> the net-plugin API versions it looks for in a net plugin (libnccl-net*.so), newest first as NCCL tries
# them: the `ncclNetPlugin_vN` symbols it dlsym()s. Read from NVIDIA/nccl at every release tag from v2.17.1-1 to
# v2.30.7-1: src/net.cc up to 2.25 (the dlsym chain), src/plugin/net/net_vN.cc from 2.26 (one file per version, listed
# in src/plugin/net.cc's getNcclNet table). Every release of a series looks for the same versions. A plugin NCCL can
# load exports at least one of them (aws-ofi-nccl 1.21.1 exports v6 to v12).
NCCL_NET_PLUGIN_API: dict[str, tuple[int, ...]] = {
    "2.17": (6, 5, 4),
    "2.18": (6, 5, 4),
    "2.19": (7, 6, 5),
    "2.20": (8, 7, 6, 5),
    "2.21": (8, 7, 6, 5),
    "2.22": (8, 7, 6, 5),
    "2.23": (8, 7, 6, 5),
    "2.24": (9, 8, 7, 6, 5),
    "2.25": (9, 8, 7, 6, 5),
    "2.26": (10, 9, 8, 7, 6),
    "2.27": (10, 9, 8, 7, 6),
    "2.28": (11, 10, 9, 8, 7, 6),
    "2.29": (11, 10, 9, 8, 7, 6),
    "2.30": (12, 11, 10, 9, 8, 7, 6),
}


def net_plugin_api(nccl: str) -> tuple[int, ...] | None:
    """The net-plugin API versions NCCL `nccl` looks for, newest first (None: its series is not in the table)."""
    return NCCL_NET_PLUGIN_API.get(".".join(nccl.split(".")[:2]))


def same_version(a: str, b: str) -> bool:
    """Whether two version strings name one release: equal by PEP 440 (2.27.5 and 2.27.5.0, +cu128 kept), or by
    their text where either is not a PEP 440 version."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def libfabric_release(version: str) -> tuple[int, int, int]:
    """A libfabric version's release number: 2.6.0amzn1.0 -> (2, 6, 0) (AWS's `amznN` builds of one release)."""
    parts = [int(p) for p in re.findall(r"\d+", version.split("amzn")[0])[:3]]
    return (*parts, *[0] * (3 - len(parts)))  # type: ignore[return-value]


def plugin_tag(version: str) -> str:
    """Git tag of an aws-ofi-nccl release: `vX.Y.Z-aws` up to 1.13.2, plain `vX.Y.Z` from 1.14.0."""
    return f"v{version}-aws" if Version(version) < Version("1.14.0") else f"v{version}"


# The EFA installer's releases (what each bundles, the OS releases it installs on) are in blocks/efa/releases.yaml.
EFA_KEY_FINGERPRINT = "4E9091BCBB97A96B26B15E59A05480B1DD2D3CCC"
EFA_CONTAINER_FLAGS = ("-y", "--skip-kmod", "--skip-limit-conf", "--no-verify")

# From 1.48.0 the installer takes an nvidia/cuda base (Docker Hub's nvidia/cuda is NGC's nvcr.io/nvidia/cuda) for
# an "NGC build image": it skips rdma-core, so libfabric1-aws fails its `ibverbs-providers >= 59` dependency
# (`--disable-build-ngc` turns that off), and it skips its NCCL plugin (`--disable-ngc`). AWS's nccl-tests
# Dockerfile passes both (awslabs/awsome-distributed-ai PR #1153, micro-benchmarks/nccl-tests). Which bases the
# installer takes for NGC is inferred from those Dockerfiles (nvidia/cuda and nvcr.io/nvidia/* images), not read
# in the installer.
EFA_NGC_DETECTION = "1.48.0"
NGC_BASE_IMAGES = ("nvidia/cuda", "docker.io/nvidia/cuda", "nvcr.io/nvidia/cuda")


def ngc_base(image: str) -> bool:
    """Whether the EFA installer (1.48+) takes a base image of this name (no tag) for an NGC build image."""
    return image in NGC_BASE_IMAGES or image.startswith("nvcr.io/nvidia/")


@dataclass(frozen=True)
class Distro:
    """Versions a distribution release ships (the packages imgbuild installs from it)."""

    openmpi: str
    libfabric: str
    python: str
    mpi4py: str
    hwloc: str  # libhwloc15 (Debian 12: 2.9.0-1, Ubuntu 22.04: 2.7.0-2ubuntu1, Ubuntu 24.04: 2.10.0-1build1)
    # The C library (libc6: Debian 12 2.36-9, Ubuntu 22.04 2.35-0ubuntu3, Ubuntu 24.04 2.39-0ubuntu8): the newest
    # manylinux_2_XX wheel tag the release runs, the platform `imgbuild lock` resolves wheels for (pin.wheels).
    glibc: str
    # Packages the release's Open MPI pulls in that an image must not carry, each with why: the image gets an empty
    # stand-in instead (render.stub_packages_run). Debian 13's libopenmpi40 links libucx0, and libucx0 depends on ROCm's
    # HIP and HSA runtimes (with libamd-comgr2 and LLVM 17: about 235 MB) that only UCX's ROCm modules
    # (ucx/libuct_rocm.so, libucm_rocm.so) load; libucp and libuct themselves do not, so Open MPI runs without them.
    openmpi_stubs: Mapping[str, str] = field(default_factory=dict)


ROCM_STUB = (
    "libucx0 (which libopenmpi40 links) depends on it, but only UCX's ROCm modules load it; with LLVM 17 it is "
    "about 235 MB of ROCm no NVIDIA image needs"
)

DISTRO: dict[str, Distro] = {
    "debian12": Distro(openmpi="4.1.4", libfabric="1.17.0", python="3.11", mpi4py="3.1.4", hwloc="2.9.0", glibc="2.36"),
    "ubuntu22.04": Distro(
        openmpi="4.1.2", libfabric="1.11.0", python="3.10", mpi4py="3.1.3", hwloc="2.7.0", glibc="2.35"
    ),
    "ubuntu24.04": Distro(
        openmpi="4.1.6", libfabric="1.17.0", python="3.12", mpi4py="3.1.5", hwloc="2.10.0", glibc="2.39"
    ),
    # Debian 13 (trixie): openmpi-bin 5.0.7-1 (libopenmpi40), libfabric1 2.1.0-1.1 (the efa provider built in),
    # python3 3.13.5-1, python3-mpi4py 4.0.3-4, libhwloc15 2.12.0-4, libc6 2.41-12 (apt-cache policy, 2026-11-26).
    "debian13": Distro(
        openmpi="5.0.7",
        libfabric="2.1.0",
        python="3.13",
        mpi4py="4.0.3",
        hwloc="2.12.0",
        glibc="2.41",
        openmpi_stubs={"libamdhip64-5": ROCM_STUB, "libhsa-runtime64-1": ROCM_STUB},
    ),
}


@dataclass(frozen=True)
class GaudiRelease:
    """What a Gaudi software release's PyTorch image carries."""

    pytorch: str
    openmpi: str
    efa: str
    libfabric: str
    os: tuple[str, ...]


# Gaudi 1.15.x PyTorch images: Ubuntu 22.04 only (Habana's support matrix lists no 20.04 image for 1.15); Open MPI
# from EFA 1.29.0 in /opt/amazon/openmpi (MPI_ROOT in Habana's dockerfiles/base/Dockerfile.ubuntu22.04).
# Gaudi 1.21.x, the last release whose support matrix lists first-gen Gaudi (DL1; 1.22's lists Gaudi 2 and 3 only):
# PyTorch 2.6.0 and Open MPI 4.1.6 (Habana's Support Matrix v1.21.0; PT_VERSION in HabanaAI/Setup_and_Install
# r1.21.0 dockerfiles/common.mk); Ubuntu 22.04 and 24.04 images (the matrix; Dockerfile.ubuntu22.04/24.04 there); EFA
# installer 1.34.0 (DEFAULT_EFA_INSTALLER_VER in its dockerfiles/base/install_efa.sh), whose libfabric 1.22.0 (in
# /opt/amazon/efa) is the image's only one from 1.21.0: Habana's own /opt/habanalabs/libfabric-X build is gone from
# its Dockerfile. EFA 1.34.0 bundles libfabric-aws 1.22.0 and openmpi40-aws 4.1.6 (aws/aws-parallelcluster-cookbook
# CHANGELOG.md, "Upgrade EFA installer to 1.34.0"). Patch releases 1.21.1-1.21.5 (Habana's Release Notes v1.21) have
# no Setup_and_Install tag: that they carry 1.21.0's EFA is inferred (r1.21.0 and r1.22.0 both pin 1.34.0).
GAUDI: dict[str, GaudiRelease] = {
    **{v: GaudiRelease("2.2.0", "4.1.6", "1.29.0", "1.20.0", ("ubuntu22.04",)) for v in ("1.15.0", "1.15.1", "1.15.3")},
    **{
        v: GaudiRelease("2.6.0", "4.1.6", "1.34.0", "1.22.0", ("ubuntu22.04", "ubuntu24.04"))
        for v in ("1.21.0", "1.21.1", "1.21.2", "1.21.3", "1.21.4", "1.21.5")
    },
}

# CPU architectures (the recipe's platform.arch, Docker's names) and what each is called elsewhere: `uname -m`, the
# machine in wheel tags and markers (x86_64, aarch64); Debian's multiarch triplet names library directories.
MACHINE: dict[str, str] = {"amd64": "x86_64", "arm64": "aarch64"}
# CUDA's target directory of each architecture (CUDA_HOME/targets/<it>/{include,lib}, what nvcc.profile's
# _TARGET_DIR_ names): ARM servers are "sbsa" (Server Base System Architecture), not aarch64-linux (Jetson's).
CUDA_TARGET: dict[str, str] = {"amd64": "x86_64-linux", "arm64": "sbsa-linux"}
DEFAULT_ARCH = "amd64"


def multiarch(arch: str) -> str:
    """Debian's and Ubuntu's multiarch triplet of `arch` (/usr/lib/<triplet>): x86_64-linux-gnu, aarch64-linux-gnu."""
    return f"{MACHINE[arch]}-linux-gnu"


MULTIARCH = "{multiarch}"  # in a pin's path: the architecture's triplet, filled in for each architecture's image


def for_arch(path: str, arch: str) -> str:
    """A pin's path for `arch`: MULTIARCH replaced by its triplet (/usr/lib/{multiarch}/openmpi ->
    /usr/lib/aarch64-linux-gnu/openmpi). A pin is one for every architecture the recipe lists; its render is not."""
    return path.replace(MULTIARCH, multiarch(arch))


def docker_platform(arch: str) -> str:
    """The OCI/Docker platform string of `arch`: linux/amd64, linux/arm64."""
    return f"linux/{arch}"


def parse_platform(text: str) -> str:
    """`linux/arm64` (or `arm64`, `linux/aarch64`) as a platform.arch value; ValueError naming what is known."""
    value = text.strip().lower()
    os_name, _, arch = value.rpartition("/")
    arch = {machine: name for name, machine in MACHINE.items()}.get(arch, arch)
    if os_name not in ("", "linux") or arch not in MACHINE:
        known = ", ".join(docker_platform(a) for a in MACHINE)
        raise ValueError(f"{text!r} is not a platform imgbuild builds for (known: {known})")
    return arch


@dataclass(frozen=True)
class TableSource:
    """Where a table's facts were read and when: `read_on` is an ISO date, or a month where the day was not recorded,
    or None where nobody recorded it (the table may then be stale by any amount)."""

    source: str
    read_on: str | None


# When each table was read. `imgbuild outdated` takes a table's newest entry as the newest release of a component
# that is not looked up on the package index, and says when the table was read: a release published since is not in
# it. The months come from the project's facts notes, which date what they add by month (git first shows these tables
# on 2026-11-21). Change a date when you read the source again, not when you edit the table for another reason.
TABLES: dict[str, TableSource] = {
    "TORCH": TableSource("each release's wheel METADATA on the package index", "2026-11"),
    "NCCL_NET_PLUGIN_API": TableSource(
        "NVIDIA/nccl src/net.cc, src/plugin/net/net_v*.cc at each release tag", "2026-11"
    ),
    "GAUDI": TableSource("HabanaAI/Setup_and_Install tags, Habana's support matrices and release notes", "2026-11-26"),
    "DISTRO": TableSource("the Debian and Ubuntu package archives", None),
}


# Instance families whose GPUs share one NVLink domain across instances (multi-node NVLink, MNNVL): a GB200 NVL72
# rack is 18 p6e-gb200.36xlarge trays of 4 GPUs joined by NVLink switches (AWS's EKS user guide, cited in
# cluster/jobplan.py: u-p6e-gb200x72 is 18 instances, u-p6e-gb200x36 9). GPU memory is shared across trays only
# through IMEX channels (/dev/nvidia-caps-imex-channels/channelN, blocks.cuda.driver), which are made per job: on
# Kubernetes by NVIDIA's DRA driver for a ComputeDomain (resource.nvidia.com/v1beta1) that each pod claims
# (cluster/k8s.py), on Slurm by a prolog (cluster/slurm.py). What AWS's EKS guide and sample jobs do for them, per
# family:
# - MNNVL_ENV: the NCCL variables AWS's GB200 nccl-tests MPIJob passes to every rank (awsome-distributed-training's
#   nccl-tests-gb200.yaml: `-x NCCL_NVLS_ENABLE=1 -x NCCL_MNNVL_ENABLE=1`): NCCL uses NVLink across trays and NVLink
#   SHARP; the image sets them (render.image_env) and so does the job, a recipe's own `env` value winning in both;
# - the pods claim the ComputeDomain's channel (resourceClaimTemplate) and keep to one NVLink domain with a required
#   podAffinity on the label NVIDIA's GPU Feature Discovery puts on each node, `nvidia.com/gpu.clique` (the EKS guide's
#   nvbandwidth MPIJob and the sample).
MNNVL_FAMILIES = frozenset({"p6e-gb200"})
# The most instances one NVLink domain holds, per MNNVL family: a job keeps every node in one domain (the pods'
# podAffinity on nvidia.com/gpu.clique; on Slurm, one UltraServer for IMEX), so a job of more nodes never runs.
# p6e-gb200: the largest UltraServer, u-p6e-gb200x72, is 18 instances (AWS's EKS user guide, as above; x36 is 9).
MNNVL_DOMAIN_NODES = {"p6e-gb200": 18}
MNNVL_ENV = {"NCCL_MNNVL_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"}


def mnnvl(instance_type: str | None) -> bool:
    """Whether an instance type's GPUs share NVLink with other instances' (MNNVL_FAMILIES)."""
    return instance_type is not None and instance_type.split(".", 1)[0] in MNNVL_FAMILIES


def mnnvl_domain_nodes(instance_type: str | None) -> int | None:
    """The most instances of `instance_type` one NVLink domain holds (MNNVL_DOMAIN_NODES; None: not MNNVL)."""
    return MNNVL_DOMAIN_NODES.get(instance_type.split(".", 1)[0]) if instance_type else None


def instance_env(instance_types: Iterable[str]) -> dict[str, str]:
    """The environment the instance types' interconnect asks for (MNNVL_ENV where any of them is MNNVL): what the
    image sets for a recipe's platform.instance_types and a job for its instance type."""
    return dict(MNNVL_ENV) if any(mnnvl(t) for t in instance_types) else {}
