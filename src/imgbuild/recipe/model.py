"""The recipe model: what a recipe says, as strict pydantic models (one per section of a recipe file), and a
loaded recipe with where it came from. Each block's options model lives in its block (imgbuild.blocks.<name>); the
recipe composes them. Loading a file into these models is imgbuild.recipe.loading.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, create_model, model_validator

from imgbuild.blocks.app import App  # the user's layer (`app:`): the options of the block of that name
from imgbuild.blocks.cuda import Cuda  # the target's CUDA toolkit (`cuda:`): the options of the block of that name
from imgbuild.core import imageref
from imgbuild.core.errors import RecipeError
from imgbuild.core.fields import (
    Capability,
    Command,
    DebPackage,
    Digest,
    EnvName,
    InstanceType,
    Interface,
    LabelKey,
    McaName,
    NcclInterfaces,
    Strict,
    Text,
    matching,
    one_line,
)
from imgbuild.core.paths import display

# --------------------------------------------------------------------------------------------------------------
# The target

ImageTag = Annotated[
    str,
    AfterValidator(matching(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", "a tag of letters, digits and . _ - (128 at most)")),
]


def _image_name(value: str) -> str:
    """base.image: an image reference's name (core/imageref's grammar), the tag and digest being keys of their own."""
    expected = "an image name such as debian, nvidia/cuda or host:5000/team/image, without :TAG or @DIGEST"
    try:
        ref = imageref.parse(value)
    except ValueError:
        raise ValueError(f"expected {expected}, got {value!r}") from None
    if ref.tag or ref.digest:
        raise ValueError(f"expected {expected} (base.tag and base.digest hold those), got {value!r}")
    return value


class Base(Strict):
    """The image everything is built on.

    `tag: latest` is refused unless `latest_only: true` says the publisher offers nothing else; such a base
    is accepted with a warning, and pinned by `digest` when one is given. `builder_tag` gives the builder stage
    another tag of the same image (nvidia/cuda: compile on `-devel`, ship `-runtime`, several GB smaller).
    """

    image: Annotated[str, AfterValidator(_image_name)]
    """The base image's name (debian, nvidia/cuda, host:5000/team/image), without its tag or digest."""
    tag: ImageTag
    """The base image's tag (bookworm-slim, 12.8.1-cudnn-devel-ubuntu22.04); `latest` only with `latest_only`."""
    builder_tag: ImageTag | None = None
    """Another tag of the same image for the builder stage (nvidia/cuda: compile on `-devel`, ship `-runtime`)."""
    digest: Digest | None = None
    """Pins the base: `FROM image@digest`."""
    latest_only: bool = False
    """The publisher offers no tag but `latest`: such a base is accepted with a warning (pin it with `digest`)."""


class OS(Strict):
    """The base image's distribution and the extra packages the recipe wants from it."""

    family: Literal["debian", "ubuntu"]
    """The base image's distribution."""
    version: Annotated[str, AfterValidator(matching(r"\d+(\.\d+)?", "a release number such as 12 or 22.04"))]
    """Its release (12, 22.04)."""
    packages: tuple[DebPackage, ...] = ()
    """Extra Debian packages for the image (`name` or `name=VERSION`)."""


Arch = Literal["amd64", "arm64"]


def _arch_list(value: object) -> object:
    """`arch: arm64` or `arch: [amd64, arm64]`: one architecture or several, none twice."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)):
        if not items:
            raise ValueError("expected an architecture or a list of them (amd64, arm64), got an empty list")
        unknown = [item for item in items if item not in ("amd64", "arm64")]
        if unknown:
            raise ValueError(f"expected amd64 or arm64 (Docker's names; a list for several), got {unknown[0]!r}")
        if len(set(items)) != len(items):
            raise ValueError(f"an architecture is listed twice: {list(items)}")
        return tuple(items)
    return value


class Platform(Strict):
    """The hardware the image is for."""

    accelerator: Literal["none", "nvidia", "gaudi"]
    """The devices the image drives: none (CPU), nvidia (then `cuda:` and `gpu_arch`) or gaudi."""
    arch: Annotated[
        tuple[Literal["amd64", "arm64"], ...],
        BeforeValidator(_arch_list, json_schema_input_type=Arch | list[Arch]),  # `imgbuild schema`: one or a list
    ] = ("amd64",)
    """The CPU architectures the image is built for (Docker's names): one, or a list for a multi-architecture image (the
    first is the default `imgbuild build` makes; `--platform` picks another). AWS's Graviton and Grace instances
    (p6e-gb200) are arm64."""
    gpu_arch: Literal["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103"] | None = None
    """nvidia: the GPU architecture the compiled parts are built for: sm_70 (V100) ... sm_90 (H100), sm_100 (B200),
    sm_103 (B300: CUDA >= 12.9)."""
    instance_types: tuple[InstanceType, ...] = ()
    """The EC2 instance types the image is for: their EFA devices (`imgbuild run --print`), environment (multi-node
    NVLink) and published NCCL figures (the nccl-tests verdict)."""
    devices_per_node: int = Field(1, ge=1, le=64)
    """Accelerators per host: the MPI slots per host of a multi-node run."""


# --------------------------------------------------------------------------------------------------------------
# Components: each block's options model lives in its module (imgbuild.blocks.<name>).


def _components_model() -> type[Strict]:
    from imgbuild.blocks import REGISTRY

    fields: dict[str, Any] = {b.name: (b.options | None, None) for b in REGISTRY if not b.top_level}
    model: type[Strict] = create_model(
        "Components",
        __base__=Strict,
        __doc__="The building blocks of an image; a missing (or null) block is not installed.",
        **fields,
    )
    return model


if TYPE_CHECKING:

    class Components(Strict):
        """The building blocks of an image (a field per registered block)."""

        def __getattr__(self, name: str) -> Any: ...

else:
    Components = _components_model()


class Runtime(Strict):
    """How containers of the image are started (`imgbuild run`, `imgbuild verify`)."""

    runtime: Literal["habana", "nvidia"] | None = None
    """The container runtime (`--runtime`)."""
    gpus: Literal["all"] | None = None
    """`--gpus all`, where the host has a GPU and NVIDIA's container toolkit."""
    env: dict[EnvName, Text] = {}
    """Variables set in the container (`-e`)."""
    cap_add: tuple[Capability, ...] = ()
    """Linux capabilities added (`--cap-add`)."""
    network: Literal["host"] | None = None
    """`--net=host`: the host's network (multi-node traffic, EFA)."""
    ipc: Literal["host"] | None = None
    """`--ipc=host`: the host's shared memory (no `shm_size` then)."""
    efa_devices: bool = False
    """Pass each EFA device the host has (/dev/infiniband/uverbsN)."""
    host_devices: tuple[Annotated[str, AfterValidator(matching(r"/dev/[A-Za-z0-9._/-]+", "a /dev path"))], ...] = ()
    """Device nodes passed only where the host has them (`imgbuild run`, verify); blocks add theirs (gdrcopy:
    /dev/gdrdrv) to the image manifest's copy of this section."""
    shm_size: (
        Annotated[str, AfterValidator(matching(r"\d+[bkmg]?", "a size such as 1g, 512m or 1073741824"))] | None
    ) = None
    """The size of /dev/shm (`--shm-size`; 1g when not set), unless `ipc: host`."""
    memlock_unlimited: bool = True
    """`--ulimit memlock=-1:-1`: EFA and NCCL pin memory."""


class MpiRun(Strict):
    """The mpirun command line used across nodes (launch.py builds it; `train` reads it from mpirun.args, one
    argument per line)."""

    launcher: Command = "mpirun"
    """The mpirun command: a name on PATH or its absolute path."""
    mca: dict[McaName, Text] = {}
    """MCA parameters: `--mca KEY VALUE` each, sorted by key."""
    exclude_interfaces: tuple[Interface, ...] = ("lo", "docker0")
    """Interfaces Open MPI's TCP transport and out-of-band channel leave out (`btl_tcp_if_exclude`,
    `oob_tcp_if_exclude`, unless `mca` sets them)."""
    nccl_socket_ifname: NcclInterfaces | None = None
    """The default of NCCL_SOCKET_IFNAME in the launcher's environment (a value the job sets wins): interface prefixes,
    `^` to exclude, `=` for an exact name."""
    extra_args: tuple[Text, ...] = ()
    """Arguments right after the launcher (`--allow-run-as-root`)."""


HoldName = Annotated[
    str, AfterValidator(matching(r"[a-z0-9_]+", "a component of `imgbuild outdated` (pytorch, numpy)"))
]
HoldReason = Annotated[str, Field(min_length=1), AfterValidator(one_line)]


class Recipe(Strict):
    """A whole target. `name` defaults to the file's stem; `abstract` recipes are only parents."""

    name: Annotated[
        str, AfterValidator(matching(r"[a-z0-9_][a-z0-9._-]*", "a name of lowercase letters, digits and . _ -"))
    ]
    """The recipe's name (default: the file's name without .yaml); never inherited."""
    description: Text = ""
    """One line about the image (`imgbuild list`)."""
    abstract: bool = False
    """Only a parent for other recipes: nothing is built, run or verified from it; never inherited."""
    platform: Platform
    base: Base
    os: OS
    cuda: Cuda | None = None
    components: Components = Components()
    env: dict[EnvName, Text] = {}
    """Variables the image sets (Dockerfile `ENV`; `FI_*`, `NCCL_*`, `HCCL_*` ...), after the blocks' own."""
    runtime: Runtime = Runtime()
    mpirun: MpiRun = MpiRun()
    labels: dict[LabelKey, Text] = {}
    """Image labels (Dockerfile `LABEL`), besides imgbuild's own."""
    license: Text | None = None
    """An SPDX expression: the image's org.opencontainers.image.licenses label."""
    app: App | None = None
    hold: dict[HoldName, HoldReason] = {}
    """Components kept behind their newest release on purpose, each with the reason (`imgbuild outdated` shows them as
    held, not behind; `lock --upgrade` leaves them unless named): a row of `imgbuild outdated` -> why."""

    @model_validator(mode="after")
    def _cuda_matches_platform(self) -> Recipe:
        if self.platform.accelerator == "nvidia" and (self.cuda is None or self.platform.gpu_arch is None):
            raise ValueError("an nvidia platform needs `cuda:` and `platform.gpu_arch`")
        return self


# --------------------------------------------------------------------------------------------------------------
# A loaded recipe (imgbuild.recipe.loading makes one)


class LoadedRecipe(BaseModel):
    """A validated recipe with where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, defer_build=True)

    recipe: Recipe
    path: Path
    chain: tuple[Path, ...]  # the file, then its parents
    merged: dict[str, Any]  # the merged mapping that was validated (for the lock's fingerprint)

    def concrete(self) -> LoadedRecipe:
        """This recipe, or RecipeError when it is abstract (a parent: nothing is built, run or verified from it)."""
        if self.recipe.abstract:
            raise RecipeError(f"{display(self.path)}: '{self.recipe.name}' is abstract (a parent for other recipes)")
        return self

    @property
    def digest(self) -> str:
        """sha256 of the merged recipe in canonical JSON: a parent's change changes the child's too. `hold` is left
        out: why a pin stays behind changes nothing the lock or the image holds, so it never makes a lock stale."""
        image = {key: value for key, value in self.merged.items() if key != "hold"}
        text = json.dumps(image, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
