"""Trees of files for tests that read a folder as a filesystem (a rootfs to trim, an image's files to scan)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> None:
    """Write each file (a path relative to `root` -> its text or bytes), making the folders it needs."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
