"""The digest of a code tree: what `imgbuild render` computes of the files an app's code folder puts in the image
(after its ignore rules) and what `imgbuild verify` computes of the folder in the image. One rule, in one file: verify
runs this file's text in the container (Python 3.8+, stdlib only), render imports it.

A tree's digest is the sha256 of one line per regular file, sorted by path: `PATH NUL x|- NUL SHA256 LF` (x: the owner
may execute it). Folders and file times are not part of it; a symbolic link in the image is read as its target file
when that is a file inside the tree (render copies no other), else it is a line of its own with `outside` for SHA256:
never read, and never the digest of a tree render made. Nothing but a regular file is opened (a FIFO, a device).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable


def digest(entries: Iterable[tuple[str, bool, str]]) -> str:
    """sha256 of (relative path, executable, sha256 of the content) entries, in path order."""
    h = hashlib.sha256()
    for path, executable, sha in sorted(entries):
        h.update(f"{path}\0{'x' if executable else '-'}\0{sha}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def inside(path: str, root: str) -> bool:
    """Whether `path`, its links followed, is in the folder `root` (links followed)."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip("/") + "/")


def walk(root: str) -> list[tuple[str, bool, str]]:
    """Every regular file under `root` (links to files inside it followed, `__pycache__` folders left out: Python
    writes them when the code runs) as digest() entries; a link out of `root` is an entry `outside`, unread."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if os.path.islink(full) and not inside(full, root):
                out.append((rel, False, "outside"))
            elif os.path.isfile(full):
                out.append((rel, bool(os.stat(full).st_mode & 0o100), file_sha256(full)))
    return out


if __name__ == "__main__":  # in the container: python3 codetree.py ROOT -> {"digest": ..., "files": N}
    entries = walk(sys.argv[1]) if os.path.isdir(sys.argv[1]) else None
    print(json.dumps({"digest": digest(entries), "files": len(entries)} if entries is not None else {"missing": True}))
