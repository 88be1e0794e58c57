"""Every download goes through `_build.j2`'s `download` and is checked against the lock's sha256: the fragment's text
(checked, unchecked with the reason, from a sources folder), every downloading block's Dockerfile with a Content,
and a real BuildKit build of the fragment against a local HTTP server (the right tarball passes, a tampered one
fails naming the file and both hashes)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from conftest import REPO, hadolint
from imgbuild import recipe
from imgbuild.blocks import REGISTRY, Downloads, context_for
from imgbuild.core.errors import LockError
from imgbuild.image import render
from imgbuild.pin import record
from imgbuild.pin.content import Content, Download, Requirement, download_name
from imgbuild.pin.resolver import Resolved, resolve
from test_checksums import Server

TEST_RECIPES = REPO / "tests" / "recipes"
URL = "https://example.org/releases/x-1.0.tar.bz2"
SHA = "ab" * 32


def build_module(sources_dir: str | None = None, local_files: frozenset[str] = frozenset()):
    """`_build.j2`'s macros, from an environment of their own (the shared one is cached: never changed here)."""
    env = render.environment.__wrapped__(local_files=local_files)
    env.globals["sources_dir"] = sources_dir
    return env.get_template("blocks/_build.j2").module


@pytest.mark.parametrize(
    ("url", "name"),
    [
        # GitHub's archive of a tag: named as its Content-Disposition names it (and ../shared/data/sources its files)
        ("https://github.com/NVIDIA/nccl-tests/archive/refs/tags/v2.18.3.tar.gz", "nccl-tests-2.18.3.tar.gz"),
        ("https://github.com/aws/aws-ofi-nccl/archive/refs/tags/v1.21.1.tar.gz", "aws-ofi-nccl-1.21.1.tar.gz"),
        ("https://github.com/NVIDIA/nccl/archive/refs/tags/v2.27.5-1.tar.gz", "nccl-2.27.5-1.tar.gz"),
        ("https://github.com/NVIDIA/gdrcopy/archive/v2.5.1.tar.gz", "gdrcopy-2.5.1.tar.gz"),  # Spack's form
        ("https://github.com/o/r/archive/refs/tags/2.0.zip", "r-2.0.zip"),  # no `v`: nothing dropped
        ("https://github.com/o/r/archive/refs/tags/version-2.tar.gz", "r-version-2.tar.gz"),
        # anything else: its last path part
        ("https://github.com/aws/aws-ofi-nccl/releases/download/v1.21.1/aws-ofi-nccl-1.21.1.tar.gz",
         "aws-ofi-nccl-1.21.1.tar.gz"),
        ("https://download.open-mpi.org/release/open-mpi/v4.1/openmpi-4.1.6.tar.bz2", "openmpi-4.1.6.tar.bz2"),
        ("https://efa-installer.amazonaws.com/aws-efa-installer.key", "aws-efa-installer.key"),
        ("https://github.com/o/r/archive/main.tar.gz.sig", "main.tar.gz.sig"),
    ],
)  # fmt: skip
def test_one_rule_names_every_download(url: str, name: str) -> None:
    assert download_name(url) == name
    assert Download(url=url, sha256=None, origin="o").filename == name


def test_a_tag_archive_is_saved_under_its_github_name() -> None:
    url = "https://github.com/NVIDIA/gdrcopy/archive/refs/tags/v2.5.1.tar.gz"
    text = str(build_module().download(url, Download(url=url, sha256=SHA, origin="o")))
    assert text.startswith(f"curl -fsSL -o /tmp/gdrcopy-2.5.1.tar.gz {url} \\\n")
    assert "tar -xzf /tmp/gdrcopy-2.5.1.tar.gz -C /tmp" in text


def test_a_download_the_files_folder_holds_is_copied_the_others_fetched() -> None:
    build = build_module(local_files=frozenset({"x-1.0.tar.bz2"}))
    text = str(build.download(URL, Download(url=URL, sha256=SHA, origin="o")))
    assert text.startswith("cp /imgbuild-sources/files/x-1.0.tar.bz2 /tmp/x-1.0.tar.bz2 \\\n")
    assert "curl" not in text and f'!= "{SHA}"' in text  # still checked in the RUN
    other = "https://example.org/releases/y-2.0.tar.gz"
    text = str(build.download(other, Download(url=other, sha256=SHA, origin="o")))
    assert text.startswith(f"curl -fsSL -o /tmp/y-2.0.tar.gz {other}")


def test_a_recorded_sha256_is_checked_before_unpacking() -> None:
    text = str(build_module().download(URL, Download(url=URL, sha256=SHA, origin="spack: x")))
    assert text == (
        f"curl -fsSL -o /tmp/x-1.0.tar.bz2 {URL} \\\n"
        " && found=\"$(sha256sum /tmp/x-1.0.tar.bz2 | cut -d ' ' -f 1)\" \\\n"
        f' && if [ "${{found}}" != "{SHA}" ]; then echo "imgbuild: x-1.0.tar.bz2: sha256 expected {SHA}, found '
        '${found}" >&2; exit 1; fi \\\n'
        " && tar -xjf /tmp/x-1.0.tar.bz2 -C /tmp \\\n"
        " && rm /tmp/x-1.0.tar.bz2"
    )


def test_an_unchecked_download_says_so_and_why() -> None:
    build = build_module()
    why = "unestablished: Spack lists no such version"
    text = str(build.download(URL, Download(url=URL, sha256=None, origin=why), unpack=False))
    assert text == (
        f"curl -fsSL -o /tmp/x-1.0.tar.bz2 {URL} \\\n"
        f"# imgbuild: x-1.0.tar.bz2 is not checked by sha256: {why}\n"
        ' && echo "imgbuild: x-1.0.tar.bz2 is not checked by sha256" >&2'
    )
    text = str(build.download(URL, None))  # rendered without a lock's content
    assert "# imgbuild: x-1.0.tar.bz2 is not checked by sha256: rendered without a lock's content" in text
    assert "sha256sum" not in text


def test_a_sources_folder_replaces_the_network_and_is_still_checked() -> None:
    text = str(build_module("/imgbuild-sources").download(URL, Download(url=URL, sha256=SHA, origin="o")))
    assert text.startswith("cp /imgbuild-sources/files/x-1.0.tar.bz2 /tmp/x-1.0.tar.bz2 \\\n")
    assert "curl" not in text and f'!= "{SHA}"' in text


def test_more_checks_run_on_the_saved_file_before_it_is_unpacked() -> None:
    text = str(build_module().download(URL, Download(url=URL, sha256=SHA, origin="o"), checks=["gpg --verify x"]))
    assert text.index("sha256sum") < text.index("gpg --verify x") < text.index("tar -xjf")


def _with_content(resolved: Resolved) -> tuple[Resolved, dict[str, str]]:
    """`resolved` with a Content that records a distinct sha256 for every URL its blocks download."""
    urls = record.downloads(resolved)
    shas = {url: hashlib.sha256(url.encode()).hexdigest() for url in urls}
    # the requirement sets a lock records too (one stand-in distribution each: these tests are about downloads)
    stand_in = (Requirement(name="stand-in", version="1", hashes=("sha256:" + "0" * 64,)),)
    content = Content(
        downloads={url: Download(url=url, sha256=sha, origin="test") for url, sha in shas.items()},
        python={name: stand_in for name in record.requirement_sets(resolved)},
    )
    return resolved.model_copy(update={"content": content}), shas


# Between them these recipes use every block that downloads (the shipped a100 via ofi-release: efa, gdrcopy,
# nccl_tests, aws_ofi_nccl release; modes: openmpi source; nccl-build: nccl build).
RECIPES = ["ofi-release", "modes", "nccl-build"]


@pytest.mark.parametrize("name", RECIPES)
def test_every_download_of_a_locked_recipe_is_checked(name: str) -> None:
    resolved, shas = _with_content(resolve(recipe.load(TEST_RECIPES / f"{name}.yaml"), lookup_torch=None))
    dockerfile = render.plan(resolved).dockerfile
    assert "is not checked by sha256" not in dockerfile
    for url, sha in shas.items():
        name_ = download_name(url)
        assert f"curl -fsSL -o /tmp/{name_} {url}" in dockerfile or f"/{name_} {url}" in dockerfile
        assert f'!= "{sha}" ]; then echo "imgbuild: {name_}: sha256 expected {sha}, found ${{found}}"' in dockerfile
    # The RUNs that download, linted on their own (other steps of the image are test_render's to lint).
    runs = [i for i in instructions(dockerfile) if i.startswith("RUN ") and ("curl -fsSL -o" in i)]
    assert runs
    text = 'FROM debian:bookworm-slim\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\n' + "\n".join(runs) + "\n"
    lint = subprocess.run([hadolint(), "--config", str(REPO / ".hadolint.yaml"), "--no-color", "-"],
                          input=text, capture_output=True, text=True)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + text


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, each with its continuation lines (comment lines inside one included)."""
    out: list[str] = []
    current: list[str] | None = None
    for line in dockerfile.splitlines():
        if current is None:
            if not line.strip() or line.startswith("#"):
                continue
            current = [line]
        else:
            current.append(line)
        if line.startswith("#") or line.endswith("\\"):
            continue
        out.append("\n".join(current))
        current = None
    return out


def test_every_downloading_block_is_covered() -> None:
    downloading = set()
    for name in RECIPES:
        resolved = resolve(recipe.load(TEST_RECIPES / f"{name}.yaml"), lookup_torch=None)
        ctx = context_for(resolved)
        downloading |= {
            b.name
            for b in REGISTRY
            if b.name in resolved.pins and isinstance(b, Downloads) and b.downloads(resolved.pins[b.name], ctx)
        }
    assert downloading == {"aws_ofi_nccl", "efa", "gdrcopy", "nccl", "nccl_tests", "openmpi"}


def test_the_efa_installer_keeps_its_signature_check_after_the_sha256() -> None:
    resolved, shas = _with_content(resolve(recipe.load(TEST_RECIPES / "ofi-release.yaml"), lookup_torch=None))
    dockerfile = render.plan(resolved).dockerfile
    tarball = "/opt/imgbuild-dist/aws-efa-installer-1.43.2.tar.gz"
    sha = shas["https://efa-installer.amazonaws.com/aws-efa-installer-1.43.2.tar.gz"]
    assert dockerfile.index(f'!= "{sha}"') < dockerfile.index(f"gpg --batch --verify {tarball}.sig {tarball}")
    assert dockerfile.index(f"gpg --batch --verify {tarball}.sig") < dockerfile.index(f"tar -xzf {tarball}")


def test_a_lock_without_a_downloads_checksum_is_refused() -> None:
    resolved = resolve(recipe.load(TEST_RECIPES / "modes.yaml"), lookup_torch=None)
    with pytest.raises(LockError, match=r"records no checksum for https://download\.open-mpi\.org/"):
        render.plan(resolved.model_copy(update={"content": Content()}))


# ------------------------------------------------------------------------------------------------------------
# A real build of the fragment


def _tarball(text: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = text.encode()
        info = tarfile.TarInfo("x-1.0/hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _build(context: Path, tag: str, nonce: str, network: str = "host") -> subprocess.CompletedProcess[str]:
    """The project's builder (BuildKit through the docker CLI) on `context`, with the host's network so that the
    build reaches the local server (or `network`: none)."""
    from imgbuild.build import builders

    builder = builders.select()
    argv = builders.command(
        builder, context, tags=[tag], labels={"io.imgbuild.test": "download"}, build_args={"NONCE": nonce},
        nocache=False, pull=False, secrets={}, cache=builders.cache_plan(builder), iidfile=context / "iid",
        metadata_file=None,
    )  # fmt: skip
    argv[-3:-3] = ["--network", network]
    return subprocess.run(argv, env=builders.cli_env(builder), capture_output=True, text=True, timeout=600)


@pytest.mark.docker
def test_a_build_checks_the_tarball_and_fails_on_a_tampered_one(docker_client, tmp_path: Path) -> None:
    good = _tarball("hello\n")
    sha = hashlib.sha256(good).hexdigest()
    server = Server()
    tag = f"imgbuild-test/download:{uuid.uuid4().hex[:12]}"
    try:
        url = server.url("/releases/x-1.0.tar.gz")
        fragment = str(build_module().download(url, Download(url=url, sha256=sha, origin="test")))
        (tmp_path / "Dockerfile").write_text(
            "FROM debian:bookworm-slim\n"
            'SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n'
            "RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*\n"
            "ARG NONCE\n"  # a new value each build: the download step never comes from the cache
            f"RUN {fragment} \\\n && cat /tmp/x-1.0/hello.txt\n"
        )
        server.files["/releases/x-1.0.tar.gz"] = good
        ok = _build(tmp_path, tag, uuid.uuid4().hex)
        assert ok.returncode == 0, ok.stdout + ok.stderr

        tampered = _tarball("hello, tampered\n")
        server.files["/releases/x-1.0.tar.gz"] = tampered
        bad = _build(tmp_path, tag, uuid.uuid4().hex)
        out = bad.stdout + bad.stderr
        assert bad.returncode != 0
        found = hashlib.sha256(tampered).hexdigest()
        assert f"imgbuild: x-1.0.tar.gz: sha256 expected {sha}, found {found}" in out, out[-3000:]
    finally:
        server.close()
        import docker.errors

        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(tag, force=True)
