"""Read a resolution's content from the world (`imgbuild lock`, `imgbuild lock --check`): base digests from the
registry or the engine, checksums of every download, hashes of every Python distribution. The network edge of the
pin floor: each part is imported only when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.blocks import REGISTRY, Downloads, PythonSets, builder_base, context_for, dedupe
from imgbuild.pin.content import Content, Download, download_name
from imgbuild.pin.resolver import Resolved

if TYPE_CHECKING:
    from imgbuild.pin.wheels import Yank


def downloads(resolved: Resolved) -> list[str]:
    """Every URL the image's blocks download, in registry order."""
    ctx = context_for(resolved)
    return dedupe(
        url
        for b in REGISTRY
        if b.name in resolved.pins and isinstance(b, Downloads)
        for url in b.downloads(resolved.pins[b.name], ctx)
    )


def requirement_sets(resolved: Resolved) -> dict[str, list[str]]:
    """Every requirement set of the image's blocks (name -> specifiers), in install order (registry order, each
    block's own sets in its order)."""
    ctx = context_for(resolved)
    out: dict[str, list[str]] = {}
    for b in REGISTRY:
        if b.name in resolved.pins and isinstance(b, PythonSets):
            out.update({name: list(reqs) for name, reqs in b.requirements(resolved.pins[b.name], ctx).items()})
    return out


def bases(resolved: Resolved) -> list[str]:
    """The base images a build of `resolved` starts from: the builder stage's, then the runtime's."""
    return dedupe([builder_base(resolved), resolved.base_ref])


def _checksum(url: str, offline: bool, files: Path | None = None) -> Download:
    """`checksums.establish`; a download the `files` folder holds (`local_copy`), hashed from that file; offline, only
    the shipped third-party table (else unestablished, saying so)."""
    from imgbuild.pin import checksums

    local = local_copy(files, url) if files is not None else None
    if local is not None:
        return checksums.from_file(url, local)
    if not offline:
        return checksums.establish(url)
    known = checksums.third_party().get(url)
    if known is not None:
        return known
    return Download(url=url, sha256=None, origin=f"{checksums.UNLOCKED}locked --offline: not looked up")


def local_copy(folder: Path, url: str) -> Path | None:
    """THE lookup of `--files DIR` (lock and build): download `url`'s file in `folder`, found by its file name
    (`download_name`), as the path of the file itself (links resolved, so its bytes are what is hashed and copied);
    None when the folder has no such name. A ContentError naming it, before anything reads it, for a name that is no
    regular file (a folder, a device, a FIFO, a broken link or a loop), a link that leads out of `folder` (what the
    folder names never reaches another part of the machine), or a file over checksums.MAX_BYTES (2 GiB: the bound
    of the downloads a lock hashes; a sparse file of a terabyte is refused at once)."""
    from imgbuild.core import files as userfiles
    from imgbuild.core.errors import ContentError
    from imgbuild.pin.checksums import MAX_BYTES

    path = folder / download_name(url)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        real = userfiles.inside(folder, path)
        st = userfiles.regular(real)
    except userfiles.Refused as exc:
        raise ContentError(f"--files {folder}: {path.name} (for {url}): {exc}") from None
    if st.st_size > MAX_BYTES:
        raise ContentError(
            f"--files {folder}: {path.name} (for {url}): {userfiles.size(st.st_size)}, over the "
            f"{userfiles.size(MAX_BYTES)} a download may be"
        )
    return real


def record(
    resolved: Resolved,
    *,
    engine: object | None = None,
    offline: bool = False,
    files: Path | None = None,
    preferences: Mapping[str, str] | None = None,
    yanked: list[Yank] | None = None,
    established: Mapping[str, Download] | None = None,
    at_hand: Sequence[tuple[str, Resolved]] = (),
    taken: list[str] | None = None,
) -> Content:
    """The content of `resolved`'s build, read from the world now. `engine`: a docker client to ask for base digests
    (None: they are recorded as unestablished). `offline`: no network (checksums from the shipped table, wheel
    hashes from uv's cache). `preferences`: the existing lock's Python pins, kept where they still resolve (a newer
    release is not taken unless asked: `wheels.compile_sets`); `yanked` receives the yanked releases resolved to.
    `files`: a folder consulted before the network for every download (`imgbuild lock --files`, `local_copy`).
    `established`: checksums already computed this run, by URL (archives `imgbuild.pin.artifacts` downloaded to read
    them), not fetched again. `at_hand`: locks read already (their file's name, their resolution), whose requirement
    sets an offline lock takes where their inputs are the same (`wheels.reusable`; `taken` receives what it took).
    Digests and checksums are read for the exact tag and URL the pins name: the same version read again."""
    from imgbuild.pin import digests, wheels

    sets: Mapping[str, list[str]] = requirement_sets(resolved)
    recorded = [
        rec
        for where, locked in (at_hand if offline else ())
        if (rec := wheels.recorded_in(where, locked, requirement_sets(locked))) is not None
    ]
    return Content(
        bases={ref: digests.establish(ref, resolved, engine=engine) for ref in bases(resolved)},
        downloads={url: (established or {}).get(url) or _checksum(url, offline, files) for url in downloads(resolved)},
        python=wheels.compile_sets(
            sets, resolved, offline=offline, preferences=preferences, yanked=yanked, recorded=recorded, taken=taken
        )
        if sets
        else {},
    )
