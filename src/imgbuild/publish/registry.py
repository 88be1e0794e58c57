"""Registries: where to push (`parse_registry`: ``HOST[/PREFIX]``), just enough of their HTTP API (v2) to read a
tag's manifest and to put an image index under a tag, and what the engine knows about them.

`publish` uses it for immutable tags: before pushing, it asks the registry whether the tag exists and which image
it holds (``GET /v2/<name>/manifests/<tag>``); a multi-architecture image's OCI image index, which the engine cannot
push, goes up with ``PUT /v2/<name>/manifests/<tag>`` (`RegistryAPI.put_manifest`). `engine_insecure` tells whether
the engine talks plain HTTP to the registry (so may we); `docker_credentials` reads what ``docker login`` stored for
it.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import docker
import docker.auth
import requests
import requests.exceptions

from imgbuild.core import imageref
from imgbuild.core.errors import PushError
from imgbuild.engine.client import reason

__all__ = [
    "CREDENTIALS_HINT",
    "LOGIN_HINT",
    "MANIFEST_TYPES",
    "OCI_INDEX",
    "Destination",
    "RegistryAPI",
    "RemoteManifest",
    "TransientError",
    "docker_credentials",
    "engine_insecure",
    "parse_registry",
    "strip_domain",
]

LOGIN_HINT = "run `docker login {host}` (credentials go to ~/.docker/config.json or a credential helper) and retry"
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
    )
)


OCI_INDEX = "application/vnd.oci.image.index.v1+json"

_DOMAIN_RE = re.compile(r"^(?:localhost|[^/]*[.:][^/]*)(?::\d+)?\Z")
# What parse_registry takes as a host: DNS letters, digits, dots and dashes (or a bracketed IPv6 address), a port.
_HOST_RE = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::\d{1,5})?\Z")
_PATH_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")


class TransientError(Exception):
    """A failure worth another attempt: the registry answered 5xx or 429, or could not be reached."""


# --------------------------------------------------------------------------------------------------------
# addresses


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


MAX_DESTINATION = 200  # leaves room for /imgbuild/<recipe> in Docker's 255-character repository names
CREDENTIALS_HINT = (
    "leave USER:PASSWORD@ out of the address and run `docker login HOST` once (credentials go to "
    "~/.docker/config.json or a credential helper); for Amazon ECR, --ecr takes your AWS credentials"
)


def parse_registry(value: str) -> Destination:
    """``HOST[:PORT][/PREFIX]`` (a leading https:// is dropped) -> Destination.

    An address with credentials (``USER:PASSWORD@HOST``) is refused without repeating any of it: a password on a
    command line or in IMGBUILD_REGISTRY would reach shell history, process lists and CI logs, and the engine takes
    credentials from ``docker login`` only."""
    if "@" in value:
        raise PushError("the registry address holds credentials (USER:PASSWORD@HOST); imgbuild takes none there "
                        "and does not repeat them", hint=CREDENTIALS_HINT)  # fmt: skip
    text = value.strip().removeprefix("https://").removeprefix("http://").strip("/")
    if len(text) > MAX_DESTINATION:
        raise PushError(f"--registry {text[:40]!r}...: {len(text)} characters; a repository's whole name (registry, "
                        f"prefix and image) holds at most 255, so HOST[/PREFIX] at most {MAX_DESTINATION}")  # fmt: skip
    host, _, prefix = text.partition("/")
    if not host or not _DOMAIN_RE.match(host) or not _HOST_RE.match(host):
        raise PushError(
            f"--registry {value!r}: the first part must be a registry host (with a dot or a port, or localhost)",
            hint="e.g. --registry 127.0.0.1:5000/team or --registry 123456789012.dkr.ecr.us-east-1.amazonaws.com",
        )
    for part in prefix.split("/") if prefix else []:
        if not _PATH_COMPONENT_RE.match(part):
            raise PushError(f"--registry {value!r}: {part!r} is not a valid repository path component",
                            hint="lowercase letters, digits and single separators (. _ -)")  # fmt: skip
    return Destination(host=host.lower(), prefix=prefix)


def strip_domain(repo: str) -> str:
    """``ghcr.io/org/x`` -> ``org/x``; ``imgbuild/cpu`` stays."""
    return imageref.parse(repo, where="the repository", error=PushError).path


# --------------------------------------------------------------------------------------------------------
# the HTTP API


@dataclass(frozen=True)
class RemoteManifest:
    digest: str
    media_type: str
    config_digest: str | None
    # The document and its length in bytes (an index's descriptor of it needs them): what the digest stands for,
    # so not compared.
    size: int | None = field(default=None, compare=False)
    body: bytes = field(default=b"", compare=False, repr=False)


class RegistryAPI:
    """Just enough of the registry v2 API to read a tag's manifest and put one: https (http too for insecure
    registries), basic auth or a bearer token from the registry's realm."""

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
        """The manifest of ``name:tag`` (or ``name@digest``: pass the digest as `tag`), None when the registry has no
        such tag (or repository)."""
        resp = self._get(f"/v2/{name}/manifests/{tag}", scope=f"repository:{name}:pull")
        if resp.status_code == 404:
            return None
        if resp.status_code in (401, 403):
            raise PushError(f"{self.host}: authentication failed reading {name}:{tag} ({resp.status_code})",
                            hint=LOGIN_HINT.format(host=self.host))  # fmt: skip
        if resp.status_code >= 500 or resp.status_code == 429:
            raise TransientError(f"{self.host} answered {resp.status_code} for the manifest of {name}:{tag}")
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
            size=len(body),
            body=body,
        )

    def put_manifest(self, name: str, tag: str, body: bytes, media_type: str) -> str:
        """Put a manifest (an image index) under ``name:tag``; the digest the registry gives it, which must be the
        sha256 of `body` (what the caller computed and reports). PushError for a refusal (its text), a failed login,
        or a digest that differs; TransientError for 5xx, 429 and a registry that cannot be reached."""
        want = f"sha256:{hashlib.sha256(body).hexdigest()}"
        resp = self._send("PUT", f"/v2/{name}/manifests/{tag}", scope=f"repository:{name}:pull,push", data=body,
                          content_type=media_type)  # fmt: skip
        if resp.status_code in (401, 403):
            raise PushError(f"{self.host}: authentication failed putting {name}:{tag} ({resp.status_code})",
                            hint=LOGIN_HINT.format(host=self.host))  # fmt: skip
        if resp.status_code >= 500 or resp.status_code == 429:
            raise TransientError(f"{self.host} answered {resp.status_code} putting the manifest of {name}:{tag}")
        if resp.status_code not in (200, 201):
            raise PushError(f"{self.host} refused the manifest of {name}:{tag} ({resp.status_code}): "
                            f"{resp.text[:300]}")  # fmt: skip
        got = resp.headers.get("Docker-Content-Digest") or want
        if got != want:
            raise PushError(f"{self.host} stored the manifest of {name}:{tag} as {got}, not its sha256 {want}")
        return want

    def _get(self, path: str, *, scope: str) -> requests.Response:
        return self._send("GET", path, scope=scope)

    def _send(
        self, method: str, path: str, *, scope: str, data: bytes | None = None, content_type: str | None = None
    ) -> requests.Response:
        last: Exception | None = None
        for scheme in list(self.schemes):
            try:
                resp = self._request(f"{scheme}://{self.host}{path}", scope, method, data, content_type)
            except (requests.exceptions.SSLError, requests.exceptions.ConnectionError) as exc:
                last = exc
                continue
            except requests.exceptions.RequestException as exc:
                raise TransientError(f"{self.host}: {reason(exc)}") from exc
            self.schemes = [scheme]  # remember what works
            return resp
        raise TransientError(f"cannot reach {self.host}: {reason(last) if last else 'no scheme left'}")

    def _request(
        self, url: str, scope: str, method: str = "GET", data: bytes | None = None, content_type: str | None = None
    ) -> requests.Response:
        headers = {"Accept": MANIFEST_TYPES}
        if content_type:
            headers["Content-Type"] = content_type
        resp = self._session.request(method, url, headers=headers, data=data, timeout=self.timeout_s)
        if resp.status_code != 401:
            return resp
        challenge = resp.headers.get("WWW-Authenticate", "")
        creds = self._credentials()
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if creds is None:
                return resp
            return self._session.request(method, url, headers=headers, data=data, auth=creds, timeout=self.timeout_s)
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
            return self._session.request(method, url, headers={**headers, "Authorization": f"Bearer {token}"},
                                         data=data, timeout=self.timeout_s)  # fmt: skip
        return resp


def engine_insecure(client: docker.DockerClient, host: str) -> bool:
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


def docker_credentials(host: str) -> tuple[str, str] | None:
    """What `docker login HOST` stored (config.json or a credential helper)."""
    with contextlib.suppress(Exception):
        found = docker.auth.load_config().resolve_authconfig(host) or {}
        user = found.get("username") or found.get("Username")
        password = found.get("password") or found.get("Password")
        if user and password:
            return str(user), str(password)
    return None
