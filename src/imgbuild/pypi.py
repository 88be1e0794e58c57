"""Read a wheel's METADATA from the package index without downloading the wheel.

The resolver needs to know which NCCL (and CUDA) a PyTorch release pins for releases that are not in the
shipped table. Torch wheels are close to a gigabyte, so this module reads only what it needs with HTTP
range requests:

1. the project's page of the simple (PEP 503, HTML) API, to find the wheel's URL;
2. the tail of the wheel: the end-of-central-directory record and the end of the central directory, where
   the ``*.dist-info/`` entries usually are (wheel builders write the dist-info directory last); when
   they are not, the start of the central directory (torch's older wheels put it first), and only then
   the rest of it;
3. the one ``METADATA`` member, through the stdlib ``zipfile``.

torch 2.5.1 (906 MB, a 1.3 MB central directory) costs three range requests and about 140 kB.

The index need not serve the JSON API or PEP 658 ``.metadata`` files, only the simple HTML pages and range
requests on the files. A big wheel's central directory alone can be over a megabyte (torch has 11k+
files), so ``zipfile`` is shown a *virtual* archive: the real bytes up to the end of the central
directory, then a rewritten end record that declares only the last entries of the directory. ``zipfile``
then parses those entries, and reads and checks (CRC) the member itself.
"""

from __future__ import annotations

import email.parser
import io
import logging
import os
import re
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from typing import TYPE_CHECKING
from urllib.parse import urldefrag, urljoin, urlsplit

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from imgbuild.errors import IndexLookupError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = [
    "TorchPins",
    "WheelMetadata",
    "index_url",
    "read_wheel_metadata",
    "torch_pins",
]

log = logging.getLogger(__name__)

#: (connect, read) timeouts in seconds, on every request.
TIMEOUT = (10, 60)
#: Bytes fetched past the end of a read, so that zipfile's many small reads don't each become a request.
READAHEAD = 64 * 1024
#: Size of the first request, from the end of the wheel: the end record and the end of the central directory.
TAIL_FETCH = 64 * 1024
#: Bytes read from the start of the central directory when METADATA is not at its end.
HEAD_FETCH = 64 * 1024
#: Stop looking for METADATA in a central directory bigger than this (a sane wheel is far below).
MAX_CENTRAL_DIRECTORY = 64 * 1024 * 1024
#: Refuse a METADATA member bigger than this.
MAX_METADATA = 16 * 1024 * 1024

_USER_AGENT = "imgbuild (wheel metadata reader)"

# zip record layouts (APPNOTE.TXT 4.3.12, 4.3.14-16).
_EOCD = struct.Struct("<4s4H2LH")
_EOCD_SIG = b"PK\x05\x06"
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_LOCATOR_SIG = b"PK\x06\x07"
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_ZIP64_EOCD_SIG = b"PK\x06\x06"
_CDIR = struct.Struct("<4s6H3L5H2L")
_CDIR_SIG = b"PK\x01\x02"
_LOCAL_HEADER_SIZE = 30
_MAX_COMMENT = 0xFFFF

_HASH_FRAGMENT = re.compile(r"^(?P<algo>sha256|sha384|sha512|sha224|sha1|md5)=(?P<digest>[0-9a-fA-F]+)$")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?P<start>\d+)-(?P<end>\d+)/(?P<total>\d+|\*)\s*$", re.IGNORECASE)
_MANYLINUX_X86_64 = re.compile(r"^(manylinux\d*|manylinux_\d+_\d+)_x86_64$")
_NCCL = re.compile(r"^nvidia-nccl-cu\d+$")
_CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$")
_CUDA_TOOLKIT = "cuda-toolkit"  # torch 2.11+: cuda-toolkit[cudart,...]==13.0.2


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class WheelMetadata:
    """The core metadata of one wheel, and what it cost to read it.

    ``bytes_fetched`` and ``requests_made`` count the range requests made on the wheel itself (the
    project's index page, fetched once before, is counted in ``index_page_bytes``).
    """

    project: str
    version: str
    wheel_url: str
    wheel_filename: str
    wheel_size: int
    requires_dist: tuple[str, ...]
    bytes_fetched: int
    requests_made: int
    #: The ``#sha256=`` digest the index gave for the wheel (not checked: the wheel is never downloaded).
    wheel_sha256: str | None = None
    index_page_url: str = ""
    index_page_bytes: int = 0


@dataclass(frozen=True)
class TorchPins:
    """What a PyTorch release pins: its NCCL wheel and the CUDA runtime it was built against."""

    torch_version: str
    nccl_package: str
    nccl_version: str
    cuda_version: str | None
    bytes_fetched: int
    wheel_size: int
    wheel_filename: str
    requests_made: int = 0
    wheel_url: str = ""
    wheel_sha256: str | None = None


# --------------------------------------------------------------------------------------------------
# Which index


def _is_http(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("http", "https")


def _run_pip_config(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("pip config %s failed: %s", " ".join(args), exc)
        return None
    return proc.stdout if proc.returncode == 0 else None


def _pip_config_index_url() -> str | None:
    """``global.index-url`` from pip's configuration files, or None when unset or pip can't say."""
    value = _run_pip_config("get", "global.index-url")
    if value is None:
        # Unset, or a pip whose `config get` cannot read file keys (23.2 answers "No such key" for all):
        # `config list` prints the merged configuration as key='value' lines.
        for line in (_run_pip_config("list") or "").splitlines():
            key, sep, raw = line.partition("=")
            if sep and key.strip() == "global.index-url":
                value = raw.strip().strip("'\"")
    value = (value or "").strip()
    return value.split()[0] if value else None


def _pip_default_index_url() -> str:
    try:
        from pip._internal.models.index import PyPI
    except Exception as exc:  # pip missing, or its internals moved
        raise IndexLookupError(
            "no package index configured and pip's default index could not be read from pip itself "
            f"({type(exc).__name__}: {exc})",
            hint="set IMGBUILD_INDEX_URL or PIP_INDEX_URL to the simple API root of an http(s) index",
        ) from exc
    return str(PyPI.simple_url)


def index_url() -> str:
    """The simple-API root to read from, found the way pip finds it.

    In order: ``IMGBUILD_INDEX_URL``, ``PIP_INDEX_URL``, pip's ``global.index-url`` configuration, pip's
    built-in default. A ``file://`` (or any non-http) URL is skipped: it cannot serve range requests.
    """
    candidates: list[tuple[str, str | None]] = [
        ("IMGBUILD_INDEX_URL", os.environ.get("IMGBUILD_INDEX_URL")),
        ("PIP_INDEX_URL", os.environ.get("PIP_INDEX_URL")),
    ]
    for source, value in candidates:
        value = (value or "").strip()
        if not value:
            continue
        if _is_http(value):
            return value
        log.debug("skipping index %s=%s: not http(s), cannot serve range requests", source, value)
    configured = _pip_config_index_url()
    if configured:
        if _is_http(configured):
            return configured
        log.debug("skipping pip's global.index-url=%s: not http(s)", configured)
    return _pip_default_index_url()


# --------------------------------------------------------------------------------------------------
# The simple page


@dataclass(frozen=True)
class _Link:
    url: str  # absolute, without fragment
    filename: str
    sha256: str | None
    yanked: bool


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "base" and self.base is None:
            href = dict(attrs).get("href")
            if href:
                self.base = href
        elif tag == "a":
            self.anchors.append(dict(attrs))


def _parse_simple_page(html: str, page_url: str) -> list[_Link]:
    parser = _AnchorParser()
    parser.feed(html)
    parser.close()
    base = urljoin(page_url, parser.base) if parser.base else page_url
    links = []
    for attrs in parser.anchors:
        href = (attrs.get("href") or "").strip()
        if not href:
            continue
        url, fragment = urldefrag(urljoin(base, href))
        filename = urlsplit(url).path.rsplit("/", 1)[-1]
        match = _HASH_FRAGMENT.match(fragment)
        sha256 = match["digest"].lower() if match and match["algo"] == "sha256" else None
        links.append(_Link(url=url, filename=filename, sha256=sha256, yanked="data-yanked" in attrs))
    return links


def _pick_wheel(links: list[_Link], project: str, version: str, page_url: str) -> _Link:
    """The wheel of `project` `version` to read: Linux x86_64, this interpreter's cp tag if there is one."""
    wanted_name = canonicalize_name(project)
    try:
        wanted_version = Version(version)
    except InvalidVersion as exc:
        raise IndexLookupError(f"{project} {version}: {version!r} is not a valid version ({page_url})") from exc
    this_cp = f"cp{sys.version_info.major}{sys.version_info.minor}"

    candidates: list[tuple[tuple[int, int, int, int], _Link]] = []
    release_files: list[str] = []
    for link in links:
        if not link.filename.endswith(".whl"):
            if link.filename.endswith((".tar.gz", ".zip")):
                # An sdist of the version still proves the release exists.
                stem = link.filename.removesuffix(".tar.gz").removesuffix(".zip")
                name, _, ver = stem.rpartition("-")
                try:
                    if canonicalize_name(name) == wanted_name and Version(ver) == wanted_version:
                        release_files.append(link.filename)
                except InvalidVersion:
                    pass
            continue
        try:
            name, wheel_version, _build, tags = parse_wheel_filename(link.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if name != wanted_name or wheel_version != wanted_version:
            continue
        release_files.append(link.filename)
        best: tuple[int, int, int, int] | None = None
        for tag in tags:
            if _MANYLINUX_X86_64.match(tag.platform):
                platform_rank = 3
            elif tag.platform == "linux_x86_64":
                platform_rank = 2
            elif tag.platform == "any":
                platform_rank = 1
            else:
                continue
            if tag.interpreter == this_cp:
                interp_rank = 3
            elif tag.interpreter.startswith("cp3"):
                interp_rank = 2
            elif tag.interpreter.startswith("py3") or tag.interpreter == "py2.py3":
                interp_rank = 1
            else:
                continue
            # A free-threaded ABI (cp313t) is not what a default interpreter loads.
            abi_rank = 0 if tag.abi.endswith("t") and tag.abi.startswith("cp") else 1
            rank = (platform_rank, interp_rank, abi_rank, 0 if link.yanked else 1)
            best = rank if best is None or rank > best else best
        if best is not None:
            candidates.append((best, link))

    if not candidates:
        if not release_files:
            raise IndexLookupError(
                f"{project} {version}: no such version on the index ({page_url} lists no file for it)"
            )
        shown = ", ".join(sorted(release_files)[:6]) + (", ..." if len(release_files) > 6 else "")
        raise IndexLookupError(
            f"{project} {version}: no Linux x86_64 (or pure-Python) wheel on the index ({page_url} has: {shown})"
        )
    candidates.sort(key=lambda item: (item[0], item[1].filename))
    return candidates[-1][1]


# --------------------------------------------------------------------------------------------------
# Range-request file


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file whose reads become HTTP range requests.

    Fetched bytes are kept (as merged, contiguous segments) and never fetched twice; a read of bytes not
    yet fetched fetches from the read position to at least `readahead` bytes further. Optionally the
    bytes from `patch_at` on are replaced by `patch` (the file then ends with the patch): that is how a
    rewritten zip end record is shown.
    """

    def __init__(
        self,
        session: requests.Session,
        url: str,
        *,
        what: str,
        readahead: int = READAHEAD,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self._session = session
        self._url = url
        self._what = what
        self._readahead = readahead
        self._max_bytes = max_bytes
        self._pos = 0
        self._segments: list[tuple[int, bytes]] = []  # (start, data), sorted, disjoint, not touching
        self.size = -1  # real size, known after the first request
        self.bytes_fetched = 0
        self.requests_made = 0
        self._patch_at: int | None = None
        self._patch = b""

    # -- io.RawIOBase

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    @property
    def _virtual_size(self) -> int:
        return self.size if self._patch_at is None else self._patch_at + len(self._patch)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._virtual_size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise OSError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        want = len(view)
        done = 0
        while done < want:
            chunk = self._read_some(want - done)
            if not chunk:
                break
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
        return done

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._virtual_size - self._pos)
        out = bytearray(size)
        n = self.readinto(out)
        return bytes(out[:n])

    def readall(self) -> bytes:
        return self.read(-1)

    # -- internals

    def _read_some(self, n: int) -> bytes:
        pos = self._pos
        if self._patch_at is not None and pos >= self._patch_at:
            chunk = self._patch[pos - self._patch_at : pos - self._patch_at + n]
        else:
            end_real = self.size if self._patch_at is None else self._patch_at
            if pos >= end_real:
                return b""
            n = min(n, end_real - pos)
            segment = self._segment_at(pos)
            if segment is None:
                self.ensure(pos, min(end_real, pos + max(n, self._readahead)))
                segment = self._segment_at(pos)
                assert segment is not None
            seg_start, data = segment
            chunk = data[pos - seg_start : pos - seg_start + n]
        self._pos += len(chunk)
        return chunk

    def _segment_at(self, pos: int) -> tuple[int, bytes] | None:
        for start, data in self._segments:
            if start <= pos < start + len(data):
                return start, data
        return None

    def buffered_from(self, end: int) -> int:
        """Where the fetched bytes that run up to `end` start (`end` itself when none do)."""
        for start, data in self._segments:
            if start <= end <= start + len(data):
                return start
        return end

    def set_patch(self, at: int, data: bytes) -> None:
        self._patch_at = at
        self._patch = data

    def ensure(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the real file, fetching only the parts not fetched yet."""
        pieces: list[tuple[int, bytes]] = []
        pos = start
        for seg_start, data in self._segments:
            seg_end = seg_start + len(data)
            if seg_end < start or seg_start > end:
                continue
            if seg_start > pos:
                pieces.append((pos, self._get(pos, seg_start)))
            pos = max(pos, seg_end)
        if pos < end:
            pieces.append((pos, self._get(pos, end)))
        self._add(pieces)
        segment = self._segment_at(start)
        assert segment is not None or start >= end
        if segment is None:
            return b""
        seg_start, data = segment
        return data[start - seg_start : end - seg_start]

    def _add(self, pieces: list[tuple[int, bytes]]) -> None:
        merged: list[tuple[int, bytes]] = []
        for start, data in sorted(self._segments + [p for p in pieces if p[1]], key=lambda seg: seg[0]):
            if merged and start <= merged[-1][0] + len(merged[-1][1]):
                prev_start, prev = merged[-1]
                merged[-1] = (prev_start, prev + data[prev_start + len(prev) - start :])
            else:
                merged.append((start, data))
        self._segments = merged

    def fetch_tail(self, n: int) -> bytes:
        """The last `n` bytes (fewer if the file is smaller); learns the file's size."""
        data, total = self._request(f"bytes=-{n}", expected_len=None, suffix=n)
        self.size = total
        self._add([(total - len(data), data)])
        return data

    def _get(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        data, _ = self._request(f"bytes={start}-{end - 1}", expected_len=end - start, start=start)
        return data

    def _fail(self, what_went_wrong: str) -> IndexLookupError:
        return IndexLookupError(f"{self._what}: {what_went_wrong} ({self._url})")

    def _request(
        self, range_header: str, *, expected_len: int | None, start: int | None = None, suffix: int = 0
    ) -> tuple[bytes, int]:
        if self._max_bytes is not None and self.bytes_fetched > self._max_bytes:
            raise self._fail(f"read more than {self._max_bytes} bytes of the wheel without finding METADATA")
        headers = {"Range": range_header, "Accept-Encoding": "identity", "User-Agent": _USER_AGENT}
        self.requests_made += 1
        try:
            with self._session.get(
                self._url, headers=headers, stream=True, timeout=TIMEOUT, allow_redirects=True
            ) as resp:
                total = self._check_response(resp, range_header, start=start, suffix=suffix)
                limit = expected_len if expected_len is not None else suffix
                body = bytearray()
                for chunk in resp.iter_content(chunk_size=64 * 1024):
                    body += chunk
                    if len(body) > limit:
                        raise self._fail(f"the server sent more than the {limit} bytes asked for ({range_header})")
        except requests.Timeout as exc:
            raise self._fail(f"timed out reading {range_header} of the wheel") from exc
        except requests.RequestException as exc:
            raise self._fail(f"HTTP request for {range_header} of the wheel failed: {exc}") from exc
        self.bytes_fetched += len(body)
        if expected_len is not None and len(body) != expected_len:
            raise self._fail(f"asked for {expected_len} bytes ({range_header}), got {len(body)}")
        return bytes(body), total

    def _check_response(self, resp: requests.Response, range_header: str, *, start: int | None, suffix: int) -> int:
        """The file's total size, from a 206 answer; raise on anything else."""
        if resp.status_code == 200:
            length = resp.headers.get("Content-Length")
            # Asking for the last `suffix` bytes of a file smaller than that may get the whole file: fine.
            if suffix and length is not None and length.isdigit() and int(length) <= suffix:
                return int(length)
            size = f"the whole {length}-byte file" if length else "the whole file"
            raise self._fail(
                f"the server ignored the Range header (answered 200 with {size}); refusing to download the "
                "wheel to read its metadata"
            )
        if resp.status_code == 416:
            raise self._fail(f"the server refused the range {range_header} (416 Range Not Satisfiable)")
        if resp.status_code != 206:
            raise self._fail(f"HTTP {resp.status_code} {resp.reason} for {range_header} of the wheel")
        match = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
        if not match or match["total"] == "*":
            raise self._fail(
                f"206 answer without a usable Content-Range header ({resp.headers.get('Content-Range')!r})"
            )
        total = int(match["total"])
        if start is not None and int(match["start"]) != start:
            raise self._fail(f"asked for {range_header}, the server sent {resp.headers['Content-Range']}")
        if self.size >= 0 and total != self.size:
            raise self._fail(f"the file changed size while being read ({self.size} then {total} bytes)")
        return total


# --------------------------------------------------------------------------------------------------
# Zip tail


@dataclass(frozen=True)
class _CentralDirectory:
    start: int  # absolute position of the first entry in the file
    end: int  # absolute position just past the last entry
    concat: int  # bytes prepended to the archive (added to every offset stored in it)


def _locate_central_directory(rf: _RangeFile, tail: bytes) -> _CentralDirectory:
    size = rf.size
    tail_start = size - len(tail)
    # The record is 22 bytes plus a comment: its signature starts at most 22 bytes from the end.
    at = tail.rfind(_EOCD_SIG, 0, max(0, len(tail) - _EOCD.size + len(_EOCD_SIG)))
    while at >= 0:
        # Take the last signature whose comment length runs exactly to the end of the file.
        fields = _EOCD.unpack_from(tail, at)
        if at + _EOCD.size + fields[7] == len(tail):
            break
        at = tail.rfind(_EOCD_SIG, 0, at - 1 + len(_EOCD_SIG))
    if at < 0:
        if len(tail) < min(size, _EOCD.size + _MAX_COMMENT) and size > len(tail):
            return _locate_central_directory(rf, rf.ensure(max(0, size - _EOCD.size - _MAX_COMMENT), size))
        raise rf._fail("not a zip file: no end-of-central-directory record")
    eocd_pos = tail_start + at
    _, disk, cd_disk, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    if disk != 0 or cd_disk != 0:
        raise rf._fail("a multi-disk zip archive is not a wheel")
    record_pos = eocd_pos  # where the central directory is expected to end
    locator_pos = eocd_pos - _ZIP64_LOCATOR.size
    if locator_pos >= 0:
        locator = rf.ensure(locator_pos, eocd_pos)
        sig, _, zip64_pos, _ = _ZIP64_LOCATOR.unpack(locator)
        if sig == _ZIP64_LOCATOR_SIG:
            record_pos = locator_pos - _ZIP64_EOCD.size
            record = rf.ensure(record_pos, locator_pos)
            fields = _ZIP64_EOCD.unpack(record)
            if fields[0] != _ZIP64_EOCD_SIG:
                raise rf._fail(f"corrupt zip64 end record (locator points at {zip64_pos})")
            count, cd_size, cd_offset = fields[7], fields[8], fields[9]
    cd_start = record_pos - cd_size
    concat = cd_start - cd_offset
    if cd_start < 0 or concat < 0:
        raise rf._fail("corrupt zip: the central directory does not fit before its end record")
    if cd_size > MAX_CENTRAL_DIRECTORY:
        raise rf._fail(f"the wheel's central directory is {cd_size} bytes, over {MAX_CENTRAL_DIRECTORY}")
    log.debug("%s: %d entries, central directory %d bytes at %d", rf._url, count, cd_size, cd_start)
    return _CentralDirectory(start=cd_start, end=record_pos, concat=concat)


@dataclass(frozen=True)
class _Entry:
    pos: int  # position of the entry in the bytes parsed
    end: int  # position just past it
    name: str
    header_offset: int  # of the member's local header, relative to the archive (add concat)
    compress_size: int


def _parse_entries(data: bytes, pos: int, *, to_end: bool) -> list[_Entry] | None:
    """The central-directory entries chained from `pos` in `data`.

    With `to_end`, the chain must end exactly at len(data), else None. Without, the chain stops at the
    first entry that does not fit (the window cut it), and None only if there is no entry at `pos`.
    """
    entries: list[_Entry] = []
    while pos < len(data):
        if pos + _CDIR.size > len(data) and not to_end:
            break
        if data[pos : pos + 4] != _CDIR_SIG or pos + _CDIR.size > len(data):
            return None
        fields = _CDIR.unpack_from(data, pos)
        flags, compress_size = fields[3], fields[8]
        name_len, extra_len, comment_len, header_offset = fields[10], fields[11], fields[12], fields[16]
        end = pos + _CDIR.size + name_len + extra_len + comment_len
        if end > len(data):
            if to_end:
                return None
            break
        raw = data[pos + _CDIR.size : pos + _CDIR.size + name_len]
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
        entries.append(_Entry(pos, end, name, header_offset, compress_size))
        pos = end
    return entries or None


def _chain_to_end(data: bytes) -> list[_Entry] | None:
    """The entries of a window cut from the end of a central directory: those from the first position
    where a signature starts a chain that runs exactly to the end (a signature inside a name or an extra
    field cannot, short of a contrived archive)."""
    at = data.find(_CDIR_SIG)
    while at >= 0:
        entries = _parse_entries(data, at, to_end=True)
        if entries:
            return entries
        at = data.find(_CDIR_SIG, at + 1)
    return None


def _metadata_entry(entries: list[_Entry], project: str) -> _Entry | None:
    """The ``<name>-<version>.dist-info/METADATA`` entry, preferring the one named for `project`."""
    found = [e for e in entries if re.fullmatch(r"[^/]+\.dist-info/METADATA", e.name)]
    wanted = canonicalize_name(project)
    for entry in found:
        dist = entry.name.split("/", 1)[0].removesuffix(".dist-info").rsplit("-", 1)[0]
        if canonicalize_name(dist) == wanted:
            return entry
    return found[0] if found else None


def _end_records(cd_offset: int, cd_size: int, count: int) -> bytes:
    """A (zip64 where needed) end of central directory for `count` entries of `cd_size` at `cd_offset`."""
    if count < 0xFFFF and cd_size < 0xFFFFFFFF and cd_offset < 0xFFFFFFFF:
        return _EOCD.pack(_EOCD_SIG, 0, 0, count, count, cd_size, cd_offset, 0)
    zip64_pos = cd_offset + cd_size  # relative to the (virtual) archive, like cd_offset
    zip64 = _ZIP64_EOCD.pack(_ZIP64_EOCD_SIG, _ZIP64_EOCD.size - 12, 45, 45, 0, 0, count, count, cd_size, cd_offset)
    locator = _ZIP64_LOCATOR.pack(_ZIP64_LOCATOR_SIG, 0, zip64_pos, 1)
    eocd = _EOCD.pack(_EOCD_SIG, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return zip64 + locator + eocd


def _find_metadata_entries(rf: _RangeFile, cd: _CentralDirectory, project: str) -> tuple[int, int, list[_Entry]]:
    """(start, stop, entries): a run of whole central-directory entries, at [start, stop) of the file, that
    holds the METADATA entry. Entry positions are relative to `start`.

    Looked for, in order, where it costs least: in what the first request brought of the directory's end
    (wheel writers put ``.dist-info/`` last), at the directory's start (some repackers, torch's among
    them, put it first), then in ever bigger windows from the end up to the whole directory.
    """
    total = cd.end - cd.start
    have = cd.end - max(cd.start, rf.buffered_from(cd.end))
    window = min(total, max(have, 4096))
    tried_head = False
    while True:
        start = cd.end - window
        data = rf.ensure(start, cd.end)
        entries = _parse_entries(data, 0, to_end=True) if window == total else _chain_to_end(data)
        if window == total and entries is None:
            raise rf._fail("corrupt zip: the central directory does not parse")
        if entries and _metadata_entry(entries, project):
            first = entries[0].pos
            return start + first, cd.end, [replace(e, pos=e.pos - first, end=e.end - first) for e in entries]
        if window == total:
            raise rf._fail("the wheel has no *.dist-info/METADATA member")
        if not tried_head:
            tried_head = True
            head = rf.ensure(cd.start, min(cd.end, cd.start + HEAD_FETCH))
            entries = _parse_entries(head, 0, to_end=False)
            if entries is None:
                raise rf._fail("corrupt zip: no entry at the start of the central directory")
            if _metadata_entry(entries, project):
                return cd.start, cd.start + entries[-1].end, entries
        window = min(total, window * 4)


def _read_metadata_member(rf: _RangeFile, project: str) -> tuple[str, bytes]:
    tail = rf.fetch_tail(TAIL_FETCH)
    cd = _locate_central_directory(rf, tail)
    start, stop, entries = _find_metadata_entries(rf, cd, project)
    entry = _metadata_entry(entries, project)
    assert entry is not None

    # Show zipfile the archive as if its central directory held only these entries.
    rf.set_patch(stop, _end_records(start - cd.concat, stop - start, len(entries)))
    if entry.compress_size < 0xFFFFFFFF:
        # Fetch the local header and the compressed member in one request (the local extra field is
        # usually the central one's size or less; readahead covers a longer one).
        header = cd.concat + entry.header_offset
        extra = 256 + entry.end - entry.pos - _CDIR.size - len(entry.name.encode())
        rf.ensure(
            header,
            min(stop, header + _LOCAL_HEADER_SIZE + len(entry.name.encode()) + extra + entry.compress_size),
        )
    try:
        with zipfile.ZipFile(rf) as zf:
            info = zf.getinfo(entry.name)
            if info.file_size > MAX_METADATA:
                raise rf._fail(f"{entry.name} is {info.file_size} bytes, over {MAX_METADATA}")
            return entry.name, zf.read(info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, NotImplementedError, EOFError) as exc:
        raise rf._fail(f"cannot read {entry.name} from the wheel: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise rf._fail(f"cannot read {entry.name} from the wheel: {type(exc).__name__}: {exc}") from exc


# --------------------------------------------------------------------------------------------------
# Public API


def _fetch_simple_page(session: requests.Session, index: str, project: str, version: str) -> tuple[str, str, int]:
    page_url = index.rstrip("/") + "/" + canonicalize_name(project) + "/"
    what = f"{project} {version}"
    try:
        resp = session.get(
            page_url,
            headers={"Accept": "text/html", "User-Agent": _USER_AGENT},
            timeout=TIMEOUT,
            allow_redirects=True,
        )
    except requests.Timeout as exc:
        raise IndexLookupError(f"{what}: timed out reading the index page {page_url}") from exc
    except requests.RequestException as exc:
        raise IndexLookupError(f"{what}: cannot read the index page {page_url}: {exc}") from exc
    with resp:
        if resp.status_code == 404:
            raise IndexLookupError(f"{what}: no project {project!r} on the index ({page_url} answered 404)")
        if resp.status_code != 200:
            raise IndexLookupError(f"{what}: HTTP {resp.status_code} {resp.reason} from the index page {page_url}")
        return resp.text, resp.url or page_url, len(resp.content)


def read_wheel_metadata(
    project: str,
    version: str,
    *,
    index: str | None = None,
    session: requests.Session | None = None,
) -> WheelMetadata:
    """Read the METADATA of `project` `version`'s wheel from the index with a few range requests.

    `index` is a simple-API root (default: :func:`index_url`). Raises :class:`IndexLookupError` on any
    failure, with the project, version and URL in the message.
    """
    root = index or index_url()
    if not _is_http(root):
        raise IndexLookupError(
            f"{project} {version}: the index {root} is not http(s), so it cannot serve range requests"
        )
    own_session = session is None
    sess = session if session is not None else requests.Session()
    try:
        html, page_url, page_bytes = _fetch_simple_page(sess, root, project, version)
        link = _pick_wheel(_parse_simple_page(html, page_url), project, version, page_url)
        rf = _RangeFile(sess, link.url, what=f"{project} {version} ({link.filename})", max_bytes=MAX_CENTRAL_DIRECTORY)
        member, raw = _read_metadata_member(rf, project)
        headers = email.parser.HeaderParser().parsestr(raw.decode("utf-8", errors="replace"))
        requires = tuple(str(value).strip() for value in headers.get_all("Requires-Dist") or [])
        log.debug("%s: read %s, %d bytes in %d requests", link.url, member, rf.bytes_fetched, rf.requests_made)
        return WheelMetadata(
            project=project,
            version=version,
            wheel_url=link.url,
            wheel_filename=link.filename,
            wheel_size=rf.size,
            requires_dist=requires,
            bytes_fetched=rf.bytes_fetched,
            requests_made=rf.requests_made,
            wheel_sha256=link.sha256,
            index_page_url=page_url,
            index_page_bytes=page_bytes,
        )
    finally:
        if own_session:
            sess.close()


def _exact_pin(req: Requirement) -> str | None:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
        return specs[0].version
    return None


def _major_minor(version: str) -> str | None:
    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    return f"{release[0]}.{release[1]}" if len(release) >= 2 else None


def torch_pins(
    torch_version: str,
    *,
    index: str | None = None,
    session: requests.Session | None = None,
) -> TorchPins:
    """The NCCL wheel and CUDA runtime version that torch `torch_version`'s Linux x86_64 wheel pins.

    NCCL: the ``nvidia-nccl-cu12==X`` / ``nvidia-nccl-cu13==X`` requirement, which must be an exact
    ``==`` pin. CUDA (major.minor): from the ``nvidia-cuda-runtime-cu12==12.4.127`` or
    ``nvidia-cuda-runtime==13.0.96`` pin, else from a ``cuda-toolkit[...]==13.0.2`` pin; None when
    neither is there. Requirement markers are ignored.
    """
    meta = read_wheel_metadata("torch", torch_version, index=index, session=session)
    where = f"torch {torch_version} ({meta.wheel_url})"
    nccl: list[tuple[str, str | None, str]] = []
    cuda_runtime: str | None = None
    cuda_toolkit: str | None = None
    for line in meta.requires_dist:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            if re.match(r"\s*nvidia[-_.]nccl", line, re.IGNORECASE):
                raise IndexLookupError(f"{where}: cannot parse the NCCL requirement {line!r}: {exc}") from exc
            continue
        name = canonicalize_name(req.name)
        if _NCCL.match(name):
            nccl.append((name, _exact_pin(req), line))
        elif _CUDA_RUNTIME.match(name) and cuda_runtime is None:
            pinned = _exact_pin(req)
            cuda_runtime = _major_minor(pinned) if pinned else None
        elif name == _CUDA_TOOLKIT and cuda_toolkit is None:
            pinned = _exact_pin(req)
            cuda_toolkit = _major_minor(pinned) if pinned else None
    # The runtime's own pin says it best; the cuda-toolkit meta-package pin is next. A cuNN suffix alone
    # gives no minor version, so it is not used to guess one.
    cuda = cuda_runtime or cuda_toolkit
    if not nccl:
        raise IndexLookupError(
            f"{where}: Requires-Dist names no nvidia-nccl-cu* package (a CPU-only or non-Linux build?)"
        )
    for _, pin, line in nccl:
        if pin is None:
            raise IndexLookupError(f"{where}: the NCCL requirement {line!r} is not an exact '==' pin")
    pins = {(name, pin) for name, pin, _ in nccl}
    if len(pins) > 1:
        raise IndexLookupError(f"{where}: conflicting NCCL pins: {', '.join(line for _, _, line in nccl)}")
    nccl_package, nccl_version = next(iter(pins))
    assert nccl_version is not None
    return TorchPins(
        torch_version=torch_version,
        nccl_package=nccl_package,
        nccl_version=nccl_version,
        cuda_version=cuda,
        bytes_fetched=meta.bytes_fetched,
        wheel_size=meta.wheel_size,
        wheel_filename=meta.wheel_filename,
        requests_made=meta.requests_made,
        wheel_url=meta.wheel_url,
        wheel_sha256=meta.wheel_sha256,
    )
