"""Files and folders a user hands imgbuild (a recipe's requirements file, a code folder and what it holds, a
pyproject.toml, a CA bundle, a scan gate's allow file, a sources folder and its sources.json): each found where it
belongs and read with a bound.

- `inside(root, path)`: `path` with its links resolved, when that is `root` or below it (`root` resolved too). A path
  that leaves it (`..`, an absolute path, a link out) or a link loop is refused: what a recipe, a code folder or a
  sources folder names never reaches another part of the machine.
- `read_bounded(path, limit)`: a regular file's bytes, at most `limit`. Its size is looked at before it is read (a
  sparse file of a terabyte is refused at once), and a folder, a device (/dev/zero would be read forever) or a FIFO
  (reading it would wait for a writer) is refused without reading it.

Both raise `Refused` (a ValueError) saying what is wrong with the path, which they name; each caller adds the key
or option it came from and raises its own error class (its exit code).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class Refused(ValueError):
    """A user's path that is not used: outside where it belongs, not a regular file, too large, unreadable."""


class Outside(Refused):
    """A path that resolves (`target`) outside the folder it belongs in (`folder`, resolved)."""

    def __init__(self, message: str, folder: Path, target: Path) -> None:
        super().__init__(message)
        self.folder = folder
        self.target = target


def size(n: int) -> str:
    """A byte count as a message says it: 1 MiB, 256 KiB, 300 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}" if n % (1 << shift) == 0 else f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link loop (or a chain of links too long to follow)"
    return exc.strerror or str(exc)


def inside(root: Path, path: Path) -> Path:
    """`path` resolved (links followed), when it is `root` (resolved) or below it; Refused otherwise, naming where it
    resolves to. A path that does not exist yet resolves as far as it exists (a file about to be written)."""
    try:
        folder = root.resolve()
        target = path.resolve()
    except RuntimeError:  # Python < 3.13: "Symlink loop from ..."
        raise Refused(f"{path}: a symbolic link loop") from None
    except OSError as exc:  # ELOOP (Python 3.13), a name too long for the system
        raise Refused(f"{path}: {_why(exc)}") from None
    except ValueError:  # a NUL byte in the name
        raise Refused(f"{path!r}: not a usable file name (a NUL byte)") from None
    if not target.is_relative_to(folder):
        raise Outside(f"{path}: resolves to {target}, outside {folder}", folder, target)
    return target


def regular(path: Path) -> os.stat_result:
    """`path`'s status when it is a regular file (links followed); Refused for a folder, a device, a FIFO or a socket,
    which are never opened."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise Refused(f"{path}: {_why(exc)}") from None
    except ValueError:
        raise Refused(f"{path!r}: not a usable file name (a NUL byte)") from None
    if stat.S_ISDIR(st.st_mode):
        raise Refused(f"{path}: is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise Refused(f"{path}: is {kind}, not a regular file")
    return st


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, which may hold at most `limit`: refused before it is read when its size
    says more (or when it grows past `limit` while read), and without being opened when it is no regular file.
    Opened without blocking, and checked again once open: a file swapped for a FIFO in between cannot hang the read."""
    st = regular(path)
    if st.st_size > limit:
        raise Refused(f"{path}: {size(st.st_size)}, over the {size(limit)} it may be")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Refused(f"{path}: {_why(exc)}") from None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{path}: not a regular file")
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise Refused(f"{path}: {_why(exc)}") from None
    if len(data) > limit:
        raise Refused(f"{path}: more than the {size(limit)} it may be")
    return data


def read_text_bounded(path: Path, limit: int) -> str:
    """`read_bounded`, decoded as UTF-8 (Refused naming the line of the first byte that is not)."""
    data = read_bounded(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise Refused(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x})") from None
