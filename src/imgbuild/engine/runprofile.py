"""Runtime profiles: how a container of a recipe's image is started, decided once (`run_spec`).

The recipe's `runtime:` section (the image's manifest carries the same section) and the host's EFA devices
become one `RunSpec`; it is written out as `docker run` arguments (`imgbuild run`, `RunSpec.docker_args`) or as
docker-py options (`imgbuild verify` and `verify --nodes`, `RunSpec.docker_py`), so the three never disagree:

- container runtime (`--runtime=habana`), its environment (`-e`), capabilities, `--net=host`, `--ipc=host`;
- `--gpus all` for CUDA targets;
- one `--device=/dev/infiniband/uverbsN` per EFA device the host has, in numeric order (only those: mounting
  all of /dev/infiniband breaks EFA where the host also has other verbs devices);
- the devices the blocks name (`host_devices`: gdrcopy's /dev/gdrdrv) and, for CUDA targets, the host's IMEX channels
  (/dev/nvidia-caps-imex-channels/channelN), each only where the host has it;
- `--ulimit memlock=-1:-1` (EFA and NCCL pin memory), and a large /dev/shm unless the host's IPC is shared;
- `-it` only when stdin is a terminal, and `--rm` (`docker_run_args`).

`for_host` adapts a spec to the engine and host it starts on (what they lack is left out, with a note): `imgbuild run`
and verification (`for_engine`, whose containers never take the host's network). `target_spec` is the same rule for
the recipe's target host instead (`imgbuild run --print`: a line to paste there): its instance type's EFA devices,
the runtime and `--gpus` whole, and `what_this_host_drops` says what `for_host` would leave out here.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from imgbuild.blocks.cuda.driver import IMEX_CHANNEL_GLOB

if TYPE_CHECKING:
    from imgbuild.image.identity import Identity
    from imgbuild.pin.resolver import Resolved
    from imgbuild.recipe import LoadedRecipe, Recipe, Runtime

EFA_DEVICE_GLOB = "/dev/infiniband/uverbs*"
DEFAULT_SHM_SIZE = "1g"


def device_present(path: str) -> bool:
    """Whether this host has the device node `path`."""
    return os.path.exists(path)


def host_efa_devices(pattern: str = EFA_DEVICE_GLOB) -> list[str]:
    """The host's EFA (verbs) devices, in numeric order (uverbs2 before uverbs10)."""

    def key(path: str) -> tuple[int, str]:
        digits = re.search(r"(\d+)$", path)
        return (int(digits.group(1)) if digits else -1, path)

    return sorted(glob.glob(pattern), key=key)


def host_imex_channels(pattern: str = IMEX_CHANNEL_GLOB) -> list[str]:
    """The host's IMEX channel devices (channel0 before channel10); none where IMEX was not set up."""
    return host_efa_devices(pattern)


@dataclass(frozen=True)
class RunSpec:
    """How one container starts. Devices are `HOST[:CONTAINER[:PERMS]]` strings, as `--device` takes them."""

    runtime: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # sorted by name
    cap_add: tuple[str, ...] = ()
    network: str | None = None
    ipc: str | None = None
    gpus: str | None = None
    devices: tuple[str, ...] = ()
    memlock_unlimited: bool = False
    shm_size: str | None = None  # None: the engine's default, or the host's /dev/shm with ipc=host

    @property
    def devices_inside(self) -> tuple[str, ...]:
        """Each device's path inside the container."""
        return tuple(_inside(d) for d in self.devices)

    def docker_args(self) -> list[str]:
        """The `docker run` options (between `run` and the image)."""
        args = [f"--runtime={self.runtime}"] if self.runtime else []
        for name, value in self.env:
            args += ["-e", f"{name}={value}"]
        args += [f"--cap-add={cap}" for cap in self.cap_add]
        if self.network:
            args.append(f"--net={self.network}")
        if self.ipc:
            args.append(f"--ipc={self.ipc}")
        if self.gpus:
            args += ["--gpus", self.gpus]
        args += [f"--device={dev}" for dev in self.devices]
        if self.memlock_unlimited:
            args += ["--ulimit", "memlock=-1:-1"]
        if self.shm_size:
            args.append(f"--shm-size={self.shm_size}")
        return args

    def docker_py(self) -> dict[str, Any]:
        """The same options as keyword arguments of docker-py's `containers.create` / `containers.run`."""
        import docker.types

        kwargs: dict[str, Any] = {}
        if self.runtime:
            kwargs["runtime"] = self.runtime
        if self.env:
            kwargs["environment"] = dict(self.env)
        if self.cap_add:
            kwargs["cap_add"] = list(self.cap_add)
        if self.network:
            kwargs["network_mode"] = self.network
        if self.ipc:
            kwargs["ipc_mode"] = self.ipc
        if self.gpus:
            # `--gpus all`: every GPU, through the engine's GPU device driver (the NVIDIA container toolkit).
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if self.devices:
            kwargs["devices"] = [_full_device(d) for d in self.devices]
        if self.memlock_unlimited:
            kwargs["ulimits"] = [docker.types.Ulimit(name="memlock", soft=-1, hard=-1)]
        if self.shm_size:
            kwargs["shm_size"] = self.shm_size
        return kwargs


def run_spec(
    runtime: Runtime,
    host_devices: Sequence[str],
    extra_devices: Sequence[str] = (),
    *,
    exists: Callable[[str], bool] | None = None,
    imex_channels: Sequence[str] | None = None,
) -> RunSpec:
    """THE rule: a recipe's (or an image manifest's) `runtime:` section on a host with these EFA devices.

    `host_devices`: the host's EFA devices (`host_efa_devices`), added only when the profile wants EFA.
    `extra_devices`: devices the user asked for (`--device`), first; an EFA device among them is not repeated.
    The profile's `host_devices` (gdrcopy's /dev/gdrdrv) are added where the host has them (`exists`, default
    `device_present`): a device the host lacks would stop Docker from starting the container.
    A profile with GPUs (`gpus`) also gets the host's IMEX channels (`imex_channels`, default `host_imex_channels`):
    there are none but where IMEX was set up for NVLink across nodes, and CUDA needs them there.
    """
    devices = list(extra_devices)
    present = exists or device_present
    imex = (host_imex_channels() if imex_channels is None else list(imex_channels)) if runtime.gpus else []
    wanted = [
        *(host_devices if runtime.efa_devices else ()),
        *(d for d in runtime.host_devices if present(d)),
        *imex,
    ]
    inside = {_inside(d) for d in devices}
    devices += [dev for dev in dict.fromkeys(wanted) if dev not in inside]
    return RunSpec(
        runtime=runtime.runtime,
        env=tuple(sorted(runtime.env.items())),
        cap_add=tuple(runtime.cap_add),
        network=runtime.network,
        ipc=runtime.ipc,
        gpus=runtime.gpus,
        devices=tuple(devices),
        memlock_unlimited=runtime.memlock_unlimited,
        shm_size=None if runtime.ipc == "host" else (runtime.shm_size or DEFAULT_SHM_SIZE),
    )


GPU_DEVICE = "/dev/nvidia0"


def host_has_gpu(device: str = GPU_DEVICE) -> bool:
    """Whether this host has an NVIDIA GPU (its first device node)."""
    return device_present(device)


NVIDIA_HOOK = "nvidia-container-runtime-hook"


def nvidia_hook_present() -> bool:
    """Whether NVIDIA's container toolkit hook is on this host's PATH: Docker registers its `--gpus` driver when
    the daemon finds this binary (moby daemon/nvidia_linux.go), whether or not an `nvidia` runtime is configured."""
    return shutil.which(NVIDIA_HOOK) is not None


def for_host(spec: RunSpec, *, runtimes: Sequence[str], has_gpu: bool) -> tuple[RunSpec, list[str]]:
    """THE rule for what the engine and host can give a container (`imgbuild run` and verification alike): no
    runtime the engine lacks, and `--gpus` only on a host with a GPU where NVIDIA's container toolkit serves it:
    the engine lists the `nvidia` runtime (`nvidia-ctk runtime configure`) or the toolkit's hook is on PATH
    (Docker's own `--gpus` driver needs it); without either Docker refuses to start the container. Returns the
    spec and a note for each thing left out."""
    spec, dropped = _host_limits(spec, runtimes=runtimes, has_gpu=has_gpu)
    return spec, [f"{why}: started without {what}" for what, why in dropped]


def _host_limits(spec: RunSpec, *, runtimes: Sequence[str], has_gpu: bool) -> tuple[RunSpec, list[tuple[str, str]]]:
    """`for_host`'s rule: the spec, and (what is left out as `docker run` options, why) for each thing left out."""
    dropped = []
    if spec.runtime and spec.runtime not in runtimes:
        dropped.append((f"--runtime={spec.runtime}", f"the engine has no '{spec.runtime}' runtime"))
    toolkit = "nvidia" in runtimes or nvidia_hook_present()
    gpus = spec.gpus if has_gpu and toolkit else None
    if spec.gpus and gpus is None:
        why = (
            f"no GPU on this host ({GPU_DEVICE})"
            if not has_gpu
            else f"NVIDIA's container toolkit is not set up (no 'nvidia' runtime, no {NVIDIA_HOOK})"
        )
        dropped.append((f"--gpus {spec.gpus}", why))
    return replace(spec, gpus=gpus, runtime=spec.runtime if spec.runtime in runtimes else None), dropped


def target_spec(
    runtime: Runtime, target: tuple[str, int] | None, host_devices: Sequence[str]
) -> tuple[RunSpec, list[str]]:
    """THE rule (`run_spec`) for the recipe's target host rather than this one (`imgbuild run --print`): the runtime
    and `--gpus` whole, the target instance type's EFA devices (`target`: the instance type and its number of EFA
    devices, cluster.jobplan.target_instance; this host's, `host_devices`, with a note, where the recipe names no
    instance type whose devices are known), and none of the devices passed only where a host has them (a device the
    target lacks stops `docker run`; `imgbuild run` there adds them). Returns the spec and a note for each thing the
    line cannot know."""
    notes = []
    devices: list[str] | None = []
    if runtime.efa_devices:
        devices = None if target is None else [EFA_DEVICE_GLOB.replace("*", str(n)) for n in range(target[1])]
    if target is not None and devices:
        notes.append(f"the line is for the recipe's target host, {target[0]} ({len(devices)} EFA devices)")
    if devices is None:
        devices = list(host_devices)
        notes.append(
            "the recipe names no instance type whose EFA devices imgbuild knows (platform.instance_types): the line "
            f"has this host's {len(devices)}; on the target add --device=/dev/infiniband/uverbsN for each of its own"
        )
    spec = run_spec(runtime, devices, exists=lambda _: False, imex_channels=())
    if runtime.host_devices:
        left = " ".join(f"--device={d}" for d in runtime.host_devices)
        notes.append(f"{left} left out: passed only where a host has it (`imgbuild run` on that host adds it)")
    return spec, notes


def what_this_host_drops(
    target: RunSpec, host_devices: Sequence[str], engine: tuple[Sequence[str], bool] | None
) -> list[str]:
    """What `imgbuild run` on this host (its EFA devices, its engine's runtimes and whether it has a GPU; None: no
    engine to ask) would leave out of the target's line, one note each: the runtime and `--gpus` (`for_host`), and
    the target's EFA devices this host lacks."""
    dropped = _host_limits(target, runtimes=engine[0], has_gpu=engine[1])[1] if engine is not None else []
    here = set(host_devices)
    missing = [d for d in target.devices if d not in here]
    if missing:
        folders = {os.path.dirname(d) for d in missing}
        names = ",".join(os.path.basename(d) for d in missing)
        if len(folders) == 1 and len(missing) > 1:
            what = f"--device={folders.pop()}/{{{names}}}"
        else:
            what = " ".join(f"--device={d}" for d in missing)
        have = f"only {len(here)}" if here else "none"
        dropped.append((what, f"it has {have} ({EFA_DEVICE_GLOB})"))
    return [f"this host would drop {what}: {why}" for what, why in dropped]


def for_engine(spec: RunSpec, *, runtimes: Sequence[str], has_gpu: bool) -> tuple[RunSpec, list[str]]:
    """The spec a verification starts on this engine and host: `for_host`, on its own network (never the
    host's)."""
    spec, notes = for_host(spec, runtimes=runtimes, has_gpu=has_gpu)
    return replace(spec, network=None), notes


def without_memlock(spec: RunSpec) -> RunSpec:
    """The spec for an engine that refuses memlock=unlimited (rootless, or no CAP_SYS_RESOURCE)."""
    return replace(spec, memlock_unlimited=False)


def _profile_of(source: Resolved | LoadedRecipe | Recipe, named: Identity | None = None) -> Runtime:
    """The run profile: a resolved recipe's as its image's manifest has it (with the blocks' host devices; `named`:
    the image's identity, where the caller has read it, else read here), else the recipe's `runtime:` section."""
    from imgbuild.pin.resolver import Resolved

    if isinstance(source, Resolved):
        from imgbuild.image import identity, render

        return render.manifest(source, named if named is not None else identity.of(source)).runtime
    return _recipe_of(source).runtime


def _recipe_of(source: Resolved | LoadedRecipe | Recipe) -> Recipe:
    from imgbuild.recipe import Recipe

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
    engine: tuple[Sequence[str], bool] | None = None,
    notes: list[str] | None = None,
    target: bool = False,
    target_host: tuple[str, int] | None = None,
    named: Identity | None = None,
) -> list[str]:
    """The whole `docker run` command (argv, starting with "docker") for a container of the recipe's image.

    `host_devices` are the host's EFA devices (see `host_efa_devices`); they are added only when the recipe's
    runtime wants EFA. `interactive` (stdin is a terminal) adds `-it`. `engine` (the engine's runtimes, whether
    the host has a GPU) adapts the profile to them (`for_host`, a note in `notes` for each thing left out); None
    (no engine to ask) keeps it whole. `target`: the line for the recipe's target host instead (`target_spec`, with
    `target_host` its instance type and EFA device count), whole, with a note in `notes` for what this host would
    drop (`what_this_host_drops`). `named`: the image's identity (identity.of), where the caller has read it: the
    profile of a resolved recipe is its manifest's, which names it.
    """
    profile = _profile_of(source, named)
    if target:
        spec, about = target_spec(profile, target_host, host_devices)
        about += what_this_host_drops(spec, host_devices, engine)
    else:
        spec, about = run_spec(profile, host_devices), []
        if engine is not None:
            spec, about = for_host(spec, runtimes=engine[0], has_gpu=engine[1])
    if notes is not None:
        notes += about
    return ["docker", "run", "--rm", *(["-it"] if interactive else []), *spec.docker_args(), image_ref, *cmd]


def engine_runtimes() -> list[str] | None:
    """The container runtimes of the engine `docker` talks to (DOCKER_HOST), None when it cannot be asked."""
    from imgbuild.core.errors import EngineError
    from imgbuild.engine import client as engine

    try:
        client = engine.connect()
        try:
            return list((client.info().get("Runtimes") or {}).keys())
        finally:
            client.close()
    except (EngineError, OSError, ValueError):
        return None


def command_line(argv: Sequence[str]) -> str:
    """argv as one line a shell runs back into the same argv."""
    return shlex.join(argv)


def _inside(device: str) -> str:
    parts = device.split(":")
    return parts[1] if len(parts) > 1 and parts[1] else parts[0]


def _full_device(device: str) -> str:
    """HOST[:CONTAINER[:PERMS]] -> HOST:CONTAINER:PERMS (docker-py wants all three)."""
    parts = device.split(":")
    host = parts[0]
    inside = parts[1] if len(parts) > 1 and parts[1] else host
    perms = parts[2] if len(parts) > 2 and parts[2] else "rwm"
    return f"{host}:{inside}:{perms}"
