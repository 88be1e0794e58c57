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
import re
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from imgbuild.blocks import _releases as releases
from imgbuild.blocks.efa import installer_urls
from imgbuild.pin.content import Download, download_name
from imgbuild.spec import compat

if TYPE_CHECKING:
    import requests

# The packages whose versions the bundle records, by the names the installer's .deb and .rpm files carry.
PACKAGES: dict[str, releases.Bundled] = {
    "libfabric1-aws": "libfabric",  # .deb
    "libfabric-aws": "libfabric",  # .rpm
    "libnccl-ofi": "aws_ofi_nccl",
    "aws-ofi-nccl": "aws_ofi_nccl",
    "openmpi40-aws": "openmpi4",
    "openmpi50-aws": "openmpi5",
}
_NAMES = "|".join(sorted(map(re.escape, PACKAGES), key=len, reverse=True))
# DEBS/<OS>/<machine>/[sub/]<name>_<version>[-<revision>]_<debarch>.deb
_DEB = re.compile(
    rf"(?:\./)?[^/]+/DEBS/(?P<os>[A-Z0-9]+)/(?P<machine>[^/]+)/(?:[^/]+/)*(?P<pkg>{_NAMES})_(?P<version>\d[^_]*?)"
    r"(?:-\d+)?_[^_/]+\.deb"
)
# RPMS/<OS>/<machine>/[sub/]<name>-<version>-<release>.rpm (the version starts with a digit: -devel is another name)
_RPM = re.compile(
    rf"(?:\./)?[^/]+/RPMS/(?P<os>[A-Z0-9]+)/(?P<machine>[^/]+)/(?:[^/]+/)*(?P<pkg>{_NAMES})-(?P<version>\d[^-/]*)"
    r"-[^-/]+\.rpm"
)


def os_folder(os_id: str) -> str:
    """The installer's folder name of an OS release: ubuntu22.04 -> UBUNTU2204, debian12 -> DEBIAN12."""
    return os_id.upper().replace(".", "")


def bundled_in(names: Iterable[str], os_id: str, machines: Sequence[str]) -> dict[str, str]:
    """The bundled versions (EfaBundle's fields) that the tarball's member `names` hold for `os_id` on `machines`;
    ValueError saying why when the tarball has no folder for them or its machines disagree."""
    found: dict[str, dict[str, set[str]]] = {}  # os folder -> field -> versions
    for name in names:
        m = _DEB.fullmatch(name) or _RPM.fullmatch(name)
        if m is None or m["machine"] not in machines:
            continue
        found.setdefault(m["os"], {}).setdefault(PACKAGES[m["pkg"]], set()).add(m["version"])
    folder = os_folder(os_id)
    if folder not in found:
        listed = ", ".join(sorted(found)) or "none"
        raise ValueError(f"it holds no {'/'.join(machines)} packages for {os_id} ({folder}; it has: {listed})")
    out: dict[str, str] = {}
    for what, versions in sorted(found[folder].items()):
        if len(versions) > 1:
            raise ValueError(f"its {folder} folders hold {what} {' and '.join(sorted(versions))}")
        out[what] = versions.pop()
    return out


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


# The release notes' sentences on what a release was tested with: "The 1.21.1 release series has been tested with
# [NCCL v2.31.2-1](...) while maintaining backward compatibility with older NCCL versions ([NCCL v2.17.1]...)" (1.19
# on), "supports [NCCL v2.29.2-1]" (up to 1.18); "This release has been tested with [Libfabric v2.6.0amzn1.0]" (1.19
# on), "it is currently tested with versions up to [Libfabric v2.3.1amzn1.0]" (1.16-1.17).
_SECTION = re.compile(r"^# v(?P<version>\d+\.\d+\.\d+)(?:-aws)?\b.*$", re.MULTILINE)
_NCCL = re.compile(r"NCCL v?(\d+\.\d+\.\d+)(?:-\d+)?")
_LIBFABRIC = re.compile(r"tested with (?:versions up to )?\[Libfabric v?(\d[^\]\s]*)\]", re.IGNORECASE)


def release_notes(text: str, version: str) -> dict[str, str]:
    """What RELEASENOTES.md's section for `version` says it was tested with (tested_nccl, tested_libfabric: the
    newest named; absent where it names none); ValueError when the notes have no section for it."""
    heads = list(_SECTION.finditer(text))
    for i, head in enumerate(heads):
        if head["version"] != version:
            continue
        body = text[head.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        out: dict[str, str] = {}
        tested = body.split("backward compatibility", 1)[0]  # the oldest NCCL it still supports comes after
        nccl = [m.group(1) for m in _NCCL.finditer(tested)]
        if nccl:
            out["tested_nccl"] = max(nccl, key=lambda v: tuple(int(x) for x in v.split(".")))
        libfabric = _LIBFABRIC.search(body)
        if libfabric:
            out["tested_libfabric"] = libfabric.group(1)
        return out
    raise ValueError(f"its RELEASENOTES.md has no section for v{version}")


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

    def efa(self, version: str) -> releases.EfaBundle | None:
        url = installer_urls(version)["tarball"]
        shipped = f"efa {version}: bundle from the shipped data ({releases.file_name('efa')})"
        try:
            scan = self._scan(url)
            bundle = None if scan is None else releases.EfaBundle(**self._bundled(scan), read_from=scan.read_from)
        except ValueError as exc:
            self.said.append(f"{shipped}: the installer tarball was not read: {exc}")
            return None
        if bundle is None:
            self.said.append(f"{shipped}: the installer tarball was not read: locked --offline, no --files copy")
            return None
        self.said.append(
            f"efa {version}: bundle read from {bundle.read_from}: {self._compared(bundle, 'efa', version)}"
        )
        return bundle

    def plugin(self, version: str, url: str) -> releases.PluginNotes | None:
        shipped = (
            f"aws_ofi_nccl {version}: tested versions from the shipped data ({releases.file_name('aws_ofi_nccl')})"
        )
        try:
            scan = self._scan(url, keep=lambda name: name.count("/") == 1 and name.endswith("/RELEASENOTES.md"))
            if scan is None:
                self.said.append(f"{shipped}: its archive was not read: locked --offline, no --files copy")
                return None
            if not scan.kept:
                raise ValueError(f"{scan.read_from} holds no RELEASENOTES.md")
            text = next(iter(scan.kept.values())).decode("utf-8", "replace")
            notes = releases.PluginNotes(**release_notes(text, version), read_from=scan.read_from)
        except ValueError as exc:
            self.said.append(f"{shipped}: its release notes were not read: {exc}")
            return None
        said = self._compared(notes, "aws_ofi_nccl", version)
        self.said.append(
            f"aws_ofi_nccl {version}: tested versions read from {notes.read_from}'s RELEASENOTES.md: {said}"
        )
        return notes

    def tag(self, component: releases.TagComponent, version: str, url: str) -> releases.TagRead | None:
        label = f"{component} {version}"
        try:
            scan = self._scan(url)
        except ValueError as exc:
            self.said.append(f"{label}: the archive of its tag was not read: {exc}")
            return None
        if scan is None:
            self.said.append(f"{label}: the archive of its tag was not read: locked --offline, no --files copy")
            return None
        commit = scan.pax.get("comment", "")
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            self.said.append(f"{label}: {scan.read_from} names no commit (not made by git archive)")
            return None
        self.said.append(f"{label}: {scan.read_from} was made from commit {commit}")
        return releases.TagRead(commit=commit, read_from=scan.read_from)

    def _compared(self, read: releases.EfaBundle | releases.PluginNotes, name: str, version: str) -> str:
        """What was read, and where the release file says otherwise (what was read is used)."""
        fields = [k for k in type(read).model_fields if k != "read_from"]
        found = ", ".join(f"{k} {v}" for k in fields if (v := getattr(read, k)) is not None) or "none of them"
        if isinstance(read, releases.EfaBundle):
            listed = {k: getattr(releases.efa_release(version), k, None) for k in fields}
        else:
            listed = {k: releases.plugin_fact(version, k) for k in fields}  # type: ignore[arg-type]
        differs = [
            f"{k} {listed[k]}"
            for k in fields
            if getattr(read, k) is not None and listed[k] not in (None, getattr(read, k))
        ]
        return found + (
            f" ({releases.file_name(name)} says {', '.join(differs)}: the archive's are used)" if differs else ""
        )

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

    def _bundled(self, scan: Scan) -> dict[str, str]:
        try:
            return bundled_in(scan.names, self.os_id, self.machines)
        except ValueError as exc:
            raise ValueError(f"{scan.read_from}: {exc}") from None


def reader(
    os_id: str, arches: Sequence[str], *, files: Path | None, offline: bool, session: requests.Session | None = None
) -> Reader:
    """The reader for a recipe's target (its OS release and platform architectures, Docker's names)."""
    return Reader(os_id, tuple(compat.MACHINE[a] for a in arches), files, offline, session)
