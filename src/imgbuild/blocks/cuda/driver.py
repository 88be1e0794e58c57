"""The host's NVIDIA driver against the CUDA an image needs (NVIDIA's table: cuda's releases.yaml): one rule for
`imgbuild doctor` (this host) and `imgbuild verify` (the container's or the --host's driver); and where IMEX
channels are (doctor, verify and the run profile).

The driver is read as a GPU host's tools report it: `nvidia-smi --query-gpu=driver_version --format=csv,noheader`
(one version per GPU), else /proc/driver/nvidia/version, whose first line is the kernel module's
`NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.135  <date>` (proprietary module) or
`NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (<builder>)  <date>` (open
module; `for aarch64` on arm64 hosts): the forms read in published host reports and in tools that parse the file
(that the kernel module's procfs code writes it, NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv-procfs.c, is
inferred: that file was not read here).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from packaging.version import InvalidVersion, Version

from imgbuild.blocks.cuda import driver_floors

if TYPE_CHECKING:
    from imgbuild.checks.context import PinView

# IMEX channels: the device nodes through which CUDA imports memory exported by a GPU of another node of the same
# NVLink domain (GB200 NVL72 across trays; without a channel such calls fail with "insufficient permission"). A host
# has them only where IMEX was set up for the job (a Slurm/AWS PCS job's prolog, the EKS ComputeDomain's DRA driver).
IMEX_CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
IMEX_CHANNEL_GLOB = f"{IMEX_CHANNEL_DIR}/channel*"

PROC_VERSION = "/proc/driver/nvidia/version"
SMI_QUERY = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
# One shell line for every target (this host, a container, an ssh host): nvidia-smi, else the kernel module's file.
READ_COMMAND = f"{SMI_QUERY} 2>/dev/null || cat {PROC_VERSION} 2>/dev/null"
READ_TIMEOUT_S = 30

Status = Literal["ok", "behind", "no driver", "unknown"]

_NVRM = re.compile(r"^NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d{1,6}\.\d{1,6}(?:\.\d{1,6})?)\s", re.MULTILINE)
_SMI = re.compile(r"^\s*(\d{1,6}\.\d{1,6}(?:\.\d{1,6})?)\s*$", re.MULTILINE)
# What READ_COMMAND's output becomes when it did not finish: no version, and the reason in its place.
NO_ANSWER = f"(no answer from `{SMI_QUERY}` within {{seconds}} s: it was ended)"
SHOWN = 120  # characters of an unreadable answer shown in a finding


def parse(text: str) -> tuple[str, str] | None:
    """(driver version, where it was read) from READ_COMMAND's output: nvidia-smi's query (the first GPU's line) or
    /proc/driver/nvidia/version's NVRM line; None when neither is there (no driver, or nvidia-smi's error text)."""
    m = _NVRM.search(text + "\n")
    if m:
        return m.group(1), PROC_VERSION
    m = _SMI.search(text)
    if m:
        return m.group(1), "nvidia-smi"
    return None


def read_here(timeout_s: float = READ_TIMEOUT_S) -> str:
    """READ_COMMAND's output on this machine ("" when neither nvidia-smi nor the kernel module answers), as text
    whatever its bytes (invalid UTF-8 replaced). One that does not finish in `timeout_s` is ended, its whole process
    group (the shell and nvidia-smi), and the output is NO_ANSWER."""
    import os
    import signal

    try:
        proc = subprocess.Popen(
            ["sh", "-c", READ_COMMAND], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
    except OSError:
        return ""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return NO_ANSWER.format(seconds=f"{timeout_s:g}")
    return out.decode("utf-8", "replace")


def unreadable(text: str) -> str | None:
    """Why READ_COMMAND's non-empty output gave no version (`parse` None): what it printed, shortened; None when it
    printed nothing (no driver)."""
    printed = text.strip()
    if not printed:
        return None
    if printed.startswith("(no answer from"):
        return printed
    shown = printed if len(printed) <= SHOWN else f"{printed[:SHOWN]}... ({len(printed)} characters)"
    return f"the host's driver tools printed {shown!r}, which holds no driver version"


def image_cuda(components: Mapping[str, PinView]) -> str | None:
    """The CUDA an image's programs run with: its `cuda` pin (the base image's toolkit, or CUDA from wheels), else
    the CUDA its PyTorch wheel is built for (it brings its own runtime); None for an image without CUDA."""
    cuda = components.get("cuda")
    if cuda is not None and cuda.version:
        return str(cuda.version)
    torch = components.get("pytorch")
    built_for = getattr(torch.details, "cuda", None) if torch is not None else None
    return str(built_for) if built_for else None


def needs(cuda: str) -> str | None:
    """The oldest driver that runs every CUDA `cuda` release of its major (cuda's releases.yaml); None: not in it."""
    try:
        return driver_floors().get(int(cuda.split(".")[0]))
    except ValueError:
        return None


def _v(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def runs(driver: str) -> int | None:
    """The newest CUDA major the driver runs under minor-version compatibility (None: older than every row)."""
    have = _v(driver)
    fits = [major for major, floor in driver_floors().items() if have is not None and have >= Version(floor)]
    return max(fits) if fits else None


@dataclass(frozen=True)
class Finding:
    """What the host's driver means for an image of CUDA `cuda`."""

    driver: str | None  # the host's driver version; None: no NVIDIA driver
    source: str | None  # where it was read: "nvidia-smi" or /proc/driver/nvidia/version
    cuda: str | None  # the image's CUDA
    needs: str | None  # the oldest driver for it (blocks/cuda/releases.yaml)
    status: Status
    advice: str

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "source": self.source,
            "cuda": self.cuda,
            "needs": self.needs,
            "status": self.status,
            "advice": self.advice,
        }


TABLE_SOURCE = "NVIDIA's CUDA minor-version compatibility table"


def judge(read: tuple[str, str] | None, cuda: str | None, printed: str = "") -> Finding:
    """The finding for an image of CUDA `cuda` on a host whose driver `read` (parse's result) is; `printed`: what
    READ_COMMAND printed, so that output with no version in it is a finding of its own ("unknown"), not "no driver"."""
    driver, source = read if read is not None else (None, None)
    floor = needs(cuda) if cuda else None
    if cuda is None:
        return Finding(driver, source, None, None, "unknown", "the image has no CUDA: any driver (or none) will do")
    if floor is None:
        why = f"CUDA {cuda} is not in {TABLE_SOURCE} (blocks/cuda/releases.yaml)"
        return Finding(driver, source, cuda, None, "unknown", why)
    if driver is None and (printed_why := unreadable(printed)) is not None:
        advice = f"{printed_why}: the driver could not be judged (CUDA {cuda} needs >= {floor})"
        return Finding(None, None, cuda, floor, "unknown", advice)
    if driver is None:
        return Finding(
            None, None, cuda, floor, "no driver",
            f"no NVIDIA driver here (no nvidia-smi answer, no {PROC_VERSION}): the image runs without GPUs here; "
            f"a GPU host for it needs driver >= {floor} (CUDA {cuda}, {TABLE_SOURCE})",
        )  # fmt: skip
    have = _v(driver)
    if have is None:
        return Finding(driver, source, cuda, floor, "unknown", f"driver version {driver!r} is not a version")
    if have >= Version(floor):
        return Finding(driver, source, cuda, floor, "ok", f"driver {driver} runs CUDA {cuda} (needs >= {floor})")
    major = int(cuda.split(".")[0])
    fits = runs(driver)
    other = (
        f", or use an image built for CUDA {fits}.x, which this driver runs"
        if fits is not None and fits < major
        else " (no CUDA major release in the table runs on this driver)"
    )
    return Finding(
        driver, source, cuda, floor, "behind",
        f"driver {driver} is older than CUDA {cuda} needs (>= {floor}, {TABLE_SOURCE}; CUDA calls fail with "
        f"'CUDA driver version is insufficient for CUDA runtime version'): upgrade the host's NVIDIA driver to "
        f"{floor} or newer{other}; on NVIDIA data-centre GPUs only, NVIDIA's forward-compatibility package "
        f"(cuda-compat-{major}-<minor>) in the image is the other way",
    )  # fmt: skip
