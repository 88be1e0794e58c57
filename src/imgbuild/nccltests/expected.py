"""The published bus bandwidth figures `imgbuild cluster report` judges nccl-tests runs against, and which sizes
are judged on which instance types.

The figures live in `bandwidth.yaml` next to this module (one row per instance type, node count and message size,
each with its source and the NCCL that produced it; one rule per instance family saying from which size bus
bandwidth is judged and how far a job must run, with the why; and the instance types for which a search found no
published figure, with where it looked, `unpublished`) so that a new published run is a data change reviewed like
one. This module loads and checks that file; `max_judged_size(instance_type)` tells command.py how far
all_reduce_perf must run (`-e`) for the verdict to judge it.
"""

from __future__ import annotations

import fnmatch
import functools
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from imgbuild.core import datafile
from imgbuild.core.errors import VerifyError

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
    busbw: float = Field(gt=0, allow_inf_nan=False, description="GB/s")
    nccl: str | None = Field(pattern=r"^\d+\.\d+\.\d+$", description="the NCCL that produced it; null: not stated")
    aws_ofi_nccl: str | None = Field(pattern=r"^\d+\.\d+\.\d+\S*$")
    source: Source
    note: str = ""


class Unpublished(_Strict):
    """An instance type nobody has published an all_reduce_perf figure for, as far as a search found: said, not left
    out, so that `imgbuild cluster report` tells a run on it that there is nothing to judge its bus bandwidth by (not
    that the table forgot it). `searched`: where the search looked and when; a figure found later replaces the row."""

    instance_type: str = Field(pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
    searched: str = Field(min_length=1)
    searched_on: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$", description="ISO date or month of the search")
    note: str = ""


class Judging(_Strict):
    """Which sizes are judged on the instance families it names (shell-style patterns on the part of the instance
    type before the dot: `p5`, `p6*`)."""

    families: tuple[str, ...] = Field(min_length=1)
    judged_from: int = Field(gt=0, description="bytes: figures at smaller sizes are shown, not judged")
    run_to: int = Field(gt=0, description="bytes: how far a job must run all_reduce_perf (-e) to be judged")
    why: str = Field(min_length=1)

    @model_validator(mode="after")
    def _run_reaches_judged(self) -> Judging:
        if self.run_to < self.judged_from:
            raise ValueError(f"run_to {self.run_to} is below judged_from {self.judged_from}: never judged")
        return self

    def matches(self, instance_type: str) -> bool:
        family = instance_type.split(".", 1)[0]
        return any(fnmatch.fnmatchcase(family, pattern) for pattern in self.families)


class Table(_Strict):
    """The whole file: which collective the figures are for, the tolerance and why, which sizes are judged where,
    and the figures."""

    collective: str
    tolerance: float = Field(gt=0, lt=1)
    tolerance_why: str = Field(min_length=1)
    judging: tuple[Judging, ...] = Field(min_length=1)
    figures: tuple[Figure, ...]
    unpublished: tuple[Unpublished, ...] = ()

    @model_validator(mode="after")
    def _unpublished_has_no_figure(self) -> Table:
        seen: set[str] = set()
        for i, u in enumerate(self.unpublished):
            if u.instance_type in seen:
                raise ValueError(f"unpublished.{i}: {u.instance_type} is listed twice")
            seen.add(u.instance_type)
            if u.instance_type in self.instance_types():
                raise ValueError(
                    f"unpublished.{i}: {u.instance_type} has figures: a published figure replaces its unpublished row"
                )
        return self

    def unpublished_for(self, instance_type: str) -> Unpublished | None:
        """The record that nobody published a figure for this instance type (None: not recorded as unpublished)."""
        return next((u for u in self.unpublished if u.instance_type == instance_type), None)

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

    @model_validator(mode="after")
    def _every_type_judged(self) -> Table:
        if self.judging[-1].families != ("*",):
            raise ValueError("judging: the last rule must be for every family (families: ['*'])")
        for t in self.instance_types():
            rule = self.judging_for(t)
            if not any(f.size >= rule.judged_from for f in self.figures if f.instance_type == t):
                raise ValueError(
                    f"{t}: every figure is below its judged size ({rule.judged_from} bytes): it could never be judged"
                )
        return self

    def judging_for(self, instance_type: str) -> Judging:
        """The first rule whose families match the instance type (the last rule matches every family)."""
        return next(r for r in self.judging if r.matches(instance_type))

    def judged(self, figures: tuple[Figure, ...]) -> tuple[Figure, ...]:
        """The figures a run is judged by: those at or above their instance type's judged size."""
        return tuple(f for f in figures if f.size >= self.judging_for(f.instance_type).judged_from)

    def max_judged_size(self, instance_type: str | None) -> int:
        """The size (bytes) a run must reach for every figure of its instance type to be judged: the rule's `run_to`,
        or the largest judged figure when a published run went further. Unknown type: the default rule's."""
        if instance_type is None:
            return self.judging[-1].run_to
        rule = self.judging_for(instance_type)
        return max([rule.run_to, *(f.size for f in self.judged(self.figures) if f.instance_type == instance_type)])

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
    return datafile.load(path, Table, VerifyError, "the bandwidth table")


@functools.cache
def shipped() -> Table:
    """The table that ships with imgbuild (read once)."""
    return load(TABLE_PATH)


def size_option(size: int) -> str:
    """A byte count as nccl-tests' -b/-e take it: 17179869184 -> '16G', 1048576 -> '1M', 100 -> '100'."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def max_judged_size(instance_type: str | None) -> int:
    """How far (bytes) all_reduce_perf must run (`-e`) on `instance_type` for `imgbuild cluster report` to judge
    every published figure for it: 16 GiB on p5 and later (bus bandwidth still climbs past 1 GiB there), 2 GiB on
    p4de (its published run went that far), 1 GiB elsewhere and when the type is unknown (None)."""
    return shipped().max_judged_size(instance_type)
