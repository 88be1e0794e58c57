"""`--files DIR` (IMGBUILD_FILES): a local folder of downloads consulted before the network, found by file name
(`download_name`). `imgbuild lock` hashes what it finds there; `imgbuild build` and `imgbuild render` check each file
against the lock's sha256 before anything else and copy it from the build context instead of downloading it.

The recipe is tests/recipes/ofi-tag-files.yaml: its three downloads are GitHub's archives of tags that
tests/data/upstream/sources holds; its one Python set (the nvidia-nccl wheel) comes from a local index and the
network's proxy is a closed port, so nothing here reaches the internet: a download that was not taken from the folder
would be recorded as unestablished."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO
from imgbuild import recipe
from imgbuild.blocks import _releases as releases
from imgbuild.cli import app
from imgbuild.core.errors import ContentError, UsageError
from imgbuild.image.dockerfile import SOURCES_CONTEXT, SOURCES_DIR, SOURCES_MOUNT
from imgbuild.pin import lock
from imgbuild.pin.content import Download, sha256_file
from localindex import Index, make_wheel
from test_download_verify import _build, _tarball, build_module

SOURCES = REPO / "tests" / "data" / "upstream" / "sources"
RECIPE = REPO / "tests" / "recipes" / "ofi-tag-files.yaml"
SUMS = {name: sha for sha, name in (line.split() for line in (SOURCES / "SHA256SUMS").read_text().splitlines())}
URLS = {
    "aws-ofi-nccl-1.21.1.tar.gz": "https://github.com/aws/aws-ofi-nccl/archive/refs/tags/v1.21.1.tar.gz",
    "gdrcopy-2.5.1.tar.gz": "https://github.com/NVIDIA/gdrcopy/archive/refs/tags/v2.5.1.tar.gz",
    "nccl-tests-2.18.3.tar.gz": "https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v2.18.3.tar.gz",
}

# Newer releases the folder holds too (blocks/nccl_tests/releases.yaml and gdrcopy.yaml list them), for a recipe that
# moves to them.
NEWER = {
    "gdrcopy-2.6.tar.gz": "https://github.com/NVIDIA/gdrcopy/archive/refs/tags/v2.6.tar.gz",
    "nccl-tests-2.19.6.tar.gz": "https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v2.19.6.tar.gz",
}


def run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def test_the_folder_holds_what_its_sums_say() -> None:
    assert set(SUMS) == set(URLS) | set(NEWER)
    for name, sha in SUMS.items():
        assert sha256_file(SOURCES / name) == sha, name


@pytest.fixture
def offline_recipe(index_env: Index, recipe_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test recipe copied beside a lock of its own, with the one wheel it installs on the local index and every
    other connection sent to a closed port (a download not taken from the folder cannot be hashed)."""
    filename = "nvidia_nccl_cu12-2.27.5-py3-none-any.whl"
    index_env.add_wheel("nvidia-nccl-cu12", filename, make_wheel(tmp_path, filename, [], junk=2000))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    path = recipe_dir / "ofi-tag-files.yaml"
    shutil.copy(RECIPE, path)
    return path


def _downloads(path: Path) -> dict[str, Download]:
    resolved = lock.read(recipe.load(path).concrete())
    assert resolved is not None and resolved.content is not None
    return resolved.content.downloads


@pytest.mark.parametrize("how", ["option", "env"])
def test_lock_hashes_every_download_from_the_folder(offline_recipe: Path, how: str) -> None:
    args, env = (["--files", str(SOURCES)], None) if how == "option" else ([], {"IMGBUILD_FILES": str(SOURCES)})
    result = run("lock", str(offline_recipe), *args, env=env)
    assert result.exit_code == 0, result.output
    downloads = _downloads(offline_recipe)
    assert sorted(downloads) == sorted(URLS.values())
    for name, url in URLS.items():
        d = downloads[url]
        assert d.sha256 == SUMS[name], d
        size = (SOURCES / name).stat().st_size
        # the same entry as for the URL, its origin naming the local file (not the folder: the lock reads the same
        # on every machine)
        assert d.origin == f"computed at lock time from the local file {name} ({size} bytes, --files), for {url}"
        assert str(SOURCES) not in d.origin


def test_lock_hashes_the_newer_releases_from_the_folder(offline_recipe: Path) -> None:
    """nccl-tests 2.19.6 and GDRCopy 2.6 (issue 30): a recipe that pins them locks with their archives hashed from
    the folder, nothing downloaded."""
    text = offline_recipe.read_text().replace("nccl_tests: {version: 2.18.3}", "nccl_tests: {version: 2.19.6}")
    offline_recipe.write_text(text + "  gdrcopy: {version: '2.6'}\n")
    result = run("lock", str(offline_recipe), "--files", str(SOURCES))
    assert result.exit_code == 0, result.output
    downloads = _downloads(offline_recipe)
    for name, url in NEWER.items():
        assert downloads[url].sha256 == SUMS[name], downloads[url]
        assert downloads[url].origin.startswith(f"computed at lock time from the local file {name} ")


def test_lock_reads_the_plugins_tested_versions_from_its_archive(offline_recipe: Path) -> None:
    """aws-ofi-nccl's tested NCCL and libfabric come from the archive's own RELEASENOTES.md where the archive is at
    hand (issue 30); the lock records them, and its pins are checked against that record with no archive."""
    result = run("lock", str(offline_recipe), "--files", str(SOURCES))
    assert result.exit_code == 0, result.output
    read_from = "aws-ofi-nccl-1.21.1.tar.gz (--files)"
    assert (
        f"aws_ofi_nccl 1.21.1: tested versions read from {read_from}: tested_nccl 2.31.2, "
        "tested_libfabric 2.6.0amzn1.0\n"
    ) in result.stdout  # the same as aws_ofi_nccl.yaml's rows: nothing said about a difference
    pin = json.loads(offline_recipe.with_suffix(".lock.json").read_text())["pins"]["aws_ofi_nccl"]
    assert pin["details"]["notes"] == {
        "tested_nccl": "2.31.2", "tested_libfabric": "2.6.0amzn1.0", "read_from": read_from
    }  # fmt: skip
    assert pin["details"]["tested_nccl"] == "2.31.2"
    shown = run("show", str(offline_recipe), "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["from"] == "lock", shown.output


def test_lock_records_the_commit_each_tag_archive_was_made_from(offline_recipe: Path) -> None:
    """git archive writes the commit into the archive (its pax header): the lock records it for nccl-tests and GDRCopy
    and checks it against the release files' rows (issue 30)."""
    result = run("lock", str(offline_recipe), "--files", str(SOURCES))
    assert result.exit_code == 0, result.output
    commit = "f727aa2a540fef911de9d7bfd8852bc5d2c69815"  # tests/data/upstream/sources/README.md: v2.18.3
    said = f"nccl_tests 2.18.3: the commit of its tag read from nccl-tests-2.18.3.tar.gz (--files): commit {commit}"
    assert said in result.stdout
    pins = json.loads(offline_recipe.with_suffix(".lock.json").read_text())["pins"]
    assert pins["nccl_tests"]["details"]["commit"] == commit
    gdrcopy = releases.tag_releases("gdrcopy")[pins["gdrcopy"]["version"]]
    assert pins["gdrcopy"]["details"]["commit"] == gdrcopy.commit


def test_an_archive_of_another_commit_than_the_tags_is_refused(offline_recipe: Path, tmp_path: Path) -> None:
    folder = tmp_path / "files"
    shutil.copytree(SOURCES, folder)
    other = "0123456789abcdef0123456789abcdef01234567"
    archive = folder / "nccl-tests-2.18.3.tar.gz"
    archive.unlink()
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT, pax_headers={"comment": other}) as tar:
        tar.addfile(tarfile.TarInfo("nccl-tests-2.18.3/Makefile"), io.BytesIO(b""))
    result = run("lock", str(offline_recipe), "--files", str(folder))
    assert result.exit_code == 5, result.output
    assert (
        f"components.nccl_tests.version: nccl-tests-2.18.3.tar.gz (--files) was made from commit {other}, but "
        "blocks/nccl_tests/releases.yaml records tag v2.18.3 at f727aa2a540fef911de9d7bfd8852bc5d2c69815"
    ) in result.stderr
    assert not offline_recipe.with_suffix(".lock.json").exists()


def test_without_the_folder_the_same_lock_cannot_hash_them(offline_recipe: Path) -> None:
    """The contrast: with no --files the downloads go to the network (a closed port here), and only GDRCopy's
    sha256, which Spack records (its row in gdrcopy's releases.yaml), is established: the folder is what made the
    difference."""
    result = run("lock", str(offline_recipe))
    assert result.exit_code == 0, result.output
    downloads = _downloads(offline_recipe)
    assert downloads[URLS["gdrcopy-2.5.1.tar.gz"]].sha256 == SUMS["gdrcopy-2.5.1.tar.gz"]
    for name in ("aws-ofi-nccl-1.21.1.tar.gz", "nccl-tests-2.18.3.tar.gz"):
        assert downloads[URLS[name]].sha256 is None
        assert downloads[URLS[name]].origin.startswith("unestablished: ")
    assert "not pinned by content" in result.output
    # nor read the plugin's release notes: the shipped data's tested versions, said so, and none recorded
    assert (
        "aws_ofi_nccl 1.21.1: tested versions from the shipped data (blocks/aws_ofi_nccl/releases.yaml): its "
        "archive was not read: download https://github.com/aws/aws-ofi-nccl/archive/refs/tags/v1.21.1.tar.gz: "
    ) in result.stdout
    pins = json.loads(offline_recipe.with_suffix(".lock.json").read_text())["pins"]
    assert "notes" not in pins["aws_ofi_nccl"]["details"] and pins["aws_ofi_nccl"]["details"]["tested_nccl"] == "2.31.2"
    assert "commit" not in pins["nccl_tests"]["details"]  # the tag's commit was not read either


def test_a_file_that_disagrees_with_the_well_known_checksum_is_not_trusted(
    offline_recipe: Path, tmp_path: Path
) -> None:
    """GDRCopy 2.5.1's sha256 is Spack's (its release row): a local file with other bytes is recorded as
    unestablished with both hashes, exactly as a download with other bytes would be."""
    folder = tmp_path / "mirror"
    shutil.copytree(SOURCES, folder)
    other = folder / "gdrcopy-2.5.1.tar.gz"
    other.chmod(0o644)
    other.write_bytes(other.read_bytes() + b"\0")
    result = run("lock", str(offline_recipe), "--files", str(folder))
    assert result.exit_code == 0, result.output
    d = _downloads(offline_recipe)[URLS["gdrcopy-2.5.1.tar.gz"]]
    assert d.sha256 is None
    assert sha256_file(other) in d.origin and SUMS["gdrcopy-2.5.1.tar.gz"] in d.origin and "spack" in d.origin


def test_a_files_option_that_is_no_folder_is_a_usage_error(offline_recipe: Path, tmp_path: Path) -> None:
    for bad in (tmp_path / "missing", SOURCES / "SHA256SUMS", Path("/dev/null")):
        result = run("lock", str(offline_recipe), "--files", str(bad))
        assert result.exit_code == UsageError.exit_code, result.output
        assert "--files" in result.output


@pytest.fixture
def locked(offline_recipe: Path) -> Path:
    result = run("lock", str(offline_recipe), "--files", str(SOURCES))
    assert result.exit_code == 0, result.output
    return offline_recipe


def test_render_copies_the_folders_files_from_the_context(locked: Path, tmp_path: Path) -> None:
    plain = run("render", str(locked))
    assert plain.exit_code == 0, plain.output
    out = tmp_path / "context"
    result = run("render", str(locked), "-o", str(out), "--files", str(SOURCES))
    assert result.exit_code == 0, result.output
    dockerfile = (out / "Dockerfile").read_text()
    for name, url in URLS.items():
        assert f"curl -fsSL -o /tmp/{name} {url}" in plain.stdout  # without --files: as before
        assert url not in dockerfile
        assert f"cp {SOURCES_DIR}/files/{name} /tmp/{name} \\\n" in dockerfile
        assert f'!= "{SUMS[name]}" ]; then echo "imgbuild: {name}: sha256 expected {SUMS[name]}' in dockerfile
        assert sha256_file(out / SOURCES_CONTEXT / "files" / name) == SUMS[name]  # in the context
    # the RUNs that download mount the context's folder, as an offline build's do; nothing else changes
    assert f"    {SOURCES_MOUNT} \\\n    cp {SOURCES_DIR}/files/gdrcopy-2.5.1.tar.gz" in dockerfile
    strip = [line for line in dockerfile.splitlines() if SOURCES_MOUNT not in line]
    assert len(strip) == len(plain.stdout.splitlines())


def test_a_folder_with_some_of_the_files_copies_those_and_downloads_the_rest(locked: Path, tmp_path: Path) -> None:
    folder = tmp_path / "some"
    folder.mkdir()
    shutil.copy(SOURCES / "nccl-tests-2.18.3.tar.gz", folder)
    result = run("render", str(locked), "--files", str(folder))
    assert result.exit_code == 0, result.output
    assert f"cp {SOURCES_DIR}/files/nccl-tests-2.18.3.tar.gz /tmp/nccl-tests-2.18.3.tar.gz" in result.stdout
    assert f"curl -fsSL -o /tmp/gdrcopy-2.5.1.tar.gz {URLS['gdrcopy-2.5.1.tar.gz']}" in result.stdout
    assert f"curl -fsSL -o /tmp/aws-ofi-nccl-1.21.1.tar.gz {URLS['aws-ofi-nccl-1.21.1.tar.gz']}" in result.stdout


def test_build_refuses_a_file_that_is_not_the_locks_before_building(
    locked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before the engine is asked for anything (DOCKER_HOST is a socket nobody listens on: reaching it would
    be exit 8), naming the file, the URL and both hashes; no context folder or build log is left behind."""
    folder = tmp_path / "mirror"
    shutil.copytree(SOURCES, folder)
    tampered = folder / "aws-ofi-nccl-1.21.1.tar.gz"
    tampered.chmod(0o644)
    tampered.write_bytes(tampered.read_bytes()[:-1] + b"\1")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("IMGBUILD_STATE_DIR", str(tmp_path / "state"))
    result = run("build", str(locked), "--files", str(folder))
    assert result.exit_code == ContentError.exit_code, result.output
    found = sha256_file(tampered)
    text = " ".join(result.output.split())
    assert f"aws-ofi-nccl-1.21.1.tar.gz: sha256 expected {SUMS['aws-ofi-nccl-1.21.1.tar.gz']}" in text
    assert URLS["aws-ofi-nccl-1.21.1.tar.gz"] in text and f"found {found}" in text
    assert list(temp.iterdir()) == []
    assert list((tmp_path / "state").rglob("*.log")) == []
    # render checks the same way
    rendered = run("render", str(locked), "--files", str(folder))
    assert rendered.exit_code == ContentError.exit_code, rendered.output


def test_links_in_the_folder_stay_in_it_and_their_bytes_are_copied(locked: Path, tmp_path: Path) -> None:
    """A link in the folder to a file in the folder is that file: its bytes are checked, and copied into the build
    context as a file (a link there would make the build copy whatever it names inside the container). A link that
    leads out of the folder (to the right archive elsewhere, or to /etc/shadow) is refused, by render and by lock,
    before anything reads it."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    (folder / "store").mkdir()
    shutil.copy(SOURCES / "gdrcopy-2.5.1.tar.gz", folder / "store" / "gdrcopy.tgz")
    (folder / "gdrcopy-2.5.1.tar.gz").symlink_to("store/gdrcopy.tgz")
    out = tmp_path / "context"
    result = run("render", str(locked), "-o", str(out), "--files", str(folder))
    assert result.exit_code == 0, result.output
    staged = out / SOURCES_CONTEXT / "files" / "gdrcopy-2.5.1.tar.gz"
    assert not staged.is_symlink() and sha256_file(staged) == SUMS["gdrcopy-2.5.1.tar.gz"]

    for target in (SOURCES / "nccl-tests-2.18.3.tar.gz", Path("/etc/shadow")):
        outside = tmp_path / f"out-{target.name}"
        outside.mkdir()
        (outside / "nccl-tests-2.18.3.tar.gz").symlink_to(target)
        for args in (["render", str(locked)], ["lock", str(locked)]):
            result = run(*args, "--files", str(outside))
            assert result.exit_code == ContentError.exit_code, result.output
            text = " ".join(result.output.split())
            assert f"nccl-tests-2.18.3.tar.gz (for {URLS['nccl-tests-2.18.3.tar.gz']})" in text
            assert f"resolves to {target}, outside {outside}" in text


def test_a_sparse_terabyte_is_refused_before_it_is_hashed(locked: Path, tmp_path: Path) -> None:
    """A 1 TiB sparse file under an archive's name: its size is looked at first, and it is refused unread (hashing
    it took 70 minutes)."""
    folder = tmp_path / "sparse"
    folder.mkdir()
    with (folder / "gdrcopy-2.5.1.tar.gz").open("wb") as f:
        f.truncate(1 << 40)
    for args in (["render", str(locked)], ["lock", str(locked)]):
        # a process of its own, ended if it reads the file after all (as it did: a hang, not a failure, in-process)
        ran = subprocess.run([sys.executable, "-m", "imgbuild", *args, "--files", str(folder)], capture_output=True,
                             text=True, timeout=300, check=False)  # fmt: skip
        assert ran.returncode == ContentError.exit_code, ran.stderr
        text = " ".join(ran.stderr.split())
        assert "gdrcopy-2.5.1.tar.gz" in text and "1024 GiB, over the 2 GiB a download may be" in text


def test_a_name_in_the_folder_that_is_not_a_file_is_refused(locked: Path, tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    (folder / "gdrcopy-2.5.1.tar.gz").mkdir(parents=True)
    result = run("render", str(locked), "--files", str(folder))
    assert result.exit_code == ContentError.exit_code, result.output
    assert "gdrcopy-2.5.1.tar.gz" in result.output and "is a folder" in result.output


@pytest.mark.docker
def test_a_build_takes_the_file_from_the_context_with_no_network(docker_client, tmp_path: Path) -> None:
    """The download step as `--files` renders it, built by the project's builder with `--network none`: the file
    comes from the context's SOURCES_CONTEXT/files/ (bind-mounted, as in offline builds) and is checked; a file
    with other bytes fails the RUN naming both hashes."""
    url = "https://example.invalid/releases/x-1.0.tar.gz"
    good = _tarball("hello\n")
    sha = hashlib.sha256(good).hexdigest()
    build = build_module(local_files=frozenset({"x-1.0.tar.gz"}))
    fragment = str(build.download(url, Download(url=url, sha256=sha, origin="test")))
    assert "curl" not in fragment
    (tmp_path / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\n"
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
        "ARG NONCE\n"
        f"RUN {SOURCES_MOUNT} \\\n    {fragment} \\\n && cat /tmp/x-1.0/hello.txt\n"
    )
    files = tmp_path / SOURCES_CONTEXT / "files"
    files.mkdir(parents=True)
    tag = f"imgbuild-test/files:{uuid.uuid4().hex[:12]}"
    try:
        (files / "x-1.0.tar.gz").write_bytes(good)
        ok = _build(tmp_path, tag, uuid.uuid4().hex, network="none")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        tampered = _tarball("other\n")
        (files / "x-1.0.tar.gz").write_bytes(tampered)
        bad = _build(tmp_path, tag, uuid.uuid4().hex, network="none")
        assert bad.returncode != 0
        found = hashlib.sha256(tampered).hexdigest()
        assert f"imgbuild: x-1.0.tar.gz: sha256 expected {sha}, found {found}" in bad.stdout + bad.stderr
    finally:
        import docker.errors

        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(tag, force=True)
