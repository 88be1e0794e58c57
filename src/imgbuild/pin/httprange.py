"""A remote file that the standard library's ``zipfile`` can open: reads become HTTP range requests.

:class:`RangeFile` is a read-only, seekable ``io.RawIOBase`` over one URL. It fetches the file's tail first
(which also tells its size), keeps every fetched byte, and fetches ahead on a miss, so that zipfile's many
small reads (a 22-byte end record, a 30-byte local header) don't each become a request. Reading a member
of a big wheel costs about three requests: the tail, the rest of the central directory (zipfile reads it
whole), the member.

:class:`Client` makes the requests under one overall deadline, enforced while bodies stream in as well.
This is the package-index edge: failures are :class:`IndexLookupError`, naming what was looked up and the URL.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import requests
import urllib3

from imgbuild.core.errors import IndexLookupError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["Client", "RangeFile"]

#: (connect, read) timeouts in seconds of every request, shortened to what is left of the deadline.
TIMEOUT = (10, 60)
#: The first request on a file: its last bytes (a zip's end record, and in a small wheel all of it).
TAIL_FETCH = 64 * 1024
#: A read that misses the cache fetches at least this much, so small reads don't each cost a request.
READAHEAD = 64 * 1024
#: Refuse to fetch more of one file than this (a sane wheel's central directory is far below).
MAX_FETCH = 64 * 1024 * 1024
_CHUNK = 64 * 1024
_USER_AGENT = "imgbuild (wheel metadata reader)"
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?P<start>\d+)-(?P<end>\d+)/(?P<total>\d+|\*)\s*$", re.IGNORECASE)


class Client:
    """One lookup's requests, all bounded by its overall deadline of `seconds`.

    requests' read timeout bounds each socket read, not a response: a server that sends a byte every few
    seconds defeats it, and ``iter_content`` waits for whole chunks. So bodies are read with ``read1``
    (what one socket read brings), the clock is checked between reads, and no read may block past the
    deadline. `hint` is shown when the deadline passes (say how to give more time).
    """

    def __init__(self, session: requests.Session, seconds: float, *, hint: str | None = None) -> None:
        self.session = session
        self.seconds = seconds
        self.hint = hint
        self._ends = time.monotonic() + seconds

    def left(self, what: str, url: str) -> float:
        """Seconds left of the deadline; raises IndexLookupError once it has passed."""
        left = self._ends - time.monotonic()
        if left <= 0:
            raise IndexLookupError(
                f"{what}: the lookup's {self.seconds:g} s deadline passed while reading {url}", hint=self.hint
            )
        return left

    @contextmanager
    def get(self, url: str, headers: dict[str, str], *, what: str, purpose: str) -> Iterator[requests.Response]:
        """A streamed GET of `url`. A failure, in the request or while its body is read in the ``with``
        block, becomes an IndexLookupError naming `what` and `purpose`."""
        left = self.left(what, url)
        timeout = (min(TIMEOUT[0], left), min(TIMEOUT[1], left))
        try:
            with self.session.get(
                url, headers={"User-Agent": _USER_AGENT, **headers}, stream=True, timeout=timeout
            ) as resp:
                yield resp
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            self.left(what, url)  # a timeout that came with the deadline is reported as the deadline
            timed_out = isinstance(exc, (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError))
            raise IndexLookupError(
                f"{what}: {'timed out reading' if timed_out else 'cannot read'} {purpose}: {exc}"
            ) from exc

    def body(self, resp: requests.Response, *, what: str, limit: int) -> bytes:
        """The body of `resp` (from :meth:`get`), at most `limit` bytes, read before the deadline."""
        body = bytearray()
        while True:
            left = self.left(what, resp.url)
            conn = resp.raw.connection
            if conn is not None and conn.sock is not None:
                conn.sock.settimeout(min(TIMEOUT[1], left))
            chunk = resp.raw.read1(_CHUNK, decode_content=True)
            if not chunk:
                return bytes(body)
            body += chunk
            if len(body) > limit:
                raise IndexLookupError(f"{what}: {resp.url} sent more than the {limit} bytes expected")


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of the file at `url`, fetched with range requests through `client`.

    Fetched bytes are kept (disjoint segments) and never fetched twice; a read that misses them fetches
    from the read position to at least :data:`READAHEAD` further, stopping at the next kept segment.
    ``bytes_fetched`` and ``requests_made`` say what it cost. Errors name `what` and the URL.
    """

    def __init__(self, client: Client, url: str, *, what: str, tail: int = TAIL_FETCH) -> None:
        super().__init__()
        self.client = client
        self.url = url
        self.what = what
        self.bytes_fetched = 0
        self.requests_made = 0
        self.size = -1  # known after the first request
        self._pos = 0
        self._segments: list[tuple[int, bytes]] = []
        data, self.size = self._fetch(f"bytes=-{tail}", start=None, length=tail)
        self._segments.append((self.size - len(data), data))

    def fail(self, what_went_wrong: str) -> IndexLookupError:
        return IndexLookupError(f"{self.what}: {what_went_wrong} ({self.url})")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        pos = offset + {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if pos < 0:
            raise OSError(f"seek to {pos}, before the start of {self.url}")
        self._pos = pos
        return pos

    def read(self, size: int | None = -1) -> bytes:
        # Sized to what the file still holds: a corrupt archive's huge length allocates nothing.
        left = max(0, self.size - self._pos)
        buffer = bytearray(left if size is None or size < 0 else min(size, left))
        return bytes(buffer[: self.readinto(buffer)])

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self.size - self._pos))
        done = 0
        while done < want:
            pos = self._pos + done
            start, data = self._segment_at(pos) or self._fill(pos, want - done)
            piece = data[pos - start : pos - start + want - done]
            view[done : done + len(piece)] = piece
            done += len(piece)
        self._pos += done
        return done

    def _segment_at(self, pos: int) -> tuple[int, bytes] | None:
        return next(((s, d) for s, d in self._segments if s <= pos < s + len(d)), None)

    def _fill(self, pos: int, n: int) -> tuple[int, bytes]:
        end = min(self.size, pos + max(n, READAHEAD), *(s for s, _ in self._segments if s > pos))
        data, _ = self._fetch(f"bytes={pos}-{end - 1}", start=pos, length=end - pos)
        self._segments.append((pos, data))
        return pos, data

    def _fetch(self, range_header: str, *, start: int | None, length: int) -> tuple[bytes, int]:
        """(body, file size) of one range request, checked."""
        if self.bytes_fetched + length > MAX_FETCH:
            raise self.fail(f"would fetch more than {MAX_FETCH} bytes of the file ({range_header})")
        self.requests_made += 1
        headers = {"Range": range_header, "Accept-Encoding": "identity"}
        with self.client.get(self.url, headers, what=self.what, purpose=f"{range_header} of {self.url}") as resp:
            total, expected = self._check_response(resp, range_header, start=start, length=length)
            body = self.client.body(resp, what=self.what, limit=expected)
        self.bytes_fetched += len(body)
        if len(body) != expected:
            raise self.fail(f"asked for {range_header}, got {len(body)} of {expected} bytes")
        return body, total

    def _check_response(
        self, resp: requests.Response, range_header: str, *, start: int | None, length: int
    ) -> tuple[int, int]:
        """(file size, body length) from the answer's headers; raise on anything but a fitting 206."""
        if resp.status_code == 200:
            size = resp.headers.get("Content-Length", "")
            # Asked for the last `length` bytes of a smaller file, a server may send it whole: fine.
            if start is None and size.isdigit() and int(size) <= length:
                return int(size), int(size)
            whole = f"the whole {size}-byte file" if size else "the whole file"
            raise self.fail(
                f"the server ignored the Range header (answered 200 with {whole}); refusing to download "
                "the file to read a part of it"
            )
        if resp.status_code == 416:
            raise self.fail(f"the server refused the range {range_header} (416 Range Not Satisfiable)")
        if resp.status_code != 206:
            raise self.fail(f"HTTP {resp.status_code} {resp.reason} for {range_header}")
        content_range = resp.headers.get("Content-Range", "")
        match = _CONTENT_RANGE.match(content_range)
        if not match or match["total"] == "*":
            raise self.fail(f"206 answer without a usable Content-Range header ({content_range!r})")
        first, last, total = int(match["start"]), int(match["end"]), int(match["total"])
        if (start is not None and first != start) or not 0 <= last - first < length:
            raise self.fail(f"asked for {range_header}, the server sent {content_range}")
        if self.size >= 0 and total != self.size:
            raise self.fail(f"the file changed size while being read ({self.size} then {total} bytes)")
        return total, last - first + 1
