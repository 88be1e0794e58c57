"""imgbuild.pin.pypi and imgbuild.pin.httprange: reading a wheel's METADATA from the index with HTTP range requests.

Offline tests run the small real HTTP server of localindex.py on 127.0.0.1 (conftest's ``index`` fixture: Range
``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` answered with 206 + Content-Range; HEAD) that serves a generated simple
page and real wheels made with zipfile, and that can be told to stall or to trickle its bodies a byte at a time.
The ``network`` tests read torch 2.5.1 and 2.9.1 from the real configured index; run them with ``-m network -s``.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import socket
import time
import zipfile
from pathlib import Path

import pytest
import requests

from imgbuild.blocks.pytorch import shipped
from imgbuild.core.errors import IndexLookupError
from imgbuild.pin import httprange, pypi
from imgbuild.pin.pypi import TorchPins, WheelMetadata, cuda_wheels, index_url, read_wheel_metadata, torch_pins
from localindex import CP, Index, make_wheel, torch_wheel_name

TORCH = shipped()  # blocks/pytorch/releases.yaml: version -> what its x86_64 wheel pins

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
# The local index (localindex.py, conftest's `index` fixture)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # requests must reach 127.0.0.1 directly, whatever proxy the environment has.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


# --------------------------------------------------------------------------------------------------
# Generated wheels


def central_directory_size(data: bytes) -> int:
    """Bytes from the start of the central directory to the end of the archive."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return len(data) - zf.start_dir


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
    assert pins.cuda_wheels == (
        "nvidia-cuda-nvrtc-cu12==12.4.127",
        "nvidia-cuda-runtime-cu12==12.4.127",
        "nvidia-cudnn-cu12==9.1.0.70",
        "nvidia-nccl-cu12==2.21.5",
    )
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
    # zipfile reads the whole central directory, and nothing else but its end record and the member:
    # the tail, the rest of the directory, the member (fetched with some read-ahead).
    assert pins.bytes_fetched <= central_directory_size(data) + 2 * httprange.READAHEAD
    assert pins.requests_made == 3


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


def test_cuda_wheels_are_the_linux_x86_64_ones_written_without_markers() -> None:
    """The CUDA wheels the image installs before torch: nvidia-* and cuda-toolkit[...] whose markers hold on Linux
    x86_64 with no extra, names normalised, extras and ranges kept as torch states them, sorted; everything else
    (triton, numpy, an aarch64-only or extra-only wheel, a line that does not parse) left out."""
    requires = [
        'nvidia-nccl-cu13==2.29.7; platform_system == "Linux" and platform_machine == "x86_64"',
        'Nvidia_CuDNN_cu13==9.20.0.48; sys_platform == "linux"',
        'cuda-toolkit[nvtx,cudart]==13.0.2; platform_system == "Linux"',
        'nvidia-cublas>=13.1.0.3,<=13.1.1.3; platform_system == "Linux" and platform_machine == "x86_64"',
        'nvidia-nvshmem-cu13==3.4.5; platform_machine == "aarch64"',
        'nvidia-cusparselt-cu13==0.8.1; extra == "sparse"',
        'nvidia-nvtx-cu13==13.0.39; platform_system == "Windows"',
        'cuda-bindings<14,>=13.0.3; platform_system == "Linux"',
        'triton==3.7.1; platform_system == "Linux"',
        "filelock",
        "nvidia-broken (((",
    ]
    assert cuda_wheels(requires) == (
        "cuda-toolkit[cudart,nvtx]==13.0.2",
        "nvidia-cublas<=13.1.1.3,>=13.1.0.3",
        "nvidia-cudnn-cu13==9.20.0.48",
        "nvidia-nccl-cu13==2.29.7",
    )


@pytest.mark.parametrize("version", list(TORCH))
def test_the_shipped_table_is_what_torch_pins_reads(index: Index, tmp_path: Path, version: str) -> None:
    """A wheel whose Requires-Dist holds a shipped release's CUDA wheels (with torch's markers) gives back that
    release's row: the table and the index lookup agree on the NCCL, the CUDA and the CUDA wheels."""
    row = TORCH[version]
    marker = '; platform_system == "Linux" and platform_machine == "x86_64"'
    requires = ["filelock", *(w + marker for w in row.cuda_wheels), 'triton==3.5.1; platform_system == "Linux"']
    index.add_wheel(
        "torch", torch_wheel_name(version), make_wheel(tmp_path, torch_wheel_name(version), requires, junk=100)
    )
    pins = torch_pins(version, index=index.simple)
    assert (pins.nccl_package, pins.nccl_version, pins.cuda_version) == (row.nccl_package, row.nccl, row.cuda)
    assert pins.cuda_wheels == row.cuda_wheels


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


@pytest.fixture
def refusing_port() -> int:
    """A local port nothing listens on: bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused(refusing_port: int) -> None:
    page = f"http://127.0.0.1:{refusing_port}/simple/torch/"
    started = time.monotonic()
    with pytest.raises(IndexLookupError, match=re.escape(f"torch 2.5.1: cannot read the index page {page}")):
        torch_pins("2.5.1", index=f"http://127.0.0.1:{refusing_port}/simple/")
    assert time.monotonic() - started < 5


def test_wheel_host_refusing(index: Index, refusing_port: int) -> None:
    url = f"http://127.0.0.1:{refusing_port}/files/{torch_wheel_name()}"
    index.add_link("torch", url)
    with pytest.raises(IndexLookupError, match=re.escape(f"cannot read bytes=-65536 of {url}")) as exc:
        torch_pins("2.5.1", index=index.simple)
    assert exc.value.exit_code == 7


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
    monkeypatch.delenv("IMGBUILD_INDEX_DEADLINE", raising=False)
    torch_pins("2.5.1", index=index.simple, session=session)
    assert seen and all(t == (10, 60) for t in seen)

    # With less time left than that, no request may wait longer than what is left of the deadline.
    seen.clear()
    torch_pins("2.5.1", index=index.simple, session=session, deadline=3)
    assert seen and all(isinstance(t, tuple) and 0 < t[0] <= 3 and 0 < t[1] <= 3 for t in seen)


# --------------------------------------------------------------------------------------------------
# Range reads through zipfile


def test_requests_made_for_a_big_central_directory(index: Index, tmp_path: Path) -> None:
    # ~4000 entries (~460 kB of central directory), METADATA last, as wheel builders write it.
    data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES, filler=4000)
    index.add_wheel("torch", torch_wheel_name(), data)
    cd_start = len(data) - central_directory_size(data)

    meta = read_wheel_metadata("torch", "2.5.1", index=index.simple)

    assert meta.requires_dist == tuple(TORCH_251_REQUIRES)
    tail = httprange.TAIL_FETCH
    # The tail (end record, end of the directory), then the rest of the directory in one request; the
    # member lies just before the directory, so one read-ahead request brings its header and its data.
    ranges = [rng for _, _, rng in index.wheel_requests()]
    assert ranges[:2] == [f"bytes=-{tail}", f"bytes={cd_start}-{len(data) - tail - 1}"]
    assert len(ranges) == meta.requests_made == 3
    assert meta.bytes_fetched == index.server.bytes_sent - meta.index_page_bytes
    assert meta.bytes_fetched <= central_directory_size(data) + 2 * httprange.READAHEAD


def test_range_file_reads_like_a_local_file(index: Index) -> None:
    data = os.urandom(1_000_003)
    url = index.add_file("/files/blob.bin", data)
    with requests.Session() as session:
        rf = httprange.RangeFile(httprange.Client(session, 30), url, what="blob")
        local = io.BytesIO(data)
        assert rf.size == len(data) and rf.requests_made == 1
        rng = random.Random(7)
        for _ in range(200):
            offset, whence = rng.choice(
                [(rng.randrange(len(data)), 0), (rng.randrange(-5000, 5000), 1), (-rng.randrange(1, 9000), 2)]
            )
            if local.tell() + offset < 0 and whence == 1:
                continue
            assert rf.seek(offset, whence) == local.seek(offset, whence)
            n = rng.choice([0, 1, 22, 30, 4096, 70_000, 10**7])
            assert rf.read(n) == local.read(n)
            assert rf.tell() == local.tell()
        assert rf.seek(0, 2) == len(data) and rf.read(10) == b""
        with pytest.raises(OSError, match="before the start"):
            rf.seek(-1)
        # Every byte fetched at most once: what was sent covers no byte twice, and no more than the file.
        assert rf.bytes_fetched == index.server.bytes_sent <= len(data)
        assert rf.requests_made == len(index.wheel_requests())


def test_small_reads_share_a_read_ahead(index: Index) -> None:
    data = os.urandom(2_000_000)
    url = index.add_file("/files/blob.bin", data)
    with requests.Session() as session:
        rf = httprange.RangeFile(httprange.Client(session, 30), url, what="blob", tail=100)
        for pos in range(0, 60_000, 30):  # 2000 small reads within one read-ahead
            rf.seek(pos)
            assert rf.read(30) == data[pos : pos + 30]
        assert rf.requests_made == 2


# --------------------------------------------------------------------------------------------------
# The overall deadline


@pytest.mark.parametrize("trickle", [5.0, 0.05], ids=["a-byte-every-5s", "a-byte-every-50ms"])
def test_trickling_index_page_meets_the_deadline(index: Index, tmp_path: Path, trickle: float) -> None:
    # 5 s between bytes: each read waits only what is left of the deadline. 50 ms: no read ever times
    # out, only the clock checked between reads stops it.
    index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES))
    index.server.slow_prefix, index.server.trickle = "/simple/", trickle
    started = time.monotonic()
    with pytest.raises(IndexLookupError) as exc:
        torch_pins("2.5.1", index=index.simple, deadline=2)
    elapsed = time.monotonic() - started
    assert 2 <= elapsed < 3
    assert str(exc.value).startswith(
        f"torch 2.5.1: the lookup's 2 s deadline passed while reading {index.simple}torch/"
    )
    assert "IMGBUILD_INDEX_DEADLINE" in str(exc.value)
    assert exc.value.exit_code == 7


def test_wheel_that_trickles_then_stalls_meets_the_deadline(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bytes every 0.1 s for 1.5 s, then silence: the silent read must not wait the request's whole read
    # timeout (fixed when the request started), only what is left of the deadline. From the environment.
    url = index.add_wheel("torch", torch_wheel_name(), make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES))
    index.server.slow_prefix, index.server.trickle, index.server.stall_after = "/files/", 0.1, 15
    monkeypatch.setenv("IMGBUILD_INDEX_DEADLINE", "2.5")
    started = time.monotonic()
    with pytest.raises(IndexLookupError, match=re.escape(f"2.5 s deadline passed while reading {url}")):
        torch_pins("2.5.1", index=index.simple)
    assert 2.5 <= time.monotonic() - started < 3.3


def test_deadline_spans_all_requests(index: Index, tmp_path: Path) -> None:
    # Four requests (page, tail, directory, member) that each answer in 0.6 s: each is quick, all are not.
    data = make_wheel(tmp_path, torch_wheel_name(), TORCH_251_REQUIRES, filler=4000)
    index.add_wheel("torch", torch_wheel_name(), data)
    index.server.slow_prefix, index.server.stall_before = "/", 0.6
    started = time.monotonic()
    with pytest.raises(IndexLookupError, match=r"the lookup's 2 s deadline passed while reading .*/files/torch"):
        torch_pins("2.5.1", index=index.simple, deadline=2)
    assert 2 <= time.monotonic() - started < 3
    assert torch_pins("2.5.1", index=index.simple, deadline=20).nccl_version == "2.21.5"


@pytest.mark.parametrize(("env", "arg"), [("abc", None), ("0", None), ("-3", None), ("nan", None), (None, 0.0)])
def test_bad_deadline(monkeypatch: pytest.MonkeyPatch, env: str | None, arg: float | None) -> None:
    if env is None:
        monkeypatch.delenv("IMGBUILD_INDEX_DEADLINE", raising=False)
    else:
        monkeypatch.setenv("IMGBUILD_INDEX_DEADLINE", env)
    source = "IMGBUILD_INDEX_DEADLINE" if env is not None else "deadline"
    with pytest.raises(IndexLookupError, match=f"^{source}=.*: expected a number of seconds greater than 0"):
        torch_pins("2.5.1", index="http://127.0.0.1:9/simple/", deadline=arg)


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
@pytest.mark.parametrize(
    ("version", "nccl", "cuda"),
    [
        ("2.5.1", "2.21.5", "12.4"),
        ("2.9.0", "2.27.5", "12.8"),
        ("2.9.1", "2.27.5", "12.8"),
        ("2.13.0", "2.29.7", "13.0"),
    ],
)
def test_torch_from_the_real_index(version: str, nccl: str, cuda: str) -> None:
    index = index_url()
    started = time.monotonic()
    pins = torch_pins(version, index=index)
    print(
        f"\ntorch {version} from {index}: {pins.wheel_filename}, wheel {pins.wheel_size:,} bytes; "
        f"fetched {pins.bytes_fetched:,} bytes in {pins.requests_made} range requests "
        f"({100 * pins.bytes_fetched / pins.wheel_size:.3f}% of the wheel) in {time.monotonic() - started:.2f} s"
    )
    assert (pins.nccl_version, pins.cuda_version) == (nccl, cuda)
    assert pins.cuda_wheels == TORCH[version].cuda_wheels  # the shipped table is what the index says
    # The tail, the rest of the central directory (about 1.2-1.3 MB, read whole by zipfile), the member.
    assert pins.requests_made <= 3
    assert pins.bytes_fetched < 3_000_000
