"""How imgbuild reads a probe's source to copy it into a container (this module is not a probe itself)."""

from __future__ import annotations

from importlib import resources


def text(name: str) -> str:
    """The source of probe `name` (e.g. "ddp_train.py")."""
    return resources.files("imgbuild.probes").joinpath(name).read_text(encoding="utf-8")
