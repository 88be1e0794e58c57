"""The published bus bandwidth figures `imgbuild cluster report` judges nccl-tests runs against.

The figures live in `bandwidth.yaml` next to this module (one row per instance type, node count and message size,
each with its source and the NCCL that produced it) so that a new published run is a data change reviewed like
one. This module only loads and checks that file.
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from imgbuild.errors import VerifyError

TABLE_PATH = Path(__file__).with_name("bandwidth.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Strict):
    """Where a figure was published: a title a person can search for, and the address (with lines) to check it."""

    title: str = Field(min_length=1)
    url: str = Field(pattern=r"^https://\S+$")


class Figure(_Strict):
    """One published measurement: all_reduce_perf bus bandwidth (GB/s, out-of-place) at one message size."""

    instance_type: str = Field(pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    size: int = Field(gt=0, description="message size in bytes")
    busbw: float = Field(gt=0, description="GB/s")
    nccl: str | None = Field(pattern=r"^\d+\.\d+\.\d+$", description="the NCCL that produced it; null: not stated")
    aws_ofi_nccl: str | None = Field(pattern=r"^\d+\.\d+\.\d+\S*$")
    source: Source
    note: str = ""


class Table(_Strict):
    """The whole file: which collective the figures are for, the tolerance and why, and the figures."""

    collective: str
    tolerance: float = Field(gt=0, lt=1)
    tolerance_why: str = Field(min_length=1)
    figures: tuple[Figure, ...]

    @model_validator(mode="after")
    def _one_figure_per_size(self) -> Table:
        seen: set[tuple[str, int, int]] = set()
        for i, f in enumerate(self.figures):
            key = (f.instance_type, f.nodes, f.size)
            if key in seen:
                raise ValueError(
                    f"figures.{i}: a second figure for {f.instance_type} x{f.nodes} at {f.size} bytes "
                    "(one figure per instance type, node count and size)"
                )
            seen.add(key)
        return self

    def for_run(self, instance_type: str, nodes: int) -> tuple[Figure, ...]:
        """The figures for this instance type and node count, smallest size first (empty when none)."""
        return tuple(
            sorted(
                (f for f in self.figures if f.instance_type == instance_type and f.nodes == nodes), key=lambda f: f.size
            )
        )

    def node_counts(self, instance_type: str) -> tuple[int, ...]:
        return tuple(sorted({f.nodes for f in self.figures if f.instance_type == instance_type}))

    def instance_types(self) -> tuple[str, ...]:
        return tuple(sorted({f.instance_type for f in self.figures}))


def load(path: Path = TABLE_PATH) -> Table:
    """Read and check a figures file; VerifyError naming the file, the key and what was expected when it is wrong."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise VerifyError(f"{path}: cannot read the bandwidth table: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise VerifyError(f"{path}: not valid YAML: {exc}") from None
    try:
        return Table.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors())
        raise VerifyError(f"{path}: {problems}") from None


@functools.cache
def shipped() -> Table:
    """The table that ships with imgbuild (read once)."""
    return load(TABLE_PATH)
