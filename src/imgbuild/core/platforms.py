"""The CPU architectures imgbuild builds for (the recipe's platform.arch, Docker's names) and what each is called
elsewhere: `uname -m` and wheel tags, Debian's multiarch triplets, CUDA's target directories, Docker's platform
strings. Belongs to no component."""

from __future__ import annotations

# Each architecture's `uname -m`, the machine in wheel tags and markers (x86_64, aarch64); Debian's multiarch triplet
# names library directories.
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
