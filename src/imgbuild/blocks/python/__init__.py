"""The python block: python.py (its options, pin rule, contribution and checks), python.j2 (its Dockerfile
fragments)."""

from imgbuild.blocks.python.python import (
    BLOCK,
    UV_BIN,
    UV_CACHE_DIR,
    UV_CACHE_ID,
    UV_DIR,
    UV_SET,
    Python,
    require_venv,
    site_packages,
    uv_installs,
)

__all__ = [
    "BLOCK",
    "UV_BIN",
    "UV_CACHE_DIR",
    "UV_CACHE_ID",
    "UV_DIR",
    "UV_SET",
    "Python",
    "require_venv",
    "site_packages",
    "uv_installs",
]
