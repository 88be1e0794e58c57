"""`imgbuild push`: re-tag an image under a registry, push it with retries, report the pushed digest.

What is pushed: a recipe's lock-derived refs (``imgbuild/cpu:lock-<12hex>`` and the readable tag), or the
tags of a local image. Each ``<repo>:<tag>`` becomes ``HOST[/PREFIX]/<repo>:<tag>``, is tagged in the engine
for the push and untagged afterwards, whatever happens (a tag that was already there is left, or put back).

Progress goes to a `PushObserver` (`progress.push_progress_for` picks one for a console); the registry's own
HTTP API is in `registry`, the engine calls' errors are translated by `engine.engine_error`.

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

With a scan gate (``--scan-gate LEVEL``, ECR only, `scan.ScanGate`) the content-addressed ref (a recipe's
``lock-<hash>`` tag; else the first tag) is pushed alone; ECR's scan of its digest is waited for and judged; only a
passed gate pushes the other (readable) tags. A failed gate takes back the tag this run pushed
(``BatchDeleteImage``), so nothing the run tagged is left; a tag published before this run is left as it was.

A recipe built for several architectures (platform.arch, `imgbuild build --platform`) is published as one image
index (`publish_index`): each architecture's image is pushed under ``<tag>-<arch>`` (amd64 too), then an OCI image
index (``application/vnd.oci.image.index.v1+json``) naming each image's manifest and platform goes up under the plain
tags (``lock-<12 hex>`` and the readable one) through the registry's HTTP API (`registry.RegistryAPI.put_manifest`:
the engine pushes images, not indexes). `docker pull --platform linux/arm64` of a plain tag then gets the arm64
image, a plain pull the engine's own. Every architecture's image must be built before anything is pushed; an index
that cannot be put says which per-architecture tags were pushed. Immutable tags hold for the index as for images:
the same index (its digest, from the same per-architecture manifests) is "already published", another one refused.
`--platform` picks architectures: two or more make an index as above; one alone pushes that architecture's image under
the tags the engine holds it by (the plain tags for the recipe's first, `<tag>-<arch>` for another), as a
single-architecture recipe's image is pushed. The scan gate judges one image's digest, so it is refused for an index;
gate each architecture's image with `--platform linux/ARCH --scan-gate LEVEL`.

One module of about 560 lines: tagging, the push stream, retries and the immutable-tag check are the steps of
one `Publisher.push_ref`, sharing the publisher's client, destination and progress.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import docker
import docker.errors
import docker.utils

from imgbuild.core.errors import EngineError, ImgbuildError, Interrupted, PushError
from imgbuild.engine import ENGINE_ERRORS, connect, engine_error, inspect_image, reason
from imgbuild.publish.registry import (
    LOGIN_HINT,
    OCI_INDEX,
    Destination,
    RegistryAPI,
    RemoteManifest,
    TransientError,
    docker_credentials,
    engine_insecure,
    parse_registry,
    strip_domain,
)

__all__ = [
    "PublishResult",
    "Publisher",
    "PushObserver",
    "PushedRef",
    "QuietProgress",
    "Retry",
    "Source",
    "classify",
    "publish",
    "resolve_source",
]

log = logging.getLogger("imgbuild.publish")

Kind = Literal["transient", "auth", "exists", "fatal"]

# Removing or restoring a temporary tag: a failure becomes a warning, never hides the push's own outcome.
_UNTAG_ERRORS: tuple[type[BaseException], ...] = (*ENGINE_ERRORS, EngineError)

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


def _split_ref(ref: str) -> tuple[str, str]:
    repo, tag = docker.utils.parse_repository_tag(ref)
    return repo, tag or "latest"


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
    from imgbuild.spec import recipe

    return what.endswith((".yaml", ".yml")) or what in recipe.shipped_names()


def resolve_source(client: docker.DockerClient, what: str, arch: str | None = None) -> Source:
    """RECIPE -> its lock-derived refs (which must be built; those of `arch`, one of its platform.arch, where given:
    `lock-<12 hex>-arm64` for another than the first); IMAGE -> that image's tags.

    An IMAGE given by name (``imgbuild/cpu:lock-...``) publishes every tag of that image in the same repository;
    given by id, every tag of the image that names no registry.
    """
    if _is_recipe(what):
        from imgbuild.image import render
        from imgbuild.pin import lock

        _, resolved = lock.for_ref(what)
        plan = render.plan(resolved, arch=arch)
        refs = plan.image_refs
        build_cmd = f"imgbuild build {what}" + (f" --platform linux/{arch}" if arch else "")
        built = _built_image(client, refs, f"recipe {plan.recipe}", build_cmd)
        return Source(str(built["Id"]), tuple(refs), tuple(built.get("RepoDigests") or ()), plan.recipe)

    found = inspect_image(client, what)
    if found is None:
        raise PushError(f"{what!r} is neither a recipe nor an image in the engine",
                        hint="`imgbuild list` names the recipes; `docker images` the images")  # fmt: skip
    tags = [t for t in (found.get("RepoTags") or []) if t and t != "<none>:<none>"]
    if _IMAGE_ID_RE.match(what):
        refs = [t for t in tags if strip_domain(_split_ref(t)[0]) == _split_ref(t)[0]]
    else:
        name = _split_ref(what)[0]
        refs = [t for t in tags if _split_ref(t)[0] == name]
    if not refs:
        raise PushError(f"image {what} has no tags to publish", hint="tag it first: docker tag IMAGE NAME:TAG")
    return Source(str(found["Id"]), tuple(dict.fromkeys(refs)), tuple(found.get("RepoDigests") or ()))


def _built_image(client: docker.DockerClient, refs: Sequence[str], what: str, hint: str) -> dict[str, Any]:
    """The engine's record of the image a recipe's build tagged `refs` with: every ref on one image, else a PushError
    naming the ref (`what`: "recipe cpu", "the linux/arm64 image of cpu") with the build to run as its hint."""
    found = inspect_image(client, refs[0])
    if found is None:
        raise PushError(f"{refs[0]} is not in the engine: {what} has not been built from its lock", hint=hint)
    for ref in refs[1:]:
        other = inspect_image(client, ref)
        if other is None or other["Id"] != found["Id"]:
            state = "is not in the engine" if other is None else f"is a different image ({other['Id'][:19]})"
            raise PushError(f"{ref} {state}; expected the image of {refs[0]} ({found['Id'][:19]})", hint=hint)
    return found


@dataclass(frozen=True)
class ArchImage:
    """One architecture's image of a multi-architecture recipe: the local image and, for each of its refs, the
    plain tag the index goes under (`render.tags` without the architecture's suffix)."""

    arch: str
    image_id: str
    repository: str  # imgbuild/cpu
    tags: tuple[tuple[str, str], ...]  # (local ref, plain tag): (imgbuild/cpu:lock-<12 hex>-arm64, lock-<12 hex>)
    repo_digests: tuple[str, ...] = ()


def recipe_arches(what: str) -> tuple[str, ...] | None:
    """The architectures recipe `what` is built for (platform.arch), None when `what` is an image."""
    if not _is_recipe(what):
        return None
    from imgbuild.pin import lock

    _, resolved = lock.for_ref(what)
    return tuple(resolved.recipe.platform.arch)


def resolve_arch_images(client: docker.DockerClient, what: str, arches: Sequence[str] | None = None) -> list[ArchImage]:
    """Recipe `what`'s image of each architecture in `arches` (default: every one its platform.arch lists), each
    built from the lock (every tag `render.image_refs` gives it, on one image recorded as that architecture): else a
    PushError naming the `imgbuild build ... --platform` to run, before anything is pushed."""
    from imgbuild.image import render
    from imgbuild.pin import lock
    from imgbuild.spec import compat

    _, resolved = lock.for_ref(what)
    wanted = [render.check_arch(resolved, a) for a in arches] if arches else list(resolved.recipe.platform.arch)
    plain = render.tags(resolved, render.lock_digest(resolved))
    repo = render.repository(resolved)
    images: list[ArchImage] = []
    for arch in wanted:
        refs = render.image_refs(resolved, arch)
        platform = compat.docker_platform(arch)
        hint = f"imgbuild build {what} --platform {platform}"
        found = _built_image(client, refs, f"the {platform} image of {resolved.name}", hint)
        if (got := str(found.get("Architecture") or "?")) != arch:
            raise PushError(f"{refs[0]} is a linux/{got} image, not {platform}", hint=hint)
        images.append(ArchImage(arch, str(found["Id"]), repo, tuple(zip(refs, plain, strict=True)),
                                tuple(found.get("RepoDigests") or ())))  # fmt: skip
    return images


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
class IndexEntry:
    """One architecture's image in an image index: its manifest in the registry (the descriptor's digest, media type
    and size) and the platform it runs on."""

    arch: str  # platform.arch's name: amd64, arm64
    digest: str
    media_type: str
    size: int
    image_id: str = ""  # the local image pushed (for the report; not in the index)

    @property
    def platform(self) -> str:
        return f"linux/{self.arch}"


@dataclass(frozen=True)
class IndexReport:
    """The image index put under the plain tags: its digest, and the per-architecture manifests it names."""

    digest: str
    media_type: str
    size: int
    manifests: tuple[IndexEntry, ...]
    refs: tuple[PushedRef, ...]  # one per plain tag (lock-<12 hex>, the readable one)

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "media_type": self.media_type,
            "size": self.size,
            "manifests": [
                {
                    "platform": m.platform,
                    "digest": m.digest,
                    "media_type": m.media_type,
                    "size": m.size,
                    "image_id": m.image_id,
                }
                for m in self.manifests
            ],
            "refs": [asdict(r) for r in self.refs],
        }


def index_document(entries: Sequence[IndexEntry]) -> bytes:
    """The OCI image index naming `entries` (in their order; one per architecture), as the bytes put in the registry:
    compact JSON with sorted keys, so the same manifests always give the same index digest (an immutable tag's
    "already published" check compares it)."""
    if not entries:
        raise PushError("an image index needs at least one architecture's image")
    if len({e.arch for e in entries}) != len(entries):
        raise PushError(f"an architecture is named twice in the index: {', '.join(e.arch for e in entries)}")
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": e.media_type,
                "digest": e.digest,
                "size": e.size,
                "platform": {"architecture": e.arch, "os": "linux"},
            }
            for e in entries
        ],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class PublishResult:
    registry: str
    image_id: str
    refs: tuple[PushedRef, ...]
    warnings: tuple[str, ...] = ()
    scan: Any | None = None  # scan.GateReport with --scan-gate
    index: IndexReport | None = None  # a multi-architecture push: refs are the per-architecture tags

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"registry": self.registry, "image_id": self.image_id,
                                "refs": [asdict(r) for r in self.refs], "warnings": list(self.warnings)}  # fmt: skip
        if self.scan is not None:
            data["scan"] = self.scan.to_json()
        if self.index is not None:
            data["index"] = self.index.to_json()
        return data


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
                first = next((r for r in refs if _split_ref(r)[1].startswith("lock-")), refs[0])
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
            self.progress.close()
            if self._api is not None:
                self._api.close()
                self._api = None
        return PublishResult(str(self.destination), source.image_id, tuple(pushed), tuple(warnings), report)

    # -- several architectures under one tag -----------------------------------------------------------------
    def publish_index(self, images: Sequence[ArchImage]) -> PublishResult:
        """Push each architecture's image under `<tag>-<arch>`, then the OCI image index of them under the plain tags.
        An index that cannot be put is a PushError naming the per-architecture tags this run pushed."""
        pushed: list[PushedRef] = []
        warnings: list[str] = []
        entries: list[IndexEntry] = []
        try:
            for image in images:
                source = Source(image.image_id, tuple(local for local, _ in image.tags), image.repo_digests)
                first: PushedRef | None = None
                for local, plain in image.tags:
                    try:
                        done = self.push_ref(source, local, warnings, as_tag=f"{plain}-{image.arch}")
                    except PushError as exc:
                        if not pushed:
                            raise
                        raise PushError(
                            f"{exc.message}\nno image index was put; pushed before it: "
                            + ", ".join(r.target for r in pushed),
                            hint=exc.hint,
                        ) from None
                    pushed.append(done)
                    first = first or done
                assert first is not None
                entries.append(self._entry(image, first))
            body = index_document(entries)
            digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
            refs: list[PushedRef] = []
            repo = images[0].repository
            path = self.destination.path(strip_domain(repo))
            for plain in (plain for _, plain in images[0].tags):
                target = f"{self.destination.repository(strip_domain(repo))}:{plain}"
                try:
                    refs.append(self._put_index(path, plain, target, body, digest))
                except PushError as exc:
                    done_tags = [r.target for r in pushed] + [r.target for r in refs]
                    raise PushError(
                        f"{exc.message}\nthe image index {digest} is not under {target}; pushed before it: "
                        + ", ".join(done_tags),
                        hint=exc.hint or "run the push again: the per-architecture tags are already there",
                    ) from None
            index = IndexReport(digest, OCI_INDEX, len(body), tuple(entries), tuple(refs))
        finally:
            self.progress.close()
            if self._api is not None:
                self._api.close()
                self._api = None
        return PublishResult(str(self.destination), images[0].image_id, tuple(pushed), tuple(warnings), index=index)

    def _entry(self, image: ArchImage, pushed: PushedRef) -> IndexEntry:
        """The index's descriptor of an architecture's pushed image: its manifest as the registry holds it."""
        path = self.destination.path(strip_domain(image.repository))
        remote = self._with_retries(pushed.target, lambda: self.registry_api().manifest(path, pushed.digest))
        if remote is None or remote.size is None:
            raise PushError(f"{self.destination.host} has no manifest {pushed.digest} for {pushed.target}, just pushed")
        return IndexEntry(image.arch, remote.digest, remote.media_type, remote.size, image.image_id)

    def _put_index(self, path: str, tag: str, target: str, body: bytes, digest: str) -> PushedRef:
        """The index under one plain tag: "already published" where the registry holds that very index; refused
        where an immutable tag holds another manifest; put otherwise."""
        api = self.registry_api()
        if self._is_immutable(path):
            remote = self._with_retries(target, lambda: api.manifest(path, tag))
            if remote is not None:
                if remote.digest == digest:
                    done = PushedRef(target, target, digest, len(body), "already published", 1)
                    self.progress.done(done)
                    return done
                raise self._fail(
                    target,
                    f"the tag already exists in the immutable repository with different content: the registry has "
                    f"{remote.digest} ({remote.media_type}), this run's image index is {digest}",
                    1,
                    hint="a published tag is never overwritten: change the recipe's lock (a new lock-<hash> tag) or "
                    "delete the tag in the registry on purpose",
                )
        self.progress.start(target, 1)
        self._with_retries(target, lambda: api.put_manifest(path, tag, body, OCI_INDEX))
        done = PushedRef(target, target, digest, len(body), "pushed", 1)
        self.progress.done(done)
        return done

    def _with_retries(self, target: str, call: Callable[[], Any]) -> Any:
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
            raise self._fail(target, f"gave up after {attempt} attempts; last error: {exc}", attempt,
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
        src_repo, tag = _split_ref(first.source)
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

    def _is_immutable(self, path: str) -> bool:
        repo = self.ecr.repository(path) if self.ecr is not None else None  # creates it when missing
        if self.immutable is not None:
            return self.immutable
        return bool(repo is not None and repo.immutable)

    def push_ref(
        self, source: Source, ref: str, warnings: list[str] | None = None, *, as_tag: str | None = None
    ) -> PushedRef:
        """Push one local ref (under tag `as_tag` instead of its own where given); the temporary tag is removed (or
        the previous one restored) whatever happens."""
        src_repo, tag = _split_ref(ref)
        tag = as_tag or tag
        path = self.destination.path(strip_domain(src_repo))
        target_repo = self.destination.repository(strip_domain(src_repo))
        target = f"{target_repo}:{tag}"
        immutable = self._is_immutable(path)
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
                    raise TransientError(result.error)
                raise self._fail(target, result.error, attempt)
            except TransientError as exc:
                self._back_off(target, attempt, exc)

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
    for rec in stream:
        if isinstance(rec, dict):
            yield rec
        elif isinstance(rec, bytes | str):  # not decoded (older docker-py): one JSON object per line
            for line in (rec.decode(errors="replace") if isinstance(rec, bytes) else rec).splitlines():
                with contextlib.suppress(ValueError):
                    obj = json.loads(line)
                    if isinstance(obj, dict):
                        yield obj


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
    gate: Any | None = None,
    arches: Sequence[str] | None = None,
) -> PublishResult:
    """`imgbuild push WHAT --registry HOST[/PREFIX] [--ecr] [--scan-gate LEVEL] [--platform P ...]`.

    `gate` (a `scan.ScanGate`) needs ECR: on another registry it is a usage error before anything is contacted.
    A recipe built for several architectures (or `arches`, --platform, naming some) is published as an image index
    (`Publisher.publish_index`); the scan gate is refused there (it judges one image's digest).
    """
    from imgbuild.core.errors import UsageError

    recipe_archs = recipe_arches(what)
    if arches and recipe_archs is None:
        raise UsageError(f"--platform goes with a RECIPE: {what!r} is an image (it is pushed as the engine holds it)")
    selected = list(arches or recipe_archs or ())
    multi = len(selected) > 1
    is_ecr = ecr_registry is not None or ecr or bool(registry and _ecr_host(registry))
    if gate is not None and not is_ecr:
        raise UsageError(
            f"--scan-gate needs Amazon ECR: {registry} has no vulnerability scanner imgbuild can read",
            hint="push to an ECR registry (--ecr, or an <account>.dkr.ecr.<region>.amazonaws.com host), or leave "
            "--scan-gate out and scan the image another way",
        )
    if multi and gate is not None:
        raise UsageError(
            f"--scan-gate judges one image's digest: {what} is published as an image index of "
            f"{', '.join('linux/' + a for a in selected)}",
            hint="gate each architecture's image on its own (--platform linux/ARCH --scan-gate LEVEL pushes that one "
            "image under its own tags), then push the index without the gate",
        )
    if ecr_registry is None and (ecr or (registry and _ecr_host(registry))):
        from imgbuild.publish.ecr import EcrRegistry

        host = parse_registry(registry).host if registry else None
        ecr_registry = EcrRegistry(host)
    if registry:
        destination = parse_registry(registry)
    elif ecr_registry is not None:
        destination = Destination(ecr_registry.host)
    else:
        raise PushError("no registry given", hint="--registry HOST[/PREFIX], or --ecr for your account's ECR")
    own = client is None
    docker_client = connect() if client is None else client
    try:
        publisher = Publisher(docker_client, destination, ecr=ecr_registry, immutable=immutable, retry=retry,
                              progress=progress, auth_config=auth_config, gate=gate)  # fmt: skip
        if multi:
            return publisher.publish_index(resolve_arch_images(docker_client, what, selected))
        source = resolve_source(docker_client, what, arches[0] if arches else None)
        return publisher.publish(source)
    finally:
        if own:
            docker_client.close()


def _ecr_host(registry: str) -> bool:
    from imgbuild.publish.ecr import parse_host

    return parse_host(registry.strip().removeprefix("https://").split("/")[0]) is not None
