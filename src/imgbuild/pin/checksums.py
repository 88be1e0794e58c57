"""The sha256 of a file the Dockerfile downloads, established at `imgbuild lock` (`record.record` asks `establish`
for every URL a block's `downloads` names). The network edge for downloads: nothing else here talks to a publisher.

`establish(url)` tries, in order, and records in the Download's `origin` which one answered and what failed before:

a. the publisher's own checksum, where it publishes one (`PUBLISHERS`): Open MPI lists the sha256 of every release
   tarball on its release page. The others publish none imgbuild can read: GitHub's archives of a tag (gdrcopy,
   nccl, nccl-tests) and aws-ofi-nccl's release assets come with no checksum file, and AWS signs the EFA installer
   with GPG (the build checks that signature as well) but lists no sha256 for it;
b. computed: the file downloaded now (streamed, at most `MAX_BYTES`) and hashed. What the publisher served at lock
   time is what every later build must get;
c. a checksum a well-known third party published for the same file (the release rows' `downloads`,
   blocks/<name>/releases.yaml: Spack's package recipes, each naming the repository, path and commit it was read
   from). Where (b) worked too, the two must agree;
d. else none: sha256 None, `origin` "unestablished: " and why. A build says so; nothing is invented.

`imgbuild lock --files DIR` hashes a download DIR holds (by `download_name`) instead (`from_file`): no network for
it, the third party's checksum still compared, the origin naming the local file.

Every network failure is caught per URL and named in the origin, never silenced.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.pin.content import SHA256, Download, download_name, sha256_file

if TYPE_CHECKING:
    import requests

MAX_BYTES = 2 << 30  # the largest file computed at lock time (the EFA installer is a few hundred MB)
TIMEOUT = (10.0, 60.0)  # connect, read (seconds)
CHUNK = 1 << 20
UNLOCKED = "unestablished: "  # = imgbuild.blocks._releases.UNESTABLISHED


@dataclass(frozen=True)
class Publisher:
    """Where a publisher lists the sha256 of its files. `pattern` matches a download URL; `where` is the URL of the
    list, a format string over the match's groups (`{0}`, `{1}`...) and `{url}`; `kind` how to read it:
    `sums`  sha256sum's format (`HASH  NAME` lines) or a lone hash (a .sha256 file next to the download);
    `page`  an HTML page naming the file, then its sha256 ("SHA256: <64 hex>") before the next file."""

    name: str
    pattern: str
    where: str
    kind: str

    def match(self, url: str) -> str | None:
        """The checksum list's URL for `url`, None when this publisher does not publish `url`."""
        m = re.fullmatch(self.pattern, url)
        return self.where.format(*m.groups(), url=url) if m else None


PUBLISHERS: tuple[Publisher, ...] = (
    # https://www.open-mpi.org/software/ompi/v4.1/ lists md5, sha1 and sha256 under each release tarball.
    Publisher(
        "Open MPI",
        r"https://download\.open-mpi\.org/release/open-mpi/(v\d+\.\d+)/openmpi-[^/]+",
        "https://www.open-mpi.org/software/ompi/{0}/",
        "page",
    ),
)


def establish(
    url: str,
    *,
    publishers: Sequence[Publisher] = PUBLISHERS,
    table: Mapping[str, Download] | None = None,
    session: requests.Session | None = None,
    max_bytes: int = MAX_BYTES,
) -> Download:
    """The sha256 of `url` and where it came from (see the module's docstring for the order)."""
    import requests

    http = session if session is not None else requests.Session()
    known = table if table is not None else third_party()
    name = download_name(url)
    failed: list[str] = []
    for pub in publishers:
        where = pub.match(url)
        if where is None:
            continue
        try:
            sha = _published(http, where, pub.kind, name)
        except (requests.RequestException, OSError, ValueError) as exc:
            failed.append(f"{pub.name}'s checksum list {where}: {why(exc)}")
            continue
        if sha is not None:
            return Download(url=url, sha256=sha, origin=f"publisher: {where}")
        failed.append(f"{pub.name}'s checksum list {where} has no sha256 for {name}")
    try:
        computed, size = _compute(http, url, max_bytes)
    except (requests.RequestException, OSError, ValueError) as exc:
        computed = None
        failed.append(f"download {url}: {why(exc)}")
    record = known.get(url)
    if computed is not None:
        return checked(url, computed, f"({size} bytes from {url})", record)
    tried = "; ".join(failed)
    if record is not None and record.sha256 is not None:
        return Download(url=url, sha256=record.sha256, origin=f"{record.origin} (the publisher: {tried})")
    if record is not None:  # the table says why nobody could establish it
        return Download(url=url, sha256=None, origin=f"{record.origin}; {tried}")
    return Download(url=url, sha256=None, origin=f"{UNLOCKED}{tried}; no well-known third party records it")


def from_file(url: str, path: Path, *, table: Mapping[str, Download] | None = None) -> Download:
    """The sha256 of `url` computed from a local copy of it (`imgbuild lock --files DIR`: the file DIR holds under the
    download's name), with no network; a well-known third party's checksum for the URL (step c) must agree, as with
    a file downloaded at lock time. The origin names the local file, not the folder: the lock reads the same on
    every machine."""
    known = table if table is not None else third_party()
    computed, size = sha256_file(path), path.stat().st_size
    where = f"from the local file {path.name} ({size} bytes, --files), for {url}"
    return checked(url, computed, where, known.get(url))


def checked(url: str, computed: str, where: str, record: Download | None) -> Download:
    """A sha256 computed at lock time (`where`: from the download or a local file) as the lock records it, checked
    against a well-known third party's checksum of the URL (`record`): where they disagree, the download is left
    without one, naming both."""
    if record is not None and record.sha256 is not None and record.sha256 != computed:
        return Download(
            url=url,
            sha256=None,
            origin=f"{UNLOCKED}computed {computed} at lock time {where}, but {record.origin} records {record.sha256}",
        )
    return Download(url=url, sha256=computed, origin=f"computed at lock time {where}")


@cache
def third_party() -> dict[str, Download]:
    """The checksums well-known third parties publish, by URL, each with where it was read (the release rows'
    `downloads`: imgbuild.blocks.recorded_checksums), and the downloads nobody could establish with why."""
    from imgbuild.blocks import recorded_checksums

    return {url: Download(url=url, sha256=c.sha256, origin=c.origin) for url, c in recorded_checksums().items()}


def _published(http: requests.Session, where: str, kind: str, name: str) -> str | None:
    """The sha256 that the list at `where` gives `name` (None: the list does not name it)."""
    response = http.get(where, timeout=TIMEOUT)
    response.raise_for_status()
    return READERS[kind](response.text, name)


def read_sums(text: str, name: str) -> str | None:
    """`name`'s sha256 in sha256sum's format (`HASH  NAME`, `HASH *NAME`), or the lone hash of a .sha256 file."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and len(lines[0]) == 1 and SHA256.fullmatch(lines[0][0].lower()):
        return lines[0][0].lower()
    for parts in lines:
        if len(parts) == 2 and SHA256.fullmatch(parts[0].lower()) and parts[1].lstrip("*").split("/")[-1] == name:
            return parts[0].lower()
    return None


def read_page(text: str, name: str) -> str | None:
    """`name`'s sha256 on an HTML release page: the first "SHA256" hash after the file's name and before the next
    release file's (a page lists each file, then its checksums)."""
    plain = html.unescape(re.sub(r"<[^>]+>", " ", text))
    for m in re.finditer(re.escape(name), plain):
        rest = plain[m.end() :]
        following = re.search(r"\S+\.(?:tar\.(?:gz|bz2|xz)|tgz|zip)\b", rest)
        window = rest[: following.start()] if following else rest
        found = re.search(r"sha-?256\W{0,20}([0-9a-fA-F]{64})\b", window, re.IGNORECASE)
        if found:
            return found.group(1).lower()
    return None


READERS: dict[str, Callable[[str, str], str | None]] = {"sums": read_sums, "page": read_page}


def _compute(http: requests.Session, url: str, max_bytes: int) -> tuple[str, int]:
    """The sha256 and size of `url`'s bytes, streamed; a file past `max_bytes` is refused, not truncated."""
    h = hashlib.sha256()
    size = 0
    with http.get(url, stream=True, timeout=TIMEOUT) as response:
        response.raise_for_status()
        for chunk in response.iter_content(CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise ValueError(f"larger than {max_bytes} bytes, the most imgbuild downloads at lock time")
            h.update(chunk)
    return h.hexdigest(), size


def why(exc: BaseException) -> str:
    """One line about a failure: its kind and the start of its message (for a connection that failed, the reason
    urllib3 gives, e.g. "NameResolutionError: Failed to resolve 'github.com'", without object addresses)."""
    inner = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None
    reason = getattr(inner, "reason", None) or inner or exc
    text = re.sub(r"<[^<>]* object at 0x[0-9a-f]+>:? ?", "", " ".join(str(reason).split()))
    return f"{type(reason).__name__}: {text[:200]}" if text else type(reason).__name__
