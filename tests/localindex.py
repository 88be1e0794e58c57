"""A package index on 127.0.0.1 for tests that must not reach the real one (test_pypi, test_outdated).

A real HTTP server (``http.server``) serves generated PEP 503 simple pages and real wheels made with zipfile, with
what imgbuild.pin.pypi needs of an index: Range ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` answered with 206 +
Content-Range, HEAD, and PEP 592 ``data-yanked`` anchors. It can be told to ignore ranges, to stall, or to trickle
its bodies a byte at a time. conftest.py's ``index`` fixture starts one per test.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CP = f"cp{sys.version_info.major}{sys.version_info.minor}"


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
        self.slow = path.startswith(self.server.slow_prefix)
        if self.slow and self.server.stall_before:
            time.sleep(self.server.stall_before)
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
                if self.slow and self.server.trickle:
                    self._trickle(data)
                else:
                    self.wfile.write(data)
                    self.server.bytes_sent += len(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

    def _trickle(self, data: bytes) -> None:
        """One byte every `trickle` seconds; after `stall_after` bytes, nothing for a minute."""
        for i in range(len(data)):
            time.sleep(60 if i == self.server.stall_after else self.server.trickle)
            self.wfile.write(data[i : i + 1])
            self.server.bytes_sent += 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.log: list[tuple[str, str, str | None]] = []
        self.ignore_range = False
        self.bytes_sent = 0
        # Requests for paths under `slow_prefix` wait `stall_before` s before answering, then send their
        # body a byte every `trickle` s (when set), going silent after `stall_after` bytes.
        self.slow_prefix = "/nothing-is-slow/"
        self.stall_before = 0.0
        self.trickle = 0.0
        self.stall_after = -1

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hangs up early (as on a 200 it refuses) is expected


@dataclass
class Index:
    server: _Server
    root: str  # http://127.0.0.1:PORT
    pages: dict[str, list[str]] = field(default_factory=dict)
    yanked: set[str] = field(default_factory=set)

    @property
    def simple(self) -> str:
        return self.root + "/simple/"

    def add_file(self, path: str, data: bytes) -> str:
        self.server.files[path] = data
        return self.root + path

    def add_link(self, project: str, href: str, *, yanked: bool = False) -> None:
        """An anchor on the project's simple page (`project` already normalised); `yanked` marks it as PEP 592 says
        (a `data-yanked` attribute)."""
        self.pages.setdefault(project, []).append(href)
        if yanked:
            self.yanked.add(href)
        self._page(project)

    def remove(self, project: str, filename: str) -> None:
        """Take a file off the index: its anchor leaves the project's page and the file is no longer served."""
        self.pages[project] = [h for h in self.pages[project] if h.split("#")[0].rsplit("/", 1)[-1] != filename]
        self.server.files.pop(f"/files/{filename}", None)
        self._page(project)

    def _page(self, project: str) -> None:
        def anchor(h: str) -> str:
            yanked = ' data-yanked=""' if h in self.yanked else ""
            return f'<a href="{h}"{yanked}>{h.split("#")[0].rsplit("/", 1)[-1]}</a>'

        anchors = "\n".join(f"{anchor(h)}<br/>" for h in self.pages[project])
        page = f"<!DOCTYPE html>\n<html><body><h1>Links for {project}</h1>\n{anchors}\n</body></html>\n"
        self.server.files[f"/simple/{project}/"] = page.encode()

    def add_wheel(
        self, project: str, filename: str, data: bytes, *, href: str | None = None, yanked: bool = False
    ) -> str:
        """Serve a wheel under /files/ and link it from the page, with its #sha256= fragment."""
        url = self.add_file(f"/files/{filename}", data)
        digest = hashlib.sha256(data).hexdigest()
        self.add_link(project, f"{href or url}#sha256={digest}", yanked=yanked)
        return url

    def wheel_requests(self) -> list[tuple[str, str, str | None]]:
        return [entry for entry in self.server.log if entry[1].startswith("/files/")]


@contextmanager
def serve() -> Iterator[Index]:
    """A running index, shut down on exit."""
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Index(server=server, root=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


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
