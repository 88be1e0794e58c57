"""What each distribution release ships (the Debian and Ubuntu package archives): the versions of the packages
imgbuild installs from it, per OS release, not per component, and when that table was read. A component's own facts
(its releases, what each bundles or pins, which API versions it speaks) are its release file's rows:
blocks/<name>/releases.yaml; the CPU architectures and their names are core/platforms.py; instance types are
core/instances.yaml.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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
    # stand-in instead (dockerfile.stub_packages_run). Debian 13's libopenmpi40 links libucx0, and libucx0 depends on
    # ROCm's HIP and HSA runtimes (with libamd-comgr2 and LLVM 17: about 235 MB) that only UCX's ROCm modules
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
    "DISTRO": TableSource("the Debian and Ubuntu package archives", None),
}
