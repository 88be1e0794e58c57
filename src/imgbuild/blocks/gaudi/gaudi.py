"""gaudi: the Intel Gaudi software release (SynapseAI) that Habana's PyTorch base image carries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import imgbuild.blocks._releases as releases
from imgbuild.blocks._block import Block, RecipeRules, Released, Tracks
from imgbuild.blocks._core import Pin, Resolution, Target, Tracked
from imgbuild.blocks._releases import Text
from imgbuild.core.fields import Strict, pin_validator


class GaudiRow(releases.Row):
    """What a Gaudi software release's PyTorch image carries."""

    pytorch: Text
    openmpi: Text
    efa: Text
    libfabric: Text
    os: tuple[Text, ...]


class GaudiFile(releases.ReleaseFile):
    component: Literal["gaudi"]
    releases: tuple[GaudiRow, ...]


def release_file() -> GaudiFile:
    return releases.component_file("gaudi", GaudiFile)


def gaudi_release(version: str) -> GaudiRow | None:
    return releases.by_version(release_file().releases).get(version)


class Gaudi(Strict):
    """Intel Gaudi software release (SynapseAI) that the base image carries."""

    version: str
    """The release, e.g. 1.15.1: releases.yaml says which PyTorch, OS, EFA, libfabric and Open MPI its image has, and
    the pin rule holds the recipe to them (base.image must be that release's image)."""
    _pin = pin_validator("version")


_NAMES = {"efa": "EFA", "libfabric": "libfabric", "openmpi": "Open MPI"}


def check_base(rs: Resolution, key: str, what: Literal["efa", "libfabric", "openmpi"], version: str | None) -> bool:
    """For a block that comes with the base image (`what`): on a Gaudi recipe, `version` must be the one that
    release's image has (releases.yaml); a ResolveError naming `key` otherwise. True when the Gaudi table vouched for
    it (the image is Habana's build for that release's OS); False off Gaudi, where there is nothing to check."""
    g = rs.options("gaudi")
    release = gaudi_release(g.version) if g is not None else None
    if release is None:
        return False
    if getattr(release, what) != version:
        raise rs.fail(key, f"Gaudi {g.version}'s image has {_NAMES[what]} {getattr(release, what)}, got {version}")
    return True


class GaudiBlock(Block, RecipeRules, Released, Tracks):
    name = "gaudi"
    options = Gaudi
    modes = {"base": "provided"}
    tag = (1, "gaudi")

    def resolve(self, g: Gaudi, rs: Resolution) -> Pin:
        release = gaudi_release(g.version)
        if release is None:
            known = ", ".join(r.version for r in release_file().releases)
            raise rs.fail(
                "components.gaudi.version",
                f"Gaudi {g.version} is not in {releases.file_name('gaudi')} (known: {known})",
            )
        t = rs.options("pytorch")
        if t is None or t.version != release.pytorch:
            raise rs.fail(
                "components.pytorch.version",
                f"Gaudi {g.version} ships PyTorch {release.pytorch}, got {t.version if t else 'none'}",
            )
        if t.source != "base":
            raise rs.fail("components.pytorch.source", "Gaudi's PyTorch comes with the base image: 'base'")
        if rs.os_id not in release.os:
            raise rs.fail("os", f"Gaudi {g.version} supports {', '.join(release.os)}, got {rs.os_id}")
        image = f"{rs.recipe.base.image}:{rs.recipe.base.tag}"
        if g.version not in image or f"pytorch-installer-{release.pytorch}" not in image:
            raise rs.fail(
                "base.image",
                f"{image} is not Gaudi {g.version}'s PyTorch {release.pytorch} image "
                f"(expected .../{g.version}/.../pytorch-installer-{release.pytorch})",
            )
        return Pin(version=g.version, source="base", origin="recipe")

    def required(self, recipe: Target) -> str | None:
        return "a gaudi platform needs components.gaudi.version" if recipe.platform.accelerator == "gaudi" else None

    def release_file(self) -> releases.ReleaseFile:
        return release_file()

    def track(self, pin: Pin, resolved: Any, files: Callable[[str], Any]) -> list[Tracked]:
        """`imgbuild outdated`: the Gaudi releases releases.yaml lists."""
        versions = tuple(r.version for r in release_file().releases)
        return [Tracked("table", "gaudi", ("components", "gaudi", "version"), versions)]


BLOCK = GaudiBlock()
