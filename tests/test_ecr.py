"""Amazon ECR through moto: authorization tokens, their refresh, repositories created immutable. No real AWS."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import boto3
import pytest
from moto import mock_aws

from imgbuild.core.errors import PushError
from imgbuild.publish import ecr

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
HOST = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch):
    """moto in place of AWS, with fake credentials so nothing real could ever be reached."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield boto3.Session(region_name=REGION)


def count_calls(registry: ecr.EcrRegistry, operation: str) -> list[dict[str, Any]]:
    """The parameters of every `operation` call the registry's client makes from now on."""
    calls: list[dict[str, Any]] = []
    registry.client.meta.events.register(
        f"provide-client-params.ecr.{operation}", lambda params, **_: calls.append(dict(params))
    )
    return calls


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


# ---------------------------------------------------------------------------------------------------------
# hosts and tokens


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (HOST, (ACCOUNT, REGION)),
        (f"https://{ACCOUNT}.dkr.ecr.eu-west-1.amazonaws.com/", (ACCOUNT, "eu-west-1")),
        (f"{ACCOUNT}.dkr.ecr-fips.us-gov-west-1.amazonaws.com", (ACCOUNT, "us-gov-west-1")),
        (f"{ACCOUNT}.dkr.ecr.cn-north-1.amazonaws.com.cn", (ACCOUNT, "cn-north-1")),
        ("127.0.0.1:5000", None),
        ("ghcr.io", None),
        ("12345.dkr.ecr.us-east-1.amazonaws.com", None),
    ],
)
def test_parse_host(host: str, expected: tuple[str, str] | None) -> None:
    assert ecr.parse_host(host) == expected


def test_decode_authorization() -> None:
    expires = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone.utc)
    token = ecr.decode_authorization(
        {
            "authorizationToken": base64.b64encode(b"AWS:s3cr:et").decode(),
            "expiresAt": expires,
            "proxyEndpoint": f"https://{HOST}",
        }
    )
    assert (token.username, token.password, token.registry, token.expires_at) == ("AWS", "s3cr:et", HOST, expires)
    assert token.auth_config() == {"username": "AWS", "password": "s3cr:et", "serveraddress": HOST}
    assert "s3cr" not in repr(token)


def test_decode_naive_and_numeric_expiry() -> None:
    raw = base64.b64encode(b"AWS:pw").decode()
    naive = ecr.decode_authorization({"authorizationToken": raw, "expiresAt": dt.datetime(2030, 1, 1)})
    assert naive.expires_at == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    numeric = ecr.decode_authorization({"authorizationToken": raw, "expiresAt": 1_893_456_000})
    assert numeric.expires_at == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("raw", ["not base64!", base64.b64encode(b"no-colon").decode(), ""])
def test_decode_malformed_token(raw: str) -> None:
    with pytest.raises(PushError, match="malformed authorization token"):
        ecr.decode_authorization({"authorizationToken": raw})


def test_token_from_moto(aws: boto3.Session) -> None:
    registry = ecr.EcrRegistry(HOST, session=aws)
    auth = registry.auth_config()
    assert auth == {"username": "AWS", "password": f"{ACCOUNT}-auth-token", "serveraddress": HOST}
    assert registry.region == REGION and registry.account == ACCOUNT


def test_host_from_token_when_none_given(aws: boto3.Session) -> None:
    registry = ecr.EcrRegistry(None, session=aws)
    assert registry.host == HOST


def test_token_cached_then_refreshed_near_expiry(aws: boto3.Session) -> None:
    clock = Clock(dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    registry = ecr.EcrRegistry(HOST, session=aws, clock=clock, margin_s=300)
    calls = count_calls(registry, "GetAuthorizationToken")
    first = registry.tokens.get()
    assert len(calls) == 1 and calls[0]["registryIds"] == [ACCOUNT]

    clock.now = first.expires_at - dt.timedelta(minutes=10)  # 10 min left: reuse
    registry.auth_config()
    registry.auth_config()
    assert len(calls) == 1 and registry.tokens.fetches == 1

    clock.now = first.expires_at - dt.timedelta(minutes=4)  # within the 5-minute margin: fetch again
    registry.auth_config()
    assert len(calls) == 2 and registry.tokens.fetches == 2

    registry.tokens.invalidate()  # what a push does after an "expired token" error
    registry.auth_config()
    assert len(calls) == 3


def test_token_cache_unit() -> None:
    clock = Clock(dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
    expiry = [clock.now + dt.timedelta(hours=12)]

    def fetch() -> ecr.EcrToken:
        return ecr.EcrToken("AWS", "pw", HOST, expiry[0])

    cache = ecr.TokenCache(fetch, margin_s=300, clock=clock)
    cache.get()
    clock.now += dt.timedelta(hours=11, minutes=54)
    cache.get()
    assert cache.fetches == 1
    clock.now += dt.timedelta(minutes=2)  # 4 minutes left
    expiry[0] = clock.now + dt.timedelta(hours=12)
    assert cache.get().expires_at == expiry[0] and cache.fetches == 2


# ---------------------------------------------------------------------------------------------------------
# repositories


def test_repository_created_immutable_with_scan_on_push(aws: boto3.Session) -> None:
    registry = ecr.EcrRegistry(HOST, session=aws)
    creates = count_calls(registry, "CreateRepository")
    repo = registry.repository("team/imgbuild/cpu")
    assert repo.created and repo.immutable and repo.scan_on_push
    assert creates == [
        {
            "repositoryName": "team/imgbuild/cpu",
            "imageTagMutability": "IMMUTABLE",
            "imageScanningConfiguration": {"scanOnPush": True},
            "registryId": ACCOUNT,
        }
    ]
    found = aws.client("ecr").describe_repositories(repositoryNames=["team/imgbuild/cpu"])["repositories"][0]
    assert found["imageTagMutability"] == "IMMUTABLE"
    assert found["imageScanningConfiguration"] == {"scanOnPush": True}
    registry.repository("team/imgbuild/cpu")  # remembered: no second lookup
    assert len(creates) == 1


def test_existing_repository_left_alone(aws: boto3.Session) -> None:
    aws.client("ecr").create_repository(repositoryName="imgbuild/cpu", imageTagMutability="MUTABLE")
    registry = ecr.EcrRegistry(HOST, session=aws)
    creates = count_calls(registry, "CreateRepository")
    repo = registry.repository("imgbuild/cpu")
    assert not repo.created and not repo.immutable and not repo.scan_on_push
    assert creates == []
    found = aws.client("ecr").describe_repositories(repositoryNames=["imgbuild/cpu"])["repositories"][0]
    assert found["imageTagMutability"] == "MUTABLE"


def test_not_an_ecr_host() -> None:
    with pytest.raises(PushError, match="not an Amazon ECR registry host"):
        ecr.EcrRegistry("127.0.0.1:5000")


def test_no_credentials_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Without any credentials botocore refuses before sending anything: no request leaves the machine."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    registry = ecr.EcrRegistry(HOST)
    with pytest.raises(PushError) as info:
        registry.auth_config()
    assert "no AWS credentials" in info.value.message
    assert info.value.hint and "aws-actions/configure-aws-credentials" in info.value.hint
