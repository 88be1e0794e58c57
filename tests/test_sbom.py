"""`imgbuild sbom`: the CycloneDX document from what an image reports (its dpkg list, the .debs' checksums its
apt-get step recorded, its interpreters' distributions) and the lock; the OCI labels render writes from the lock
and the recipe's provenance; then (Docker) the SBOM of the real cpu image, schema-checked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from imgbuild import probes
from imgbuild.core import paths
from imgbuild.core.errors import VerifyError
from imgbuild.image import identity, provenance, render
from imgbuild.image import sbom as doc
from imgbuild.pin.content import Content, Download, ImageDigest, Requirement
from imgbuild.pin.resolver import Resolved, resolve
from imgbuild.publish import inventory as contents
from imgbuild.recipe import load

NCCL_X86 = "sha256:" + "1" * 64
NCCL_ARM = "sha256:" + "2" * 64
OPENMPI_BIN = "5" * 64
BASE_DIGEST = "sha256:" + "d" * 64

# What the cpu image's container answers, as it answers it (dpkg-query's format, the tsv of the apt-get step,
# the inventory script's JSON lines).
DPKG = (
    "adduser\t3.134\tall\n"
    "libc6\t2.36-9+deb12u14\tamd64\n"
    "libopenmpi3\t4.1.4-3+b1\tamd64\n"
    "openmpi-bin\t4.1.4-3+b1\tamd64\n"
    "openmpi-common\t4.1.4-3\tall\n"
    "python3-mpi4py\t3.1.4-2\tamd64\n"
    "late-package\t1.0\tamd64\n"
    "removed-but-configured\t\t\n"
)
DPKG_SHA256 = (
    f"adduser\t3.134\tall\t{'a' * 64}\n"
    "libc6\t2.36-9+deb12u14\tamd64\t\n"  # the base's version, gone from apt's lists
    f"libopenmpi3\t4.1.4-3+b1\tamd64\t{'4' * 64}\n"
    f"openmpi-bin\t4.1.4-3+b1\tamd64\t{OPENMPI_BIN}\n"
    f"openmpi-common\t4.1.4-3\tall\t{'6' * 64}\n"
    f"python3-mpi4py\t3.1.4-2\tamd64\t{'7' * 64}\n"
)
VENV = "/opt/venv/lib/python3.11/site-packages"
DIST = "/usr/lib/python3/dist-packages"
PYTHON = (
    json.dumps({"interpreter": "/opt/venv/bin/python", "prefix": "/opt/venv", "distributions": [
        {"name": "nvidia-nccl-cu12", "version": "2.27.5", "location": VENV},
        {"name": "pip", "version": "23.0.1", "location": VENV},
        {"name": "mpi4py", "version": "3.1.4", "location": DIST},
    ]}) + "\n"
    + json.dumps({"interpreter": "/usr/bin/python3", "prefix": "/usr", "distributions": [
        {"name": "mpi4py", "version": "3.1.4", "location": DIST},
    ]}) + "\n"
)  # fmt: skip


def cpu_with_content(**content: Any) -> Resolved:
    """The cpu recipe freshly resolved (no network for it), with a lock's content and time."""
    resolved = resolve(load("cpu").concrete())
    base = {resolved.base_ref: ImageDigest(ref=resolved.base_ref, digest=BASE_DIGEST, origin="registry")}
    python = {
        "nccl": (Requirement(name="nvidia_nccl_cu12", version="2.27.5", hashes=(NCCL_X86, NCCL_ARM)),),
        "sagemaker": (Requirement(name="boto3", version="1.44.5", hashes=("sha256:" + "b" * 64,)),),
        "python/uv": (Requirement(name="uv", version="0.13.9", hashes=("sha256:" + "c" * 64,)),),  # not in the image
    }
    full = Content(**{"bases": base, "python": python, **content})
    return resolved.model_copy(update={"content": full, "locked_at": "2025-06-01T12:00:00Z"})


def inventory(resolved: Resolved, *, dpkg_sha256: str | None = DPKG_SHA256, **over: Any) -> doc.Inventory:
    return doc.Inventory(
        **{
            "image": "imgbuild/cpu:lock-0123456789ab",
            "image_id": "sha256:" + "e" * 64,
            "manifest": render.manifest(resolved, identity.of(resolved)),
            "dpkg": DPKG,
            "dpkg_sha256": dpkg_sha256,
            "python": PYTHON,
            **over,
        }
    )


def by_ref(text: str) -> dict[str, dict[str, Any]]:
    data = json.loads(text)
    out = {}
    stack = list(data["components"])
    while stack:
        c = stack.pop()
        out[c["bom-ref"]] = c
        stack += c.get("components", [])
    return out


def hashes(component: dict[str, Any]) -> list[str]:
    return [h["content"] for h in component.get("hashes", []) if h["alg"] == "SHA-256"]


def props(component: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in component.get("properties", [])}


# ------------------------------------------------------------------------------------------------------------
# the document


def test_document_lists_pins_packages_and_distributions_with_hashes() -> None:
    resolved = cpu_with_content()
    text = doc.document(inventory(resolved), resolved)
    doc.validate(text)
    refs = by_ref(text)
    data = json.loads(text)
    assert data["bomFormat"] == "CycloneDX" and data["specVersion"] == "1.6"

    # NCCL: the pin, and the wheel the image holds with the lock's hashes (both files of that version)
    nccl = refs[f"pypi:nvidia-nccl-cu12@2.27.5:{VENV}"]
    assert nccl["purl"] == "pkg:pypi/nvidia-nccl-cu12@2.27.5"
    assert hashes(nccl) == [NCCL_X86[7:], NCCL_ARM[7:]]
    assert "the installed one is among them" in props(nccl)["imgbuild:hashes"]
    assert refs["pin:nccl"]["version"] == "2.27.5"
    deps = {d["ref"]: d.get("dependsOn", []) for d in data["dependencies"]}
    assert deps["pin:nccl"] == [nccl["bom-ref"]]

    # Open MPI: the distribution's packages, with apt's SHA256 of that version
    ompi = refs["deb:openmpi-bin:amd64@4.1.4-3+b1"]
    assert ompi["version"] == "4.1.4-3+b1" and hashes(ompi) == [OPENMPI_BIN]
    assert ompi["purl"] == "pkg:deb/debian/openmpi-bin@4.1.4-3%2Bb1?arch=amd64&distro=debian-12"
    assert refs["pin:openmpi"]["version"] == "4.1.4"
    assert set(deps["pin:openmpi"]) == {
        "deb:openmpi-bin:amd64@4.1.4-3+b1", "deb:libopenmpi3:amd64@4.1.4-3+b1", "deb:openmpi-common:all@4.1.4-3"
    }  # fmt: skip

    # honest gaps: the base's libc6 (no such version in apt's lists), a later layer's package, pip (not locked)
    assert hashes(refs["deb:libc6:amd64@2.36-9+deb12u14"]) == []
    assert "came with the base image" in props(refs["deb:libc6:amd64@2.36-9+deb12u14"])["imgbuild:sha256"]
    assert "after the runtime stage's apt-get" in props(refs["deb:late-package:amd64@1.0"])["imgbuild:sha256"]
    assert not any(r.startswith("deb:removed-but-configured") for r in refs)
    pip = refs[f"pypi:pip@23.0.1:{VENV}"]
    assert hashes(pip) == [] and props(pip)["imgbuild:hashes"].startswith("none")

    # one component per site folder, with every interpreter that sees it
    mpi4py = refs[f"pypi:mpi4py@3.1.4:{DIST}"]
    assert props(mpi4py)["imgbuild:python-interpreters"] == "/opt/venv/bin/python /usr/bin/python3"

    # the base with its digest, the image with its id and lock
    assert hashes(refs["base:debian:bookworm-slim"]) == [BASE_DIGEST[7:]]
    image = data["metadata"]["component"]
    assert image["type"] == "container" and image["name"] == "imgbuild/cpu" and image["version"] == "lock-0123456789ab"
    assert props(image)["imgbuild:image-id"] == "sha256:" + "e" * 64
    assert props(image)["imgbuild:lock-digest"] == identity.lock_digest(resolved)
    assert "purl" not in image  # not pushed: no manifest digest to name it by


def test_downloads_nest_under_their_block_with_the_locks_checksum() -> None:
    resolved = cpu_with_content()
    urls = doc._downloads_by_block(resolved)
    extra = "https://example.org/files/unattributed-1.0.tar.gz"
    downloads = {extra: Download(url=extra, sha256=None, origin="unestablished: offline")}
    for block_urls in urls.values():
        for url in block_urls:
            downloads[url] = Download(url=url, sha256="9" * 64, origin="publisher")
    resolved = cpu_with_content(downloads=downloads)
    text = doc.document(inventory(resolved), resolved)
    doc.validate(text)
    refs = by_ref(text)
    loose = refs[f"download:{extra}"]
    assert hashes(loose) == [] and props(loose)["imgbuild:sha256-origin"] == "unestablished: offline"
    assert loose["externalReferences"] == [{"type": "distribution", "url": extra}]
    for block, block_urls in urls.items():
        nested = {c["bom-ref"] for c in refs[f"pin:{block}"].get("components", [])}
        assert nested == {f"download:{u}" for u in block_urls}
        assert all(hashes(refs[f"download:{u}"]) == ["9" * 64] for u in block_urls)


def test_pushed_image_is_named_by_its_manifest_digest() -> None:
    resolved = cpu_with_content()
    digest = "sha256:" + "f" * 64
    inv = inventory(resolved, repo_digests=(f"127.0.0.1:5000/team/imgbuild/cpu@{digest}",))
    text = doc.document(inv, resolved)
    doc.validate(text)
    image = json.loads(text)["metadata"]["component"]
    assert image["purl"] == f"pkg:oci/cpu@{digest}?repository_url=127.0.0.1:5000/team/imgbuild/cpu"
    assert props(image)["imgbuild:repo-digest-0"] == f"127.0.0.1:5000/team/imgbuild/cpu@{digest}"


@pytest.mark.parametrize(
    ("image", "name", "version"),
    [
        ("host:5000/repo", "host:5000/repo", None),
        ("host:5000/team/repo:lock-0123", "host:5000/team/repo", "lock-0123"),
        ("localhost/x", "localhost/x", None),
        ("imgbuild/cpu:lock-0123456789ab", "imgbuild/cpu", "lock-0123456789ab"),
    ],
)
def test_image_component_is_named_by_the_one_reference_parser(image: str, name: str, version: str | None) -> None:
    # an untagged host:5000/repo was named "host" (the port read as a tag)
    resolved = cpu_with_content()
    text = doc.document(inventory(resolved, image=image), resolved)
    component = json.loads(text)["metadata"]["component"]
    assert component["name"] == name
    assert component.get("version") == version


def test_a_docker_hub_repo_digest_names_docker_io() -> None:
    resolved = cpu_with_content()
    digest = "sha256:" + "f" * 64
    text = doc.document(inventory(resolved, repo_digests=(f"team/cpu@{digest}",)), resolved)
    assert json.loads(text)["metadata"]["component"]["purl"] == (
        f"pkg:oci/cpu@{digest}?repository_url=docker.io/team/cpu"
    )


def test_image_without_the_checksum_file_or_a_lock_says_so() -> None:
    resolved = cpu_with_content()
    text = doc.document(inventory(resolved, dpkg_sha256=None), resolved)
    ompi = by_ref(text)["deb:openmpi-bin:amd64@4.1.4-3+b1"]
    assert hashes(ompi) == [] and "no record of apt's checksums" in props(ompi)["imgbuild:sha256"]
    bare = resolve(load("cpu").concrete())  # no lock: versions, no hashes
    text = doc.document(inventory(bare), bare)
    doc.validate(text)
    assert hashes(by_ref(text)[f"pypi:nvidia-nccl-cu12@2.27.5:{VENV}"]) == []


def test_the_schema_check_refuses_a_broken_document() -> None:
    resolved = cpu_with_content()
    data = json.loads(doc.document(inventory(resolved), resolved))
    data["components"][0]["hashes"] = [{"alg": "SHA-256", "content": "not hex"}]
    with pytest.raises(VerifyError, match="CycloneDX"):
        doc.validate(json.dumps(data))


class _NoEngine:
    """A client the inventory is never asked through (collect is replaced): closed at the end."""

    def close(self) -> None:
        pass


def _collect_answers(monkeypatch: pytest.MonkeyPatch, resolved: Resolved) -> list[str]:
    """`inventory.collect` answering as the image of `resolved` would (its manifest, the cpu image's lists), with no
    engine; the references it was asked about."""
    answer = inventory(resolved)
    asked: list[str] = []

    def collect(client: Any, image: str, *, repo_digests: tuple[str, ...] = ()) -> doc.Inventory:
        asked.append(image)
        return doc.Inventory(**{**answer.__dict__, "image": image, "repo_digests": repo_digests})

    monkeypatch.setattr(contents, "collect", collect)
    monkeypatch.setattr(contents, "connect", _NoEngine)
    return asked


def test_the_sbom_after_a_push_names_the_image_by_the_identity_the_push_read(
    identity_reads: dict[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`push --sbom` hands the SBOM the Identity it pushed by: the document is made for that reference and checked
    against that lock digest, and neither is read again (no lock digest, no code digest)."""
    from types import SimpleNamespace

    resolved = cpu_with_content()
    named = identity.of(resolved)
    asked = _collect_answers(monkeypatch, resolved)
    identity_reads.update(lock_digest=0, image_digests=0)  # what the command read before the push
    pushed = SimpleNamespace(
        refs=[SimpleNamespace(target="registry.test/team/cpu:lock-x", digest="sha256:" + "f" * 64)]
    )
    made = contents.after_push(resolved, named, pushed, tmp_path / "sbom.json")
    assert identity_reads == {"lock_digest": 0, "image_digests": 0}
    assert asked == [named.ref()] and made.image == named.ref()
    assert json.loads((tmp_path / "sbom.json").read_text())["bomFormat"] == "CycloneDX"


def test_the_sbom_command_reads_the_images_identity_once(
    identity_reads: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`imgbuild sbom cpu` reads the identity of the lock's image once (its reference, the lock digest the image's
    manifest must name), through the real command."""
    from imgbuild.cli import app
    from imgbuild.pin import lock

    resolved = lock.for_ref("cpu")[1]
    asked = _collect_answers(monkeypatch, resolved)
    identity_reads.update(lock_digest=0, image_digests=0)
    result = CliRunner().invoke(app, ["sbom", "cpu"])
    assert result.exit_code == 0, result.output
    assert identity_reads == {"lock_digest": 1, "image_digests": 1}
    assert asked == [identity.of(resolved).ref()]


def test_inventory_script_output_is_read_by_its_markers() -> None:
    script = contents.inventory_script(["/opt/venv/bin/python", "/usr/bin/python3", "/opt/venv/bin/python"])
    assert script.count("command -v") == 2 and paths.DPKG_SHA256 in script
    proc = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = (
        "### imgbuild-sbom dpkg\na\t1\tall\n### imgbuild-sbom dpkg-sha256\na\t1\tall\t\n### imgbuild-sbom python\n{}\n"
    )
    assert contents.sections(out) == {"dpkg": "a\t1\tall\n", "dpkg-sha256": "a\t1\tall\t\n", "python": "{}\n"}
    assert "dpkg-sha256" not in contents.sections("### imgbuild-sbom dpkg\n### imgbuild-sbom python\n")


def test_python_probe_runs_here() -> None:
    """The probe the image's interpreters run is plain Python: this interpreter's answer parses."""
    import sys

    proc = subprocess.run([sys.executable, "-c", probes.text("python_dists.py"), sys.executable],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dists = doc.parse_python(proc.stdout)
    assert any(d.name.lower() == "cyclonedx-python-lib" for d in dists)


# ------------------------------------------------------------------------------------------------------------
# labels


def test_labels_from_the_lock_and_provenance() -> None:
    resolved = cpu_with_content()
    plain = render.plan(resolved).labels
    assert plain["org.opencontainers.image.created"] == "2025-06-01T12:00:00Z"
    assert plain["org.opencontainers.image.base.name"] == "debian:bookworm-slim"
    assert plain["org.opencontainers.image.base.digest"] == BASE_DIGEST
    assert plain["io.imgbuild.lock-digest"] == identity.lock_digest(resolved)
    for absent in ("source", "revision", "licenses"):
        assert f"org.opencontainers.image.{absent}" not in plain  # unknown: left out, never guessed
    licensed = resolved.model_copy(update={"recipe": resolved.recipe.model_copy(update={"license": "Apache-2.0"})})
    origin = render.Provenance(source="https://github.com/org/imgbuild", revision="c" * 40)
    labels = render.plan(licensed, origin).labels
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"] == "https://github.com/org/imgbuild"
    assert labels["org.opencontainers.image.revision"] == "c" * 40
    no_lock = render.plan(resolve(load("cpu").concrete())).labels
    assert "org.opencontainers.image.created" not in no_lock and "org.opencontainers.image.base.digest" not in no_lock


@pytest.mark.parametrize(
    ("remote", "url"),
    [
        ("git@github.com:org/imgbuild.git", "https://github.com/org/imgbuild"),
        ("https://x-access-token:s3cret@github.com/org/imgbuild.git", "https://github.com/org/imgbuild"),
        ("ssh://git@gitlab.example.com:2222/team/imgbuild", "https://gitlab.example.com/team/imgbuild"),
        ("https://git.example.com:8443/imgbuild/", "https://git.example.com:8443/imgbuild"),
        ("/srv/git/imgbuild.git", None),
        ("file:///srv/git/imgbuild.git", None),
        ("", None),
    ],
)
def test_remote_urls_are_public_and_without_credentials(remote: str, url: str | None) -> None:
    assert provenance.public_url(remote) == url


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def test_revision_is_the_last_commit_of_the_recipe_and_none_when_changed(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "remote", "add", "origin", "git@github.com:org/recipes.git")
    (tmp_path / "mine.yaml").write_text("extends: cpu\ndescription: mine\n")
    git(tmp_path, "add", "mine.yaml")
    git(tmp_path, "commit", "-q", "-m", "recipe")
    first = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "other.txt").write_text("unrelated\n")
    git(tmp_path, "add", "other.txt")
    git(tmp_path, "commit", "-q", "-m", "unrelated")
    loaded = load(str(tmp_path / "mine.yaml"))
    origin = provenance.of(loaded)
    # the revision that changed the recipe, not HEAD: an unrelated commit keeps the image's labels (and id)
    assert origin.revision == first
    assert origin.source == "https://github.com/org/recipes"
    (tmp_path / "mine.yaml").write_text("extends: cpu\ndescription: changed\n")
    assert provenance.of(load(str(tmp_path / "mine.yaml"))).revision is None


def test_no_git_no_revision(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("extends: cpu\n")
    origin = provenance.of(load(str(tmp_path / "mine.yaml")))
    assert origin.revision is None and origin.source == provenance.project_url()


# ------------------------------------------------------------------------------------------------------------
# the real cpu image


@pytest.mark.docker
def test_sbom_of_the_cpu_image(cpu_image: Any, docker_client: Any, tmp_path: Path) -> None:
    from imgbuild.cli import app
    from imgbuild.pin import lock

    _, resolved = lock.for_ref("cpu")
    out = tmp_path / "cpu.cdx.json"
    result = CliRunner().invoke(app, ["sbom", "cpu", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    doc.validate(text)
    data = json.loads(text)
    assert props(data["metadata"]["component"])["imgbuild:image-id"] == cpu_image.image_id

    nccl = doc.components_named(text, "nvidia-nccl-cu12")
    assert [c["version"] for c in nccl] == ["2.27.5"]
    locked = {h.removeprefix("sha256:") for r in resolved.content.python["nccl"] for h in r.hashes}
    assert hashes(nccl[0]) and set(hashes(nccl[0])) <= locked

    ompi = doc.components_named(text, "openmpi-bin")
    assert len(ompi) == 1 and ompi[0]["version"].startswith("4.1.4")
    assert len(hashes(ompi[0])) == 1 and len(hashes(ompi[0])[0]) == 64
    assert any(d["ref"] == "pin:openmpi" and ompi[0]["bom-ref"] in d["dependsOn"] for d in data["dependencies"])
    # no container left behind
    assert not docker_client.containers.list(all=True, filters={"label": "io.imgbuild.verify"})
