"""What the release files say is bad among a set of pins (`Row.bad`, a file's `known_bad`), and every download
checksum they record: the rows of every block that has them (`Released`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import imgbuild.blocks._releases as releases
from imgbuild.blocks._block import Released
from imgbuild.blocks._core import Pin
from imgbuild.blocks.registry import REGISTRY, dedupe


@dataclass(frozen=True)
class KnownBad:
    """A pinned release, or a combination of pins, that a block's release file marks bad (`Row.bad`, `known_bad`)."""

    what: str  # "aws_ofi_nccl 1.18.0", "cuda 13.0.2 with cuda.gpu_arch sm_70"
    names: tuple[str, ...]  # the components it is about: the first is where a recipe sets it
    bad: releases.Bad
    listed_in: str  # the release file that says so

    def message(self) -> str:
        good = f"; the nearest good release: {self.bad.good}" if self.bad.good else ""
        known = "known bad" if self.bad.level == "refuse" else "a known risk"
        return f"{self.what} is {known}: {self.bad.why} ({', '.join(self.bad.links)}){good}"


def known_bad(pins: Mapping[str, Pin], involving: str | None = None) -> list[KnownBad]:
    """What the release files say is bad among `pins`: each pinned release whose row (or its series' row) is marked
    `bad`, then each `known_bad` combination whose every `when` entry holds, in registry order; with `involving`,
    only what names that block (the resolver asks as each pin is made: each finding is met once, at the pin that
    completes it)."""
    found: list[KnownBad] = []
    for block in REGISTRY:
        pin = pins.get(block.name)
        if not isinstance(block, Released) or pin is None:  # a file's combinations name its own component
            continue
        listed = block.release_file()
        where = releases.file_name(block.name)
        if pin.version is not None and involving in (None, block.name):
            for row in releases.row_for(listed.releases, pin.version):
                if row.bad is not None:
                    origin = f" ({pin.origin})" if pin.origin != "recipe" else ""
                    found.append(KnownBad(f"{block.name} {pin.version}{origin}", (block.name,), row.bad, where))
                    break
        for combo in listed.known_bad:
            names = tuple(dedupe(key.split(".", 1)[0] for key in combo.when))
            if involving not in (None, *names):
                continue
            if all(
                name in pins and releases.holds(pins[name].version, pins[name].details, key, value)
                for key, value in combo.when.items()
                for name in [key.split(".", 1)[0]]
            ):
                parts = [
                    f"{key} {value}" if "." in key else f"{key} {pins[key].version}"
                    for key, value in combo.when.items()
                ]
                found.append(KnownBad(" with ".join(parts), names, combo, where))
    return found


def recorded_checksums() -> dict[str, releases.Checksum]:
    """Every download's checksum the release files record (their rows' `downloads` and their own), by URL: what a
    well-known third party published of it, or why nobody could read one (imgbuild.pin.checksums, step c)."""
    out: dict[str, releases.Checksum] = {}
    for block in REGISTRY:
        if isinstance(block, Released):
            listed = block.release_file()
            out.update(listed.downloads)
            for row in listed.releases:
                out.update(row.downloads)
    return out
