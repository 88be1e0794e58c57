"""Runtime profiles: the `docker run` command line a recipe's containers need (`imgbuild run`).

A pure function of the recipe's `runtime:` block, the image and the host's devices (found by the caller), so the
exact command can be printed, tested and pasted:

- container runtime (`--runtime=habana`), its environment (`-e`), capabilities, `--net=host`, `--ipc=host`;
- `--gpus all` for CUDA targets;
- one `--device=/dev/infiniband/uverbsN` per EFA device the host has (only those: mounting all of
  /dev/infiniband breaks EFA where the host also has other verbs devices);
- `--ulimit memlock=-1:-1` (EFA and NCCL pin memory), and a large /dev/shm unless the host's IPC is shared;
- `-it` only when stdin is a terminal, and `--rm`.
"""

from __future__ import annotations

import glob
import re
import shlex
from collections.abc import Sequence

from imgbuild.recipe import LoadedRecipe, Recipe
from imgbuild.resolver import Resolved

EFA_DEVICE_GLOB = "/dev/infiniband/uverbs*"
DEFAULT_SHM_SIZE = "1g"


def host_efa_devices(pattern: str = EFA_DEVICE_GLOB) -> list[str]:
    """The host's EFA (verbs) devices, in numeric order (uverbs2 before uverbs10)."""

    def key(path: str) -> tuple[int, str]:
        digits = re.search(r"(\d+)$", path)
        return (int(digits.group(1)) if digits else -1, path)

    return sorted(glob.glob(pattern), key=key)


def _recipe_of(source: Resolved | LoadedRecipe | Recipe) -> Recipe:
    if isinstance(source, Recipe):
        return source
    return source.recipe


def docker_run_args(
    source: Resolved | LoadedRecipe | Recipe,
    image_ref: str,
    cmd: Sequence[str] = (),
    *,
    host_devices: list[str],
    interactive: bool = False,
) -> list[str]:
    """The whole `docker run` command (argv, starting with "docker") for a container of the recipe's image.

    `host_devices` are the host's EFA devices (see `host_efa_devices`); they are added only when the recipe's
    runtime wants EFA. `interactive` (stdin is a terminal) adds `-it`.
    """
    rt = _recipe_of(source).runtime
    args = ["docker", "run", "--rm"]
    if interactive:
        args.append("-it")
    if rt.runtime:
        args.append(f"--runtime={rt.runtime}")
    for name, value in sorted(rt.env.items()):
        args += ["-e", f"{name}={value}"]
    args += [f"--cap-add={cap}" for cap in rt.cap_add]
    if rt.network:
        args.append(f"--net={rt.network}")
    if rt.ipc:
        args.append(f"--ipc={rt.ipc}")
    if rt.gpus:
        args += ["--gpus", rt.gpus]
    if rt.efa_devices:
        args += [f"--device={dev}" for dev in host_devices]
    if rt.memlock_unlimited:
        args += ["--ulimit", "memlock=-1:-1"]
    if rt.ipc != "host":
        args.append(f"--shm-size={rt.shm_size or DEFAULT_SHM_SIZE}")
    return [*args, image_ref, *cmd]


def command_line(argv: Sequence[str]) -> str:
    """argv as one line a shell runs back into the same argv."""
    return shlex.join(argv)
