"""What the publishers' own artifacts say, read at `imgbuild lock` (issue 30: a new release locks without a new
imgbuild): the EFA installer tarball's bundle, aws-ofi-nccl's RELEASENOTES.md, and the commit a GitHub archive of a
tag was made from.

The EFA installer tarball holds the packages it installs, one folder per OS release and machine, their versions in
the file names (`aws-efa-installer/DEBS/UBUNTU2204/x86_64/libfabric1-aws_2.4.0amzn3.0_amd64.deb`,
`.../libnccl-ofi_1.19.0-1_amd64.deb`, `.../openmpi40-aws_4.1.7-1_amd64.deb`;
`aws-efa-installer/RPMS/ALINUX2023/x86_64/libfabric-aws-2.4.0amzn5.0-1.amzn2023.x86_64.rpm`,
`libnccl-ofi-1.20.0-1.amzn2023.x86_64.rpm`, `openmpi40-aws-4.1.7-3.x86_64.rpm`, `openmpi50-aws-5.0.9amzn1-11...rpm`:
names as third parties' Dockerfiles and a listing of 1.49.0's package_list.txt show them). The member names are
read as the archive streams by (nothing is unpacked); the recipe's OS release and machines pick the folder.
An aws-ofi-nccl archive (the release tarball or the tag's) holds RELEASENOTES.md, whose section for the release
names the NCCL and libfabric it was tested with.

An archive is taken from a `--files` folder (by its download name) or downloaded once (not with --offline; its
sha256 then serves the checksum step too); where it can't be had or read, the release files
(blocks/*/releases.yaml) answer, and `imgbuild lock` says which, and why.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import BaseModel

from imgbuild.blocks import BY_NAME, Released
from imgbuild.blocks import _releases as releases
from imgbuild.blocks._core import Artifact
from imgbuild.core import platforms
from imgbuild.pin.content import Download, download_name

if TYPE_CHECKING:
    import requests


@dataclass(frozen=True)
class Scan:
    """What one pass over a tar archive found: every member name, the contents of the members asked for, its global
    pax header (git archive writes the commit it was made from there, as `comment`), and how the archive was had."""

    names: list[str]
    kept: dict[str, bytes]
    pax: dict[str, str]
    read_from: str


def scan_tar(
    stream: IO[bytes], keep: Callable[[str], bool] = lambda name: False
) -> tuple[list[str], dict[str, bytes], dict[str, str]]:
    """One pass over a (gzipped) tar archive as it streams by: member names, the contents of the (small, regular)
    members `keep` names, the global pax header; ValueError when it is not one."""
    names: list[str] = []
    kept: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            for member in tar:
                names.append(member.name)
                if member.isfile() and member.size <= 1 << 20 and keep(member.name):
                    f = tar.extractfile(member)
                    kept[member.name] = f.read() if f is not None else b""
            pax = dict(tar.pax_headers)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(f"not a readable tar archive ({type(exc).__name__}: {exc})") from None
    return names, kept, pax


class _Hashing:
    """A read-only stream that hashes what passes through it (the download's sha256, read once for both uses)."""

    def __init__(self, raw: Any, max_bytes: int) -> None:  # urllib3 HTTPResponse: read(n) -> bytes
        self.raw, self.max_bytes = raw, max_bytes
        self.sha, self.size = hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.size += len(data)
        if self.size > self.max_bytes:
            raise OSError(f"larger than {self.max_bytes} bytes, the most imgbuild downloads at lock time")
        self.sha.update(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


@dataclass(frozen=True)
class Target:
    """What a block's parser may need of the recipe: its OS release (ubuntu22.04) and machines (x86_64, aarch64)."""

    os_id: str
    machines: tuple[str, ...]


def _compared(read: BaseModel, spec: Artifact, version: str) -> str:
    """What was read, and where the release file says otherwise (what was read is used)."""
    if spec.describe is not None:
        return spec.describe(read)
    fields = [k for k in type(read).model_fields if k != "read_from"]
    found = ", ".join(f"{k} {v}" for k in fields if (v := getattr(read, k)) is not None) or "none of them"
    listed = spec.listed(version)
    differs = [
        f"{k} {listed[k]}"
        for k in fields
        if getattr(read, k) is not None and listed.get(k) not in (None, getattr(read, k))
    ]
    return found + (f" (the release file says {', '.join(differs)}: the archive's are used)" if differs else "")


@dataclass
class Reader:
    """The publishers' artifacts for `imgbuild lock` (releases.Artifacts): each archive read once, from `files` or
    downloaded (not `offline`). `said` collects one line per artifact for `imgbuild lock` to print (what it used, and
    why); `downloaded` the sha256 of each archive it downloaded, so the checksum step does not fetch it again."""

    os_id: str
    machines: tuple[str, ...]
    files: Path | None = None
    offline: bool = False
    session: requests.Session | None = None
    said: list[str] = field(default_factory=list)
    downloaded: dict[str, Download] = field(default_factory=dict)

    @property
    def target(self) -> Target:
        return Target(self.os_id, self.machines)

    def read(self, block: str, version: str, url: str | None) -> BaseModel | None:  # releases.Artifacts
        """What block `block`'s publisher's archive of release `version` says (its `Block.artifact`): read from the
        archive at `url` (else the block's own for the release), from `files` or downloaded; None, with the reason in
        `said`, where it can't be (the block's release file answers)."""
        owner = BY_NAME[block]
        spec = owner.artifact if isinstance(owner, Released) else None
        if spec is None:
            return None
        url = url or (spec.url(version) if spec.url is not None else None)
        if url is None:
            return None
        label = f"{block} {version}"
        shipped = f"{label}: {spec.what} from the shipped data ({releases.file_name(block)})"
        try:
            scan = self._scan(url, keep=spec.keep)
            if scan is None:
                self.said.append(f"{shipped}: {spec.archive} was not read: locked --offline, no --files copy")
                return None
            read = spec.parse(scan, version, self.target)
        except ValueError as exc:
            self.said.append(f"{shipped}: {spec.archive} was not read: {exc}")
            return None
        self.said.append(
            f"{label}: {spec.what} read from {getattr(read, 'read_from', url)}: {_compared(read, spec, version)}"
        )
        return read

    def _scan(self, url: str, keep: Callable[[str], bool] = lambda name: False) -> Scan | None:
        """The archive at `url`, from the `files` folder or downloaded (None: offline with no copy); ValueError saying
        why it could not be read."""
        from imgbuild.pin import checksums, record

        name = download_name(url)
        local = record.local_copy(self.files, url) if self.files is not None else None
        if local is not None:
            with local.open("rb") as f:
                names, kept, pax = scan_tar(f, keep)
            return Scan(names, kept, pax, f"{name} (--files)")
        if self.offline:
            return None
        import requests

        http = self.session if self.session is not None else requests.Session()
        try:
            with http.get(url, stream=True, timeout=checksums.TIMEOUT) as response:
                response.raise_for_status()
                stream = _Hashing(response.raw, checksums.MAX_BYTES)
                names, kept, pax = scan_tar(stream, keep)  # type: ignore[arg-type]
                stream.drain()
        except (requests.RequestException, OSError) as exc:
            raise ValueError(f"download {url}: {checksums.why(exc)}") from None
        where = f"({stream.size} bytes from {url})"
        self.downloaded[url] = checksums.checked(url, stream.sha.hexdigest(), where, checksums.third_party().get(url))
        return Scan(names, kept, pax, f"{name} (downloaded from {url})")


def reader(
    os_id: str, arches: Sequence[str], *, files: Path | None, offline: bool, session: requests.Session | None = None
) -> Reader:
    """The reader for a recipe's target (its OS release and platform architectures, Docker's names)."""
    return Reader(os_id, tuple(platforms.MACHINE[a] for a in arches), files, offline, session)
