"""imgbuild.pin.checksums: a download's sha256 from the publisher's list, computed at lock time, from a well-known
third party's record, or unestablished with the reason, each against a real HTTP server on this machine."""

from __future__ import annotations

import hashlib
import http.server
import re
import socket
import threading
from collections.abc import Iterator

import pytest

from imgbuild.pin import checksums
from imgbuild.pin.checksums import Publisher, establish
from imgbuild.pin.content import Download

TARBALL = b"imgbuild test tarball\n" * 1000
SHA = hashlib.sha256(TARBALL).hexdigest()


class Server:
    """A local HTTP server: `files` maps a path to the bytes it serves (anything else is a 404)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        files = self.files

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return self.base + path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.close()


def closed_port_url(path: str) -> str:
    """A URL nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


def sidecar(server: Server) -> Publisher:
    """A publisher that puts FILE.sha256 next to each file (sha256sum's format)."""
    return Publisher("Local", re.escape(server.base) + r"/pub/.+", "{url}.sha256", "sums")


def test_the_publishers_checksum_comes_first(server: Server) -> None:
    # The file itself differs from what the publisher lists: the published value wins, and the file is not fetched.
    server.files["/pub/x-1.0.tar.gz"] = b"something else"
    server.files["/pub/x-1.0.tar.gz.sha256"] = f"{SHA}  x-1.0.tar.gz\n".encode()
    url = server.url("/pub/x-1.0.tar.gz")
    d = establish(url, publishers=[sidecar(server)], table={})
    assert d == Download(url=url, sha256=SHA, origin=f"publisher: {url}.sha256")


def test_a_publishers_release_page_is_read_file_by_file(server: Server) -> None:
    other = "0" * 64
    server.files["/ompi/v9.1/"] = (
        "<table><tr><td><a href='openmpi-9.1.0.tar.gz'>openmpi-9.1.0.tar.gz</a></td><td>MD5: abc<br>"
        f"SHA256: {other}</td></tr><tr><td><a href='x'>openmpi-9.1.0.tar.bz2</a></td><td>10 MB</td>"
        f"<td>MD5: def<br>SHA1: 123<br>SHA256: {SHA.upper()}</td></tr></table>"
    ).encode()
    pub = Publisher("Open MPI", re.escape(server.base) + r"/release/(v\d+\.\d+)/openmpi-[^/]+",
                    server.base + "/ompi/{0}/", "page")  # fmt: skip
    url = server.url("/release/v9.1/openmpi-9.1.0.tar.bz2")
    assert establish(url, publishers=[pub], table={}) == Download(
        url=url, sha256=SHA, origin=f"publisher: {server.base}/ompi/v9.1/"
    )
    assert checksums.read_page(server.files["/ompi/v9.1/"].decode(), "openmpi-9.1.0.tar.gz") == other
    assert checksums.read_page(server.files["/ompi/v9.1/"].decode(), "openmpi-9.2.0.tar.gz") is None


def test_open_mpi_is_the_publisher_with_a_list() -> None:
    url = "https://download.open-mpi.org/release/open-mpi/v4.1/openmpi-4.1.6.tar.bz2"
    assert [p.match(url) for p in checksums.PUBLISHERS] == ["https://www.open-mpi.org/software/ompi/v4.1/"]
    assert [p.match("https://github.com/NVIDIA/nccl/archive/refs/tags/v2.27.5-1.tar.gz") for p in
            checksums.PUBLISHERS] == [None]  # fmt: skip


def test_without_a_published_checksum_the_file_is_downloaded_and_hashed(server: Server) -> None:
    server.files["/pub/x-1.0.tar.gz"] = TARBALL  # no .sha256 next to it: the publisher's list is a 404
    url = server.url("/pub/x-1.0.tar.gz")
    d = establish(url, publishers=[sidecar(server)], table={})
    assert d.sha256 == SHA
    assert d.origin == f"computed at lock time ({len(TARBALL)} bytes from {url})"


def test_a_file_past_the_size_cap_is_refused_not_truncated(server: Server) -> None:
    server.files["/big.tar.gz"] = TARBALL
    url = server.url("/big.tar.gz")
    d = establish(url, publishers=[], table={}, max_bytes=1000)
    assert d.sha256 is None
    assert d.origin.startswith("unestablished: ") and "larger than 1000 bytes" in d.origin


def test_where_the_publisher_is_unreachable_a_third_partys_record_is_used() -> None:
    url = closed_port_url("/x-1.0.tar.gz")
    spack = Download(url=url, sha256=SHA, origin="spack: spack/spack-packages x/package.py at abc, version 1.0")
    d = establish(url, publishers=[], table={url: spack})
    assert d.sha256 == SHA
    assert d.origin.startswith(spack.origin + " (the publisher: download " + url + ": ")
    assert "Connection" in d.origin  # the failure is named, not silenced


def test_a_computed_checksum_must_agree_with_the_third_partys(server: Server) -> None:
    server.files["/x-1.0.tar.gz"] = TARBALL
    url = server.url("/x-1.0.tar.gz")
    spack = Download(url=url, sha256="1" * 64, origin="spack: somewhere")
    d = establish(url, publishers=[], table={url: spack})
    assert d.sha256 is None
    assert d.origin == (
        f"unestablished: computed {SHA} at lock time ({len(TARBALL)} bytes from {url}), "
        f"but spack: somewhere records {'1' * 64}"
    )


def test_unestablished_says_why(server: Server) -> None:
    url = server.url("/gone.tar.gz")  # a 404
    d = establish(url, publishers=[], table={})
    assert d.sha256 is None
    assert d.origin.startswith(f"unestablished: download {url}: HTTPError: 404")
    assert d.origin.endswith("no well-known third party records it")
    # The table's reason is kept where it has one.
    why = Download(url=url, sha256=None, origin="unestablished: Spack lists no such version")
    d = establish(url, publishers=[], table={url: why})
    assert d.sha256 is None and d.origin.startswith("unestablished: Spack lists no such version; download ")


def test_a_failing_publisher_list_is_named_and_the_next_step_tried(server: Server) -> None:
    server.files["/pub/x-1.0.tar.gz"] = TARBALL
    server.files["/pub/x-1.0.tar.gz.sha256"] = b"not a checksum file\n"
    url = server.url("/pub/x-1.0.tar.gz")
    d = establish(url, publishers=[sidecar(server)], table={})
    assert d.sha256 == SHA and d.origin.startswith("computed at lock time")


def test_the_shipped_third_party_table() -> None:
    """Every entry is well formed, names where it was read, and covers what the shipped and test recipes download."""
    table = checksums.third_party()
    for url, d in table.items():
        assert d.url == url
        if d.sha256 is not None:
            assert re.fullmatch(r"spack: spack/spack-packages repos/spack_repo/builtin/packages/\w+/package\.py at "
                                r"[0-9a-f]{40}, version \S+.*", d.origin), d.origin  # fmt: skip
        else:
            assert d.origin.startswith("unestablished: ")
    assert table["https://download.open-mpi.org/release/open-mpi/v4.1/openmpi-4.1.6.tar.bz2"].sha256 == (
        "f740994485516deb63b5311af122c265179f5328a0d857a567b85db00b11e415"
    )
    from conftest import REPO, SHIPPED
    from imgbuild import recipe
    from imgbuild.pin import record
    from imgbuild.pin.resolver import resolve

    wanted: set[str] = set()
    for path in [*SHIPPED, *(REPO / "tests" / "recipes" / f"{n}.yaml" for n in ("modes", "nccl-build", "ofi-release"))]:
        wanted |= set(record.downloads(resolve(recipe.load(path), lookup_torch=None)))
    assert wanted and wanted <= set(table), sorted(wanted - set(table))
