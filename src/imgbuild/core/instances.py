"""The AWS instance families imgbuild knows, as data (instances.yaml beside this module): the accelerator each
carries, its CPU architecture, the EFA devices a job asks for per node, and whether its GPUs share one NVLink domain
across instances (MNNVL: the ComputeDomain, IMEX channels and NCCL environment its jobs get). One rule per fact,
read by `cluster job`, `run --print`, render and the verdict; adding an instance type is adding a row."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from imgbuild.core import datafile
from imgbuild.core.errors import ResolveError

FILE = Path(__file__).with_name("instances.yaml")

Text = datafile.Text


class Mnnvl(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    domain_nodes: int = Field(ge=2)  # the most instances one NVLink domain holds


class Family(datafile.Sourced):
    """One instance family; `source` says where it was read, `inferred: true` with `why` where nobody read it."""

    accelerator: Literal["nvidia", "gaudi", "neuron", "qualcomm"]
    gpu_arch: Annotated[str, StringConstraints(pattern=r"^sm_\d{2,3}$")] | None = None
    device: Text
    arch: Literal["amd64", "arm64"] = "amd64"
    efa: int | None = Field(default=None, ge=0)  # EFA devices a job asks for per node (None: not known)
    mnnvl: Mnnvl | None = None


class Instances(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    mnnvl_env: dict[Text, Text] = Field(min_length=1)
    families: dict[Text, Family] = Field(min_length=1)


@functools.cache
def table() -> Instances:
    """instances.yaml, read and checked once; ResolveError naming the file and the key otherwise."""
    return datafile.load(FILE, Instances, ResolveError, "the instance table")


def family(instance_type: str | None) -> Family | None:
    """An instance type's family row (p6e-gb200.36xlarge -> p6e-gb200's); None: not a family imgbuild knows."""
    return table().families.get(instance_type.split(".", 1)[0]) if instance_type else None


def efa_devices(instance_type: str) -> int | None:
    """EFA devices a job asks for per node of `instance_type` (None: not known)."""
    row = family(instance_type)
    return row.efa if row is not None else None


def efa_known() -> list[str]:
    """The families with an EFA device count."""
    return sorted(name for name, row in table().families.items() if row.efa is not None)


def efa_max() -> int:
    """The most EFA devices any known family has (--efa: more than any instance has never schedules)."""
    return max(row.efa or 0 for row in table().families.values())


def instance_arch(instance_type: str) -> str | None:
    """The CPU architecture (amd64, arm64) of an instance type (None: a family imgbuild does not know)."""
    row = family(instance_type)
    return row.arch if row is not None else None


def mnnvl(instance_type: str | None) -> bool:
    """Whether an instance type's GPUs share NVLink with other instances' (its family has `mnnvl`)."""
    row = family(instance_type)
    return row is not None and row.mnnvl is not None


def mnnvl_domain_nodes(instance_type: str | None) -> int | None:
    """The most instances of `instance_type` one NVLink domain holds (None: not MNNVL)."""
    row = family(instance_type)
    return row.mnnvl.domain_nodes if row is not None and row.mnnvl is not None else None


def mnnvl_families() -> list[str]:
    return sorted(name for name, row in table().families.items() if row.mnnvl is not None)


def instance_env(instance_types: Iterable[str]) -> dict[str, str]:
    """The environment the instance types' interconnect asks for (the MNNVL environment where any of them is MNNVL):
    what the image sets for a recipe's platform.instance_types and a job for its instance type."""
    return dict(table().mnnvl_env) if any(mnnvl(t) for t in instance_types) else {}
