"""Files and folders a user asks a command to write (`-o`, `--output`, `--json FILE`, `--junit FILE`, `--sbom FILE`,
`sources fetch -o DIR`), all written one way, the way `cluster report` writes its outputs:

- a path is taken as typed: a relative one is relative to the working folder;
- a file is written whole or not at all: through a temporary file beside it, renamed over it (`write_atomic`); a
  failure, Ctrl-C or SIGTERM leaves the old file (or none), never half of the new one;
- a folder is filled in a temporary folder beside it and renamed into place at the end (`new_folder`); a failure,
  Ctrl-C or SIGTERM removes it;
- a path that cannot be written (a missing or read-only folder, a full disk, under /proc) is `OutputError` (exit 14)
  naming the path and why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from imgbuild.core.errors import OutputError, UsageError


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` through a temporary file created exclusively (O_EXCL, a name no one can
    predict) in the same folder, then renamed over it: a symlink planted beside the file is never followed, and
    parallel writers each rename a whole file of their own. The file gets the mode a plain open() would give
    it (0666 less the umask), not mkstemp's 0600. A symlink at `path` itself is replaced, not written through.
    OSError escapes (`write_file` names the path)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask (read back by setting it: files are written from the CLI's one thread)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(path: Path, data: str | bytes, *, what: str, parents: bool = False) -> None:
    """`data` written whole to `path` (`write_atomic`), its folders made first when `parents`; `OutputError` (exit 14)
    "PATH: cannot write WHAT: why" when it cannot be."""
    try:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(21, "is a folder")
        write_atomic(path, data)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def new_folder(path: Path, *, what: str) -> Iterator[Path]:
    """A temporary folder beside `path` to fill; renamed onto `path` when the block ends without an exception,
    removed otherwise (a failure, Ctrl-C, SIGTERM in a `terminable` command): nothing half-written is left. `path`
    must be new or an empty folder (else `UsageError`, exit 2); one that cannot be made is `OutputError` (exit 14)
    naming it."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"{path}: exists and is not an empty folder", hint="name a new folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)).absolute()
    except OSError as exc:
        raise OutputError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None
    try:
        yield tmp
        try:
            if path.exists():
                path.rmdir()
            os.replace(tmp, path)
        except OSError as exc:
            raise OutputError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
