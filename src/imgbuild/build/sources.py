"""Air-gapped builds: `imgbuild sources fetch RECIPE -o DIR` downloads everything a build of the recipe's lock needs
and checks it; `imgbuild build RECIPE --sources DIR` builds from that folder alone, with the build's network off.

The folder holds:
  files/NAME            every tarball the Dockerfile downloads, checked against the lock's sha256;
  wheels/               every Python distribution of the lock's requirement sets, each with a hash the lock records;
  debs/<base slug>/     the .debs each base's stages install (apt fetched them against the archive's signed indexes),
                        with a Packages index (apt-ftparchive): a flat apt repository;
  base/<base slug>.tar  each base image (`docker save`: engine 20.10 writes a docker-archive, which `docker load`
                        reads on any engine), with its image id;
  sources.json          what was fetched for which lock: every file with its sha256, every base with its id.

A build from the folder checks it first: the lock it was fetched for, every file's sha256 against sources.json AND
against the lock (tarballs, wheels), each base's id after loading it. A missing or corrupted file is refused, naming
it with the expected and found hash, before anything is built or tagged (ContentError, exit 16). The build then gets
the folder in its context (imgbuild-sources/, bind-mounted by the RUNs that would download: render.SOURCES_MOUNT) and
runs with `--network none`: BuildKit's build contexts (`--build-context`) need buildx, which Debian 12's docker CLI
lacks, and a local file server would need the build's network on.
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

from imgbuild import engine
from imgbuild.blocks import slug
from imgbuild.core import files as userfiles
from imgbuild.core import validate
from imgbuild.core.errors import ContentError, UsageError
from imgbuild.image import render
from imgbuild.pin import lock
from imgbuild.pin.content import Content, Requirement, sha256_file
from imgbuild.pin.resolver import Resolved

INDEX = "sources.json"
FORMAT = 1
# sources.json lists a few thousand files at most: a larger one is refused before it is read.
MAX_INDEX_BYTES = 16 << 20
# What sources.json may name: a file in one of the folder's parts, by a plain name (apt writes an epoch's ':' as
# %3a). No name starts with a dot: nothing names `..`, the folder itself or a file outside it.
_NAME = r"[A-Za-z0-9_+~%][A-Za-z0-9._+~%-]*"
_ENTRY = re.compile(rf"(files|wheels|base)/{_NAME}|debs/{_NAME}/{_NAME}", re.ASCII)
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


def _locked(ref: str) -> tuple[Resolved, Content, render.BuildPlan]:
    """The recipe's lock (content included) and its plan; a recipe without a lock is refused (lock.resolved_for)."""
    _, resolved = lock.for_ref(ref)
    assert resolved.content is not None  # lock.read refuses a lock without content
    return resolved, resolved.content, render.plan(resolved)


# ---- fetch


def fetch(ref: str, out: Path, client: Any, say: Say = print) -> Index:
    """Download and check everything a build of REF's lock needs into `out` (new or empty). Written in a temporary
    folder beside it and renamed into place at the end: a failed or interrupted fetch leaves nothing."""
    from imgbuild.core.outputs import new_folder

    resolved, content, plan = _locked(ref)
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
    from imgbuild.spec import compat

    machine = compat.MACHINE[arch or resolved.recipe.platform.arch[0]]
    python = resolved.pins["python"].version or "3"
    distro = compat.DISTRO.get(f"{resolved.recipe.os.family}{resolved.recipe.os.version}")
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
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
                "--dest", str(wheels), "-r", str(reqs), *target_platform(resolved)]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        reqs.unlink()
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise ContentError(f"pip download of requirement set {name} failed:\n{tail}")
    return {f"wheels/{p.name}": sha256_file(p) for p in sorted(wheels.iterdir())}


# The fetch container: apt in the stage's own base (its sources, its installed packages), downloading only; then
# apt-ftparchive (apt-utils, installed in the throwaway container, never among the fetched files) writes the index.
FETCH_DEBS = r"""set -eu
apt-get update -qq
apt-get install -qq -y --no-install-recommends apt-utils >/dev/null
mkdir -p /out/partial
apt-get install -qq -y --download-only --no-install-recommends -o Dir::Cache::archives=/out "$@" >/dev/null
rmdir /out/partial
cd /out && apt-ftparchive packages . > Packages
"""


def _fetch_debs(client: Any, plan: render.BuildPlan, tmp: Path, say: Say) -> dict[str, str]:
    from imgbuild.engine.containers import Containers

    out: dict[str, str] = {}
    for ref, packages in plan.apt_packages.items():
        folder = tmp / "debs" / slug(ref)
        folder.mkdir(parents=True, exist_ok=True)
        say(f"fetching {len(packages)} packages (and what they depend on) for {ref}")
        run = Containers(client)
        try:
            container = run.create(ref, ["bash", "-c", FETCH_DEBS, "fetch", *packages], "fetch-debs",
                                   volumes={str(folder): {"bind": "/out", "mode": "rw"}})  # fmt: skip
            container.start()
            status = container.wait()
            if status.get("StatusCode") != 0:
                logs = container.logs().decode(errors="replace").strip().splitlines()[-8:]
                raise ContentError(f"fetching the packages of {ref} failed:\n" + "\n".join(logs))
        finally:
            run.remove_all()
        out.update({f"debs/{slug(ref)}/{p.name}": sha256_file(p) for p in sorted(folder.iterdir())})
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
    root = context / render.SOURCES_CONTEXT
    for rel in index.files:
        if rel.startswith("base/"):
            continue
        source, dest = entry(folder, rel), userfiles.inside(root, root / rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, dest)
        except OSError:
            shutil.copy2(source, dest)
    with contextlib.suppress(FileExistsError):
        (root / "apt" / "none").mkdir(parents=True)
