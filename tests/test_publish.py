"""`imgbuild push` and `imgbuild matrix`.

Unit tests drive `Publisher` with a scripted fake engine (retries, auth failures, immutable tags, temporary
tags); docker-marked tests push the real cpu image to Debian's `docker-registry` (registry 2.8) started on
127.0.0.1:<free port> (the engine trusts 127.0.0.0/8 over plain HTTP by default), pull it back and compare
digests, and check authentication failures, a stopped registry, a registry killed mid-push and immutable tags.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import io
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests
import responses
import typer
from typer.testing import CliRunner

from imgbuild import publish
from imgbuild.cli.publish import register
from imgbuild.core.errors import PushError
from imgbuild.pin import lock
from imgbuild.publish import matrix
from imgbuild.publish.registry import MANIFEST_TYPES, RegistryAPI, RemoteManifest, parse_registry
from imgbuild.ui.progress import LivePushProgress, PlainPushProgress, push_progress_for

CPU_REF = "imgbuild/cpu:lock-0123456789ab"
CPU_READABLE = "imgbuild/cpu:nccl2.27.5-ompi4.1.4"
IMAGE_ID = "sha256:" + "a" * 64
OTHER_ID = "sha256:" + "b" * 64
DIGEST = "sha256:" + "d" * 64
REMOTE_DIGEST = "sha256:" + "e" * 64


# ---------------------------------------------------------------------------------------------------------
# a scripted engine


def ok_stream(tag: str, digest: str = DIGEST) -> list[dict[str, Any]]:
    return [
        {"status": "The push refers to repository [x]"},
        {"status": "Preparing", "progressDetail": {}, "id": "0a1b2c3d4e5f"},
        {
            "status": "Pushing",
            "progressDetail": {"current": 512, "total": 74818183},
            "id": "0a1b2c3d4e5f",
            "progress": "\x1b[1m[>   ]\x1b[0m",
        },
        {"status": "Pushed", "progressDetail": {}, "id": "0a1b2c3d4e5f"},
        {"status": f"{tag}: digest: {digest} size: 1234"},
        {"progressDetail": {}, "aux": {"Tag": tag, "Digest": digest, "Size": 1234}},
    ]


def error_stream(message: str) -> list[dict[str, Any]]:
    return [
        {"status": "The push refers to repository [x]"},
        {"status": "Preparing", "progressDetail": {}, "id": "0a1b2c3d4e5f"},
        {"errorDetail": {"message": message}, "error": message},
    ]


class FakeAPI:
    """The slice of docker-py's APIClient the publisher uses, with scripted push streams."""

    def __init__(self, streams: list[list[dict[str, Any]]] | None = None) -> None:
        self.tags: dict[str, str] = {CPU_REF: IMAGE_ID, CPU_READABLE: IMAGE_ID}
        self.streams = list(streams or [])
        self.pushes: list[tuple[str, str, dict[str, str] | None]] = []

    def inspect_image(self, ref: str) -> dict[str, Any]:
        image_id = self.tags.get(ref) or (ref if ref in self.tags.values() else None)
        if image_id is None:
            raise docker.errors.ImageNotFound(f"No such image: {ref}")
        return {"Id": image_id, "RepoTags": [t for t, i in self.tags.items() if i == image_id], "RepoDigests": []}

    def tag(self, image: str, repository: str, tag: str | None = None, force: bool = False) -> bool:
        self.tags[f"{repository}:{tag}"] = self.tags.get(image, image)
        return True

    def remove_image(self, ref: str, force: bool = False, noprune: bool = False) -> None:
        del self.tags[ref]

    def push(self, repository: str, tag: str | None = None, stream: bool = False, decode: bool = False,
             auth_config: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:  # fmt: skip
        assert stream and decode
        assert f"{repository}:{tag}" in self.tags, "pushed a ref that was not tagged first"
        self.pushes.append((repository, tag or "", auth_config))
        return iter(self.streams.pop(0) if self.streams else ok_stream(tag or ""))

    def info(self) -> dict[str, Any]:
        return {"RegistryConfig": {"InsecureRegistryCIDRs": ["127.0.0.0/8"], "IndexConfigs": {}}}


class FakeClient:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api


class FakeRegistryAPI:
    def __init__(self, manifest: RemoteManifest | None = None) -> None:
        self.remote = manifest
        self.lookups: list[tuple[str, str]] = []

    def manifest(self, name: str, tag: str) -> RemoteManifest | None:
        self.lookups.append((name, tag))
        return self.remote

    def close(self) -> None:
        pass


class Sleeps(list[float]):
    """An injected sleep: records the delays instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def cpu() -> publish.Recipe:
    """The cpu recipe with its lock, as `imgbuild push cpu` reads it once and hands it down."""
    return publish.recipe(*lock.for_ref("cpu"))


def source() -> publish.Source:
    return publish.Source(IMAGE_ID, (CPU_REF, CPU_READABLE), (), "cpu")


def publisher(api: FakeAPI, sleeps: Sleeps, **kwargs: Any) -> publish.Publisher:
    return publish.Publisher(
        FakeClient(api),  # type: ignore[arg-type]
        parse_registry("127.0.0.1:5000/team"),
        retry=publish.Retry(sleep=sleeps),
        **kwargs,
    )


def leftover(api: FakeAPI) -> list[str]:
    return [t for t in api.tags if t.startswith("127.0.0.1:5000/")]


# ---------------------------------------------------------------------------------------------------------
# parsing and classification


@pytest.mark.parametrize(
    ("value", "host", "prefix"),
    [
        ("127.0.0.1:5000", "127.0.0.1:5000", ""),
        ("127.0.0.1:5000/team", "127.0.0.1:5000", "team"),
        ("https://Registry.Example.com/a/b/", "registry.example.com", "a/b"),
        ("localhost/x", "localhost", "x"),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/ml", "123456789012.dkr.ecr.us-east-1.amazonaws.com", "ml"),
    ],
)
def test_parse_registry(value: str, host: str, prefix: str) -> None:
    dest = parse_registry(value)
    assert (dest.host, dest.prefix) == (host, prefix)
    assert dest.repository("imgbuild/cpu") == f"{host}/{prefix + '/' if prefix else ''}imgbuild/cpu"


@pytest.mark.parametrize("value", ["myuser", "myuser/team", "127.0.0.1:5000/Team", "127.0.0.1:5000/a//b", ""])
def test_parse_registry_rejects(value: str) -> None:
    with pytest.raises(PushError):
        parse_registry(value)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("received unexpected HTTP status: 502 Bad Gateway", "transient"),
        ("received unexpected HTTP status: 500 Internal Server Error", "transient"),
        ('Put "http://127.0.0.1:5000/v2/x/blobs/uploads/1": read tcp: connection reset by peer', "transient"),
        ('Get "http://127.0.0.1:5000/v2/": dial tcp 127.0.0.1:5000: connect: connection refused', "transient"),
        ('Patch "http://127.0.0.1:5000/v2/x/blobs/uploads/abc": EOF', "transient"),
        ("net/http: TLS handshake timeout", "transient"),
        ("no basic auth credentials", "auth"),
        ("unauthorized: authentication required", "auth"),
        ("denied: requested access to the resource is denied", "auth"),
        ("denied: Your authorization token has expired. Reauthenticate and try again.", "auth"),
        (
            "tag invalid: The image tag 'v1' already exists in the 'x' repository and cannot be overwritten "
            "because the repository is immutable.",
            "exists",
        ),
        ("An image does not exist locally with the tag: x", "fatal"),
        ("name invalid: repository name not known to registry", "fatal"),
    ],
)
def test_classify(message: str, kind: str) -> None:
    assert publish.classify(message) == kind


def test_backoff_delays() -> None:
    retry = publish.Retry()
    assert [retry.delay(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert publish.Retry(delay_s=10, max_delay_s=15).delay(3) == 15


# ---------------------------------------------------------------------------------------------------------
# the publisher against a scripted engine


def test_push_tags_pushes_reports_digest_and_untags() -> None:
    api, sleeps = FakeAPI(), Sleeps()
    result = publisher(api, sleeps).publish(source())
    assert [r.target for r in result.refs] == [
        "127.0.0.1:5000/team/imgbuild/cpu:lock-0123456789ab",
        "127.0.0.1:5000/team/imgbuild/cpu:nccl2.27.5-ompi4.1.4",
    ]
    assert {(r.digest, r.size, r.status, r.attempts) for r in result.refs} == {(DIGEST, 1234, "pushed", 1)}
    assert [p[:2] for p in api.pushes] == [("127.0.0.1:5000/team/imgbuild/cpu", "lock-0123456789ab"),
                                          ("127.0.0.1:5000/team/imgbuild/cpu", "nccl2.27.5-ompi4.1.4")]  # fmt: skip
    assert api.pushes[0][2] is None  # docker-py falls back to what `docker login` stored
    assert leftover(api) == [] and sleeps == []


def test_transient_errors_retried_with_backoff_then_clear_failure() -> None:
    api = FakeAPI([error_stream("received unexpected HTTP status: 502 Bad Gateway")] * 4)
    sleeps = Sleeps()
    with pytest.raises(PushError) as info:
        publisher(api, sleeps).publish(source())
    assert len(api.pushes) == 4 and sleeps == [1.0, 2.0, 4.0]
    message = info.value.message
    assert "127.0.0.1:5000" in message and "imgbuild/cpu:lock-0123456789ab" in message
    assert "gave up after 4 attempts" in message and "502 Bad Gateway" in message
    assert leftover(api) == []


def test_transient_error_then_success() -> None:
    api = FakeAPI([error_stream("read tcp 127.0.0.1:1->127.0.0.1:5000: read: connection reset by peer")])
    sleeps = Sleeps()
    result = publisher(api, sleeps).publish(source())
    assert [r.attempts for r in result.refs] == [2, 1] and sleeps == [1.0]
    assert leftover(api) == []


@pytest.mark.parametrize(
    "message", ["no basic auth credentials", "unauthorized: authentication required", "denied: access forbidden"]
)
def test_auth_failure_is_not_retried(message: str) -> None:
    api, sleeps = FakeAPI([error_stream(message)]), Sleeps()
    with pytest.raises(PushError) as info:
        publisher(api, sleeps).publish(source())
    assert len(api.pushes) == 1 and sleeps == []
    assert "authentication failed" in info.value.message and message in info.value.message
    assert info.value.hint and "docker login 127.0.0.1:5000" in info.value.hint
    assert leftover(api) == []


def test_unknown_error_fails_at_once() -> None:
    api, sleeps = FakeAPI([error_stream("manifest invalid: manifest invalid")]), Sleeps()
    with pytest.raises(PushError, match="manifest invalid"):
        publisher(api, sleeps).publish(source())
    assert len(api.pushes) == 1 and sleeps == []


def test_stream_without_digest_is_a_failure() -> None:
    api, sleeps = FakeAPI([[{"status": "The push refers to repository [x]"}]]), Sleeps()
    with pytest.raises(PushError, match="no digest"):
        publisher(api, sleeps).publish(source())


def test_existing_tag_is_put_back_and_own_tag_kept() -> None:
    api, sleeps = FakeAPI(), Sleeps()
    api.tags["127.0.0.1:5000/team/imgbuild/cpu:lock-0123456789ab"] = OTHER_ID  # the user's own, older tag
    api.tags["127.0.0.1:5000/team/imgbuild/cpu:nccl2.27.5-ompi4.1.4"] = IMAGE_ID  # already on this image
    publisher(api, sleeps).publish(source())
    assert api.tags["127.0.0.1:5000/team/imgbuild/cpu:lock-0123456789ab"] == OTHER_ID
    assert api.tags["127.0.0.1:5000/team/imgbuild/cpu:nccl2.27.5-ompi4.1.4"] == IMAGE_ID


def test_immutable_tag_same_image_is_already_published() -> None:
    api, sleeps = FakeAPI(), Sleeps()
    pub = publisher(api, sleeps, immutable=True)
    pub._api = FakeRegistryAPI(RemoteManifest(REMOTE_DIGEST, "application/vnd.docker...", IMAGE_ID))  # type: ignore[assignment]
    result = pub.publish(source())
    assert {(r.status, r.digest) for r in result.refs} == {("already published", REMOTE_DIGEST)}
    assert api.pushes == [] and leftover(api) == []


def test_immutable_tag_other_image_fails() -> None:
    api, sleeps = FakeAPI(), Sleeps()
    pub = publisher(api, sleeps, immutable=True)
    pub._api = FakeRegistryAPI(RemoteManifest(REMOTE_DIGEST, "application/vnd.docker...", OTHER_ID))  # type: ignore[assignment]
    with pytest.raises(PushError) as info:
        pub.publish(source())
    assert "already exists in the immutable repository with different content" in info.value.message
    assert REMOTE_DIGEST in info.value.message and IMAGE_ID in info.value.message
    assert api.pushes == [] and leftover(api) == []


def test_immutable_absent_tag_is_pushed() -> None:
    api, sleeps = FakeAPI(), Sleeps()
    pub = publisher(api, sleeps, immutable=True)
    fake = FakeRegistryAPI(None)
    pub._api = fake  # type: ignore[assignment]
    result = pub.publish(source())
    assert [r.status for r in result.refs] == ["pushed", "pushed"]
    assert fake.lookups == [("team/imgbuild/cpu", "lock-0123456789ab"), ("team/imgbuild/cpu", "nccl2.27.5-ompi4.1.4")]


ECR_REFUSAL = ("tag invalid: The image tag 'lock-0123456789ab' already exists in the 'team/imgbuild/cpu' repository "
               "and cannot be overwritten because the repository is immutable.")  # fmt: skip


@pytest.mark.parametrize(("remote_image", "ok"), [(IMAGE_ID, True), (OTHER_ID, False)])
def test_registry_refusal_of_existing_tag(remote_image: str, ok: bool) -> None:
    """ECR says so in the stream when the digest check was off: compare with what the registry holds."""
    api, sleeps = FakeAPI([error_stream(ECR_REFUSAL)]), Sleeps()
    pub = publisher(api, sleeps, immutable=False)
    pub._api = FakeRegistryAPI(RemoteManifest(REMOTE_DIGEST, "x", remote_image))  # type: ignore[assignment]
    if ok:
        assert pub.publish(source()).refs[0].status == "already published"
    else:
        with pytest.raises(PushError, match="different content"):
            pub.publish(source())
    assert sleeps == [] and leftover(api) == []


def test_interrupt_still_removes_the_temporary_tag() -> None:
    class Interrupting(FakeAPI):
        def push(self, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
            super().push(*args, **kwargs)
            raise KeyboardInterrupt

    api = Interrupting()
    from imgbuild.core.errors import Interrupted

    with pytest.raises(Interrupted):
        publisher(api, Sleeps()).publish(source())
    assert leftover(api) == []


def test_ecr_publisher_uses_the_token_and_creates_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    from imgbuild.publish import ecr

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    host = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    with mock_aws():
        registry = ecr.EcrRegistry(host)
        api = FakeAPI()
        pub = publish.Publisher(FakeClient(api), parse_registry(f"{host}/team"), ecr=registry,  # type: ignore[arg-type]
                                retry=publish.Retry(sleep=Sleeps()))  # fmt: skip
        fake = FakeRegistryAPI(None)
        pub._api = fake  # type: ignore[assignment]
        result = pub.publish(source())
        repo = registry.client.describe_repositories(repositoryNames=["team/imgbuild/cpu"])["repositories"][0]
    assert repo["imageTagMutability"] == "IMMUTABLE" and repo["imageScanningConfiguration"]["scanOnPush"]
    assert fake.lookups, "an immutable ECR repository gets the digest check"
    expected = {"username": "AWS", "password": "123456789012-auth-token", "serveraddress": host}
    assert [p[2] for p in api.pushes] == [expected, expected]
    assert result.refs[0].target == f"{host}/team/imgbuild/cpu:lock-0123456789ab"


def test_resolve_image_by_name_and_by_id() -> None:
    api = FakeAPI()
    api.tags["someone/else:x"] = IMAGE_ID
    api.tags["ghcr.io/org/img:1"] = IMAGE_ID
    client: Any = FakeClient(api)
    by_name = publish.resolve_source(client, CPU_REF)
    assert by_name.image_id == IMAGE_ID and set(by_name.refs) == {CPU_REF, CPU_READABLE}
    by_id = publish.resolve_source(client, IMAGE_ID)
    assert set(by_id.refs) == {CPU_REF, CPU_READABLE, "someone/else:x"}
    with pytest.raises(PushError, match="neither a recipe nor an image"):
        publish.resolve_source(client, "nothing/here:1")


def test_recipe_not_built_is_a_clear_error() -> None:
    api = FakeAPI()
    api.tags.clear()
    with pytest.raises(PushError) as info:
        publish.resolve_source(FakeClient(api), cpu())  # type: ignore[arg-type]
    assert "has not been built" in info.value.message and info.value.hint == "imgbuild build cpu"


def test_plain_progress_is_one_line_per_state_without_escapes() -> None:
    buf = io.StringIO()
    api = FakeAPI([error_stream("received unexpected HTTP status: 503 Service Unavailable")])
    publisher(api, Sleeps(), progress=PlainPushProgress(buf)).publish(source())
    text = buf.getvalue()
    assert "\x1b" not in text and "\r" not in text
    assert "  0a1b2c3d4e5f: pushing 74.8 MB\n  0a1b2c3d4e5f: Pushed\n" in text
    assert "failed (attempt 1/4): received unexpected HTTP status: 503 Service Unavailable; retrying in 1s" in text
    assert f"pushed 127.0.0.1:5000/team/imgbuild/cpu:lock-0123456789ab@{DIGEST}" in text
    assert "Preparing" not in text


# ---------------------------------------------------------------------------------------------------------
# the registry HTTP API


@responses.activate
def test_registry_api_bearer_token_flow() -> None:
    url = "https://registry.example.com/v2/team/imgbuild/cpu/manifests/v1"
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"digest": IMAGE_ID}}  # fmt: skip
    challenge = 'Bearer realm="https://auth.example.com/token",service="registry.example.com"'
    responses.get(url, status=401, headers={"WWW-Authenticate": challenge})
    responses.get("https://auth.example.com/token", json={"token": "tok"})
    responses.get(url, json=manifest, headers={"Docker-Content-Digest": REMOTE_DIGEST})
    api = RegistryAPI("registry.example.com", credentials=lambda: ("u", "p"))
    found = api.manifest("team/imgbuild/cpu", "v1")
    assert found == RemoteManifest(REMOTE_DIGEST, manifest["mediaType"], IMAGE_ID)
    token_call = responses.calls[1].request
    assert "scope=repository%3Ateam%2Fimgbuild%2Fcpu%3Apull" in token_call.url
    assert token_call.headers["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
    assert responses.calls[2].request.headers["Authorization"] == "Bearer tok"


@responses.activate
def test_registry_api_absent_tag_and_auth_failure() -> None:
    base = "https://registry.example.com/v2/x/manifests"
    responses.get(f"{base}/absent", status=404, json={"errors": [{"code": "MANIFEST_UNKNOWN"}]})
    responses.get(f"{base}/locked", status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
    api = RegistryAPI("registry.example.com")
    assert api.manifest("x", "absent") is None
    with pytest.raises(PushError, match="authentication failed"):
        api.manifest("x", "locked")


# ---------------------------------------------------------------------------------------------------------
# matrix


def test_matrix_shape() -> None:
    from conftest import SHIPPED

    data = matrix.matrix()
    assert set(data) == {"include"}
    rows = {row["recipe"]: row for row in data["include"]}
    assert sorted(rows) == SHIPPED
    cpu = rows["cpu"]
    assert cpu["image"] == "imgbuild/cpu" and cpu["accelerator"] == "none"
    assert cpu["runner"] == "ubuntu-latest" and cpu["runs_on"] == ["ubuntu-latest"]
    assert cpu["tags"][0].startswith("lock-") and len(cpu["tags"][0]) == len("lock-") + 12
    assert rows["h100"]["runner"] == "self-hosted gpu" and rows["h100"]["runs_on"] == ["self-hosted", "gpu"]
    assert rows["gaudi-1.15"]["runner"] == "self-hosted gaudi" and rows["gaudi-1.15"]["accelerator"] == "gaudi"
    for row in data["include"]:
        assert set(row) == {"recipe", "image", "tags", "accelerator", "runner", "runs_on"}


def cli_app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_matrix_cli_json_is_one_line() -> None:
    result = CliRunner().invoke(cli_app(), ["matrix", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1
    assert json.loads(result.stdout) == matrix.matrix()
    one = CliRunner().invoke(cli_app(), ["matrix", "--json", "cpu"])
    assert [r["recipe"] for r in json.loads(one.stdout)["include"]] == ["cpu"]


def flat(text: str) -> str:
    """Output with its whitespace and box-drawing characters taken out (click's error box wraps lines)."""
    return "".join(ch for ch in text if not ch.isspace() and not "\u2500" <= ch <= "\u257f").lower()


def test_push_cli_bad_registry_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli_app(), ["push", "cpu", "--registry", "nohost"])
    assert result.exit_code == 2, result.output
    assert "registryhost" in flat(result.output)


SECRET = "Hunter2SECRET"
WITH_CREDENTIALS = [
    f"bob:{SECRET}@127.0.0.1:5000/team",
    f"https://bob:{SECRET}@Registry.Example.com/a",
    f"{SECRET}@localhost",
    f"bob:p@ss/{SECRET}@127.0.0.1:5000",  # '@' and '/' in the password
    f"bob:{SECRET}@123456789012.dkr.ecr.us-east-1.amazonaws.com/ml",  # an ECR host too
]


@pytest.mark.parametrize("value", WITH_CREDENTIALS)
@pytest.mark.parametrize("how", ["option", "env"])
def test_push_refuses_credentials_in_the_registry_without_repeating_them(value: str, how: str) -> None:
    """A password in --registry or IMGBUILD_REGISTRY: a usage error (exit 2) with the `docker login` hint, and no
    part of the password (in any case) on stdout or stderr."""
    from imgbuild.cli import app

    args, env = (
        (["push", "cpu", "--registry", value], {})
        if how == "option"
        else (["push", "cpu"], {"IMGBUILD_REGISTRY": value})
    )
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    text = flat(result.stdout + result.stderr)
    assert "dockerlogin" in text and "credentials" in text
    assert SECRET.lower() not in text and "hunter" not in text
    assert "traceback" not in text


def test_publish_library_refuses_credentials_without_repeating_them() -> None:
    with pytest.raises(PushError) as info:
        publish.publish(cpu(), WITH_CREDENTIALS[0], client=FakeClient(FakeAPI()))  # type: ignore[arg-type]
    assert SECRET.lower() not in str(info.value).lower()
    assert info.value.hint and "docker login" in info.value.hint


# ---------------------------------------------------------------------------------------------------------
# a real registry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def registry_binary() -> str:
    exe = shutil.which("docker-registry") or shutil.which("registry")
    if exe is None:
        msg = "no registry binary: apt-get install docker-registry (Debian/Ubuntu's registry 2.8)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def htpasswd_line(user: str, password: str) -> str:
    """A bcrypt htpasswd entry (the only hash registry:2 accepts)."""
    try:
        import bcrypt

        return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}"
    except ImportError:
        pass
    if shutil.which("htpasswd"):
        out = subprocess.run(["htpasswd", "-nbB", user, password], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    pytest.fail("need bcrypt (pip install bcrypt) or htpasswd (apt-get install apache2-utils) for the auth test")


class LocalRegistry:
    """Debian's docker-registry on 127.0.0.1:<free port>, storage in a temp folder."""

    def __init__(self, root: Path, *, htpasswd: str | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        root.mkdir(parents=True, exist_ok=True)
        auth = ""
        if htpasswd:
            (root / "htpasswd").write_text(htpasswd + "\n")
            auth = f"auth:\n  htpasswd:\n    realm: imgbuild-test\n    path: {root / 'htpasswd'}\n"
        self.config = root / "config.yml"
        self.config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n  secret: imgbuild-test\n" + auth
        )

    def start(self) -> LocalRegistry:
        log = (self.root / "registry.log").open("ab")
        self.proc = subprocess.Popen([registry_binary(), "serve", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"registry exited: {(self.root / 'registry.log').read_text()[-2000:]}")
            try:
                if requests.get(f"http://{self.host}/v2/", timeout=1).status_code in (200, 401):
                    return self
            except requests.ConnectionError:
                time.sleep(0.1)
        pytest.fail(f"registry on {self.host} did not answer within 15s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    reg = LocalRegistry(tmp_path_factory.mktemp("registry")).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    reg = LocalRegistry(tmp_path_factory.mktemp("auth-registry"), htpasswd=htpasswd_line("ci", "s3cret")).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def pinned_cpu(docker_client, cpu_image):
    """The cpu build, held by a tag of our own so that no other cleanup can remove the image under the tests."""
    pin = f"imgbuild-pushtest/pin:{os.getpid()}"
    repo, tag = pin.split(":")
    docker_client.api.tag(cpu_image.image_id, repo, tag=tag)
    yield cpu_image
    with contextlib.suppress(docker.errors.APIError):
        docker_client.api.remove_image(pin, noprune=True)


def local_tags(client: docker.DockerClient, host: str) -> list[str]:
    return [t for image in client.images.list() for t in image.tags if t.startswith(host + "/")]


def untag_all(client: docker.DockerClient, host: str) -> None:
    for tag in local_tags(client, host):
        client.api.remove_image(tag, noprune=True)


@pytest.mark.docker
def test_push_recipe_pull_back_same_digest(docker_client, pinned_cpu, registry: LocalRegistry) -> None:
    buf = io.StringIO()
    t0 = time.monotonic()
    result = publish.publish(cpu(), f"{registry.host}/team", client=docker_client, arches=["amd64"],
                             progress=PlainPushProgress(buf), retry=publish.Retry(sleep=Sleeps()))  # fmt: skip
    took = time.monotonic() - t0
    repo = f"{registry.host}/team/imgbuild/cpu"
    lock_tag, readable = (r.split(":", 1)[1] for r in pinned_cpu.refs[:2])
    assert [r.target for r in result.refs] == [f"{repo}:{lock_tag}", f"{repo}:{readable}"]
    assert {r.status for r in result.refs} == {"pushed"}
    digest = result.refs[0].digest
    assert digest.startswith("sha256:") and result.refs[1].digest == digest
    assert local_tags(docker_client, registry.host) == [], "temporary tags left behind"
    assert "\x1b" not in buf.getvalue() and f"pushed {repo}:{lock_tag}@{digest}" in buf.getvalue()
    print(f"push of the cpu image: {took:.1f}s")

    try:
        pulled = docker_client.images.pull(repo, tag=lock_tag)
        assert pulled.id == result.image_id
        assert f"{repo}@{digest}" in pulled.attrs["RepoDigests"]
        # and the registry itself serves that digest for the tag
        head = requests.head(f"http://{registry.host}/v2/team/imgbuild/cpu/manifests/{lock_tag}",
                             headers={"Accept": MANIFEST_TYPES}, timeout=10)  # fmt: skip
        assert head.headers["Docker-Content-Digest"] == digest
    finally:
        untag_all(docker_client, registry.host)


@pytest.mark.docker
def test_push_image_through_cli(docker_client, pinned_cpu, registry: LocalRegistry) -> None:
    docker_client.api.tag(pinned_cpu.image_id, "imgbuild-pushtest/cli", tag="v1")
    try:
        result = CliRunner().invoke(
            cli_app(), ["push", "imgbuild-pushtest/cli:v1", "--registry", registry.host, "--json"]
        )
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert [r["target"] for r in data["refs"]] == [f"{registry.host}/imgbuild-pushtest/cli:v1"]
        assert data["refs"][0]["digest"].startswith("sha256:") and data["image_id"] == pinned_cpu.image_id
        assert local_tags(docker_client, registry.host) == []
    finally:
        docker_client.api.remove_image("imgbuild-pushtest/cli:v1", noprune=True)


@pytest.mark.docker
def test_registry_requiring_auth_fails_fast(docker_client, pinned_cpu, auth_registry: LocalRegistry) -> None:
    sleeps, buf = Sleeps(), io.StringIO()
    t0 = time.monotonic()
    with pytest.raises(PushError) as info:
        publish.publish(cpu(), auth_registry.host, client=docker_client, retry=publish.Retry(sleep=sleeps),
                        progress=PlainPushProgress(buf), arches=["amd64"])  # fmt: skip
    print(f"auth failure reported after {time.monotonic() - t0:.2f}s")
    assert "authentication failed" in info.value.message and "no basic auth credentials" in info.value.message
    assert info.value.hint and f"docker login {auth_registry.host}" in info.value.hint
    assert sleeps == [] and buf.getvalue().count("pushing ") == 1, "auth failures must not be retried"
    assert local_tags(docker_client, auth_registry.host) == []


@pytest.mark.docker
def test_registry_with_credentials_accepts(docker_client, pinned_cpu, auth_registry: LocalRegistry) -> None:
    auth = {"username": "ci", "password": "s3cret", "serveraddress": auth_registry.host}
    result = publish.publish(cpu(), auth_registry.host, client=docker_client, auth_config=auth, immutable=True,
                             arches=["amd64"])  # fmt: skip
    assert {r.status for r in result.refs} == {"pushed"}
    again = publish.publish(cpu(), auth_registry.host, client=docker_client, auth_config=auth, immutable=True,
                            arches=["amd64"])  # fmt: skip
    assert {r.status for r in again.refs} == {"already published"}  # the HTTP digest check used basic auth
    assert local_tags(docker_client, auth_registry.host) == []


@pytest.mark.docker
def test_stopped_registry_retries_then_fails(docker_client, pinned_cpu) -> None:
    host = f"127.0.0.1:{free_port()}"  # nothing listens: connection refused
    sleeps = Sleeps()
    with pytest.raises(PushError) as info:
        publish.publish(cpu(), host, client=docker_client, retry=publish.Retry(sleep=sleeps), arches=["amd64"])
    assert sleeps == [1.0, 2.0, 4.0]
    message = info.value.message
    assert host in message and "imgbuild/cpu:lock-" in message and "gave up after 4 attempts" in message
    assert "connection refused" in message
    assert local_tags(docker_client, host) == []


class KillOnUpload(PlainPushProgress):
    """Kills the registry as soon as a large layer starts uploading."""

    def __init__(self, registry: LocalRegistry) -> None:
        self.log = io.StringIO()
        super().__init__(self.log)
        self.registry = registry
        self.killed_at: float | None = None

    def record(self, rec: dict[str, Any]) -> None:
        super().record(rec)
        total = (rec.get("progressDetail") or {}).get("total") or 0
        if self.killed_at is None and rec.get("status") == "Pushing" and total > 1_000_000:
            self.registry.kill()
            self.killed_at = time.monotonic()


@pytest.mark.docker
def test_registry_killed_mid_push(docker_client, pinned_cpu, tmp_path: Path) -> None:
    """The engine retries the layer upload itself (about 50 s), then reports; we retry, then fail clearly."""
    reg = LocalRegistry(tmp_path / "doomed").start()
    observer = KillOnUpload(reg)
    sleeps = Sleeps()
    try:
        with pytest.raises(PushError) as info:
            publish.publish(cpu(), reg.host, client=docker_client, progress=observer,
                            retry=publish.Retry(sleep=sleeps), arches=["amd64"])  # fmt: skip
    finally:
        reg.stop()
    assert observer.killed_at is not None, "the push never started uploading"
    print(observer.log.getvalue())
    assert sleeps == [1.0, 2.0, 4.0], observer.log.getvalue()
    assert reg.host in info.value.message and "gave up after 4 attempts" in info.value.message
    assert local_tags(docker_client, reg.host) == []


@pytest.mark.docker
def test_sigterm_mid_push_removes_the_temporary_tags_and_exits_143(docker_client, pinned_cpu, tmp_path: Path) -> None:
    """SIGTERM (timeout, docker stop, a cancelled CI job) while `imgbuild push` uploads: the re-tags under the
    registry are removed as after Ctrl-C, exit 143."""
    import signal
    import sys

    reg = LocalRegistry(tmp_path / "stopped-push").start()  # empty: every layer has to be uploaded
    proc = subprocess.Popen(
        [sys.executable, "-m", "imgbuild.cli", "push", "cpu", "--platform", "linux/amd64", "--registry", reg.host],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "CI": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    seen = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen += line
            if line.startswith("pushing ") or not line:
                break
        assert line.startswith("pushing "), seen
        assert local_tags(docker_client, reg.host), "the re-tag should exist while the push runs"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, seen + rest
        assert "interrupted" in rest and "Traceback" not in rest
        assert local_tags(docker_client, reg.host) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        untag_all(docker_client, reg.host)
        reg.stop()


@pytest.mark.docker
def test_immutable_tag_same_image_then_different_image(docker_client, pinned_cpu, registry: LocalRegistry) -> None:
    name = f"imgbuild-pushtest/immutable-{dt.datetime.now():%H%M%S%f}"
    docker_client.api.tag(pinned_cpu.image_id, name, tag="v1")
    other = None
    try:
        first = publish.publish(f"{name}:v1", registry.host, client=docker_client, immutable=True)
        assert [r.status for r in first.refs] == ["pushed"]
        # the local digest reference went with the temporary tag: the check compares the registry's config digest
        second = publish.publish(f"{name}:v1", registry.host, client=docker_client, immutable=True)
        assert [(r.status, r.digest) for r in second.refs] == [("already published", first.refs[0].digest)]

        other, _ = docker_client.images.build(
            fileobj=io.BytesIO(f"FROM {pinned_cpu.image_id}\nLABEL io.imgbuild.test=different\n".encode()), rm=True
        )
        docker_client.api.tag(other.id, name, tag="v1")  # same tag, different image
        with pytest.raises(PushError) as info:
            publish.publish(f"{name}:v1", registry.host, client=docker_client, immutable=True)
        assert "already exists in the immutable repository with different content" in info.value.message
        assert first.refs[0].digest in info.value.message
        assert local_tags(docker_client, registry.host) == []
    finally:
        docker_client.api.remove_image(f"{name}:v1", noprune=True)
        if other is not None:  # untagged above, so normally gone already
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.api.remove_image(other.id)


def test_live_progress_renders_without_errors() -> None:
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    progress = push_progress_for(console)
    assert isinstance(progress, LivePushProgress) or os.environ.get("CI")
    live = LivePushProgress(console)
    api = FakeAPI([error_stream("received unexpected HTTP status: 503 Service Unavailable")])
    publisher(api, Sleeps(), progress=live).publish(source())
    assert f"pushed 127.0.0.1:5000/team/imgbuild/cpu:lock-0123456789ab@{DIGEST}" in buf.getvalue()
    assert "retrying in 1s" in buf.getvalue()


@pytest.mark.docker
def test_push_writes_the_sbom_beside_the_push(
    docker_client, pinned_cpu, registry: LocalRegistry, tmp_path, lock_reads: dict[str, int]
) -> None:
    """`push RECIPE --sbom FILE`: the SBOM of the pushed image, named by the registry's manifest digest (Debian's
    distribution 2.8 has no referrers API: the file is what CI keeps, see docs/publishing.md). The whole walk (the
    architectures, the image to push, the push, the SBOM) reads the recipe and its lock once."""
    from imgbuild.image import sbom as doc

    out = tmp_path / "cpu.cdx.json"
    try:
        result = CliRunner().invoke(
            cli_app(),
            ["push", "cpu", "--platform=linux/amd64", "-r", f"{registry.host}/sbom", "--json", "--sbom", str(out)],
        )
        assert result.exit_code == 0, result.output
        assert lock_reads == {"for_ref": 1, "resolve": 1}
        digest = json.loads(result.stdout)["refs"][0]["digest"]
        text = out.read_text()
        doc.validate(text)
        image = json.loads(text)["metadata"]["component"]
        assert image["purl"] == f"pkg:oci/cpu@{digest}?repository_url={registry.host}/sbom/imgbuild/cpu"
        assert doc.components_named(text, "openmpi-bin") and doc.components_named(text, "nvidia-nccl-cu12")
    finally:
        untag_all(docker_client, registry.host)
    refused = CliRunner().invoke(cli_app(), ["push", "imgbuild-pushtest/x:1", "-r", registry.host, "--sbom", "f"])
    assert refused.exit_code == 2 and "not a recipe" in refused.output
