"""The app block: app.py (its options, pin rule, contribution and checks), app.j2 (its Dockerfile
fragments)."""

from imgbuild.blocks.app.app import (
    BLOCK,
    App,
    parse_requirements,
)

__all__ = [
    "BLOCK",
    "App",
    "parse_requirements",
]
