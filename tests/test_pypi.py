"""imgbuild.pypi: reading a wheel's METADATA from the index with HTTP range requests.

Offline tests run a small HTTP server on 127.0.0.1 (Range ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n``
answered with 206 + Content-Range; HEAD) that serves a generated simple page and generated wheels. The one
``network`` test reads torch 2.5.1 from the real configured index; run it with ``-m network -s``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from imgbuild import pypi
from imgbuild.errors import IndexLookupError
from imgbuild.pypi import TorchPins, WheelMetadata, index_url, read_wheel_metadata, torch_pins

CP = f"cp{sys.version_info.major}{sys.version_info.minor}"

TORCH_251_REQUIRES = [
    "filelock",
    "typing-extensions>=4.8.0",
    'nvidia-cuda-nvrtc-cu12==12.4.127; platform_system == "Linux" and platform_machine == "x86_64"',
    'nvidia-cuda-runtime-cu12==12.4.127; platform_system == "Linux" and platform_machine == "x86_64"',
    'nvidia-cudnn-cu12==9.1.0.70; platform_system == "Linux" and platform_machine == "x86_64"',
    'nvidia-nccl-cu12==2.21.5; platform_system == "Linux" and platform_machine == "x86_64"',
    'triton==3.1.0; platform_system == "Linux" and platform_machine == "x86_64" and python_version < "3.13"',
    'opt-einsum>=3.3; extra == "opt-einsum"',
]


# --------------------------------------------------------------------------------------------------
# A local index


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        rng = self.headers.get("Range")
        self.server.log.append((self.command, path, rng))
        data = self.server.files.get(path)
        if data is None:
            self._send(404, b"not found\n", {"Content-Type": "text/plain"}, body)
            return
        ctype = "text/html" if path.endswith("/") else "application/octet-stream"
        if rng is None or self.server.ignore_range:
            self._send(200, data, {"Content-Type": ctype, "Accept-Ranges": "bytes"}, body)
            return
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
        size = len(data)
        if not m or (not m[1] and not m[2]):
            self._send(416, b"", {"Content-Range": f"bytes */{size}"}, body)
            return
        if m[1]:
            start, end = int(m[1]), min(int(m[2]) if m[2] else size - 1, size - 1)
        else:
            start, end = max(0, size - int(m[2])), size - 1
        if start >= size or end < start:
            self._send(416, b"", {"Content-Range": f"bytes */{size}"}, body)
            return
        headers = {"Content-Type": ctype, "Content-Range": f"bytes {start}-{end}/{size}"}
        self._send(206, data[start : end + 1], headers, body)

    def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            try:
                self.wfile.write(data)
                self.server.bytes_sent += len(data)
            except (BrokenPipeError, ConnectionResetError):
                pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.ignore_range = False
        self.bytes_sent = 0

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up early (as on a 200 it refuses) is expected


@dataclass
class Index:
    server: _Server
    root: str  # http://127.0.0.1:PORT
    pages: dict[str, list[str]] = field(default_factory=dict)

    @property
    def simple(self) -> str:
        return self.root + "/simple/"

    def add_file(self, path: str, data: bytes) -> str:
        self.server.files[path] = data
        return self.root + path

    def add_link(self, project: str, href: str) -> None:
        """An anchor on the project's simple page (`project` already normalised)."""
        self.pages.setdefault(project, []).append(href)
        anchors = "\n".join(f'<a href="{h}">{h.split("#")[0].rsplit("/", 1)[-1]}</a><br/>' for h in self.pages[project])
        page = f"<!DOCTYPE html>\n<html><body><h1>Links for {project}</h1>\n{anchors}\n</body></html>\n"
        self.server.files[f"/simple/{project}/"] = page.encode()

    def add_wheel(self, project: str, filename: str, data: bytes, *, href: str | None = None) -> str:
        """Serve a wheel under /files/ and link it from the page, with its #sha256= fragment."""
        url = self.add_file(f"/files/{filename}", data)
        digest = hashlib.sha256(data).hexdigest()
        self.add_link(project, f"{href or url}#sha256={digest}")
        return url

    def wheel_requests(self) -> list[tuple[str, str, str | None]]:
        return [entry for entry in self.server.log if entry[1].startswith("/files/")]


@pytest.fixture
def index() -> Iterator[Index]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Index(server=server, root=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # requests must reach 127.0.0.1 directly, whatever proxy the environment has.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


# --------------------------------------------------------------------------------------------------
# Generated wheels


def make_wheel(
    tmp_path: Path,
    filename: str,
    requires: list[str],
    *,
    layout: str = "last",
    junk: int = 3 * 1024 * 1024,
    filler: int = 0,
) -> bytes:
    """A real wheel: a package, `junk` bytes of incompressible data, `filler` small members (to make the
    central directory big), and ``<name>-<version>.dist-info/`` last, first or in the middle."""
    name, version = filename.split("-")[:2]
    dist_info = f"{name}-{version}.dist-info"
    metadata = "\n".join(
        ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", "Summary: a test wheel"]
        + [f"Requires-Dist: {r}" for r in requires]
        + ["", "A long description. " * 200, ""]
    )

    def write_dist_info(zf: zipfile.ZipFile) -> None:
        zf.writestr(f"{dist_info}/METADATA", metadata, compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr(f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nTag: {CP}-{CP}-manylinux1_x86_64\n")
        zf.writestr(f"{dist_info}/RECORD", "")

    def write_filler(zf: zipfile.ZipFile, lo: int, hi: int) -> None:
        for i in range(lo, hi):
            zf.writestr(f"{name}/include/some/deep/header/directory/of/the/package/file_{i:06d}.h", b"x")

    path = tmp_path / filename
    with zipfile.ZipFile(path, "w") as zf:
        if layout == "first":
            write_dist_info(zf)
        zf.writestr(f"{name}/__init__.py", f"VERSION = '{version}'\n")
        zf.writestr(f"{name}/lib/libbig.so", os.urandom(junk), compress_type=zipfile.ZIP_STORED)
        write_filler(zf, 0, filler // 2)
        if layout == "middle":
            write_dist_info(zf)
        write_filler(zf, filler // 2, filler)
        if layout == "last":
            write_dist_info(zf)
    return path.read_bytes()


def torch_wheel_name(version: str = "2.5.1", platform: str = "manylinux1_x86_64", cp: str = CP) -> str:
    return f"torch-{version}-{cp}-{cp}-{platform}.whl"


# --------------------------------------------------------------------------------------------------
# Pins


def test_torch_pins_found(index: Index, tmp_path: Path) -> None:
    data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES)
    url = index.add_wheel("torch", torch_wheel_name(), data)

    pins = torch_pins("2.5.1", index=index.simple)

    assert isinstance(pins, TorchPins)
    assert pins.nccl_package == "nvidia-nccl-cu12"
    assert pins.nccl_version == "2.21.5"
    assert pins.cuda_version == "12.4"
    assert pins.torch_version == "2.5.1"
    assert pins.wheel_filename == torch_wheel_name()
    assert pins.wheel_size == len(data)
    assert pins.wheel_url == url
    assert pins.wheel_sha256 == hashlib.sha256(data).hexdigest()
    # A few requests, a small fraction of the wheel, and nothing else was downloaded.
    assert 0 < pins.bytes_fetched < len(data) // 20
    assert pins.requests_made <= 3
    assert len(index.wheel_requests()) == pins.requests_made
    assert all(rng for _, _, rng in index.wheel_requests())
    assert index.server.bytes_sent < len(data) // 20 + 10_000


def test_read_wheel_metadata_fields(index: Index, tmp_path: Path) -> None:
    data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES)
    index.add_wheel("torch", torch_wheel_name(), data)

    meta = read_wheel_metadata("torch", "2.5.1", index=index.simple)

    assert isinstance(meta, WheelMetadata)
    assert meta.project == "torch" and meta.version == "2.5.1"
    assert meta.requires_dist == tuple(TORCH_251_REQUIRES)
    assert meta.wheel_size == len(data)
    assert meta.index_page_url == index.simple + "torch/"


def test_relative_href_and_sha256_fragment(index: Index, tmp_path: Path) -> None:
    data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES)
    # The page is /simple/torch/; ../../files/x resolves to /files/x.
    index.add_wheel("torch", torch_wheel_name(), data, href=f"../../files/{torch_wheel_name()}")

    meta = read_wheel_metadata("torch", "2.5.1", index=index.simple)

    assert meta.wheel_url == f"{index.root}/files/{torch_wheel_name()}"
    assert "#" not in meta.wheel_url
    assert meta.wheel_sha256 == hashlib.sha256(data).hexdigest()


def test_index_url_without_trailing_slash(index: Index, tmp_path: Path) -> None:
    index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES))
    assert torch_pins("2.5.1", index=index.simple.rstrip("/")).nccl_version == "2.21.5"


@pytest.mark.parametrize("layout", ["first", "middle"])
def test_metadata_not_at_the_end_of_a_big_central_directory(index: Index, tmp_path: Path, layout: str) -> None:
    # ~4000 entries: a central directory of ~400 kB, several times what the first request brings.
    data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES, layout=layout, filler=4000)
    index.add_wheel("torch", torch_wheel_name(), data)

    pins = torch_pins("2.5.1", index=index.simple)

    assert (pins.nccl_package, pins.nccl_version, pins.cuda_version) == ("nvidia-nccl-cu12", "2.21.5", "12.4")
    if layout == "first":  # found by the look at the directory's start: no full scan
        assert pins.bytes_fetched < 250_000
        assert pins.requests_made <= 3


def test_zip64_end_records(index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 2)  # makes zipfile write zip64 end records
        data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES, junk=100_000)
    assert b"PK\x06\x06" in data[-200:]
    index.add_wheel("torch", torch_wheel_name(), data)
    assert torch_pins("2.5.1", index=index.simple).nccl_version == "2.21.5"


def test_small_wheel_and_prepended_bytes(index: Index, tmp_path: Path) -> None:
    # Smaller than the first request, and with bytes before the archive (offsets shifted).
    data = b"#!/bin/sh\n" + make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES, junk=10)
    index.add_wheel("torch", torch_wheel_name(), data)
    pins = torch_pins("2.5.1", index=index.simple)
    assert pins.nccl_version == "2.21.5"
    assert pins.requests_made == 1


@pytest.mark.parametrize(
    ("requires", "package", "cuda"),
    [
        (
            ['nvidia-nccl-cu13==2.27.7; platform_system == "Linux"', "nvidia-cuda-runtime==13.0.96"],
            "nvidia-nccl-cu13",
            "13.0",
        ),
        (
            [
                "nvidia-nccl-cu13==2.28.9",
                "cuda-toolkit[cublas,cudart,nvrtc]==13.0.2",
                "cuda-bindings<14,>=13.0.3",
            ],
            "nvidia-nccl-cu13",
            "13.0",
        ),
        (["nvidia-cuda-runtime-cu11 (==11.7.99)", "nvidia-nccl-cu11 (==2.14.3)"], "nvidia-nccl-cu11", "11.7"),
        (["Nvidia_NCCL_cu12==2.20.5"], "nvidia-nccl-cu12", None),
    ],
)
def test_pin_styles(index: Index, tmp_path: Path, requires: list[str], package: str, cuda: str | None) -> None:
    index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), requires, junk=1000))
    pins = torch_pins("2.5.1", index=index.simple)
    assert pins.nccl_package == package
    assert pins.cuda_version == cuda


def test_wheel_choice_prefers_linux_x86_64_and_this_interpreter(index: Index, tmp_path: Path) -> None:
    other_cp = "cp39" if CP != "cp39" else "cp310"
    decoys = [
        torch_wheel_name(platform="macosx_11_0_arm64"),
        torch_wheel_name(platform="win_amd64"),
        torch_wheel_name(platform="manylinux2014_aarch64"),
        torch_wheel_name(cp=other_cp),
        torch_wheel_name(version="2.5.0"),
    ]
    for name in decoys:
        index.add_wheel("torch", name, b"not a zip at all")
    index.add_link("torch", "torch-2.5.1.tar.gz")
    good = torch_wheel_name()
    index.add_wheel("torch", good, make_wheel(tmp_path, good, TORCH_251_REQUIRES, junk=1000))

    assert torch_pins("2.5.1", index=index.simple).wheel_filename == good


def test_wheel_choice_falls_back_to_any_cp3(index: Index, tmp_path: Path) -> None:
    other = torch_wheel_name(cp="cp39" if CP != "cp39" else "cp310", platform="manylinux_2_28_x86_64")
    index.add_wheel("torch", other, make_wheel(tmp_path, other, TORCH_251_REQUIRES, junk=1000))
    assert torch_pins("2.5.1", index=index.simple).wheel_filename == other


def test_project_name_normalised(index: Index, tmp_path: Path) -> None:
    name = "my_pkg-1.0-py3-none-any.whl"
    index.add_wheel("my-pkg", name, make_wheel(tmp_path, name, ["requests>=2"], junk=1000))
    meta = read_wheel_metadata("My.Pkg", "1.0", index=index.simple)
    assert meta.wheel_filename == name
    assert meta.requires_dist == ("requests>=2",)


# --------------------------------------------------------------------------------------------------
# Failures


def test_missing_version(index: Index, tmp_path: Path) -> None:
    index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), [], junk=10))
    with pytest.raises(IndexLookupError, match=r"torch 9\.9\.9: no such version") as exc:
        torch_pins("9.9.9", index=index.simple)
    assert f"{index.simple}torch/" in str(exc.value)
    assert index.wheel_requests() == []


def test_missing_project(index: Index) -> None:
    with pytest.raises(IndexLookupError, match="no project 'nosuch'") as exc:
        read_wheel_metadata("nosuch", "1.0", index=index.simple)
    assert f"{index.simple}nosuch/" in str(exc.value)


def test_no_linux_wheel(index: Index) -> None:
    name = torch_wheel_name(platform="macosx_11_0_arm64")
    index.add_wheel("torch", name, b"x")
    with pytest.raises(IndexLookupError, match=r"torch 2\.5\.1: no Linux x86_64 .*macosx"):
        torch_pins("2.5.1", index=index.simple)


def test_server_ignoring_range(index: Index, tmp_path: Path) -> None:
    data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES)
    url = index.add_wheel("torch", torch_wheel_name(), data)
    index.server.ignore_range = True
    with pytest.raises(IndexLookupError, match="ignored the Range header") as exc:
        torch_pins("2.5.1", index=index.simple)
    message = str(exc.value)
    assert "torch 2.5.1" in message and url in message
    assert len(index.wheel_requests()) == 1


def test_non_exact_nccl_pin(index: Index, tmp_path: Path) -> None:
    requires = ["nvidia-nccl-cu12>=2.21.5", "nvidia-cuda-runtime-cu12==12.4.127"]
    url = index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), requires, junk=10))
    with pytest.raises(IndexLookupError, match="not an exact '==' pin") as exc:
        torch_pins("2.5.1", index=index.simple)
    assert "torch 2.5.1" in str(exc.value) and url in str(exc.value)


def test_no_nccl_requirement(index: Index, tmp_path: Path) -> None:
    index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), ["filelock"], junk=10))
    with pytest.raises(IndexLookupError, match="names no nvidia-nccl"):
        torch_pins("2.5.1", index=index.simple)


def test_not_a_zip(index: Index) -> None:
    url = index.add_wheel("torch", torch_wheel_name(), b"<html>this is not a wheel</html>" * 5000)
    with pytest.raises(IndexLookupError, match="not a zip file") as exc:
        torch_pins("2.5.1", index=index.simple)
    assert url in str(exc.value)


def test_no_metadata_member(index: Index, tmp_path: Path) -> None:
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("torch/__init__.py", "")
        zf.writestr("torch-2.5.1.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    index.add_wheel("torch", torch_wheel_name(), path.read_bytes())
    with pytest.raises(IndexLookupError, match=r"no \*\.dist-info/METADATA"):
        torch_pins("2.5.1", index=index.simple)


def test_wheel_url_404(index: Index) -> None:
    index.add_link("torch", f"{index.root}/files/{torch_wheel_name()}")
    with pytest.raises(IndexLookupError, match="HTTP 404") as exc:
        torch_pins("2.5.1", index=index.simple)
    assert torch_wheel_name() in str(exc.value)


def test_connection_refused() -> None:
    with pytest.raises(
        IndexLookupError, match=re.escape("cannot read the index page http://127.0.0.1:9/simple/torch/")
    ):
        torch_pins("2.5.1", index="http://127.0.0.1:9/simple/")


def test_file_index_refused() -> None:
    with pytest.raises(IndexLookupError, match="not http"):
        read_wheel_metadata("torch", "2.5.1", index="file:///opt/simple")


def test_timeouts_on_every_request(index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES))
    seen: list[object] = []
    session = requests.Session()
    original = session.get

    def spy(url: str, **kwargs: object) -> requests.Response:
        seen.append(kwargs.get("timeout"))
        return original(url, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(session, "get", spy)
    torch_pins("2.5.1", index=index.simple, session=session)
    assert seen and all(t == (10, 60) for t in seen)


# --------------------------------------------------------------------------------------------------
# Which index


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    monkeypatch.delenv("IMGBUILD_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setattr(pypi, "_pip_config_index_url", lambda: None)
    return monkeypatch


def test_index_url_precedence(clean_env: pytest.MonkeyPatch) -> None:
    from pip._internal.models.index import PyPI

    assert index_url() == PyPI.simple_url

    clean_env.setattr(pypi, "_pip_config_index_url", lambda: "https://config.example/simple")
    assert index_url() == "https://config.example/simple"

    clean_env.setenv("PIP_INDEX_URL", "https://pip-env.example/simple")
    assert index_url() == "https://pip-env.example/simple"

    clean_env.setenv("IMGBUILD_INDEX_URL", "https://imgbuild.example/simple")
    assert index_url() == "https://imgbuild.example/simple"


def test_index_url_skips_file_urls(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("IMGBUILD_INDEX_URL", "file:///opt/pypi/simple")
    clean_env.setenv("PIP_INDEX_URL", "https://pip-env.example/simple")
    assert index_url() == "https://pip-env.example/simple"

    clean_env.setenv("PIP_INDEX_URL", "file:///opt/other/simple")
    clean_env.setattr(pypi, "_pip_config_index_url", lambda: "/local/dir")
    from pip._internal.models.index import PyPI

    assert index_url() == PyPI.simple_url


def test_index_url_from_pip_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("IMGBUILD_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://from-pip-config.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    assert index_url() == "https://from-pip-config.example/simple"


def test_pip_config_unset_is_tolerated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global]\ntimeout = 5\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    value = pypi._pip_config_index_url()
    assert value is None or value.startswith(("http", "file", "/"))  # None unless a system file sets one


# --------------------------------------------------------------------------------------------------
# The real index


@pytest.mark.network
def test_torch_251_from_the_real_index() -> None:
    pins = torch_pins("2.5.1")
    print(
        f"\ntorch 2.5.1 from {index_url()}: {pins.wheel_filename}, wheel {pins.wheel_size:,} bytes; "
        f"fetched {pins.bytes_fetched:,} bytes in {pins.requests_made} range requests "
        f"({100 * pins.bytes_fetched / pins.wheel_size:.3f}% of the wheel)"
    )
    assert pins.nccl_package == "nvidia-nccl-cu12"
    assert pins.nccl_version == "2.21.5"
    assert pins.cuda_version == "12.4"
    assert pins.bytes_fetched < 1_000_000
