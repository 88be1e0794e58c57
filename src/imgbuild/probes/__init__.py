"""Programs imgbuild runs inside containers of an image (copied in at run time, never baked into images)."""

from __future__ import annotations

from importlib import resources


def text(name: str) -> str:
    """The source of probe `name` (e.g. "ddp_train.py")."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
