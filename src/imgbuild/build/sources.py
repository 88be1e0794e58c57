"""Air-gapped builds: `imgbuild sources fetch RECIPE -o DIR` downloads everything a build of the recipe's lock needs
and checks it; `imgbuild build RECIPE --sources DIR` builds from that folder alone, with the build's network off.

The folder holds:
  files/NAME            every tarball the Dockerfile downloads, checked against the lock's sha256;
  wheels/               every Python distribution of the lock's requirement sets, each with a hash the lock records;
  debs/<base slug>/     the .debs each base's stages install (apt fetched them against the archive's signed indexes),
                        with a Packages index (apt-ftparchive): a flat apt repository;
  lists/<base slug>/    apt's indexes of the archive those .debs came from, as apt verified them when it fetched
                        them: each suite's signed InRelease and its Packages, uncompressed;
  base/<base slug>.tar  each base image (`docker save`: engine 20.10 writes a docker-archive, which `docker load`
                        reads on any engine), with its image id;
  sources.json          what was fetched for which lock: every file with its sha256, every base with its id.

A build from the folder checks it first: sources.json's form (every entry a plain name in one of these parts: nothing
it names is outside the folder, a link out, a FIFO or a device), the lock it was fetched for, every file's sha256
against sources.json AND against the lock (tarballs, wheels), each base's id after loading it, and every .deb against
the archive's signed indexes (`check_debs`: the lock records no .deb, and sources.json rewritten along with a
tampered .deb would vouch for it). A missing or corrupted file is refused, naming it with the expected and found
hash, before anything is built or tagged (ContentError, exit 16). The build then gets the folder in its context
(imgbuild-sources/, bind-mounted by the RUNs that would download: dockerfile.SOURCES_MOUNT) and runs with
`--network none`: BuildKit's build contexts (`--build-context`) need buildx, which Debian 12's docker CLI lacks, and a
local file server would need the build's network on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from imgbuild.blocks import slug
from imgbuild.core import files as userfiles
from imgbuild.core import validate
from imgbuild.core.errors import ContentError, UsageError
from imgbuild.engine import client as engine
from imgbuild.image import dockerfile, render
from imgbuild.pin import wheels as wheels_mod
from imgbuild.pin.content import Content, Requirement, sha256_file
from imgbuild.pin.resolver import Resolved

INDEX = "sources.json"
FORMAT = 1
# sources.json lists a few thousand files at most: a larger one is refused before it is read.
MAX_INDEX_BYTES = 16 << 20
# What sources.json may name: a file in one of the folder's parts, by a plain name (apt writes an epoch's ':' as
# %3a). No name starts with a dot: nothing names `..`, the folder itself or a file outside it.
_NAME = r"[A-Za-z0-9_+~%][A-Za-z0-9._+~%-]*"
_ENTRY = re.compile(rf"(files|wheels|base)/{_NAME}|(debs|lists)/{_NAME}/{_NAME}", re.ASCII)
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)
Say = Callable[[str], None]


@dataclass(frozen=True)
class Index:
    """What sources.json records."""

    recipe: str
    lock_digest: str
    files: dict[str, str]  # relative path -> sha256
    bases: dict[str, dict[str, str]]  # base ref -> {"id": image id, "archive": relative path}

    def to_json(self) -> str:
        data = {"format": FORMAT, "recipe": self.recipe, "lock_digest": self.lock_digest,
                "files": dict(sorted(self.files.items())), "bases": dict(sorted(self.bases.items()))}  # fmt: skip
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


# ---- fetch


def fetch(resolved: Resolved, out: Path, client: Any, say: Say = print) -> Index:
    """Download and check everything a build of the lock `resolved` (the command's `lock.for_ref`) needs into `out`
    (new or empty). Written in a temporary folder beside it and renamed into place at the end: a failed or
    interrupted fetch leaves nothing."""
    from imgbuild.core.outputs import new_folder

    content = resolved.content
    assert content is not None  # lock.read refuses a lock without content
    plan = render.plan(resolved)
    with new_folder(out, what="the sources") as tmp:  # renamed onto `out` at the end, removed on any failure
        files: dict[str, str] = {}
        files.update(_fetch_downloads(content, tmp, say))
        files.update(_fetch_wheels(resolved, content, tmp, say))
        files.update(_fetch_debs(client, plan, tmp, say))
        bases = _save_bases(client, plan, tmp, files, say)
        index = Index(recipe=resolved.name, lock_digest=plan.lock_digest, files=files, bases=bases)
        (tmp / INDEX).write_text(index.to_json())
    return index


def _fetch_downloads(content: Content, tmp: Path, say: Say) -> dict[str, str]:
    import requests

    out: dict[str, str] = {}
    for url, download in content.downloads.items():
        rel = f"files/{download.filename}"
        if _ENTRY.fullmatch(rel) is None:
            raise ContentError(f"{url}: the lock's URL ends in {download.filename!r}, not a plain file name")
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        say(f"fetching {url}")
        try:
            with requests.get(url, stream=True, timeout=60) as response:
                response.raise_for_status()
                with path.open("wb") as f:
                    for chunk in response.iter_content(1 << 20):
                        f.write(chunk)
        except requests.RequestException as exc:
            raise ContentError(f"{url}: cannot fetch it: {exc}") from None
        found = sha256_file(path)
        if download.sha256 is None:
            say(f"imgbuild: warning: {download.filename}: the lock has no checksum ({download.origin}); fetched as is")
        elif found != download.sha256:
            raise ContentError(
                f"{url}: sha256 expected {download.sha256}, found {found} (the lock's, {download.origin})"
            )
        out[rel] = found
    return out


def target_platform(resolved: Resolved, arch: str | None = None) -> list[str]:
    """pip's --python-version / --platform options for the image's Python, CPU (`arch`, default the recipe's first)
    and C library. Every manylinux tag the C library satisfies is named: pip (23.x) does not widen `manylinux_2_36`
    to the older tags itself."""
    from imgbuild.core import platforms
    from imgbuild.core.distro import DISTRO

    machine = platforms.MACHINE[arch or resolved.recipe.platform.arch[0]]
    python = resolved.pins["python"].version or "3"
    distro = DISTRO.get(f"{resolved.recipe.os.family}{resolved.recipe.os.version}")
    glibc = str(getattr(distro, "glibc", None) or "2.17")
    minor = int(glibc.split(".")[1])
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 4, -1)]
    tags += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}", f"linux_{machine}"]
    return ["--python-version", python, "--implementation", "cp", *(a for t in tags for a in ("--platform", t))]


def _fetch_wheels(resolved: Resolved, content: Content, tmp: Path, say: Say) -> dict[str, str]:
    if not content.python:
        return {}
    wheels = tmp / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for name in content.python:
        say(f"fetching requirement set {name} ({len(content.python[name])} distributions)")
        reqs = tmp / f".{name.replace('/', '-')}.txt"
        reqs.write_text(content.requirements_text(name))
        # each request meets the index's deadline (wheels.request_timeout), as uv's do at lock time
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
                f"--timeout={wheels_mod.request_timeout()}", "--dest", str(wheels), "-r", str(reqs),
                *target_platform(resolved)]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        reqs.unlink()
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise ContentError(f"pip download of requirement set {name} failed:\n{tail}")
    return {f"wheels/{p.name}": sha256_file(p) for p in sorted(wheels.iterdir())}


# The fetch container: apt in the stage's own base (its sources, its installed packages), downloading only; then
# apt-ftparchive (apt-utils, installed in the throwaway container, never among the fetched files) writes the index.
# apt's lists of the archive go to /lists as apt verified them: each suite's signed InRelease and its Packages
# indexes, uncompressed (GzipIndexes off: the Debian images' lz4 copies are no file the InRelease names).
FETCH_DEBS = r"""set -eu
apt-get -o Acquire::GzipIndexes=false update -qq
apt-get install -qq -y --no-install-recommends apt-utils >/dev/null
mkdir -p /out/partial
apt-get install -qq -y --download-only --no-install-recommends -o Dir::Cache::archives=/out "$@" >/dev/null
rmdir /out/partial
cd /out && apt-ftparchive packages . > Packages
cp /var/lib/apt/lists/*_InRelease /var/lib/apt/lists/*_Packages /lists/
"""


def _fetch_debs(client: Any, plan: render.BuildPlan, tmp: Path, say: Say) -> dict[str, str]:
    from imgbuild.engine.containers import Containers

    out: dict[str, str] = {}
    for ref, packages in plan.apt_packages.items():
        folder, lists = tmp / "debs" / slug(ref), tmp / LISTS / slug(ref)
        folder.mkdir(parents=True, exist_ok=True)
        lists.mkdir(parents=True, exist_ok=True)
        say(f"fetching {len(packages)} packages (and what they depend on) for {ref}")
        run = Containers(client)
        try:
            container = run.create(ref, ["bash", "-c", FETCH_DEBS, "fetch", *packages], "fetch-debs",
                                   volumes={str(folder): {"bind": "/out", "mode": "rw"},
                                            str(lists): {"bind": "/lists", "mode": "rw"}})  # fmt: skip
            container.start()
            status = container.wait()
            if status.get("StatusCode") != 0:
                logs = container.logs().decode(errors="replace").strip().splitlines()[-8:]
                raise ContentError(f"fetching the packages of {ref} failed:\n" + "\n".join(logs))
        finally:
            run.remove_all()
        out.update({f"debs/{slug(ref)}/{p.name}": sha256_file(p) for p in sorted(folder.iterdir())})
        out.update({f"{LISTS}/{slug(ref)}/{p.name}": sha256_file(p) for p in sorted(lists.iterdir())})
    check_debs(client, tmp, out, plan.apt_packages)  # what the site will check, checked here first
    return out


# ---- the .debs against the archive's signed indexes
#
# sources.json is the folder's own record: rewritten along with a tampered .deb (and the flat repository's
# Packages), it vouches for anything. The lock records no .deb (apt resolves the packages when the image is built),
# so each .deb is checked against what the archive signed: lists/<base>/ keeps, for each suite apt read at fetch
# time, its InRelease (signed) and its Packages indexes. The signature is checked by gpgv in a container of the base
# itself, with the keyrings its apt trusts (the base: its id checked before, by load_bases); then here, each Packages
# index against the sha256 its InRelease gives it, and each .deb against the SHA256 its Packages entry gives it
# (package, version and architecture from the name apt gave the file: NAME_VERSION_ARCH.deb, ':' written %3a).

LISTS = "lists"
# Prints, for each InRelease whose signature gpgv accepts, `IMGBUILD-RELEASE NAME LENGTH` and the signed text; for
# one it refuses, `IMGBUILD-REFUSED NAME` and gpgv's reason. Keyrings: apt's (binary ones; the removed-keys keyring
# is not a trust anchor).
VERIFY_RELEASES = r"""set -u
command -v gpgv >/dev/null 2>&1 || { echo "IMGBUILD-NO-GPGV"; exit 0; }
set --
for k in /etc/apt/trusted.gpg /etc/apt/trusted.gpg.d/*.gpg /etc/apt/keyrings/*.gpg /usr/share/keyrings/*.gpg; do
  case "$k" in *removed*) continue ;; esac
  [ -f "$k" ] && set -- "$@" --keyring "$k"
done
for f in /tmp/imgbuild-releases/*; do
  rm -f /tmp/imgbuild-signed
  if gpgv "$@" --output /tmp/imgbuild-signed "$f" >/tmp/imgbuild-gpgv 2>&1; then
    echo "IMGBUILD-RELEASE ${f##*/} $(wc -c < /tmp/imgbuild-signed)"
    cat /tmp/imgbuild-signed
  else
    echo "IMGBUILD-REFUSED ${f##*/}"
    tail -n 3 /tmp/imgbuild-gpgv
    echo
  fi
done
"""
MAX_RELEASE_BYTES = 16 << 20  # an InRelease: Debian's main suite's is about 150 KB


def check_debs(client: Any, folder: Path, files: dict[str, str], apt_refs: Any) -> None:
    """Every .deb the folder holds for each base of `apt_refs` (a stage's base ref -> its packages), against the
    archive's signed indexes fetched with it. ContentError naming the file (or the index) and what is wrong."""
    for ref in apt_refs:
        base = slug(ref)
        lists = {rel.rsplit("/", 1)[1]: rel for rel in files if rel.startswith(f"{LISTS}/{base}/")}
        debs = sorted(rel for rel in files if rel.startswith(f"debs/{base}/") and rel.endswith(".deb"))
        if not debs:
            continue
        releases = {name: rel for name, rel in lists.items() if name.endswith("_InRelease")}
        if not releases:
            raise ContentError(
                f"{folder}: {LISTS}/{base}/ holds no InRelease: the .debs for {ref} cannot be checked against the "
                "archive's signed indexes (a folder fetched by an older imgbuild)",
                hint="fetch it again with this imgbuild: imgbuild sources fetch RECIPE -o NEW_FOLDER",
            )
        signed = _verified_releases(client, ref, folder, releases)
        archive = _signed_packages(folder, base, lists, signed)
        for rel in debs:
            name = rel.rsplit("/", 1)[1]
            parts = name[: -len(".deb")].split("_")
            key = (parts[0], unquote(parts[1]), parts[2]) if len(parts) == 3 else None
            if key is None or key not in archive:
                raise ContentError(
                    f"{folder}: {rel}: no such package in the archive's signed indexes for {ref} "
                    f"({'expected NAME_VERSION_ARCH.deb' if key is None else ' '.join(key)})",
                    hint="fetch the sources again: a .deb comes from the archive apt fetched it from, or not at all",
                )
            found = sha256_file(entry(folder, rel))
            if found not in archive[key]:
                raise ContentError(
                    f"{folder}: {rel}: sha256 expected {' or '.join(sorted(archive[key]))} (the archive's signed "
                    f"index for {ref}), found {found}",
                    hint="fetch the sources again: this .deb is not the one the archive published",
                )


def _verified_releases(client: Any, ref: str, folder: Path, releases: dict[str, str]) -> dict[str, str]:
    """name -> the signed text of each InRelease, as gpgv in a container of base `ref` verified it (no network)."""
    from imgbuild.engine.containers import Containers

    content: dict[str, tuple[bytes, int]] = {}
    for name, rel in releases.items():
        try:
            content[f"/tmp/imgbuild-releases/{name}"] = (userfiles.read_bounded(entry(folder, rel), MAX_RELEASE_BYTES),
                                                         0o644)  # fmt: skip
        except userfiles.Refused as exc:
            raise ContentError(f"{folder}: {rel}: {exc}") from None
    run = Containers(client)
    try:
        container = run.create(ref, ["sh", "-c", VERIFY_RELEASES], "check-debs", entrypoint=[], network_disabled=True)
        run.copy_in(container, content)
        container.start()
        status = container.wait()
        out = container.logs(stdout=True, stderr=False)
    except engine.ENGINE_ERRORS as exc:
        raise engine.engine_error(exc, f"checking the signed indexes of {ref}") from exc
    finally:
        run.remove_all()
    if status.get("StatusCode") != 0 or out.startswith(b"IMGBUILD-NO-GPGV"):
        raise ContentError(f"{ref} has no gpgv: the archive's signed indexes cannot be checked in it")
    signed: dict[str, str] = {}
    pos = 0
    while pos < len(out):
        end = out.index(b"\n", pos)
        head = out[pos:end].decode(errors="replace").split()
        pos = end + 1
        if head and head[0] == "IMGBUILD-RELEASE" and len(head) == 3:
            length = int(head[2])
            signed[head[1]] = out[pos : pos + length].decode("utf-8", errors="replace")
            pos += length
        elif head and head[0] == "IMGBUILD-REFUSED":
            why = out[pos:].decode(errors="replace").strip().splitlines()[:3]
            raise ContentError(
                f"{folder}: {releases.get(head[1], head[1])}: its signature is not one {ref}'s apt trusts "
                f"({' '.join(why)})"
            )
    missing = sorted(set(releases) - set(signed))
    if missing:
        raise ContentError(f"{folder}: {releases[missing[0]]}: gpgv in {ref} gave no verdict")
    return signed


def _signed_packages(
    folder: Path, base: str, lists: dict[str, str], signed: dict[str, str]
) -> dict[tuple[str, str, str], set[str]]:
    """(package, version, architecture) -> the SHA256s the archive's Packages indexes give it, each index checked
    first against the sha256 its suite's signed InRelease records."""
    out: dict[tuple[str, str, str], set[str]] = {}
    for name, rel in sorted(lists.items()):
        if not name.endswith("_Packages"):
            continue
        suites = [r for r in signed if name.startswith(r[: -len("InRelease")])]
        suite = max(suites, key=len) if suites else None
        if suite is None:
            raise ContentError(f"{folder}: {rel}: no InRelease of its suite in {LISTS}/{base}/")
        path = name[len(suite) - len("InRelease") :].replace("_", "/")
        expected = _release_sha256(signed[suite]).get(path)
        found = sha256_file(entry(folder, rel))
        if expected is None or found != expected:
            raise ContentError(
                f"{folder}: {rel}: sha256 expected {expected or '(none: the InRelease names no ' + path + ')'} "
                f"(its suite's signed {suite}), found {found}"
            )
        with entry(folder, rel).open(encoding="utf-8", errors="replace") as f:
            fields: dict[str, str] = {}
            for line in [*f, ""]:
                if not line.strip():
                    if {"Package", "Version", "Architecture", "SHA256"} <= fields.keys():
                        key = (fields["Package"], fields["Version"], fields["Architecture"])
                        out.setdefault(key, set()).add(fields["SHA256"])
                    fields = {}
                elif not line[0].isspace() and ":" in line:
                    field, _, value = line.partition(":")
                    fields[field] = value.strip()
    return out


def _release_sha256(text: str) -> dict[str, str]:
    """The SHA256 section of a Release file: path (main/binary-amd64/Packages) -> sha256."""
    out: dict[str, str] = {}
    section = False
    for line in text.splitlines():
        if not line.startswith(" "):
            section = line.strip() == "SHA256:"
            continue
        parts = line.split()
        if section and len(parts) == 3 and _SHA256.fullmatch(parts[0]):
            out[parts[2]] = parts[0]
    return out


def _save_bases(
    client: Any, plan: render.BuildPlan, tmp: Path, files: dict[str, str], say: Say
) -> dict[str, dict[str, str]]:
    bases: dict[str, dict[str, str]] = {}
    for ref in plan.base_images:
        image = engine.inspect_image(client, ref)
        if image is None:
            raise ContentError(f"base image {ref} is not in the engine", hint=engine.BOOTSTRAP_HINT.format(image=ref))
        archive = f"base/{slug(ref)}.tar"
        path = tmp / archive
        path.parent.mkdir(parents=True, exist_ok=True)
        say(f"saving base image {ref} ({image['Id'][7:19]})")
        with path.open("wb") as f:
            for chunk in client.api.get_image(ref):
                f.write(chunk)
        files[archive] = sha256_file(path)
        bases[ref] = {"id": image["Id"], "archive": archive}
    return bases


# ---- check and use


def check(folder: Path, resolved: Resolved, plan: render.BuildPlan) -> Index:
    """The folder's index, every file checked: present, the sha256 sources.json records, and for tarballs and wheels
    the one the lock records. ContentError naming the file, the expected and the found hash."""
    content = resolved.content
    if content is None:
        raise UsageError(
            f"{resolved.name}: a build from sources needs the recipe's lock", hint=f"imgbuild lock {resolved.name}"
        )
    index = read_index(folder)
    hint = f"imgbuild sources fetch {resolved.name} -o NEW_FOLDER"
    if index.lock_digest != plan.lock_digest:
        raise ContentError(
            f"{folder}: fetched for lock {index.lock_digest[:12]} of {index.recipe}, the lock of {resolved.name} is "
            f"{plan.lock_digest[:12]}",
            hint=hint,
        )
    for rel, expected in sorted(index.files.items()):
        _check_file(folder, rel, expected, "sources.json", hint)
    for url, download in content.downloads.items():
        rel = f"files/{download.filename}"
        if rel not in index.files:
            raise ContentError(f"{folder}: {rel} ({url}) is missing", hint=hint)
        if download.sha256 is not None:
            _check_file(folder, rel, download.sha256, "the lock", hint)
    wheel_hashes = {sha: rel for rel, sha in index.files.items() if rel.startswith("wheels/")}
    for name, reqs in content.python.items():
        for req in reqs:
            if not any(h[7:] in wheel_hashes for h in req.hashes):
                raise ContentError(_no_wheel(folder, name, req), hint=hint)
    for ref in plan.apt_packages:
        if f"debs/{slug(ref)}/Packages" not in index.files:
            raise ContentError(f"{folder}: debs/{slug(ref)}/Packages (the packages for {ref}) is missing", hint=hint)
    for ref in plan.base_images:
        if ref not in index.bases:
            raise ContentError(f"{folder}: base image {ref} is missing", hint=hint)
    return index


def read_index(folder: Path) -> Index:
    """The folder's sources.json, read with a bound and checked for its form: every file a plain name in one of the
    folder's parts (never a path out of it) with 64 hex digits, every base an image reference with an id and an
    archive under base/. ContentError naming sources.json and what is wrong."""
    path = folder / INDEX
    if not folder.is_dir():
        raise ContentError(f"{folder}: not a folder")
    if not path.exists() and not path.is_symlink():
        raise ContentError(f"{folder}: no {INDEX}: not a folder `imgbuild sources fetch` wrote")
    try:
        entry(folder, INDEX)
        data = json.loads(userfiles.read_text_bounded(path, MAX_INDEX_BYTES))
    except userfiles.Refused as exc:
        raise ContentError(f"{INDEX} unreadable: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ContentError(f"{path}: unreadable: {str(exc).split(';')[0][:200]}") from None
    if not isinstance(data, dict):
        raise ContentError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ContentError(f"{path}: format: expected {FORMAT}, got {str(data.get('format'))[:40]!r}")
    fields = {"recipe": str, "lock_digest": str, "files": dict, "bases": dict}
    for key, kind in fields.items():
        if not isinstance(data.get(key), kind):
            raise ContentError(f"{path}: {key}: expected {'text' if kind is str else 'an object'}")
    for rel, sha in data["files"].items():
        if _ENTRY.fullmatch(rel) is None:
            raise ContentError(f"{path}: files: {rel[:120]!r}: expected a plain file name under files/, wheels/, "
                               "base/ or debs/BASE/")  # fmt: skip
        if not isinstance(sha, str) or _SHA256.fullmatch(sha) is None:
            raise ContentError(f"{path}: files: {rel}: expected a sha256 of 64 hex digits, got {str(sha)[:80]!r}")
    for ref, base in data["bases"].items():
        try:
            validate.image_ref(ref)
        except ValueError as exc:
            raise ContentError(f"{path}: bases: {exc}") from None
        archive, image_id = (base.get("archive"), base.get("id")) if isinstance(base, dict) else (None, None)
        if not isinstance(archive, str) or not archive.startswith("base/") or _ENTRY.fullmatch(archive) is None:
            raise ContentError(f"{path}: bases: {ref}: archive: expected base/NAME.tar, got {str(archive)[:120]!r}")
        if not isinstance(image_id, str) or not (image_id.startswith("sha256:") and _SHA256.fullmatch(image_id[7:])):
            raise ContentError(f"{path}: bases: {ref}: id: expected sha256:<64 hex digits>, got {str(image_id)[:80]!r}")
        if archive not in data["files"]:
            raise ContentError(f"{path}: bases: {ref}: archive {archive} is not among its files (no sha256)")
    return Index(recipe=data["recipe"], lock_digest=data["lock_digest"], files=dict(data["files"]),
                 bases={k: dict(v) for k, v in data["bases"].items()})  # fmt: skip


def entry(folder: Path, rel: str) -> Path:
    """The file `rel` of the sources folder, which must stay in it (links resolved) and be a regular file (a FIFO or a
    device is never opened); ContentError naming it otherwise."""
    try:
        path = userfiles.inside(folder, folder / rel)
        userfiles.regular(path)
    except userfiles.Refused as exc:
        raise ContentError(f"{folder}: {rel}: {exc}") from None
    return path


def _no_wheel(folder: Path, name: str, req: Requirement) -> str:
    return (
        f"{folder}: wheels/ holds no file of {req.name}=={req.version} (requirement set {name}) with a sha256 the lock "
        f"records ({', '.join(h[7:19] for h in req.hashes[:4])}{'...' if len(req.hashes) > 4 else ''})"
    )


def _check_file(folder: Path, rel: str, expected: str, whose: str, hint: str) -> None:
    path = folder / rel
    if not path.exists() and not path.is_symlink():
        raise ContentError(f"{folder}: {rel} is missing", hint=hint)
    found = sha256_file(entry(folder, rel))
    if found != expected:
        raise ContentError(f"{folder}: {rel}: sha256 expected {expected} ({whose}), found {found}", hint=hint)


def load_bases(client: Any, folder: Path, index: Index, say: Say = print) -> None:
    """Each base image in the engine with the id the fetch recorded: loaded from its archive unless the engine already
    has that very image; a loaded image with another id is refused."""
    for ref, base in index.bases.items():
        have = engine.inspect_image(client, ref)
        if have is not None and have["Id"] == base["id"]:
            continue
        say(f"loading base image {ref} from {base['archive']}")
        with entry(folder, base["archive"]).open("rb") as f:
            try:
                client.images.load(f)
            except engine.ENGINE_ERRORS as exc:
                raise engine.engine_error(exc, f"loading {base['archive']}") from exc
        have = engine.inspect_image(client, ref)
        if have is None or have["Id"] != base["id"]:
            raise ContentError(
                f"{folder / base['archive']}: loads as {ref} {have['Id'] if have else 'nothing'}, the fetch recorded "
                f"{base['id']}"
            )


def stage(folder: Path, index: Index, context: Path) -> None:
    """The fetched files (not the base archives: they are loaded, not built from) into the build context's
    SOURCES_CONTEXT, hard-linked where the file system allows."""
    root = context / dockerfile.SOURCES_CONTEXT
    for rel in index.files:
        if rel.startswith(("base/", f"{LISTS}/")):  # loaded, or read by check_debs: never built from
            continue
        _link(entry(folder, rel), userfiles.inside(root, root / rel))
    with contextlib.suppress(FileExistsError):
        (root / "apt" / "none").mkdir(parents=True)


def _link(source: Path, dest: Path) -> None:
    """`source` at `dest` in a build context: hard-linked where the file system allows, else copied."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


# ---- a local folder of downloads (`--files DIR`: a corporate mirror, CI's copy of the sources)
#
# Consulted before the network for every download of the recipe, found by file name (`record.local_copy`). What it
# holds goes the way a sources folder's files/ goes: into the context's SOURCES_CONTEXT/files/, bind-mounted by the
# RUNs that download, where `_build.j2`'s `download` copies it instead of fetching it (the Jinja global
# `local_files`), and checks its sha256 again. Downloads it lacks are fetched from the network as before.


def local_downloads(folder: Path, content: Content | None, say: Say = print) -> dict[str, Path]:
    """The downloads of the lock's `content` that `folder` holds: file name -> its path, each checked against the
    lock's sha256 first. A mismatch is a ContentError naming the file, the URL and both hashes (before any build:
    nothing is built, tagged or written). A download the lock has no sha256 for (nobody could establish one) is used
    unchecked, saying so, as the network's copy would be."""
    from imgbuild.pin.record import local_copy

    if content is None:
        raise UsageError("--files: the files are checked against the lock's sha256s, and this recipe has no lock")
    found: dict[str, Path] = {}
    for url, download in content.downloads.items():
        path = local_copy(folder, url)
        if path is None:
            continue
        if download.sha256 is None:
            say(f"imgbuild: warning: --files {folder}: {path.name}: the lock has no sha256 for {url} "
                f"({download.origin}); used unchecked")  # fmt: skip
        else:
            sha = sha256_file(path)
            if sha != download.sha256:
                raise ContentError(
                    f"--files {folder}: {path.name}: sha256 expected {download.sha256} (the lock's, for {url}), "
                    f"found {sha}",
                    hint=f"put the file the lock names in {folder} (or remove it to download {url}), or relock "
                    "with `imgbuild lock --files` if the lock is what is wrong",
                )
        found[download.filename] = path
    return found


def stage_files(found: dict[str, Path], context: Path) -> None:
    """The downloads `local_downloads` found, into the build context's SOURCES_CONTEXT/files/ (where `download` copies
    them from)."""
    root = context / dockerfile.SOURCES_CONTEXT
    for name, path in found.items():
        _link(path, userfiles.inside(root, root / "files" / name))
