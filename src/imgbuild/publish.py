"""`imgbuild push`: re-tag an image under a registry, push it with retries, report the pushed digest.

What is pushed: a recipe's lock-derived refs (``imgbuild/cpu:lock-<12hex>`` and the readable tag), or the
tags of a local image. Each ``<repo>:<tag>`` becomes ``HOST[/PREFIX]/<repo>:<tag>``, is tagged in the engine
for the push and untagged afterwards, whatever happens (a tag that was already there is left, or put back).

The push goes through docker-py's low-level API and its JSON stream is read by hand: an ``error`` /
``errorDetail`` record is a failure although the HTTP call succeeded, and the ``aux`` record carries the
digest. Failures are sorted three ways:

* transient (registry 5xx, connection reset/refused, EOF, timeouts): retried with exponential backoff
  (`Retry`: 4 tries, 1, 2, 4 s between them), then a `PushError` naming registry, ref and last error;
* authentication ("unauthorized", "no basic auth credentials", "denied"): a `PushError` at once, with a hint
  about ``docker login`` or AWS credentials;
* everything else: a `PushError` at once.

Immutable repositories (ECR's default here, or ``immutable=True``): before pushing, the registry's manifest
for the tag is fetched over the registry HTTP API (``GET /v2/<name>/manifests/<tag>``). Absent: push. Present
and the same image (its manifest digest is one of the image's RepoDigests, or its config digest is the local
image id): "already published", a success. Present and different: a `PushError`. ECR's own refusal ("tag
invalid: ... already exists") is read the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, TextIO

import docker
import docker.auth
import docker.errors
import docker.utils
import requests
import requests.exceptions
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TaskID, TextColumn

from imgbuild.errors import EngineError, Interrupted, PushError

__all__ = [
    "Destination",
    "PlainProgress",
    "PublishResult",
    "Publisher",
    "PushObserver",
    "PushedRef",
    "RegistryAPI",
    "RemoteManifest",
    "Retry",
    "Source",
    "classify",
    "matrix",
    "parse_registry",
    "progress_for",
    "resolve_source",
]

log = logging.getLogger("imgbuild.publish")

LOGIN_HINT = "run `docker login {host}` (credentials go to ~/.docker/config.json or a credential helper) and retry"
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
    )
)

Kind = Literal["transient", "auth", "exists", "fatal"]

_EXISTS = re.compile(
    r"tag invalid|ImageTagAlreadyExists|already exists in the .* repository|cannot be overwritten", re.I
)
_AUTH = re.compile(
    r"unauthori[sz]ed|no basic auth credentials|\bdenied\b|authentication required|authorization token has expired"
    r"|incorrect username or password|\b401\b",
    re.I,
)
_TRANSIENT = re.compile(
    r"received unexpected HTTP status: 5\d\d|\b5\d\d (?:Internal Server Error|Bad Gateway|Service Unavailable"
    r"|Gateway Timeout)|connection reset|connection refused|broken pipe|\bEOF\b|i/o timeout|TLS handshake timeout"
    r"|timeout exceeded|request canceled|server closed idle connection|toomanyrequests|too many requests"
    r"|no route to host|network is unreachable|temporary failure in name resolution",
    re.I,
)
_DOMAIN_RE = re.compile(r"^(?:localhost|[^/]*[.:][^/]*)(?::\d+)?$")
_PATH_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_IMAGE_ID_RE = re.compile(r"^(?:sha256:)?[0-9a-f]{12,64}$")


def classify(message: str) -> Kind:
    """Which of the retry policies a push error message falls under."""
    if _EXISTS.search(message):
        return "exists"
    if _AUTH.search(message):
        return "auth"
    if _TRANSIENT.search(message):
        return "transient"
    return "fatal"


class _Retryable(Exception):
    """A transient failure of one attempt."""


# --------------------------------------------------------------------------------------------------------
# where to


@dataclass(frozen=True)
class Destination:
    """``HOST[/PREFIX]``: a registry host and an optional path prefix inside it."""

    host: str
    prefix: str = ""

    def path(self, repo: str) -> str:
        """The repository's name inside the registry (``team/imgbuild/cpu``)."""
        return f"{self.prefix}/{repo}" if self.prefix else repo

    def repository(self, repo: str) -> str:
        """The full repository reference (``127.0.0.1:5000/team/imgbuild/cpu``)."""
        return f"{self.host}/{self.path(repo)}"

    def __str__(self) -> str:
        return f"{self.host}/{self.prefix}" if self.prefix else self.host


def parse_registry(value: str) -> Destination:
    """``HOST[:PORT][/PREFIX]`` (a leading https:// is dropped) -> Destination."""
    text = value.strip().removeprefix("https://").removeprefix("http://").strip("/")
    host, _, prefix = text.partition("/")
    if not host or not _DOMAIN_RE.match(host):
        raise PushError(
            f"--registry {value!r}: the first part must be a registry host (with a dot or a port, or localhost)",
            hint="e.g. --registry 127.0.0.1:5000/team or --registry 123456789012.dkr.ecr.us-east-1.amazonaws.com",
        )
    for part in prefix.split("/") if prefix else []:
        if not _PATH_COMPONENT_RE.match(part):
            raise PushError(f"--registry {value!r}: {part!r} is not a valid repository path component",
                            hint="lowercase letters, digits and single separators (. _ -)")  # fmt: skip
    return Destination(host=host.lower(), prefix=prefix)


def _split_ref(ref: str) -> tuple[str, str]:
    repo, tag = docker.utils.parse_repository_tag(ref)
    return repo, tag or "latest"


def _strip_domain(repo: str) -> str:
    """``ghcr.io/org/x`` -> ``org/x``; ``imgbuild/cpu`` stays."""
    first, sep, rest = repo.partition("/")
    return rest if sep and _DOMAIN_RE.match(first) else repo


# --------------------------------------------------------------------------------------------------------
# what


@dataclass(frozen=True)
class Source:
    """A local image and the refs of it to publish (``<repo>:<tag>``)."""

    image_id: str
    refs: tuple[str, ...]
    repo_digests: tuple[str, ...] = ()
    recipe: str | None = None


def _is_recipe(what: str) -> bool:
    from imgbuild import recipe

    return what.endswith((".yaml", ".yml")) or what in recipe.shipped_names()


def _inspect(client: docker.DockerClient, ref: str) -> dict[str, Any] | None:
    try:
        return dict(client.api.inspect_image(ref))
    except docker.errors.NotFound:
        return None
    except docker.errors.APIError as exc:
        if exc.status_code == 400:
            return None
        raise EngineError(f"the engine failed to look up image {ref}: {_reason(exc)}") from exc
    except (requests.exceptions.RequestException, docker.errors.DockerException) as exc:
        raise EngineError(f"lost the Docker engine while looking up {ref}: {_reason(exc)}") from exc


def resolve_source(client: docker.DockerClient, what: str) -> Source:
    """RECIPE -> its lock-derived refs (which must be built); IMAGE -> that image's tags.

    An IMAGE given by name (``imgbuild/cpu:lock-...``) publishes every tag of that image in the same repository;
    given by id, every tag of the image that names no registry.
    """
    if _is_recipe(what):
        from imgbuild import build, render

        _, resolved, _ = build.prepare(what)
        plan = render.plan(resolved)
        refs = plan.image_refs
        found = _inspect(client, refs[0])
        if found is None:
            raise PushError(f"{refs[0]} is not in the engine: recipe {plan.recipe} has not been built from its lock",
                            hint=f"imgbuild build {what}")  # fmt: skip
        image_id = str(found["Id"])
        for ref in refs[1:]:
            other = _inspect(client, ref)
            if other is None or other["Id"] != image_id:
                state = "is not in the engine" if other is None else f"is a different image ({other['Id'][:19]})"
                raise PushError(f"{ref} {state}; expected the image of {refs[0]} ({image_id[:19]})",
                                hint=f"imgbuild build {what}")  # fmt: skip
        return Source(image_id, tuple(refs), tuple(found.get("RepoDigests") or ()), plan.recipe)

    found = _inspect(client, what)
    if found is None:
        raise PushError(f"{what!r} is neither a recipe nor an image in the engine",
                        hint="`imgbuild list` names the recipes; `docker images` the images")  # fmt: skip
    tags = [t for t in (found.get("RepoTags") or []) if t and t != "<none>:<none>"]
    if _IMAGE_ID_RE.match(what):
        refs = [t for t in tags if _strip_domain(_split_ref(t)[0]) == _split_ref(t)[0]]
    else:
        name = _split_ref(what)[0]
        refs = [t for t in tags if _split_ref(t)[0] == name]
    if not refs:
        raise PushError(f"image {what} has no tags to publish", hint="tag it first: docker tag IMAGE NAME:TAG")
    return Source(str(found["Id"]), tuple(dict.fromkeys(refs)), tuple(found.get("RepoDigests") or ()))


# --------------------------------------------------------------------------------------------------------
# retries and progress


@dataclass(frozen=True)
class Retry:
    """Bounded retries with exponential backoff: `attempts` tries, `delay_s` * `factor`**n between them."""

    attempts: int = 4
    delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 60.0
    sleep: Callable[[float], None] = time.sleep

    def delay(self, failed_attempt: int) -> float:
        return float(min(self.delay_s * self.factor ** (failed_attempt - 1), self.max_delay_s))


class PushObserver(Protocol):
    """What a push reports as it runs (`PlainProgress`, `LiveProgress`, or a test's own)."""

    def start(self, target: str, attempt: int) -> None: ...
    def record(self, rec: dict[str, Any]) -> None: ...
    def retry(self, target: str, attempt: int, attempts: int, error: str, delay_s: float) -> None: ...
    def done(self, pushed: PushedRef) -> None: ...
    def failed(self, target: str, message: str) -> None: ...
    def close(self) -> None: ...


class _Quiet:
    def start(self, target: str, attempt: int) -> None:
        pass

    def record(self, rec: dict[str, Any]) -> None:
        pass

    def retry(self, target: str, attempt: int, attempts: int, error: str, delay_s: float) -> None:
        pass

    def done(self, pushed: PushedRef) -> None:
        pass

    def failed(self, target: str, message: str) -> None:
        pass

    def close(self) -> None:
        pass


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


class PlainProgress(_Quiet):
    """One line per layer state change (no byte counters, no escape sequences): fit for a CI log."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._status: dict[str, str] = {}

    def _write(self, text: str) -> None:
        out = self._stream if self._stream is not None else sys.stderr
        out.write(text + "\n")
        out.flush()

    def start(self, target: str, attempt: int) -> None:
        self._status.clear()
        self._write(f"pushing {target}" + (f" (attempt {attempt})" if attempt > 1 else ""))

    def record(self, rec: dict[str, Any]) -> None:
        status = str(rec.get("status") or "").strip()
        layer = str(rec.get("id") or "")
        if not status or "aux" in rec:
            return
        if not layer:
            self._write(f"  {status}")
            return
        previous = self._status.get(layer, "")
        self._status[layer] = status
        if status in ("Preparing", "Waiting") or status == previous:
            return
        if status.startswith("Retrying in") and previous.startswith("Retrying in"):
            return
        if status == "Pushing":
            total = (rec.get("progressDetail") or {}).get("total")
            self._write(f"  {layer}: pushing" + (f" {_human(int(total))}" if total else ""))
            return
        self._write(f"  {layer}: {status}")

    def retry(self, target: str, attempt: int, attempts: int, error: str, delay_s: float) -> None:
        self._write(f"push of {target} failed (attempt {attempt}/{attempts}): {error}; retrying in {delay_s:g}s")

    def done(self, pushed: PushedRef) -> None:
        self._write(f"{pushed.status} {pushed.target}@{pushed.digest}")

    def failed(self, target: str, message: str) -> None:
        self._write(f"push of {target} failed: {message}")


class LiveProgress(_Quiet):
    """A rich progress bar per layer on an interactive terminal; summary lines stay, bars go."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bars: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def _ensure(self) -> Progress:
        if self._bars is None:
            self._bars = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                console=self.console,
                transient=True,
            )
            self._bars.start()
        return self._bars

    def _stop(self) -> None:
        if self._bars is not None:
            self._bars.stop()
        self._bars = None
        self._tasks.clear()

    def start(self, target: str, attempt: int) -> None:
        self._stop()
        self.console.print(
            f"pushing {target}" + (f" (attempt {attempt})" if attempt > 1 else ""),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        self._ensure()

    def record(self, rec: dict[str, Any]) -> None:
        layer = str(rec.get("id") or "")
        status = str(rec.get("status") or "").strip()
        if not layer or not status or self._bars is None:
            return
        detail = rec.get("progressDetail") or {}
        if layer not in self._tasks:
            self._tasks[layer] = self._bars.add_task(f"{layer} {status}", total=None)
        task = self._tasks[layer]
        if status == "Pushing" and detail.get("total"):
            self._bars.update(task, description=f"{layer} {status}", completed=detail.get("current", 0),
                              total=detail["total"])  # fmt: skip
        elif status in ("Pushed", "Layer already exists") or status.startswith("Mounted from"):
            total = self._bars.tasks[task].total or 1
            self._bars.update(task, description=f"{layer} {status}", completed=total, total=total)
        else:
            self._bars.update(task, description=f"{layer} {status}")

    def retry(self, target: str, attempt: int, attempts: int, error: str, delay_s: float) -> None:
        self._stop()
        self.console.print(f"push of {target} failed (attempt {attempt}/{attempts}): {error}; "
                           f"retrying in {delay_s:g}s", markup=False, highlight=False, soft_wrap=True)  # fmt: skip

    def done(self, pushed: PushedRef) -> None:
        self._stop()
        self.console.print(
            f"{pushed.status} {pushed.target}@{pushed.digest}", markup=False, highlight=False, soft_wrap=True
        )

    def failed(self, target: str, message: str) -> None:
        self._stop()

    def close(self) -> None:
        self._stop()


def progress_for(console: Console | None = None) -> PushObserver:
    """Live bars on an interactive terminal; plain lines when not a TTY or when CI is set."""
    console = console or Console(stderr=True)
    ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    if console.is_terminal and not console.is_dumb_terminal and not ci:
        return LiveProgress(console)
    return PlainProgress(console.file)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------
# the registry HTTP API (manifest lookups for immutable tags)


@dataclass(frozen=True)
class RemoteManifest:
    digest: str
    media_type: str
    config_digest: str | None


class RegistryAPI:
    """Just enough of the registry v2 API to read a tag's manifest: https (http too for insecure registries),
    basic auth or a bearer token from the registry's realm."""

    def __init__(
        self,
        host: str,
        *,
        insecure: bool = False,
        credentials: Callable[[], tuple[str, str] | None] = lambda: None,
        timeout_s: float = 20.0,
    ) -> None:
        self.host = host
        self.schemes = ["https", "http"] if insecure else ["https"]
        self._credentials = credentials
        self.timeout_s = timeout_s
        self._session = requests.Session()

    def close(self) -> None:
        self._session.close()

    def manifest(self, name: str, tag: str) -> RemoteManifest | None:
        """The manifest of ``name:tag``, None when the registry has no such tag (or repository)."""
        resp = self._get(f"/v2/{name}/manifests/{tag}", scope=f"repository:{name}:pull")
        if resp.status_code == 404:
            return None
        if resp.status_code in (401, 403):
            raise PushError(f"{self.host}: authentication failed reading {name}:{tag} ({resp.status_code})",
                            hint=LOGIN_HINT.format(host=self.host))  # fmt: skip
        if resp.status_code >= 500 or resp.status_code == 429:
            raise _Retryable(f"{self.host} answered {resp.status_code} for the manifest of {name}:{tag}")
        if resp.status_code != 200:
            raise PushError(f"{self.host}: unexpected answer {resp.status_code} reading the manifest of {name}:{tag}: "
                            f"{resp.text[:300]}")  # fmt: skip
        body = resp.content
        digest = resp.headers.get("Docker-Content-Digest") or f"sha256:{hashlib.sha256(body).hexdigest()}"
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        config = data.get("config") if isinstance(data, dict) else None
        return RemoteManifest(
            digest=digest,
            media_type=str(data.get("mediaType") or resp.headers.get("Content-Type", "")),
            config_digest=str(config["digest"]) if isinstance(config, dict) and "digest" in config else None,
        )

    def _get(self, path: str, *, scope: str) -> requests.Response:
        last: Exception | None = None
        for scheme in list(self.schemes):
            try:
                resp = self._request(f"{scheme}://{self.host}{path}", scope)
            except (requests.exceptions.SSLError, requests.exceptions.ConnectionError) as exc:
                last = exc
                continue
            except requests.exceptions.RequestException as exc:
                raise _Retryable(f"{self.host}: {_reason(exc)}") from exc
            self.schemes = [scheme]  # remember what works
            return resp
        raise _Retryable(f"cannot reach {self.host}: {_reason(last) if last else 'no scheme left'}")

    def _request(self, url: str, scope: str) -> requests.Response:
        headers = {"Accept": MANIFEST_TYPES}
        resp = self._session.get(url, headers=headers, timeout=self.timeout_s)
        if resp.status_code != 401:
            return resp
        challenge = resp.headers.get("WWW-Authenticate", "")
        creds = self._credentials()
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if creds is None:
                return resp
            return self._session.get(url, headers=headers, auth=creds, timeout=self.timeout_s)
        if scheme.lower() == "bearer":
            fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
            realm = fields.get("realm")
            if not realm:
                return resp
            query = {"service": fields.get("service", ""), "scope": fields.get("scope", scope)}
            token_resp = self._session.get(realm, params=query, auth=creds, timeout=self.timeout_s)
            if token_resp.status_code != 200:
                return resp
            token = token_resp.json().get("token") or token_resp.json().get("access_token")
            if not token:
                return resp
            return self._session.get(url, headers={**headers, "Authorization": f"Bearer {token}"},
                                     timeout=self.timeout_s)  # fmt: skip
        return resp


def _engine_insecure(client: docker.DockerClient, host: str) -> bool:
    """Whether the engine talks plain HTTP to `host` (its insecure-registries list; 127.0.0.0/8 by default)."""
    try:
        config = client.api.info().get("RegistryConfig") or {}
    except Exception:
        config = {}
    index = (config.get("IndexConfigs") or {}).get(host)
    if isinstance(index, dict) and "Secure" in index:
        return not bool(index["Secure"])
    cidrs = config.get("InsecureRegistryCIDRs") or ["127.0.0.0/8"]
    name = host.rsplit(":", 1)[0].strip("[]") if not host.endswith("]") else host.strip("[]")
    addresses: set[str] = set()
    try:
        addresses.add(str(ipaddress.ip_address(name)))
    except ValueError:
        with contextlib.suppress(OSError):
            addresses.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
    for address in addresses:
        with contextlib.suppress(ValueError):
            ip = ipaddress.ip_address(address)
            if ip.is_loopback or any(ip in ipaddress.ip_network(c, strict=False) for c in cidrs):
                return True
    return False


def _docker_credentials(host: str) -> tuple[str, str] | None:
    """What `docker login HOST` stored (config.json or a credential helper)."""
    with contextlib.suppress(Exception):
        found = docker.auth.load_config().resolve_authconfig(host) or {}
        user = found.get("username") or found.get("Username")
        password = found.get("password") or found.get("Password")
        if user and password:
            return str(user), str(password)
    return None


# --------------------------------------------------------------------------------------------------------
# pushing


@dataclass(frozen=True)
class PushedRef:
    source: str  # imgbuild/cpu:lock-...
    target: str  # 127.0.0.1:5000/team/imgbuild/cpu:lock-...
    digest: str  # sha256:... of the manifest in the registry
    size: int | None
    status: Literal["pushed", "already published"]
    attempts: int


@dataclass(frozen=True)
class PublishResult:
    registry: str
    image_id: str
    refs: tuple[PushedRef, ...]
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"registry": self.registry, "image_id": self.image_id, "refs": [asdict(r) for r in self.refs],
                "warnings": list(self.warnings)}  # fmt: skip


@dataclass
class _Attempt:
    digest: str | None = None
    size: int | None = None
    error: str | None = None
    records: int = 0
    statuses: list[str] = field(default_factory=list)


class Publisher:
    """Pushes images to one registry (an `ecr.EcrRegistry` for ECR: credentials and repositories from AWS).

    `immutable`: None follows the repository (ECR's tag mutability; False for other registries); True makes
    the digest check run first on any registry (tests use it on a plain registry:2).
    """

    def __init__(
        self,
        client: docker.DockerClient,
        destination: Destination,
        *,
        ecr: Any | None = None,
        immutable: bool | None = None,
        retry: Retry | None = None,
        progress: PushObserver | None = None,
        auth_config: dict[str, str] | None = None,
    ) -> None:
        self.client = client
        self.destination = destination
        self.ecr = ecr
        self.immutable = immutable
        self.retry = retry or Retry()
        self.progress: PushObserver = progress or _Quiet()
        self._auth_config = auth_config
        self._api: RegistryAPI | None = None

    # -- credentials ---------------------------------------------------------------------------------------
    def _auth(self) -> dict[str, str] | None:
        if self.ecr is not None:
            return dict(self.ecr.auth_config())
        return self._auth_config  # None: docker-py sends what `docker login` stored

    def _credentials(self) -> tuple[str, str] | None:
        auth = self._auth()
        if auth and auth.get("username") and auth.get("password"):
            return auth["username"], auth["password"]
        return _docker_credentials(self.destination.host)

    def registry_api(self) -> RegistryAPI:
        if self._api is None:
            insecure = _engine_insecure(self.client, self.destination.host)
            self._api = RegistryAPI(self.destination.host, insecure=insecure, credentials=self._credentials)
        return self._api

    def _hint(self) -> str:
        if self.ecr is not None:
            from imgbuild.ecr import CREDENTIALS_HINT

            return CREDENTIALS_HINT
        return LOGIN_HINT.format(host=self.destination.host)

    # -- the whole image -----------------------------------------------------------------------------------
    def publish(self, source: Source) -> PublishResult:
        pushed: list[PushedRef] = []
        warnings: list[str] = []
        try:
            for ref in source.refs:
                pushed.append(self.push_ref(source, ref, warnings))
        finally:
            self.progress.close()
            if self._api is not None:
                self._api.close()
                self._api = None
        return PublishResult(str(self.destination), source.image_id, tuple(pushed), tuple(warnings))

    def _is_immutable(self, path: str) -> bool:
        repo = self.ecr.repository(path) if self.ecr is not None else None  # creates it when missing
        if self.immutable is not None:
            return self.immutable
        return bool(repo is not None and repo.immutable)

    def push_ref(self, source: Source, ref: str, warnings: list[str] | None = None) -> PushedRef:
        """Push one local ref; the temporary tag is removed (or the previous one restored) whatever happens."""
        src_repo, tag = _split_ref(ref)
        path = self.destination.path(_strip_domain(src_repo))
        target_repo = self.destination.repository(_strip_domain(src_repo))
        target = f"{target_repo}:{tag}"
        immutable = self._is_immutable(path)
        previous = _inspect(self.client, target)
        previous_id = str(previous["Id"]) if previous else None
        try:
            self._tag(source.image_id, target_repo, tag, target)
            return self._push_with_retries(source, ref, path, target_repo, tag, target, immutable)
        except KeyboardInterrupt:
            self.progress.failed(target, "interrupted")
            raise Interrupted(f"push of {target} interrupted; temporary tags removed") from None
        finally:
            problem = self._untag(source.image_id, target_repo, tag, target, previous_id)
            if problem and warnings is not None:
                warnings.append(problem)

    def _tag(self, image_id: str, repo: str, tag: str, target: str) -> None:
        try:
            self.client.api.tag(image_id, repo, tag=tag, force=True)
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            raise EngineError(f"cannot tag {image_id[:19]} as {target}: {_reason(exc)}") from exc

    def _untag(self, image_id: str, repo: str, tag: str, target: str, previous_id: str | None) -> str | None:
        try:
            if previous_id is None:
                if _inspect(self.client, target) is not None:
                    self.client.api.remove_image(target, noprune=True)
            elif previous_id != image_id:
                self.client.api.tag(previous_id, repo, tag=tag, force=True)
        except (docker.errors.APIError, requests.exceptions.RequestException, EngineError) as exc:
            message = f"could not remove the temporary tag {target}: {_reason(exc)}"
            log.warning(message)
            return message
        return None

    # -- one ref -------------------------------------------------------------------------------------------
    def _push_with_retries(
        self, source: Source, ref: str, path: str, target_repo: str, tag: str, target: str, immutable: bool
    ) -> PushedRef:
        attempts = max(1, self.retry.attempts)
        refreshed = False
        attempt = 0
        while True:
            attempt += 1
            try:
                if immutable:
                    remote = self.registry_api().manifest(path, tag)
                    if remote is not None:
                        return self._existing(source, ref, target, remote, attempt)
                self.progress.start(target, attempt)
                result = self._push_once(target_repo, tag)
                if result.error is None:
                    if not result.digest:
                        raise self._fail(target, "the engine reported no digest for the push", attempt)
                    pushed = PushedRef(ref, target, result.digest, result.size, "pushed", attempt)
                    self.progress.done(pushed)
                    return pushed
                kind = classify(result.error)
                if kind == "exists":
                    remote = self.registry_api().manifest(path, tag)
                    if remote is not None:
                        return self._existing(source, ref, target, remote, attempt)
                    raise self._fail(target, result.error, attempt)
                if kind == "auth":
                    if self.ecr is not None and not refreshed:  # an ECR token can expire mid-publish: ask once
                        refreshed = True
                        self.ecr.tokens.invalidate()
                        attempt -= 1
                        continue
                    raise self._fail(target, f"authentication failed: {result.error}", attempt, hint=self._hint())
                if kind == "transient":
                    raise _Retryable(result.error)
                raise self._fail(target, result.error, attempt)
            except _Retryable as exc:
                if attempt >= attempts:
                    raise self._fail(target, f"gave up after {attempt} attempts; last error: {exc}", attempt,
                                     hint="the registry may be down or overloaded; retry later") from None  # fmt: skip
                delay = self.retry.delay(attempt)
                log.warning("push of %s failed (attempt %d/%d): %s; retrying in %gs", target, attempt, attempts, exc,
                            delay)  # fmt: skip
                self.progress.retry(target, attempt, attempts, str(exc), delay)
                self.retry.sleep(delay)

    def _fail(self, target: str, message: str, attempt: int, *, hint: str | None = None) -> PushError:
        self.progress.failed(target, message)
        return PushError(f"push of {target} to {self.destination.host} failed: {message}", hint=hint)

    def _existing(self, source: Source, ref: str, target: str, remote: RemoteManifest, attempt: int) -> PushedRef:
        local_digests = {d.partition("@")[2] for d in source.repo_digests}
        local_digests |= {d.partition("@")[2] for d in (self._repo_digests(source.image_id))}
        if remote.digest in local_digests or remote.config_digest == source.image_id:
            pushed = PushedRef(ref, target, remote.digest, None, "already published", attempt)
            self.progress.done(pushed)
            return pushed
        raise self._fail(
            target,
            f"the tag already exists in the immutable repository with different content: the registry has "
            f"{remote.digest} (image {remote.config_digest or 'unknown'}), the local image is {source.image_id}",
            attempt,
            hint="a published tag is never overwritten: change the recipe's lock (a new lock-<hash> tag) or delete "
            "the tag in the registry on purpose",
        )

    def _repo_digests(self, image_id: str) -> list[str]:
        found = _inspect(self.client, image_id)
        return list((found or {}).get("RepoDigests") or [])

    def _push_once(self, target_repo: str, tag: str) -> _Attempt:
        result = _Attempt()
        try:
            stream = self.client.api.push(target_repo, tag=tag, stream=True, decode=True, auth_config=self._auth())
            for rec in _records(stream):
                result.records += 1
                self.progress.record(rec)
                if "error" in rec or "errorDetail" in rec:
                    detail = rec.get("errorDetail") or {}
                    result.error = str(detail.get("message") or rec.get("error") or "unknown push error").strip()
                    break
                aux = rec.get("aux")
                if isinstance(aux, dict) and aux.get("Digest"):
                    result.digest = str(aux["Digest"])
                    result.size = int(aux["Size"]) if aux.get("Size") is not None else None
        except docker.errors.APIError as exc:  # the engine refused before streaming (e.g. no such local tag)
            result.error = _reason(exc)
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
            raise EngineError(f"lost the Docker engine during the push of {target_repo}:{tag}: {_reason(exc)}",
                              hint="is the engine still running? `imgbuild doctor` checks it") from exc  # fmt: skip
        return result


def _records(stream: Any) -> Iterator[dict[str, Any]]:
    for rec in stream:
        if isinstance(rec, dict):
            yield rec
        elif isinstance(rec, bytes | str):  # not decoded (older docker-py): one JSON object per line
            for line in (rec.decode(errors="replace") if isinstance(rec, bytes) else rec).splitlines():
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict):
                        yield obj


def _reason(exc: BaseException) -> str:
    if isinstance(exc, docker.errors.APIError):
        return str(exc.explanation or exc).strip()
    text = str(exc).strip() or type(exc).__name__
    m = re.search(r"\[Errno \d+\] [^'\"()]+", text)
    return m.group(0).strip() if m else text[:400]


# --------------------------------------------------------------------------------------------------------
# the whole command


def publish(
    what: str,
    registry: str | None,
    *,
    ecr: bool = False,
    immutable: bool | None = None,
    retry: Retry | None = None,
    progress: PushObserver | None = None,
    client: docker.DockerClient | None = None,
    auth_config: dict[str, str] | None = None,
    ecr_registry: Any | None = None,
) -> PublishResult:
    """`imgbuild push WHAT --registry HOST[/PREFIX] [--ecr]`."""
    from imgbuild import engine

    if ecr_registry is None and (ecr or (registry and _ecr_host(registry))):
        from imgbuild.ecr import EcrRegistry

        host = parse_registry(registry).host if registry else None
        ecr_registry = EcrRegistry(host)
    if registry:
        destination = parse_registry(registry)
    elif ecr_registry is not None:
        destination = Destination(ecr_registry.host)
    else:
        raise PushError("no registry given", hint="--registry HOST[/PREFIX], or --ecr for your account's ECR")
    own = client is None
    docker_client = engine.connect() if client is None else client
    try:
        source = resolve_source(docker_client, what)
        publisher = Publisher(docker_client, destination, ecr=ecr_registry, immutable=immutable, retry=retry,
                              progress=progress, auth_config=auth_config)  # fmt: skip
        return publisher.publish(source)
    finally:
        if own:
            docker_client.close()


def _ecr_host(registry: str) -> bool:
    from imgbuild.ecr import parse_host

    return parse_host(registry.strip().removeprefix("https://").split("/")[0]) is not None


# --------------------------------------------------------------------------------------------------------
# CI matrix

RUNNERS: dict[str, list[str]] = {
    "none": ["ubuntu-latest"],
    "nvidia": ["self-hosted", "gpu"],
    "gaudi": ["self-hosted", "gaudi"],
}


def matrix(names: list[str] | None = None) -> dict[str, Any]:
    """The buildable recipes and their tags, as a GitHub Actions job matrix (``{"include": [...]}``).

    Each entry: recipe, image (repository), tags (content-addressed first), accelerator, runner (labels joined
    by spaces, for people) and runs_on (the label list, for ``runs-on:``). Only recipes with a fresh lock are
    publishable: a missing or stale lock is an error naming the recipe.
    """
    from imgbuild import lock, recipe, render
    from imgbuild.errors import LockError, RecipeError

    include = []
    for name in names or recipe.shipped_names():
        loaded = recipe.load(name)
        if loaded.recipe.abstract:
            if names:
                raise RecipeError(f"{name} is abstract (a parent): nothing to build")
            continue
        resolved = lock.read(loaded)
        if resolved is None:
            raise LockError(
                f"{name} has no lock: a published image must come from a lock", hint=f"imgbuild lock {name}"
            )
        plan = render.plan(resolved)
        accelerator = loaded.recipe.platform.accelerator
        labels = RUNNERS[accelerator]
        include.append({
            "recipe": plan.recipe,
            "image": plan.repository,
            "tags": list(plan.tags),
            "accelerator": accelerator,
            "runner": " ".join(labels),
            "runs_on": labels,
        })  # fmt: skip
    return {"include": include}
