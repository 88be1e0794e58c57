"""Amazon ECR: registry credentials from the AWS credential chain, and repositories created on first push.

The only module that imports boto3, and only when an `EcrRegistry` is made (it takes a third of a second; telling
an ECR host from another needs only `parse_host`). Credentials come from ``boto3.Session()``: environment variables, a
profile, SSO, the web-identity token GitHub's OIDC role assumption leaves behind, or an instance role.
``get_authorization_token`` gives a base64 ``AWS:<password>`` pair valid for 12 hours; `TokenCache` keeps
it and asks again when it is within `REFRESH_MARGIN_S` of its expiry, so a long publish never pushes with
a stale token. Repositories are created on first use with immutable tags and scan-on-push.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from imgbuild.core.errors import PushError

__all__ = [
    "REFRESH_MARGIN_S",
    "EcrRegistry",
    "EcrToken",
    "Repository",
    "TokenCache",
    "decode_authorization",
    "ensure_repository",
    "parse_host",
]

REFRESH_MARGIN_S = 300.0
CREDENTIALS_HINT = (
    "configure AWS credentials for the account that owns the registry (AWS_PROFILE, AWS_ACCESS_KEY_ID/"
    "AWS_SECRET_ACCESS_KEY, `aws sso login`, an instance role, or aws-actions/configure-aws-credentials in "
    "GitHub Actions); the role needs ecr:GetAuthorizationToken, ecr:DescribeRepositories, "
    "ecr:CreateRepository and the ecr push actions"
)

# <account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn]
_HOST_RE = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?\Z")

Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def parse_host(host: str) -> tuple[str, str] | None:
    """(account, region) of an ECR registry host, None for any other host."""
    m = _HOST_RE.match(host.strip().lower().removeprefix("https://").split("/")[0])
    return (m.group("account"), m.group("region")) if m else None


@dataclass(frozen=True)
class EcrToken:
    """A decoded authorization token: what `docker login` would be given."""

    username: str
    password: str
    registry: str  # the host, without https://
    expires_at: dt.datetime

    def auth_config(self) -> dict[str, str]:
        """docker-py's auth_config for a push (the engine sends it to the registry as basic auth)."""
        return {"username": self.username, "password": self.password, "serveraddress": self.registry}

    def expires_within(self, seconds: float, now: dt.datetime) -> bool:
        return (self.expires_at - now).total_seconds() <= seconds

    def __repr__(self) -> str:  # never print the password
        return f"EcrToken(username={self.username!r}, registry={self.registry!r}, expires_at={self.expires_at})"


def decode_authorization(data: dict[str, Any]) -> EcrToken:
    """One ``authorizationData`` entry -> user, password, registry host and expiry (timezone-aware)."""
    try:
        raw = base64.b64decode(str(data["authorizationToken"]), validate=True).decode()
    except (KeyError, binascii.Error, UnicodeDecodeError) as exc:
        raise PushError(f"ECR returned a malformed authorization token: {exc}") from None
    username, sep, password = raw.partition(":")
    if not sep or not username or not password:
        raise PushError("ECR returned a malformed authorization token (expected base64 of 'user:password')")
    expires = data.get("expiresAt")
    if isinstance(expires, dt.datetime):
        expires_at = expires if expires.tzinfo else expires.replace(tzinfo=dt.timezone.utc)
    elif isinstance(expires, int | float):
        expires_at = dt.datetime.fromtimestamp(float(expires), dt.timezone.utc)
    else:  # absent: assume the documented 12 hours, counted from now
        expires_at = _utcnow() + dt.timedelta(hours=12)
    endpoint = str(data.get("proxyEndpoint", ""))
    registry = endpoint.removeprefix("https://").removeprefix("http://").rstrip("/")
    return EcrToken(username=username, password=password, registry=registry, expires_at=expires_at)


class TokenCache:
    """Holds one token and fetches a new one when it is missing or within `margin_s` of its expiry."""

    def __init__(
        self,
        fetch: Callable[[], EcrToken],
        *,
        margin_s: float = REFRESH_MARGIN_S,
        clock: Clock = _utcnow,
    ) -> None:
        self._fetch = fetch
        self.margin_s = margin_s
        self._clock = clock
        self._token: EcrToken | None = None
        self._lock = threading.Lock()
        self.fetches = 0

    def get(self) -> EcrToken:
        with self._lock:
            if self._token is None or self._token.expires_within(self.margin_s, self._clock()):
                self._token = self._fetch()
                self.fetches += 1
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._token = None


@dataclass(frozen=True)
class Repository:
    name: str
    uri: str
    tag_mutability: str  # IMMUTABLE | MUTABLE (or the *_WITH_EXCLUSION variants)
    scan_on_push: bool
    created: bool  # created by this call

    @property
    def immutable(self) -> bool:
        return self.tag_mutability.startswith("IMMUTABLE")


def _aws_error(action: str, exc: Exception) -> PushError:
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return PushError(f"{action}: no AWS credentials found ({exc})", hint=CREDENTIALS_HINT)
    if isinstance(exc, botocore.exceptions.NoRegionError):
        return PushError(f"{action}: no AWS region configured", hint="set AWS_REGION or name the ECR registry host")
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        code, message = err.get("Code", "ClientError"), err.get("Message", str(exc))
        auth = code in ("AccessDeniedException", "UnrecognizedClientException", "ExpiredTokenException",
                        "InvalidSignatureException", "AccessDenied")  # fmt: skip
        return PushError(f"{action}: {code}: {message}", hint=CREDENTIALS_HINT if auth else None)
    return PushError(f"{action}: {type(exc).__name__}: {exc}", hint=CREDENTIALS_HINT)


def ensure_repository(client: Any, name: str, *, registry_id: str | None = None) -> Repository:
    """The repository `name`, created with immutable tags and scan-on-push when it does not exist.

    An existing repository is left exactly as it is (its mutability and scanning settings are reported).
    """
    ids = {"registryId": registry_id} if registry_id else {}
    try:
        try:
            found = client.describe_repositories(repositoryNames=[name], **ids)["repositories"][0]
            created = False
        except client.exceptions.RepositoryNotFoundException:
            try:
                found = client.create_repository(
                    repositoryName=name,
                    imageTagMutability="IMMUTABLE",
                    imageScanningConfiguration={"scanOnPush": True},
                    **ids,
                )["repository"]
                created = True
            except client.exceptions.RepositoryAlreadyExistsException:  # another job created it just now
                found = client.describe_repositories(repositoryNames=[name], **ids)["repositories"][0]
                created = False
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise _aws_error(f"cannot look up or create the ECR repository {name}", exc) from None
    return Repository(
        name=str(found["repositoryName"]),
        uri=str(found.get("repositoryUri", "")),
        tag_mutability=str(found.get("imageTagMutability", "MUTABLE")),
        scan_on_push=bool(found.get("imageScanningConfiguration", {}).get("scanOnPush", False)),
        created=created,
    )


class EcrRegistry:
    """One ECR registry (an account in a region): its host, push credentials and repositories.

    `host` may be None: the registry of the caller's own account in the session's region is used (its host
    comes from the authorization token's proxyEndpoint).
    """

    def __init__(
        self,
        host: str | None = None,
        *,
        session: Any | None = None,
        clock: Clock = _utcnow,
        margin_s: float = REFRESH_MARGIN_S,
    ) -> None:
        parsed = parse_host(host) if host else None
        if host and parsed is None:
            raise PushError(
                f"{host} is not an Amazon ECR registry host",
                hint="ECR hosts look like <account>.dkr.ecr.<region>.amazonaws.com",
            )
        self.account: str | None = parsed[0] if parsed else None
        region = parsed[1] if parsed else None
        try:
            if session is None:
                import boto3

                session = boto3.Session()
            self.session = session
            self.client = self.session.client("ecr", region_name=region or self.session.region_name)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _aws_error("cannot set up an ECR client", exc) from None
        self.region = str(self.client.meta.region_name)
        self.tokens = TokenCache(self._fetch_token, margin_s=margin_s, clock=clock)
        self._host = host.split("/")[0] if host else None
        self._repos: dict[str, Repository] = {}

    @property
    def host(self) -> str:
        if self._host is None:
            self._host = self.tokens.get().registry
        return self._host

    def _fetch_token(self) -> EcrToken:
        kwargs = {"registryIds": [self.account]} if self.account else {}
        try:
            data = self.client.get_authorization_token(**kwargs)["authorizationData"]
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _aws_error("cannot get an ECR authorization token", exc) from None
        if not data:
            raise PushError("ECR returned no authorization data", hint=CREDENTIALS_HINT)
        token = decode_authorization(data[0])
        if not token.registry:
            token = EcrToken(token.username, token.password, self._host or "", token.expires_at)
        return token

    def auth_config(self) -> dict[str, str]:
        """Push credentials, fetched again when the cached token is about to expire."""
        config = self.tokens.get().auth_config()
        config["serveraddress"] = self.host
        return config

    def repository(self, name: str) -> Repository:
        """`ensure_repository` once per name for the life of this object."""
        if name not in self._repos:
            self._repos[name] = ensure_repository(self.client, name, registry_id=self.account)
        return self._repos[name]
