"""Build contexts: a folder holding the Dockerfile and only the files it copies. The CA bundle downloads trust is
no file of the context: it is the build secret `dockerfile.CA_SECRET_ID` (`ca_secret`, written by `write_secret` into
a folder `temp_secrets` removes)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from imgbuild.core import files
from imgbuild.core.errors import BuildError, RenderError
from imgbuild.image.render import BuildPlan


def write(plan: BuildPlan, folder: Path) -> list[Path]:
    """Write the Dockerfile and the plan's files (with their modes) into `folder`; returns what was written."""
    written = [folder / "Dockerfile"]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "Dockerfile").write_text(plan.dockerfile)
        for f in plan.files:
            target = files.inside(folder, folder / f.path)  # a context file never lands outside the context
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.content)
            os.chmod(target, f.mode)
            written.append(target)
    except OSError as exc:  # -o names a file, a folder we may not write, a path through a symlink loop ...
        where = exc.filename or folder
        raise RenderError(f"cannot write the build context to {folder}: {where}: {exc.strerror or exc}") from None
    except files.Refused as exc:
        raise RenderError(f"cannot write the build context to {folder}: {exc}") from None
    return written


MAX_CA_BUNDLE_BYTES = 16 << 20  # Debian's whole bundle is about 200 KB


def read_ca_bundle(path: Path) -> bytes:
    """A PEM bundle's bytes: a regular file (not a folder, a device such as /dev/zero, or a FIFO) of at most
    MAX_CA_BUNDLE_BYTES holding a certificate; else a BuildError naming the file."""
    try:
        data = files.read_bounded(path, MAX_CA_BUNDLE_BYTES)
    except files.Refused as exc:
        raise BuildError(f"--ca-bundle: cannot read it: {exc}") from None
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise BuildError(f"--ca-bundle {path}: not a PEM certificate bundle")
    return data


def ca_secret(ca_bundle: Path | None) -> bytes:
    """The bundle of the build secret `dockerfile.CA_SECRET_ID`: Mozilla's roots (certifi, what pip and requests trust
    by default) followed by `ca_bundle` (--ca-bundle / IMGBUILD_CA_BUNDLE) when given, so that a bundle holding only a
    proxy's CA still lets downloads reach sites the proxy does not intercept."""
    import certifi

    roots = Path(certifi.where()).read_bytes()
    if ca_bundle is None:
        return roots
    return roots.rstrip(b"\n") + b"\n" + read_ca_bundle(ca_bundle)


def write_secret(data: bytes, folder: Path, name: str) -> Path:
    """`data` in a new file `folder/name` only this user can read (a build secret's source, outside any build context);
    the caller removes the folder."""
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with open(fd, "wb") as f:
        f.write(data)
    return path


@contextlib.contextmanager
def temp_secrets(secrets: Mapping[str, bytes]) -> Iterator[dict[str, Path]]:
    """Each secret's bytes in a file only this user reads (`write_secret`), in a temporary folder outside any build
    context, removed afterwards whatever happens: {id: path} for `builders.build(secrets=...)`."""
    folder = Path(tempfile.mkdtemp(prefix="imgbuild-secrets-"))
    try:
        yield {ident: write_secret(data, folder, f"{ident}.pem") for ident, data in secrets.items()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
