"""Air-gapped builds for real: `imgbuild sources fetch cpu -o DIR` downloads everything the cpu lock names (the
nccl wheel, the Debian packages of both stages, the base image), and `imgbuild build cpu --sources DIR` builds the
image from that folder with the build's network off; a folder missing a file, holding a corrupted one or fetched for
another lock is refused before anything is built or tagged (exit 16), naming the file and both hashes."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from imgbuild.cli import app
from imgbuild.pin import lock

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def fetched(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`sources fetch cpu -o cpu`: a relative folder, as users type it (the fetch container's bind mount once got the
    relative path, and the engine answered 400 Client Error)."""
    parent = tmp_path_factory.mktemp("sources")
    here = os.getcwd()
    os.chdir(parent)
    try:
        result = CliRunner().invoke(app, ["sources", "fetch", "cpu", "-o", "cpu"])
    finally:
        os.chdir(here)
    assert result.exit_code == 0, result.output
    return parent / "cpu"


def _copy(fetched: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(fetched, copy)
    return copy


def _tags(client: Any) -> dict[str, str | None]:
    _, resolved = lock.for_ref("cpu")
    from imgbuild.image import identity

    out = {}
    for ref in identity.of(resolved).refs():
        try:
            out[ref] = client.images.get(ref).id
        except Exception:
            out[ref] = None
    return out


def test_fetch_holds_what_the_lock_names(fetched: Path) -> None:
    index = json.loads((fetched / "sources.json").read_text())
    _, resolved = lock.for_ref("cpu")
    assert resolved.content is not None
    wheels = [rel for rel in index["files"] if rel.startswith("wheels/")]
    assert any(Path(rel).name.startswith("nvidia_nccl_cu12-2.27.5") for rel in wheels), wheels
    debs = [rel for rel in index["files"] if rel.startswith("debs/")]
    assert any("/openmpi-bin_" in rel for rel in debs) and any(rel.endswith("/Packages") for rel in debs)
    lists = [rel for rel in index["files"] if rel.startswith("lists/debian-bookworm-slim/")]  # the archive's, signed
    assert any(rel.endswith("_bookworm_InRelease") for rel in lists), lists
    assert any(rel.endswith("_bookworm_main_binary-amd64_Packages") for rel in lists), lists
    assert set(index["bases"]) == {"debian:bookworm-slim"}
    assert not list(fetched.parent.glob(".cpu.*.partial"))  # the temporary folder was renamed into place


def test_build_from_sources_with_the_network_off(fetched: Path, docker_client: Any) -> None:
    # --no-cache: every step runs here, with the network off (a cached layer would prove nothing)
    result = CliRunner().invoke(app, ["build", "cpu", "--sources", str(fetched), "--no-cache"])
    assert result.exit_code == 0, result.output
    _, resolved = lock.for_ref("cpu")
    from imgbuild.image import identity

    ref = identity.of(resolved).ref()
    out = docker_client.containers.run(
        ref, ["bash", "-c", "dpkg-query -W openmpi-bin; /opt/venv/bin/pip list 2>/dev/null | grep nvidia-nccl"],
        remove=True, entrypoint=[],
    ).decode()  # fmt: skip
    assert "openmpi-bin" in out and "nvidia-nccl-cu12" in out and "2.27.5" in out
    # the build really ran offline: the log shows the network mode and the local apt repository
    log = Path(result.output.split("log: ")[-1].strip())
    text = log.read_text()
    assert "file:/imgbuild-sources/debs/" in text


@pytest.mark.parametrize("damage", ["corrupt-wheel", "missing-deb", "corrupt-base", "edited-index"])
def test_a_damaged_folder_is_refused_before_anything_is_built(
    damage: str, fetched: Path, tmp_path: Path, docker_client: Any
) -> None:
    copy = _copy(fetched, tmp_path)
    index = json.loads((copy / "sources.json").read_text())
    if damage == "corrupt-wheel":
        rel = next(r for r in index["files"] if r.startswith("wheels/"))
        with (copy / rel).open("r+b") as f:
            f.seek(100)
            f.write(b"tampered")
    elif damage == "missing-deb":
        rel = next(r for r in index["files"] if "/openmpi-bin_" in r)
        (copy / rel).unlink()
    elif damage == "corrupt-base":
        rel = next(r for r in index["files"] if r.startswith("base/"))
        with (copy / rel).open("ab") as f:
            f.write(b"\0" * 512)
    else:  # the index rewritten to match a tampered wheel: the lock's own hashes still refuse it
        rel = next(r for r in index["files"] if r.startswith("wheels/"))
        with (copy / rel).open("r+b") as f:
            f.seek(100)
            f.write(b"tampered")
        from imgbuild.pin.content import sha256_file

        index["files"][rel] = sha256_file(copy / rel)
        (copy / "sources.json").write_text(json.dumps(index))
    before = _tags(docker_client)
    result = CliRunner().invoke(app, ["build", "cpu", "--sources", str(copy)])
    assert result.exit_code == 16, result.output
    name, version = rel.split("/")[-1].split("-")[:2]  # a file's name (NAME-VERSION-...) or the pin it is for
    assert rel.split("/")[-1] in result.output or f"{name.replace('_', '-')}=={version}" in result.output, result.output
    if damage != "missing-deb" and damage != "edited-index":
        assert "expected" in result.output and "found" in result.output
    assert _tags(docker_client) == before  # nothing tagged


def _rewrite_sha256(packages: Path, filename: str, sha: str) -> None:
    """The SHA256 of `filename`'s entry in the Packages index `packages` set to `sha` (its other hashes dropped), as
    someone who swapped the file would rewrite it."""
    stanzas = packages.read_text().split("\n\n")
    hit = [i for i, s in enumerate(stanzas) if re.search(rf"^Filename: (\./|.*/){re.escape(filename)}$", s, re.M)]
    assert hit, filename
    for i in hit:
        kept = [line for line in stanzas[i].splitlines() if not line.startswith(("MD5sum:", "SHA1:", "SHA512:"))]
        stanzas[i] = re.sub(r"^SHA256: \S+$", f"SHA256: {sha}", "\n".join(kept), flags=re.M)
    packages.write_text("\n\n".join(stanzas))


@pytest.mark.parametrize("how", ["flat-index-rewritten", "signed-list-rewritten", "release-forged"])
def test_a_tampered_deb_is_refused_against_the_archives_signed_indexes(
    how: str, fetched: Path, tmp_path: Path, docker_client: Any
) -> None:
    """A .deb swapped in the folder, with everything the folder holds rewritten to match it (the flat repository's
    Packages, sources.json; then apt's Packages list of the archive; then the suite's InRelease as well): refused by
    the archive's signature, checked by gpgv in the base with its own keyrings (exit 16, naming the file)."""
    from imgbuild.pin.content import sha256_file

    copy = _copy(fetched, tmp_path)
    index = json.loads((copy / "sources.json").read_text())
    rel = next(r for r in index["files"] if "/openmpi-bin_" in r)
    deb = copy / rel
    with deb.open("r+b") as f:
        f.seek(200)
        f.write(b"tampered")
    sha = sha256_file(deb)
    lists = sorted(r for r in index["files"] if r.startswith("lists/") and r.endswith("_main_binary-amd64_Packages"))
    main = next(r for r in lists if "_dists_bookworm_main" in r)  # openmpi-bin 4.1.4-3+b1 is bookworm's own
    changed = [rel, str(Path(rel).parent / "Packages")]
    _rewrite_sha256(copy / changed[1], deb.name, sha)
    named = rel
    if how != "flat-index-rewritten":
        _rewrite_sha256(copy / main, deb.name, sha)  # no epoch: the pool's name is apt's
        changed.append(main)
        named = main
    if how == "release-forged":  # the suite's InRelease names the rewritten list's sha256: its signature no longer fits
        release = main.replace("_main_binary-amd64_Packages", "_InRelease")
        text = (copy / release).read_text()
        old = re.search(r"^ ([0-9a-f]{64}) +\d+ main/binary-amd64/Packages$", text, re.M)
        assert old is not None
        (copy / release).write_text(text.replace(old.group(1), sha256_file(copy / main)))
        changed.append(release)
        named = release
    for r in changed:
        index["files"][r] = sha256_file(copy / r)
    (copy / "sources.json").write_text(json.dumps(index))
    before = _tags(docker_client)
    result = CliRunner().invoke(app, ["build", "cpu", "--sources", str(copy)])
    assert result.exit_code == 16, result.output
    assert named in result.output, result.output
    says = {"flat-index-rewritten": "the archive's signed index", "signed-list-rewritten": "its suite's signed",
            "release-forged": "its signature is not one"}[how]  # fmt: skip
    assert says in result.output, result.output
    assert _tags(docker_client) == before  # nothing tagged


def test_a_folder_for_another_lock_is_refused(fetched: Path, tmp_path: Path) -> None:
    copy = _copy(fetched, tmp_path)
    index = json.loads((copy / "sources.json").read_text())
    index["lock_digest"] = "0" * 64
    (copy / "sources.json").write_text(json.dumps(index))
    result = CliRunner().invoke(app, ["build", "cpu", "--sources", str(copy)])
    assert result.exit_code == 16, result.output
    assert "fetched for lock 000000000000" in result.output


def test_fetch_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("mine\n")
    result = CliRunner().invoke(app, ["sources", "fetch", "cpu", "-o", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert (tmp_path / "x").read_text() == "mine\n"
