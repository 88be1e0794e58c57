"""Multi-architecture images: the cpu recipe built for linux/arm64 under QEMU, verified by running it through the
product's verify path (uname -m, sshd, ncclGetVersion of the aarch64 NCCL wheel, an MPI run of 2 ranks across
containers), and published with the amd64 image as one OCI image index in Debian's docker-registry: a pull with
`--platform linux/arm64` gets the arm64 image, a plain pull the amd64 one.

Unit tests (no engine): the index document, the per-architecture push and an index that cannot be put, the arm64
base's image config and the emulation check, the machine check, and the CLI's errors for --platform.

The docker tests need qemu-aarch64 in binfmt_misc (scripts/setup.sh enables it) and the arm64 base
`debian:bookworm-slim-arm64`, which the first test that needs it bootstraps through `imgbuild base bootstrap
debian:bookworm-slim --platform linux/arm64` when the engine lacks it (about 2.5 min under QEMU; the main job never
pays for it): without QEMU, or when that bootstrap fails, they FAIL, never skip.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests
import responses
from typer.testing import CliRunner

from imgbuild import publish
from imgbuild.checks import CheckContext, machine_matches, manifest_diffs
from imgbuild.cli import app
from imgbuild.core import platforms
from imgbuild.core.errors import PushError
from imgbuild.engine import rootfs
from imgbuild.publish.registry import OCI_INDEX, RegistryAPI, RemoteManifest, TransientError, parse_registry
from test_publish import (
    DIGEST,
    FakeAPI,
    FakeClient,
    LocalRegistry,
    Sleeps,
    error_stream,
    flat,
    local_tags,
    ok_stream,
)

DOCKER = "/usr/bin/docker"  # Debian's CLI, as the builders use it
AMD64_ID = "sha256:" + "1" * 64
ARM64_ID = "sha256:" + "2" * 64
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"


# ---------------------------------------------------------------------------------------------------------------
# the index document


def entry(arch: str, digit: str, size: int = 1000) -> publish.IndexEntry:
    return publish.IndexEntry(arch, "sha256:" + digit * 64, DOCKER_V2, size)


def test_index_document_names_each_platform_and_is_stable() -> None:
    body = publish.index_document([entry("amd64", "a"), entry("arm64", "b", 1200)])
    doc = json.loads(body)
    assert doc["schemaVersion"] == 2 and doc["mediaType"] == OCI_INDEX
    assert [m["platform"] for m in doc["manifests"]] == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux"},
    ]
    assert [(m["digest"][-3:], m["size"], m["mediaType"]) for m in doc["manifests"]] == [
        ("aaa", 1000, DOCKER_V2),
        ("bbb", 1200, DOCKER_V2),
    ]
    # the same manifests give the same bytes (an immutable tag's "already published" compares the digest)
    assert publish.index_document([entry("amd64", "a"), entry("arm64", "b", 1200)]) == body
    assert b" " not in body and body == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def test_index_document_refuses_nothing_and_an_architecture_twice() -> None:
    with pytest.raises(PushError, match="at least one"):
        publish.index_document([])
    with pytest.raises(PushError, match=r"named twice.*amd64, amd64"):
        publish.index_document([entry("amd64", "a"), entry("amd64", "b")])


# ---------------------------------------------------------------------------------------------------------------
# publishing the index (a scripted engine and registry)


class IndexRegistry:
    """A registry API that holds what the publisher pushed (by digest) and records index PUTs; `refuse` makes every
    PUT fail as a registry refusing the document would."""

    def __init__(self, *, refuse: bool = False, existing: RemoteManifest | None = None) -> None:
        self.refuse = refuse
        self.existing = existing  # what the plain tags hold already (the per-architecture ones hold nothing)
        self.puts: list[tuple[str, str, bytes, str]] = []

    def manifest(self, name: str, ref: str) -> RemoteManifest | None:
        if ref.startswith("sha256:"):
            return RemoteManifest(ref, DOCKER_V2, None, size=527)
        return self.existing if ref in (LOCK, READABLE) else None

    def put_manifest(self, name: str, tag: str, body: bytes, media_type: str) -> str:
        if self.refuse:
            raise PushError(f"127.0.0.1:5000 refused the manifest of {name}:{tag} (400): MANIFEST_INVALID")
        self.puts.append((name, tag, body, media_type))
        return f"sha256:{hashlib.sha256(body).hexdigest()}"

    def close(self) -> None:
        pass


LOCK, READABLE = "lock-0123456789ab", "nccl2.27.5-ompi4.1.4"


def arch_images(api: FakeAPI) -> list[publish.ArchImage]:
    api.tags.clear()
    api.tags.update({f"imgbuild/cpu:{LOCK}": AMD64_ID, f"imgbuild/cpu:{READABLE}": AMD64_ID,
                     f"imgbuild/cpu:{LOCK}-arm64": ARM64_ID, f"imgbuild/cpu:{READABLE}-arm64": ARM64_ID})  # fmt: skip
    return [
        publish.ArchImage(
            "amd64", AMD64_ID, "imgbuild/cpu", ((f"imgbuild/cpu:{LOCK}", LOCK), (f"imgbuild/cpu:{READABLE}", READABLE))
        ),
        publish.ArchImage(
            "arm64",
            ARM64_ID,
            "imgbuild/cpu",
            ((f"imgbuild/cpu:{LOCK}-arm64", LOCK), (f"imgbuild/cpu:{READABLE}-arm64", READABLE)),
        ),
    ]


def index_publisher(api: FakeAPI, registry: IndexRegistry, **kwargs: Any) -> publish.Publisher:
    pub = publish.Publisher(FakeClient(api), parse_registry("127.0.0.1:5000/team"),  # type: ignore[arg-type]
                            retry=publish.Retry(sleep=Sleeps()), **kwargs)  # fmt: skip
    pub._api = registry  # type: ignore[assignment]
    return pub


def test_publish_index_pushes_each_arch_under_its_tag_then_the_index_under_the_plain_tags() -> None:
    api = FakeAPI()
    images = arch_images(api)
    api.streams = [ok_stream(t, "sha256:" + d * 64) for t, d in (("a", "a"), ("b", "a"), ("c", "b"), ("d", "b"))]
    registry = IndexRegistry()
    result = index_publisher(api, registry).publish_index(images)
    host = "127.0.0.1:5000/team/imgbuild/cpu"
    assert [r.target for r in result.refs] == [
        f"{host}:{LOCK}-amd64", f"{host}:{READABLE}-amd64", f"{host}:{LOCK}-arm64", f"{host}:{READABLE}-arm64",
    ]  # fmt: skip
    assert [(p[0], p[1]) for p in api.pushes] == [("127.0.0.1:5000/team/imgbuild/cpu", r.rsplit(":", 1)[1])
                                                  for r in (r.target for r in result.refs)]  # fmt: skip
    assert result.index is not None
    assert [(name, tag, mt) for name, tag, _, mt in registry.puts] == [
        ("team/imgbuild/cpu", LOCK, OCI_INDEX),
        ("team/imgbuild/cpu", READABLE, OCI_INDEX),
    ]
    doc = json.loads(registry.puts[0][2])
    assert [(m["platform"]["architecture"], m["digest"]) for m in doc["manifests"]] == [
        ("amd64", "sha256:" + "a" * 64),
        ("arm64", "sha256:" + "b" * 64),
    ]
    assert {r.digest for r in result.index.refs} == {result.index.digest}
    assert [m.image_id for m in result.index.manifests] == [AMD64_ID, ARM64_ID]
    data = result.to_json()["index"]
    assert data["media_type"] == OCI_INDEX and [m["platform"] for m in data["manifests"]] == [
        "linux/amd64",
        "linux/arm64",
    ]
    assert not [t for t in api.tags if t.startswith("127.0.0.1:5000/")], "temporary tags left behind"


def test_an_index_that_cannot_be_put_names_the_tags_pushed_before_it() -> None:
    api = FakeAPI()
    images = arch_images(api)
    with pytest.raises(PushError) as info:
        index_publisher(api, IndexRegistry(refuse=True)).publish_index(images)
    message = info.value.message
    assert "MANIFEST_INVALID" in message and f"is not under 127.0.0.1:5000/team/imgbuild/cpu:{LOCK}" in message
    for tag in (f"{LOCK}-amd64", f"{READABLE}-amd64", f"{LOCK}-arm64", f"{READABLE}-arm64"):
        assert f"127.0.0.1:5000/team/imgbuild/cpu:{tag}" in message
    assert not [t for t in api.tags if t.startswith("127.0.0.1:5000/")]


def test_a_failed_arch_push_names_the_tags_pushed_before_it() -> None:
    api = FakeAPI()
    images = arch_images(api)
    api.streams = [ok_stream("a"), ok_stream("b"), error_stream("name invalid: no such repository")]
    with pytest.raises(PushError) as info:
        index_publisher(api, IndexRegistry()).publish_index(images)
    message = info.value.message
    assert f"push of 127.0.0.1:5000/team/imgbuild/cpu:{LOCK}-arm64" in message and "no image index was put" in message
    assert f"cpu:{LOCK}-amd64, 127.0.0.1:5000/team/imgbuild/cpu:{READABLE}-amd64" in message
    assert not [t for t in api.tags if t.startswith("127.0.0.1:5000/")]


def test_immutable_tag_holding_another_index_is_refused_and_the_same_one_is_published() -> None:
    api = FakeAPI()
    other = RemoteManifest("sha256:" + "9" * 64, OCI_INDEX, None, size=400)
    with pytest.raises(PushError, match=r"different content.*sha256:9{64}"):
        index_publisher(api, IndexRegistry(existing=other), immutable=True).publish_index(arch_images(api))
    # the same index: its digest is what the registry holds
    first = index_publisher(api, IndexRegistry(), immutable=False).publish_index(arch_images(api))
    assert first.index is not None
    same = RemoteManifest(first.index.digest, OCI_INDEX, None, size=first.index.size)
    registry = IndexRegistry(existing=same)
    again = index_publisher(api, registry, immutable=True).publish_index(arch_images(api))
    assert again.index is not None and {r.status for r in again.index.refs} == {"already published"}
    assert registry.puts == []


class ArchAPI(FakeAPI):
    """The scripted engine, recording each image's architecture as `docker image inspect` does."""

    def inspect_image(self, ref: str) -> dict[str, Any]:
        found = super().inspect_image(ref)
        return {**found, "Architecture": {AMD64_ID: "amd64", ARM64_ID: "arm64"}.get(found["Id"], "?")}


def test_an_arch_not_built_names_the_build_to_run_before_anything_is_pushed() -> None:
    api = ArchAPI()
    from imgbuild.image import identity
    from imgbuild.pin import lock

    loaded, resolved = lock.for_ref("cpu")
    cpu = publish.recipe(loaded, resolved)
    api.tags.clear()
    for ref in identity.of(resolved).refs("amd64"):
        api.tags[ref] = AMD64_ID
    with pytest.raises(PushError) as info:
        publish.resolve_arch_images(FakeClient(api), cpu)  # type: ignore[arg-type]
    assert "-arm64 is not in the engine" in info.value.message and "linux/arm64" in info.value.message
    assert info.value.hint == "imgbuild build cpu --platform linux/arm64"
    assert api.pushes == []
    # an image recorded with another architecture under the arm64 tags is no arm64 image
    for ref in identity.of(resolved).refs("arm64"):
        api.tags[ref] = AMD64_ID
    with pytest.raises(PushError, match="is a linux/amd64 image, not linux/arm64") as info:
        publish.resolve_arch_images(FakeClient(api), cpu)  # type: ignore[arg-type]
    for ref in identity.of(resolved).refs("arm64"):
        api.tags[ref] = ARM64_ID
    found = publish.resolve_arch_images(FakeClient(api), cpu)  # type: ignore[arg-type]
    assert [(i.arch, i.image_id) for i in found] == [("amd64", AMD64_ID), ("arm64", ARM64_ID)]
    lock_tag = identity.lock_tag(identity.lock_digest(resolved))
    assert found[1].tags[0] == (f"imgbuild/cpu:{lock_tag}-arm64", lock_tag)


# ---------------------------------------------------------------------------------------------------------------
# the command line


def test_bad_platform_is_a_usage_error_naming_the_option_and_the_known_platforms() -> None:
    for argv in (["build", "cpu", "--platform", "linux/s390x"], ["verify", "cpu", "--platform", "windows/arm64"],
                 ["push", "cpu", "-r", "127.0.0.1:5000", "--platform", "riscv64"],
                 ["base", "bootstrap", "debian:bookworm-slim", "--platform", "linux/arm"]):  # fmt: skip
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        text = flat(result.output)
        assert "--platform" in text and "linux/amd64,linux/arm64" in text, (argv, result.output)


def test_a_platform_the_recipe_does_not_list_is_the_render_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["build", "pytorch", "--platform", "linux/arm64"],
                                env={"IMGBUILD_STATE_DIR": str(tmp_path)})  # fmt: skip
    assert result.exit_code == 6, result.output
    text = flat(result.output)
    assert "pytorchisbuiltforlinux/amd64,notlinux/arm64" in text and "platform.arch" in text


def test_push_platform_of_an_image_and_scan_gate_of_an_index_are_refused() -> None:
    result = CliRunner().invoke(app, ["push", "debian:bookworm-slim", "-r", "127.0.0.1:5000", "--platform",
                                      "linux/arm64"])  # fmt: skip
    assert result.exit_code == 2 and "--platformgoeswitharecipe" in flat(result.output), result.output
    result = CliRunner().invoke(app, ["push", "cpu", "-r", "123456789012.dkr.ecr.us-east-1.amazonaws.com",
                                      "--scan-gate", "HIGH"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--scan-gatejudgesoneimage'sdigest" in flat(result.output)
    assert "linux/amd64,linux/arm64" in flat(result.output)


# ---------------------------------------------------------------------------------------------------------------
# the arm64 base, the emulation check and the machine check


def test_arm64_base_spec_name_and_config() -> None:
    spec = rootfs.spec_for("debian:bookworm-slim", arch="arm64")
    assert (spec.image_name, spec.repository, spec.tag) == ("debian:bookworm-slim-arm64", "debian",
                                                            "bookworm-slim-arm64")  # fmt: skip
    config = rootfs.image_config(spec, "sha256:" + "c" * 64)
    assert config["architecture"] == "arm64" and config["os"] == "linux"
    assert config["rootfs"] == {"type": "layers", "diff_ids": ["sha256:" + "c" * 64]}
    assert rootfs.spec_for("debian:bookworm-slim").image_name == "debian:bookworm-slim"
    with pytest.raises(Exception, match="unknown architecture 's390x'"):
        rootfs.spec_for("debian:bookworm-slim", arch="s390x")


def test_emulation_problem_reads_binfmt_misc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rootfs, "BINFMT_DIR", tmp_path)
    monkeypatch.setattr(rootfs, "host_arch", lambda: "amd64")
    assert rootfs.emulation_problem("amd64") is None
    assert "binfmt_misc is not mounted" in (rootfs.emulation_problem("arm64") or "")
    (tmp_path / "status").write_text("enabled\n")
    assert "qemu-aarch64 does not exist" in (rootfs.emulation_problem("arm64") or "")
    entry_file = tmp_path / "qemu-aarch64"
    entry_file.write_text("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n")
    assert "is disabled" in (rootfs.emulation_problem("arm64") or "")
    entry_file.write_text("enabled\ninterpreter /usr/bin/qemu-aarch64\nflags: P\n")
    assert "lacks the F flag" in (rootfs.emulation_problem("arm64") or "")
    entry_file.write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n")
    assert rootfs.emulation_problem("arm64") is None
    assert "update-binfmts --enable qemu-aarch64" in rootfs.emulation_hint("arm64")


class Uname:
    def __init__(self, out: str, rc: int = 0) -> None:
        self.out, self.rc = out, rc

    def run(self, command: str, *args: str) -> Any:
        return type("R", (), {"rc": self.rc, "stdout": self.out, "stderr": "boom" if self.rc else ""})()


def test_machine_check() -> None:
    def ctx(out: str, machine: str | None, rc: int = 0) -> CheckContext:
        return CheckContext(host=Uname(out, rc), scope="container", components={}, machine=machine)

    assert machine_matches(ctx("aarch64\n", "aarch64")).status == "pass"
    bad = machine_matches(ctx("x86_64\n", platforms.MACHINE["arm64"]))
    assert bad.status == "fail" and "uname -m says x86_64" in bad.reason and bad.expected == "aarch64"
    assert machine_matches(ctx("", "aarch64", rc=1)).status == "fail"
    assert machine_matches(ctx("aarch64", None)).status == "skip"


def test_ready_container_is_seen_under_qemu_too() -> None:
    from imgbuild.verify import runs_sleep

    assert runs_sleep("sleep infinity") and runs_sleep("/usr/bin/sleep infinity")
    assert runs_sleep("/usr/libexec/qemu-binfmt/aarch64-binfmt-P /usr/bin/sleep sleep infinity")
    assert not runs_sleep("/usr/libexec/qemu-binfmt/aarch64-binfmt-P /bin/bash /usr/local/bin/entrypoint")
    assert not runs_sleep("/bin/sh -c entrypoint") and not runs_sleep("")


def test_manifest_check_compares_the_architecture() -> None:
    want = {"recipe": "cpu", "lock_digest": "x", "components": {}, "env": {}, "arch": "arm64"}
    assert manifest_diffs(want, {**want}) == []
    assert manifest_diffs(want, {**want, "arch": "amd64"}) == ["arch: expected 'arm64', image 'amd64'"]
    old = {k: v for k, v in want.items() if k != "arch"}  # written before platform.arch: amd64's
    assert manifest_diffs({**want, "arch": "amd64"}, old) == []


# ---------------------------------------------------------------------------------------------------------------
# the real thing: build, verify, push, pull


ARM64_BASE = "debian:bookworm-slim-arm64"


@pytest.fixture(scope="session")
def arm64_base(docker_client) -> str:
    """The arm64 base in the engine: bootstrapped here, by the command a user runs, when the engine lacks it or
    records it as another architecture (scripts/setup.sh does not make it: the main job never builds arm64)."""
    problem = rootfs.emulation_problem("arm64")
    if problem:
        pytest.fail(f"{problem}: {rootfs.emulation_hint('arm64')}")
    if _has(docker_client):
        if docker_client.api.inspect_image(ARM64_BASE).get("Architecture") == "arm64":
            return ARM64_BASE
        docker_client.images.remove(ARM64_BASE)  # recorded as another architecture: made again below
    t0 = time.monotonic()
    argv = ["base", "bootstrap", "debian:bookworm-slim", "--platform", "linux/arm64"]
    proc = subprocess.run(
        [sys.executable, "-m", "imgbuild.cli", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"imgbuild {' '.join(argv)}: exit {proc.returncode}\n"
                    f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")  # fmt: skip
    record = docker_client.api.inspect_image(ARM64_BASE)
    assert record.get("Architecture") == "arm64", record.get("Architecture")
    print(f"arm64 base bootstrapped under emulation: {time.monotonic() - t0:.1f}s")
    return ARM64_BASE


@pytest.fixture(scope="session")
def arm64_image(docker_client, arm64_base):
    """The cpu recipe built for linux/arm64 by `imgbuild build cpu --platform linux/arm64` (under QEMU: slow; the
    layer cache makes a second run quick). Fails, never skips, without QEMU or the arm64 base."""
    from imgbuild import build
    from imgbuild.pin import lock

    t0 = time.monotonic()
    result = build.build(*lock.for_ref("cpu"), ca_bundle=build.ca_bundle_from(None), arch="arm64")
    print(f"arm64 cpu build under emulation: {time.monotonic() - t0:.1f}s ({result.steps_run} steps run, "
          f"{result.steps_cached} cached)")  # fmt: skip
    return result


def _has(client: Any) -> bool:
    try:
        client.api.inspect_image(ARM64_BASE)
    except docker.errors.ImageNotFound:
        return False
    return True


@pytest.mark.docker
def test_arm64_build_is_an_arm64_image_under_the_arch_tags(docker_client, arm64_image) -> None:
    from imgbuild.image import identity
    from imgbuild.pin import lock

    _, resolved = lock.for_ref("cpu")
    assert list(arm64_image.refs) == identity.of(resolved).refs("arm64")
    assert all(ref.endswith("-arm64") for ref in arm64_image.refs)
    record = docker_client.api.inspect_image(arm64_image.refs[0])
    assert record["Architecture"] == "arm64" and record["Id"] == arm64_image.image_id


@pytest.mark.docker
def test_verify_arm64_through_the_product_path(docker_client, arm64_image) -> None:
    from imgbuild import verify

    t0 = time.monotonic()
    report = verify.verify("cpu", arch="arm64", nodes=2)
    print(f"arm64 cpu verify (--nodes 2) under emulation: {time.monotonic() - t0:.1f}s")
    by_name = {r.name: r for r in report.results}
    assert report.image == arm64_image.refs[0]
    assert report.ok, [(r.name, r.reason) for r in report.failed]
    assert (by_name["machine"].status, by_name["machine"].found) == ("pass", "aarch64")
    assert by_name["manifest"].status == "pass"
    assert by_name["nccl-runtime-version"].status == "pass" and "2.27.5" in by_name["nccl-runtime-version"].found
    assert by_name["sshd-listening"].status == "pass"
    multinode = [r for r in report.results if r.name.startswith("multinode")]
    assert multinode and all(r.status != "fail" for r in multinode)
    assert any(r.status == "pass" and "2" in r.expected for r in multinode), multinode


def _pull(ref: str, platform: str | None = None) -> str:
    argv = [DOCKER, "pull", "-q", *(["--platform", platform] if platform else []), ref]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return subprocess.run([DOCKER, "image", "inspect", "--format", "{{.Architecture}}", ref], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


@pytest.mark.docker
def test_push_both_architectures_as_one_index_and_pull_each(
    docker_client, cpu_image, arm64_image, tmp_path_factory
) -> None:
    reg = LocalRegistry(tmp_path_factory.mktemp("multiarch-registry")).start()
    repo = f"{reg.host}/team/imgbuild/cpu"
    try:
        t0 = time.monotonic()
        result = CliRunner().invoke(app, ["push", "cpu", "--registry", f"{reg.host}/team", "--json"])
        assert result.exit_code == 0, result.output
        print(f"push of both architectures and the index: {time.monotonic() - t0:.1f}s")
        data = json.loads(result.stdout)
        lock_tag, readable = (r.split(":", 1)[1] for r in cpu_image.refs[:2])
        assert [r["target"] for r in data["refs"]] == [
            f"{repo}:{lock_tag}-amd64",
            f"{repo}:{readable}-amd64",
            f"{repo}:{lock_tag}-arm64",
            f"{repo}:{readable}-arm64",
        ]
        index = data["index"]
        assert [r["target"] for r in index["refs"]] == [f"{repo}:{lock_tag}", f"{repo}:{readable}"]
        assert {r["digest"] for r in index["refs"]} == {index["digest"]}
        per_arch = {m["platform"]: m["digest"] for m in index["manifests"]}
        assert per_arch == {"linux/amd64": data["refs"][0]["digest"], "linux/arm64": data["refs"][2]["digest"]}
        assert [m["image_id"] for m in index["manifests"]] == [cpu_image.image_id, arm64_image.image_id]
        assert local_tags(docker_client, reg.host) == [], "temporary tags left behind"

        # the registry serves the index under the plain tag: its media type and platforms
        got = requests.get(f"http://{reg.host}/v2/team/imgbuild/cpu/manifests/{lock_tag}",
                           headers={"Accept": OCI_INDEX}, timeout=10)  # fmt: skip
        assert got.status_code == 200 and got.headers["Docker-Content-Digest"] == index["digest"]
        doc = got.json()
        assert doc["mediaType"] == OCI_INDEX and got.headers["Content-Type"] == OCI_INDEX
        assert [(m["platform"], m["digest"]) for m in doc["manifests"]] == [
            ({"architecture": "amd64", "os": "linux"}, per_arch["linux/amd64"]),
            ({"architecture": "arm64", "os": "linux"}, per_arch["linux/arm64"]),
        ]

        # the text output names both manifests and the index
        again = CliRunner().invoke(app, ["push", "cpu", "--registry", f"{reg.host}/team", "--immutable"])
        assert again.exit_code == 0, again.output
        assert f"already published: {repo}:{lock_tag}  {index['digest']}  (image index)" in again.stdout
        assert f"linux/arm64  {per_arch['linux/arm64']}" in again.stdout and f"index {index['digest']}" in again.stdout

        # an immutable tag holding this index refuses another one (amd64 alone)
        refused = CliRunner().invoke(app, ["push", "cpu", "--registry", f"{reg.host}/team", "--immutable",
                                           "--platform", "linux/amd64"])  # fmt: skip
        assert refused.exit_code == 12 and "differentcontent" in flat(refused.output), refused.output

        # pulls: --platform linux/arm64 gets the arm64 image, a plain pull the engine's own (amd64)
        pulled = f"{repo}:{lock_tag}"
        assert _pull(pulled, "linux/arm64") == "arm64"
        assert docker_client.api.inspect_image(pulled)["Id"] == arm64_image.image_id
        assert _pull(pulled) == "amd64"
        assert docker_client.api.inspect_image(pulled)["Id"] == cpu_image.image_id
    finally:
        # the pulls' tags, and the digest references a pull leaves on the image (`REPO@sha256:...`)
        digests = [d for i in docker_client.images.list() for d in i.attrs.get("RepoDigests") or []
                   if d.startswith(reg.host + "/")]  # fmt: skip
        for ref in [*local_tags(docker_client, reg.host), *digests]:
            with contextlib.suppress(docker.errors.APIError):
                docker_client.api.remove_image(ref, noprune=True)
        reg.stop()
    left = [d for i in docker_client.images.list() for d in i.attrs.get("RepoDigests") or [] if reg.host in d]
    assert left == [] and local_tags(docker_client, reg.host) == [], left


def test_index_entries_use_the_registry_descriptor() -> None:
    """The index's descriptor of each image is the registry's manifest (its size), not the engine's report."""
    api = FakeAPI()
    images = arch_images(api)
    api.streams = [ok_stream("x", DIGEST) for _ in range(4)]
    result = index_publisher(api, IndexRegistry()).publish_index(images)
    assert result.index is not None and {m.size for m in result.index.manifests} == {527}


@responses.activate
def test_registry_api_put_manifest_logs_in_and_checks_the_digest() -> None:
    body = publish.index_document([entry("amd64", "a"), entry("arm64", "b")])
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    url = "https://registry.example.com/v2/team/imgbuild/cpu/manifests"
    responses.put(f"{url}/v1", status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
    responses.put(f"{url}/v1", status=201, headers={"Docker-Content-Digest": digest})
    api = RegistryAPI("registry.example.com", credentials=lambda: ("u", "p"))
    assert api.put_manifest("team/imgbuild/cpu", "v1", body, OCI_INDEX) == digest
    sent = responses.calls[1].request
    assert sent.method == "PUT" and sent.body == body and sent.headers["Content-Type"] == OCI_INDEX
    assert sent.headers["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()

    responses.put(f"{url}/v2", status=201, headers={"Docker-Content-Digest": "sha256:" + "0" * 64})
    with pytest.raises(PushError, match="not its sha256"):
        api.put_manifest("team/imgbuild/cpu", "v2", body, OCI_INDEX)
    responses.put(f"{url}/v3", status=400, json={"errors": [{"code": "MANIFEST_INVALID"}]})
    with pytest.raises(PushError, match=r"refused the manifest of team/imgbuild/cpu:v3 \(400\).*MANIFEST_INVALID"):
        api.put_manifest("team/imgbuild/cpu", "v3", body, OCI_INDEX)
    responses.put(f"{url}/v4", status=503)
    with pytest.raises(TransientError):
        api.put_manifest("team/imgbuild/cpu", "v4", body, OCI_INDEX)


class BaseAPI:
    """The engine's image records, as `engine.inspect_image` reads them."""

    def __init__(self, images: dict[str, str]) -> None:
        self.images = images  # name -> architecture

    def inspect_image(self, ref: str) -> dict[str, Any]:
        if ref not in self.images:
            raise docker.errors.ImageNotFound(f"No such image: {ref}")
        return {"Id": "sha256:" + "3" * 64, "Os": "linux", "Architecture": self.images[ref]}


def test_build_checks_emulation_and_the_arm64_base_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    from imgbuild import build
    from imgbuild.core.errors import BaseImageMissing, BuildError
    from imgbuild.image import render
    from imgbuild.pin import lock

    _, resolved = lock.for_ref("cpu")
    plan = render.plan(resolved, arch="arm64")
    assert build.engine_bases(resolved, plan) == ["debian:bookworm-slim-arm64"]
    assert build.engine_bases(resolved, render.plan(resolved)) == ["debian:bookworm-slim"]
    client = type("Client", (), {"api": BaseAPI({"debian:bookworm-slim": "amd64"})})()

    monkeypatch.setattr(rootfs, "emulation_problem", lambda arch: "binfmt_misc is not mounted")
    with pytest.raises(BuildError, match="cannot build cpu for linux/arm64: binfmt_misc") as info:
        build.check_platform(client, resolved, plan)
    assert "update-binfmts --enable qemu-aarch64" in (info.value.hint or "")
    build.check_platform(client, resolved, plan, engine_store=False)  # a builder of its own: its machines' affair

    monkeypatch.setattr(rootfs, "emulation_problem", lambda arch: None)
    with pytest.raises(BaseImageMissing) as missing:
        build.check_platform(client, resolved, plan)
    assert missing.value.hint and "imgbuild base bootstrap debian:bookworm-slim --platform linux/arm64" in (
        missing.value.hint
    )
    client.api.images["debian:bookworm-slim-arm64"] = "amd64"
    with pytest.raises(BuildError, match="records the base debian:bookworm-slim-arm64 as linux/amd64"):
        build.check_platform(client, resolved, plan)
    client.api.images["debian:bookworm-slim-arm64"] = "arm64"
    build.check_platform(client, resolved, plan)


@pytest.mark.docker
def test_arm64_base_loads_recording_its_architecture_and_runs(docker_client, arm64_base: str, tmp_path: Path) -> None:
    """rootfs's load step for another architecture, on a real arm64 tree (the base setup made, exported): the
    engine records arm64 (`docker import` would record amd64) and a container of it runs under QEMU."""
    import uuid

    tree = docker_client.containers.create(arm64_base, ["true"])
    tar = tmp_path / "rootfs.tar"
    try:
        with tar.open("wb") as f:
            for chunk in tree.export():
                f.write(chunk)
    finally:
        tree.remove()
    spec = rootfs.BaseSpec(f"imgbuild-test/base-{uuid.uuid4().hex[:8]}:bookworm-slim", "debian", "bookworm",
                              rootfs.DEBIAN_MIRROR, slim=True, arch="arm64")  # fmt: skip
    assert spec.image_name.endswith(":bookworm-slim-arm64")
    image_id = rootfs._import(docker_client, spec, tar)
    try:
        record = docker_client.api.inspect_image(spec.image_name)
        assert (record["Id"], record["Architecture"], record["Os"]) == (image_id, "arm64", "linux")
        assert record["Config"]["Cmd"] == ["bash"] and f"PATH={rootfs.IMAGE_PATH}" in record["Config"]["Env"]
        out = docker_client.containers.run(spec.image_name, ["uname", "-m"], remove=True)
        assert out.decode().strip() == "aarch64"
    finally:
        docker_client.api.remove_image(spec.image_name)
    assert not tar.exists(), "the layer's tar is moved into the archive, not copied (one copy on disk)"


def test_doctor_reports_emulation_as_a_warning_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from imgbuild.build import doctor

    monkeypatch.setattr(rootfs, "host_arch", lambda: "amd64")
    monkeypatch.setattr(rootfs, "emulation_problem", lambda arch: "linux/arm64 binaries cannot run here: x")
    rows = doctor._platform_checks({"amd64": ["cpu"], "arm64": ["cpu", "gb200"]})
    assert [(c.name, c.status, c.needed_by) for c in rows] == [("emulation linux/arm64", "warn", ("cpu", "gb200"))]
    assert "update-binfmts --enable qemu-aarch64" in rows[0].detail
    assert doctor.failed(rows, {"cpu"}) == []  # amd64 still builds: a warning, never exit 13
    monkeypatch.setattr(rootfs, "emulation_problem", lambda arch: None)
    (ok,) = doctor._platform_checks({"arm64": ["cpu"]})
    assert ok.status == "ok" and "qemu-aarch64" in ok.detail
