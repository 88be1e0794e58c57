"""Pushing one image to one registry (`Publisher`): re-tag it under the registry, push it with retries, report the
pushed digest of each ref.

Each ``<repo>:<tag>`` becomes ``HOST[/PREFIX]/<repo>:<tag>``, is tagged in the engine for the push and untagged
afterwards, whatever happens (a tag that was already there is left, or put back). Progress goes to a `PushObserver`
(`progress.push_progress_for` picks one for a console); the registry's own HTTP API is in `registry`, the engine
calls' errors are translated by `engine.engine_error`.

The push goes through docker-py's low-level API and its JSON stream is read by hand: an ``error`` /
``errorDetail`` record is a failure although the HTTP call succeeded, and the ``aux`` record carries the
digest. A failure is retried or not as `retry.classify` sorts it.

Immutable repositories (ECR's default here, or ``immutable=True``): before pushing, the registry's manifest
for the tag is fetched over the registry HTTP API (``GET /v2/<name>/manifests/<tag>``). Absent: push. Present
and the same image (its manifest digest is one of the image's RepoDigests, or its config digest is the local
image id): "already published", a success. Present and different: a `PushError`. ECR's own refusal ("tag
invalid: ... already exists") is read the same way.

With a scan gate (``--scan-gate LEVEL``, ECR only, `scan.ScanGate`) the content-addressed ref (a recipe's
``lock-<hash>`` tag; else the first tag) is pushed alone; ECR's scan of its digest is waited for and judged; only a
passed gate pushes the other (readable) tags. A failed gate takes back the tag this run pushed
(``BatchDeleteImage``), so nothing the run tagged is left; a tag published before this run is left as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import docker
import docker.errors

from imgbuild.core.errors import EngineError, ImgbuildError, Interrupted, PushError
from imgbuild.engine.client import ENGINE_ERRORS, engine_error, inspect_image, reason
from imgbuild.publish.registry import (
    LOGIN_HINT,
    Destination,
    RegistryAPI,
    RemoteManifest,
    TransientError,
    docker_credentials,
    engine_insecure,
    strip_domain,
)
from imgbuild.publish.results import PublishResult, PushedRef
from imgbuild.publish.retry import Retry, classify
from imgbuild.publish.source import ArchImage, Source, split_ref

log = logging.getLogger("imgbuild.publish")

# Removing or restoring a temporary tag: a failure becomes a warning, never hides the push's own outcome.
_UNTAG_ERRORS: tuple[type[BaseException], ...] = (*ENGINE_ERRORS, EngineError)


class PushObserver(Protocol):
    """What a push reports as it runs (`progress.PlainPushProgress`, `progress.LivePushProgress`, or a test's own)."""

    def start(self, target: str, attempt: int) -> None: ...
    def record(self, rec: dict[str, Any]) -> None: ...
    def retry(self, target: str, attempt: int, attempts: int, error: str, delay_s: float) -> None: ...
    def done(self, pushed: PushedRef) -> None: ...
    def failed(self, target: str, message: str) -> None: ...
    def close(self) -> None: ...


class QuietProgress:
    """Reports nothing: the default observer."""

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


@dataclass
class _Attempt:
    digest: str | None = None
    size: int | None = None
    error: str | None = None


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
        gate: Any | None = None,
    ) -> None:
        self.client = client
        self.destination = destination
        self.ecr = ecr
        self.gate = gate  # scan.ScanGate: needs `ecr`
        self.immutable = immutable
        self.retry = retry or Retry()
        self.progress: PushObserver = progress or QuietProgress()
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
        return docker_credentials(self.destination.host)

    def registry_api(self) -> RegistryAPI:
        if self._api is None:
            insecure = engine_insecure(self.client, self.destination.host)
            self._api = RegistryAPI(self.destination.host, insecure=insecure, credentials=self._credentials)
        return self._api

    def _hint(self) -> str:
        if self.ecr is not None:
            from imgbuild.publish.ecr import CREDENTIALS_HINT

            return CREDENTIALS_HINT
        return LOGIN_HINT.format(host=self.destination.host)

    # -- the whole image -----------------------------------------------------------------------------------
    def publish(self, source: Source) -> PublishResult:
        pushed: list[PushedRef] = []
        warnings: list[str] = []
        report = None
        try:
            refs = list(source.refs)
            if self.gate is not None:  # the content-addressed tag first, alone; the others only past the gate
                first = next((r for r in refs if split_ref(r)[1].startswith("lock-")), refs[0])
                refs.remove(first)
                pushed.append(self.push_ref(source, first, warnings))
                report = self._gate(source, pushed[0])
                if not report.passed:
                    result = PublishResult(str(self.destination), source.image_id, tuple(pushed), tuple(warnings),
                                           report)  # fmt: skip
                    raise self._gate_failed(report, result)
            for ref in refs:
                pushed.append(self.push_ref(source, ref, warnings))
        finally:
            self.close()
        return PublishResult(str(self.destination), source.image_id, tuple(pushed), tuple(warnings), report)

    # -- several architectures under one tag -----------------------------------------------------------------
    def publish_index(self, images: Sequence[ArchImage]) -> PublishResult:
        """Each architecture's image under `<tag>-<arch>`, then their OCI image index under the plain tags
        (imgbuild.publish.index)."""
        from imgbuild.publish.index import publish_index

        return publish_index(self, images)

    def close(self) -> None:
        """End the run: the progress closed, the registry's HTTP session too."""
        self.progress.close()
        if self._api is not None:
            self._api.close()
            self._api = None

    def with_retries(self, target: str, call: Callable[[], Any]) -> Any:
        """`call` (a registry HTTP request) with the push's retries on TransientError."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except TransientError as exc:
                self._back_off(target, attempt, exc)

    def _back_off(self, target: str, attempt: int, exc: TransientError) -> None:
        """After a transient failure of attempt `attempt`: a PushError when it was the last, else wait the retry's
        delay (said in the log and the progress)."""
        attempts = max(1, self.retry.attempts)
        if attempt >= attempts:
            raise self.fail(target, f"gave up after {attempt} attempts; last error: {exc}", attempt,
                             hint="the registry may be down or overloaded; retry later") from None  # fmt: skip
        delay = self.retry.delay(attempt)
        log.warning("push of %s failed (attempt %d/%d): %s; retrying in %gs", target, attempt, attempts, exc, delay)
        self.progress.retry(target, attempt, attempts, str(exc), delay)
        self.retry.sleep(delay)

    # -- the scan gate -------------------------------------------------------------------------------------
    def _gate(self, source: Source, first: PushedRef) -> Any:
        """Wait for ECR's scan of the pushed digest and judge it; a failed gate takes back the tag this run pushed."""
        from imgbuild.publish.scan import remove_tag

        if self.ecr is None or self.gate is None:
            raise PushError("the scan gate needs Amazon ECR (--ecr or an ECR registry host)")
        src_repo, tag = split_ref(first.source)
        path = self.destination.path(strip_domain(src_repo))
        log.info("waiting for ECR's scan of %s@%s", path, first.digest)
        report = self.gate.run(self.ecr.client, path, first.digest, registry_id=self.ecr.account)
        if report.passed:
            return report
        if first.status == "pushed":
            problem = remove_tag(self.ecr.client, path, tag, registry_id=self.ecr.account)
            if problem is None:
                report.removed = (first.target,)
            else:
                report.kept = (f"{first.target} (could not remove it: {problem})",)
        else:  # published before this run (and maybe promoted then): not this run's to take back
            report.kept = (f"{first.target} (published before this run)",)
        return report

    def _gate_failed(self, report: Any, result: PublishResult) -> ImgbuildError:
        from imgbuild.publish.scan import SCAN_HINT, ScanGateFailed

        if report.error is not None:
            hint = SCAN_HINT if "AccessDenied" in report.error else "the readable tags were not pushed; run again"
        else:
            hint = ("the readable tags were not pushed: fix the image, or allow a finding on purpose with --allow ID "
                    "or a line `ID # why` in the allow file")  # fmt: skip
        return ScanGateFailed(report, result, hint=hint)

    def is_immutable(self, path: str) -> bool:
        repo = self.ecr.repository(path) if self.ecr is not None else None  # creates it when missing
        if self.immutable is not None:
            return self.immutable
        return bool(repo is not None and repo.immutable)

    def push_ref(
        self, source: Source, ref: str, warnings: list[str] | None = None, *, as_tag: str | None = None
    ) -> PushedRef:
        """Push one local ref (under tag `as_tag` instead of its own where given); the temporary tag is removed (or
        the previous one restored) whatever happens."""
        src_repo, tag = split_ref(ref)
        tag = as_tag or tag
        path = self.destination.path(strip_domain(src_repo))
        target_repo = self.destination.repository(strip_domain(src_repo))
        target = f"{target_repo}:{tag}"
        immutable = self.is_immutable(path)
        previous = inspect_image(self.client, target)
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
        except ENGINE_ERRORS as exc:
            raise engine_error(exc, f"tagging {image_id[:19]} as {target}") from exc

    def _untag(self, image_id: str, repo: str, tag: str, target: str, previous_id: str | None) -> str | None:
        try:
            if previous_id is None:
                if inspect_image(self.client, target) is not None:
                    self.client.api.remove_image(target, noprune=True)
            elif previous_id != image_id:
                self.client.api.tag(previous_id, repo, tag=tag, force=True)
        except _UNTAG_ERRORS as exc:
            message = f"could not remove the temporary tag {target}: {reason(exc)}"
            log.warning(message)
            return message
        return None

    # -- one ref -------------------------------------------------------------------------------------------
    def _push_with_retries(
        self, source: Source, ref: str, path: str, target_repo: str, tag: str, target: str, immutable: bool
    ) -> PushedRef:
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
                        raise self.fail(target, "the engine reported no digest for the push", attempt)
                    pushed = PushedRef(ref, target, result.digest, result.size, "pushed", attempt)
                    self.progress.done(pushed)
                    return pushed
                kind = classify(result.error)
                if kind == "exists":
                    remote = self.registry_api().manifest(path, tag)
                    if remote is not None:
                        return self._existing(source, ref, target, remote, attempt)
                    raise self.fail(target, result.error, attempt)
                if kind == "auth":
                    if self.ecr is not None and not refreshed:  # an ECR token can expire mid-publish: ask once
                        refreshed = True
                        self.ecr.tokens.invalidate()
                        attempt -= 1
                        continue
                    raise self.fail(target, f"authentication failed: {result.error}", attempt, hint=self._hint())
                if kind == "transient":
                    raise TransientError(result.error)
                raise self.fail(target, result.error, attempt)
            except TransientError as exc:
                self._back_off(target, attempt, exc)

    def fail(self, target: str, message: str, attempt: int, *, hint: str | None = None) -> PushError:
        self.progress.failed(target, message)
        return PushError(f"push of {target} to {self.destination.host} failed: {message}", hint=hint)

    def _existing(self, source: Source, ref: str, target: str, remote: RemoteManifest, attempt: int) -> PushedRef:
        local_digests = {d.partition("@")[2] for d in source.repo_digests}
        local_digests |= {d.partition("@")[2] for d in (self._repo_digests(source.image_id))}
        if remote.digest in local_digests or remote.config_digest == source.image_id:
            pushed = PushedRef(ref, target, remote.digest, None, "already published", attempt)
            self.progress.done(pushed)
            return pushed
        raise self.fail(
            target,
            f"the tag already exists in the immutable repository with different content: the registry has "
            f"{remote.digest} (image {remote.config_digest or 'unknown'}), the local image is {source.image_id}",
            attempt,
            hint="a published tag is never overwritten: change the recipe's lock (a new lock-<hash> tag) or delete "
            "the tag in the registry on purpose",
        )

    def _repo_digests(self, image_id: str) -> list[str]:
        found = inspect_image(self.client, image_id)
        return list((found or {}).get("RepoDigests") or [])

    def _push_once(self, target_repo: str, tag: str) -> _Attempt:
        result = _Attempt()
        try:
            stream = self.client.api.push(target_repo, tag=tag, stream=True, decode=True, auth_config=self._auth())
            for rec in _records(stream):
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
            result.error = reason(exc)
        except ENGINE_ERRORS as exc:  # the connection to the engine broke
            raise engine_error(exc, f"pushing {target_repo}:{tag}") from exc
        return result


def _records(stream: Any) -> Iterator[dict[str, Any]]:
    """The push stream's records: docker-py decodes each JSON line (`decode=True`); anything else is skipped."""
    for rec in stream:
        if isinstance(rec, dict):
            yield rec
