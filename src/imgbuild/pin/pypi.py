"""Read a wheel's METADATA from the package index without downloading the wheel.

The resolver needs to know which NCCL (and CUDA) a PyTorch release pins for releases that are not in the
shipped table. Torch wheels are close to a gigabyte, so this module reads only what it needs:

1. the project's page of the simple (PEP 503, HTML) API, to find the wheel's URL;
2. the wheel's ``*.dist-info/METADATA`` member, read by the standard library's ``zipfile`` through a
   seekable file whose reads become HTTP range requests (:mod:`imgbuild.pin.httprange`): the tail, the rest
   of the central directory, the member. torch 2.5.1 (906 MB) costs three requests and about 1.4 MB.

The index need not serve the JSON API or PEP 658 ``.metadata`` files, only the simple HTML pages and range
requests on the files. Each lookup has an overall deadline (:data:`DEFAULT_DEADLINE` seconds, or
``IMGBUILD_INDEX_DEADLINE``), enforced across its requests and while bodies stream in, so an index that
answers and then trickles a byte at a time fails the lookup instead of hanging the build.
"""

from __future__ import annotations

import email.parser
import functools
import logging
import math
import os
import re
import subprocess
import sys
import zipfile
import zlib
from contextlib import suppress
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin, urlsplit

import requests
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from imgbuild.core.errors import IndexLookupError
from imgbuild.pin.httprange import Client, RangeFile

__all__ = [
    "DEFAULT_DEADLINE",
    "TorchPins",
    "WheelMetadata",
    "cuda_wheels",
    "index_url",
    "read_wheel_metadata",
    "releases",
    "torch_pins",
]

log = logging.getLogger(__name__)

#: Seconds one lookup may take in all, unless the caller or ``IMGBUILD_INDEX_DEADLINE`` says otherwise.
DEFAULT_DEADLINE = 120.0
DEADLINE_ENV = "IMGBUILD_INDEX_DEADLINE"
#: Refuse an index page, or a METADATA member, bigger than this.
MAX_PAGE = 64 * 1024 * 1024
MAX_METADATA = 16 * 1024 * 1024

_HASH_FRAGMENT = re.compile(r"^(?P<algo>sha256|sha384|sha512|sha224|sha1|md5)=(?P<digest>[0-9a-fA-F]+)\Z")
_MANYLINUX = re.compile(r"^(?:manylinux\d*|manylinux_\d+_\d+)_(?P<machine>x86_64|aarch64)\Z")
_METADATA_MEMBER = re.compile(r"[^/]+\.dist-info/METADATA")
_NCCL = re.compile(r"^nvidia-nccl-cu\d+\Z")
_CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?\Z")
_CUDA_TOOLKIT = "cuda-toolkit"  # torch 2.11+: cuda-toolkit[cudart,...]==13.0.2
#: The machines (``uname -m``) wheels are picked for: the images' CPU architectures (core.platforms.MACHINE).
MACHINES = ("x86_64", "aarch64")


def linux_markers(machine: str) -> dict[str, str]:
    """Marker values of the images' platform on `machine`: the CUDA wheels torch needs on Linux there (Python's own
    version is this interpreter's: no CUDA requirement of a torch release depends on it)."""
    return {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": machine, "os_name": "posix"}


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
    """What a PyTorch release pins: its NCCL wheel, the CUDA runtime it was built against, and every CUDA and NCCL
    wheel it requires on Linux on the machine asked for (:func:`cuda_wheels`)."""

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
    cuda_wheels: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------------
# Which index


def _is_http(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("http", "https")


def _pip_config_index_url() -> str | None:
    """``global.index-url`` from pip's configuration files, or None when unset or pip can't say.

    ``pip config list`` prints the merged configuration as key='value' lines (``pip config get`` cannot
    read file keys in some pips, 23.2 among them). pip takes about 0.4 s to start, and a lock asks once per
    requirement set: the answer is kept per process for the environment that decides which files pip reads.
    """
    where = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_") or k in _PIP_CONFIG_PLACES))
    return _pip_config_list(where)


# what decides which configuration files pip reads (and so `pip config list`'s answer)
_PIP_CONFIG_PLACES = frozenset({"HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "VIRTUAL_ENV"})


@functools.lru_cache(maxsize=8)
def _pip_config_list(where: tuple[tuple[str, str], ...]) -> str | None:
    del where  # the cache key: pip reads the same environment from os.environ
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("pip config list failed: %s", exc)
        return None
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        key, sep, raw = line.partition("=")
        if sep and key.strip() == "global.index-url":
            value = raw.strip().strip("'\"").split()
            return value[0] if value else None
    return None


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
    """The simple-API root to read from, found the way pip finds it: imgbuild's one index configuration (the page
    reader here, and uv for the hashed closures: pin.wheels.uv_index).

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


def _tag_rank(tag: Tag, machine: str) -> tuple[int, int, int] | None:
    """How well a wheel tag suits a Linux CPython on `machine` (higher is better), None if it doesn't."""
    manylinux = _MANYLINUX.match(tag.platform)
    if manylinux and manylinux["machine"] == machine:
        platform: int | None = 3
    else:
        platform = {f"linux_{machine}": 2, "any": 1}.get(tag.platform)
    this_cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if tag.interpreter == this_cp:
        interpreter = 3
    elif tag.interpreter.startswith("cp3"):
        interpreter = 2
    elif tag.interpreter.startswith("py3") or tag.interpreter == "py2.py3":
        interpreter = 1
    else:
        return None
    # A free-threaded ABI (cp313t) is not what a default interpreter loads.
    abi = 0 if tag.abi.endswith("t") and tag.abi.startswith("cp") else 1
    return None if platform is None else (platform, interpreter, abi)


def _pick_wheel(links: list[_Link], project: str, version: str, page_url: str, machine: str = "x86_64") -> _Link:
    """The wheel of `project` `version` to read: Linux on `machine`, this interpreter's cp tag if there is one."""
    wanted = canonicalize_name(project)
    try:
        wanted_version = Version(version)
    except InvalidVersion as exc:
        raise IndexLookupError(f"{project} {version}: {version!r} is not a valid version ({page_url})") from exc
    candidates: list[tuple[tuple[int, int, int, int], str, _Link]] = []
    release_files: list[str] = []
    for link in links:
        if not link.filename.endswith(".whl"):
            # An sdist of the version still proves the release exists; other files are not ours to judge.
            with suppress(InvalidSdistFilename, InvalidVersion):
                if parse_sdist_filename(link.filename) == (wanted, wanted_version):
                    release_files.append(link.filename)
            continue
        try:
            name, wheel_version, _build, tags = parse_wheel_filename(link.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if (name, wheel_version) != (wanted, wanted_version):
            continue
        release_files.append(link.filename)
        ranks = [rank for rank in (_tag_rank(tag, machine) for tag in tags) if rank is not None]
        if ranks:
            candidates.append(((*max(ranks), 0 if link.yanked else 1), link.filename, link))
    if not candidates:
        if not release_files:
            raise IndexLookupError(
                f"{project} {version}: no such version on the index ({page_url} lists no file for it)"
            )
        shown = ", ".join(sorted(release_files)[:6]) + (", ..." if len(release_files) > 6 else "")
        raise IndexLookupError(
            f"{project} {version}: no Linux {machine} (or pure-Python) wheel on the index ({page_url} has: {shown})"
        )
    return max(candidates, key=lambda c: c[:2])[2]


# --------------------------------------------------------------------------------------------------
# The wheel


def deadline_seconds(deadline: float | None) -> float:
    """The lookup's deadline: the argument, else ``IMGBUILD_INDEX_DEADLINE``, else the default."""
    source = "deadline"
    if deadline is None:
        raw = os.environ.get(DEADLINE_ENV, "").strip()
        if not raw:
            return DEFAULT_DEADLINE
        source = DEADLINE_ENV
        try:
            deadline = float(raw)
        except ValueError as exc:
            raise IndexLookupError(f"{DEADLINE_ENV}={raw!r}: expected a number of seconds greater than 0") from exc
    if not (math.isfinite(deadline) and deadline > 0):
        raise IndexLookupError(f"{source}={deadline!r}: expected a number of seconds greater than 0")
    return deadline


def _read_metadata_member(rf: RangeFile, project: str) -> tuple[str, bytes]:
    """The name and bytes of the wheel's ``<name>-<version>.dist-info/METADATA``, read by zipfile."""
    try:
        with zipfile.ZipFile(rf) as zf:
            found = [info for info in zf.infolist() if _METADATA_MEMBER.fullmatch(info.filename)]
            wanted = canonicalize_name(project)
            # Prefer the one named for `project` (a wheel could vendor another's dist-info).
            found.sort(key=lambda i: canonicalize_name(i.filename.split("/")[0].rsplit("-", 1)[0]) != wanted)
            if not found:
                raise rf.fail("the wheel has no *.dist-info/METADATA member")
            info = found[0]
            if info.file_size > MAX_METADATA:
                raise rf.fail(f"{info.filename} is {info.file_size} bytes, over {MAX_METADATA}")
            return info.filename, zf.read(info)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, zlib.error) as exc:
        raise rf.fail(f"cannot read the wheel as a zip archive: {exc}") from exc


# --------------------------------------------------------------------------------------------------
# Public API


def _fetch_simple_page(client: Client, index: str, project: str, version: str) -> tuple[str, str, int]:
    page_url = index.rstrip("/") + "/" + canonicalize_name(project) + "/"
    what = f"{project} {version}"
    with client.get(page_url, {"Accept": "text/html"}, what=what, purpose=f"the index page {page_url}") as resp:
        if resp.status_code == 404:
            raise IndexLookupError(f"{what}: no project {project!r} on the index ({page_url} answered 404)")
        if resp.status_code != 200:
            raise IndexLookupError(f"{what}: HTTP {resp.status_code} {resp.reason} from the index page {page_url}")
        body = client.body(resp, what=what, limit=MAX_PAGE)
        # PEP 503 pages are HTML5, in practice UTF-8; the filenames they carry are ASCII.
        return body.decode("utf-8", errors="replace"), resp.url or page_url, len(body)


def read_wheel_metadata(
    project: str,
    version: str,
    *,
    index: str | None = None,
    session: requests.Session | None = None,
    deadline: float | None = None,
    machine: str = "x86_64",
) -> WheelMetadata:
    """Read the METADATA of `project` `version`'s wheel from the index with a few range requests.

    `machine` is the target's ``uname -m`` (x86_64, aarch64): the wheel for Linux on it is read.
    `index` is a simple-API root (default: :func:`index_url`). `deadline` bounds the whole lookup in
    seconds (default: ``IMGBUILD_INDEX_DEADLINE``, else :data:`DEFAULT_DEADLINE`). Raises
    :class:`IndexLookupError` on any failure, with the project, version and URL in the message.
    """
    seconds = deadline_seconds(deadline)
    root = index or index_url()
    if not _is_http(root):
        raise IndexLookupError(
            f"{project} {version}: the index {root} is not http(s), so it cannot serve range requests"
        )
    own_session = session is None
    hint = f"the index is slow or stalled; set {DEADLINE_ENV} (seconds) to wait longer"
    client = Client(session if session is not None else requests.Session(), seconds, hint=hint)
    try:
        html, page_url, page_bytes = _fetch_simple_page(client, root, project, version)
        link = _pick_wheel(_parse_simple_page(html, page_url), project, version, page_url, machine)
        rf = RangeFile(client, link.url, what=f"{project} {version} ({link.filename})")
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
            client.session.close()


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


def _environment(machine: str) -> dict[str, str]:
    return {**{key: str(value) for key, value in default_environment().items()}, **linux_markers(machine), "extra": ""}


def cuda_wheels(requires_dist: tuple[str, ...] | list[str], machine: str = "x86_64") -> tuple[str, ...]:
    """The CUDA and NCCL requirements among a torch wheel's Requires-Dist, as the image installs them before torch:
    the ``nvidia-*`` ones and ``cuda-toolkit[...]`` (torch 2.11+), whose markers hold on Linux `machine` (no extra
    asked for), each written without its marker (``nvidia-cublas-cu12==12.8.4.1``, ``cuda-toolkit[cublas,...]==13.0.2``,
    a range where torch states one), sorted by name. Lines that do not parse are left out (the NCCL pin's own check
    in :func:`torch_pins` reports a broken NCCL line)."""
    env = _environment(machine)
    found: dict[str, str] = {}
    for line in requires_dist:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        if not (name.startswith("nvidia-") or name == _CUDA_TOOLKIT):
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        req.marker = None
        req.name = name
        found.setdefault(name, str(req))
    return tuple(found[name] for name in sorted(found))


def torch_pins(
    torch_version: str,
    *,
    index: str | None = None,
    session: requests.Session | None = None,
    deadline: float | None = None,
    machine: str = "x86_64",
) -> TorchPins:
    """The NCCL wheel and CUDA runtime version that torch `torch_version`'s wheel for Linux on `machine` pins.

    NCCL: the ``nvidia-nccl-cu12==X`` / ``nvidia-nccl-cu13==X`` requirement, which must be an exact
    ``==`` pin. CUDA (major.minor): from the ``nvidia-cuda-runtime-cu12==12.4.127`` or
    ``nvidia-cuda-runtime==13.0.96`` pin, else from a ``cuda-toolkit[...]==13.0.2`` pin; None when
    neither is there. A requirement whose marker does not hold on Linux `machine` is not counted (torch 2.9's
    aarch64 wheel names NCCL for x86_64 only: a CPU build). ``cuda_wheels``: see :func:`cuda_wheels`. `index`, `session`
    and `deadline`: as for :func:`read_wheel_metadata`.
    """
    meta = read_wheel_metadata("torch", torch_version, index=index, session=session, deadline=deadline, machine=machine)
    where = f"torch {torch_version} ({meta.wheel_url})"
    env = _environment(machine)
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
        if req.marker is not None and not req.marker.evaluate(env):
            continue  # not on this machine: torch 2.9's aarch64 wheel names NCCL for x86_64 only (a CPU build)
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
        cuda_wheels=cuda_wheels(meta.requires_dist, machine),
    )


def releases(
    project: str,
    *,
    index: str | None = None,
    session: requests.Session | None = None,
    deadline: float | None = None,
) -> list[str]:
    """The final releases of `project` the index offers, oldest first (by version): every version with a wheel or an
    sdist on its simple page that is not yanked (PEP 592: a release counts while one of its files is not) and is not a
    pre-release, a development release or a local version (2.5.1+cu121: a build of a release). `index`, `session`
    and `deadline`: as for :func:`read_wheel_metadata`. Raises :class:`IndexLookupError` (the project, the page's
    URL) when the page cannot be read."""
    seconds = deadline_seconds(deadline)
    root = index or index_url()
    if not _is_http(root):
        raise IndexLookupError(f"{project} releases: the index {root} is not http(s)")
    own_session = session is None
    hint = f"the index is slow or stalled; set {DEADLINE_ENV} (seconds) to wait longer"
    client = Client(session if session is not None else requests.Session(), seconds, hint=hint)
    try:
        html, page_url, _ = _fetch_simple_page(client, root, project, "releases")
    finally:
        if own_session:
            client.session.close()
    wanted = canonicalize_name(project)
    found: set[Version] = set()
    for link in _parse_simple_page(html, page_url):
        if link.yanked:
            continue
        try:
            if link.filename.endswith(".whl"):
                name, version, _build, _tags = parse_wheel_filename(link.filename)
            else:
                name, version = parse_sdist_filename(link.filename)
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue  # not a distribution (a signature, a file in another format): not a release's proof
        if name == wanted and not (version.is_prerelease or version.is_devrelease or version.local):
            found.add(version)
    return [str(v) for v in sorted(found)]
