"""What the EFA installer tarball itself says it bundles, read at `imgbuild lock` (issue 30: a new installer release
locks without a new imgbuild).

The tarball holds the packages it installs, one folder per OS release and machine, their versions in the file names
(`aws-efa-installer/DEBS/UBUNTU2204/x86_64/libfabric1-aws_2.4.0amzn3.0_amd64.deb`,
`.../libnccl-ofi_1.19.0-1_amd64.deb`, `.../openmpi40-aws_4.1.7-1_amd64.deb`;
`aws-efa-installer/RPMS/ALINUX2023/x86_64/libfabric-aws-2.4.0amzn5.0-1.amzn2023.x86_64.rpm`,
`libnccl-ofi-1.20.0-1.amzn2023.x86_64.rpm`, `openmpi40-aws-4.1.7-3.x86_64.rpm`, `openmpi50-aws-5.0.9amzn1-11...rpm`:
names as third parties' Dockerfiles and a listing of 1.49.0's package_list.txt show them). The member names are
read as the archive streams by (nothing is unpacked); the recipe's OS release and machines pick the folder.

The tarball is taken from a `--files` folder (by its download name) or downloaded (not with --offline); where it
can't be had or read, the bundle comes from the shipped data (blocks/releases/efa.yaml), and `imgbuild lock` says
which, and why.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from imgbuild.blocks import releases
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


def member_names(stream: IO[bytes]) -> list[str]:
    """The member names of a (gzipped) tar archive, read as it streams by; ValueError when it is not one."""
    try:
        with tarfile.open(fileobj=stream, mode="r|*") as tar:
            return [member.name for member in tar]
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(f"not a readable tar archive ({type(exc).__name__}: {exc})") from None


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


@dataclass
class EfaReader:
    """`resolve(read_efa=...)` for `imgbuild lock`: each EFA installer version's tarball read once, from `files` or
    downloaded (not `offline`). `said` collects one line per version for `imgbuild lock` to print (which bundle it
    used, and why); `downloaded` the sha256 of each tarball it downloaded, so the checksum step does not fetch it
    again."""

    os_id: str
    machines: tuple[str, ...]
    files: Path | None = None
    offline: bool = False
    session: requests.Session | None = None
    said: list[str] = field(default_factory=list)
    downloaded: dict[str, Download] = field(default_factory=dict)

    def __call__(self, version: str) -> releases.EfaBundle | None:
        url = installer_urls(version)["tarball"]
        name = download_name(url)
        shipped = f"efa {version}: bundle from the shipped data ({releases.file_name('efa')})"
        try:
            bundle = self._read(url, name)
        except ValueError as exc:
            self.said.append(f"{shipped}: the installer tarball was not read: {exc}")
            return None
        if bundle is None:
            self.said.append(f"{shipped}: the installer tarball was not read: locked --offline, no --files copy")
            return None
        read = ", ".join(f"{k} {v}" for k in releases.BUNDLED if (v := getattr(bundle, k)) is not None)
        row = releases.efa_release(version)
        differs = [
            f"{k} {getattr(row, k)}"
            for k in releases.BUNDLED
            if row is not None and getattr(bundle, k) is not None and getattr(row, k) not in (None, getattr(bundle, k))
        ]
        note = f" ({releases.file_name('efa')} says {', '.join(differs)}: the tarball's are used)" if differs else ""
        self.said.append(f"efa {version}: bundle read from {bundle.read_from}: {read or 'none of its packages'}{note}")
        return bundle

    def _read(self, url: str, name: str) -> releases.EfaBundle | None:
        from imgbuild.pin import checksums, record

        local = record.local_copy(self.files, url) if self.files is not None else None
        if local is not None:
            with local.open("rb") as f:
                names = member_names(f)
            return self._bundle(names, f"{name} (--files)")
        if self.offline:
            return None
        import requests

        http = self.session if self.session is not None else requests.Session()
        try:
            with http.get(url, stream=True, timeout=checksums.TIMEOUT) as response:
                response.raise_for_status()
                stream = _Hashing(response.raw, checksums.MAX_BYTES)
                names = member_names(stream)  # type: ignore[arg-type]
                stream.drain()
        except (requests.RequestException, OSError) as exc:
            raise ValueError(f"download {url}: {checksums.why(exc)}") from None
        known = checksums.third_party().get(url)
        where = f"({stream.size} bytes from {url})"
        self.downloaded[url] = checksums.checked(url, stream.sha.hexdigest(), where, known)
        return self._bundle(names, f"{name} (downloaded from {url})")

    def _bundle(self, names: list[str], read_from: str) -> releases.EfaBundle:
        try:
            versions = bundled_in(names, self.os_id, self.machines)
        except ValueError as exc:
            raise ValueError(f"{read_from}: {exc}") from None
        return releases.EfaBundle(**versions, read_from=read_from)


def efa_reader(
    os_id: str, arches: Sequence[str], *, files: Path | None, offline: bool, session: requests.Session | None = None
) -> EfaReader:
    """The reader for a recipe's target (its OS release and platform architectures, Docker's names)."""
    return EfaReader(os_id, tuple(compat.MACHINE[a] for a in arches), files, offline, session)
