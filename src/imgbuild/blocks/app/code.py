"""The app block's code folder (`app.code`): its options, the files it copies into the image (the ignore rules, what
cannot go into an image) and their digest, which the image's tags fold in and verify recomputes in the image."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, PrivateAttr

from imgbuild.core import files
from imgbuild.core.errors import RenderError
from imgbuild.core.fields import AbsPath, Strict, Text, matching
from imgbuild.probes import codetree

CODE_DIR = "/opt/ml/code"  # SageMaker's: where source_dir code lands and train looks for the program
RelPath = Annotated[
    str,
    AfterValidator(
        matching(
            r"[A-Za-z0-9._+-][A-Za-z0-9._/+-]*", "a relative path of letters, digits and . _ / + - (code, train.py)"
        )
    ),
]

ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".ipynb_checkpoints/")
# The code folder travels in the build context, held in memory: data belongs in an input channel.
MAX_CODE_BYTES = 256 << 20
MAX_CODE_FILES = 20000
# The entries a walk of the code folder looks at, ignored ones included: a folder of a whole home is refused soon.
MAX_CODE_ENTRIES = 10 * MAX_CODE_FILES


class AppCode(Strict):
    """The user's code folder: copied into the image at `path`."""

    dir: RelPath
    """The code folder, relative to the recipe (and inside its folder)."""
    path: AbsPath = CODE_DIR
    """Where it is copied in the image (SageMaker's /opt/ml/code)."""
    ignore: tuple[Text, ...] = ()
    """What is left out, as .gitignore patterns (`.git/`, `__pycache__/` and `*.pyc` always are)."""
    install: bool = False
    """Build the folder (a pyproject.toml project) into a wheel against the image and install it."""
    # The folder of the recipe that names `dir` (set by the loader, imgbuild.recipe): `dir` is relative to it.
    _root: Path | None = PrivateAttr(None)

    @property
    def folder(self) -> Path:
        if self._root is None:
            raise RenderError(f"app.code.dir {self.dir!r}: the recipe's folder is not known (loaded without a file?)")
        return self._root / self.dir


def ignored(code: AppCode) -> Any:
    """The code folder's ignore rules (pathspec's GitIgnoreSpec): app.code.ignore after ALWAYS_IGNORED."""
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines([*ALWAYS_IGNORED, *code.ignore])


def code_files(code: AppCode) -> list[tuple[str, bytes, int]]:
    """The code folder's files after the ignore rules, in path order: (path relative to the folder, content, mode
    0o755 for a file its owner may execute, else 0o644). A RenderError names the folder for what cannot go into an
    image: a link out of the folder, to a folder or in a loop, a FIFO or a device, a name that is not one printable
    line, more than MAX_CODE_FILES files or MAX_CODE_BYTES bytes (refused before reading past them). An ignored
    folder is not walked; links to folders are never followed."""
    folder = code.folder
    where = f"app.code.dir {code.dir!r} ({folder})"
    if not folder.is_dir():
        raise RenderError(f"{where}: not a folder")
    spec = ignored(code)
    too_much = RenderError(
        f"{where}: more than {MAX_CODE_FILES} files or {MAX_CODE_BYTES >> 20} MiB after the ignore rules",
        hint="leave data out of the code folder (app.code.ignore), and give the job data as an input channel",
    )
    out: list[tuple[str, bytes, int]] = []
    total = seen = 0

    def refuse(rel: str, why: str) -> RenderError:
        return RenderError(f"{where}: {rel} {why}")

    def walk_error(exc: OSError) -> None:
        raise refuse(shown(Path(exc.filename or folder).relative_to(folder).as_posix()), f"cannot be read: {exc}")

    def shown(rel: str) -> str:
        return rel if rel.isprintable() else repr(rel)

    for parent, dirs, names in os.walk(folder, onerror=walk_error):
        base = Path(parent)
        descend = []
        for name in sorted([*dirs, *names]):
            path = base / name
            rel = path.relative_to(folder).as_posix()
            seen += 1
            if seen > MAX_CODE_ENTRIES:
                raise too_much
            link = path.is_symlink()
            if name in dirs and not link:
                if not spec.match_file(rel + "/"):
                    if not rel.isprintable():
                        raise refuse(shown(rel), "is not one printable line: a folder name must be")
                    descend.append(name)
                continue
            if spec.match_file(rel):
                continue
            if not rel.isprintable():
                raise refuse(shown(rel), "is not one printable line: a file name must be")
            if link:
                try:
                    target = files.inside(folder, path)
                except files.Outside as exc:
                    raise refuse(
                        rel, f"is a link to {exc.target}: only links to files inside the folder are copied"
                    ) from None
                except files.Refused as exc:
                    raise refuse(rel, f"is a link that cannot be followed: {exc}") from None
                if target.is_dir():
                    raise refuse(rel, f"is a link to the folder {target}: only links to files inside it are copied")
            try:
                st = files.regular(path)
                if len(out) >= MAX_CODE_FILES or total + st.st_size > MAX_CODE_BYTES:
                    raise too_much
                data = files.read_bounded(path, MAX_CODE_BYTES - total)
            except files.Refused as exc:
                raise refuse(rel, f"is not copied: {exc}") from None
            total += len(data)
            out.append((rel, data, 0o755 if st.st_mode & 0o100 else 0o644))
        dirs[:] = descend
    if not out:
        raise RenderError(f"{where}: no file left after the ignore rules")
    return sorted(out)


def code_digest(code: AppCode | None) -> str | None:
    """The digest of the code the image carries (probes.codetree: what verify computes of the folder in the image);
    None without code."""
    if code is None:
        return None
    import hashlib

    return codetree.digest(
        (rel, mode == 0o755, hashlib.sha256(data).hexdigest()) for rel, data, mode in code_files(code)
    )
