"""A remote BuildKit: a second Docker engine on this machine (scripts/dockerd2.sh, fixture `second_engine`), reached
through DOCKER_HOST (its unix socket, and 127.0.0.1 over tcp) and a docker context, driven through the real
`imgbuild` CLI. The registry-cache round trip against a real local registry: build cpu with --cache-to, remove the
image and prune that engine's build cache (never the main engine's), rebuild with --cache-from: the heavy steps
(the apt and pip RUN steps) are cached, their layers come from the registry. Then verify (one container and two
nodes) and doctor on that engine.

Debian's docker.io 20.10 has no buildx, so imgbuild builds there with the CLI's own BuildKit client
(DOCKER_BUILDKIT=1): the cache is the inline one (the image carries its cache metadata and --cache-to pushes it).
Downloads during the builds trust IMGBUILD_CA_BUNDLE from the environment (scripts/test.sh sources ca-env.sh)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests

from test_publish import LocalRegistry  # Debian's docker-registry on a free 127.0.0.1 port

pytestmark = pytest.mark.docker

BUILD_TIMEOUT_S = 1800
# The steps that download: the OS packages (apt-get, in both stages) and the wheels (pip, in the builder stage).
HEAVY = re.compile(r"\bRUN\b.*(apt-get install|pip install)")


def imgbuild(env: dict[str, str], *args: str, timeout: float = BUILD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """The real CLI in a process of its own (plain progress: its output is no terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "imgbuild", *args], env=env, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def show(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


@dataclass(frozen=True)
class Step:
    """A Dockerfile step as BuildKit's plain stream in the build log shows it (`#9 [builder 4/5] RUN ...`)."""

    name: str
    state: str  # "cached", "done", "error", or "running" when the log never ended it
    seconds: float | None


def log_path(out: str) -> Path:
    m = re.search(r"log: (\S+)\s*$", out, re.M)
    assert m, f"the build names no log:\n{out}"
    return Path(m.group(1))


def steps_of(log: Path) -> list[Step]:
    """The Dockerfile steps of one build, from BuildKit's own records in the build's log."""
    names: dict[str, str] = {}
    ends: dict[str, tuple[str, float | None]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^#(\d+) (.*)$", line)
        if m is None:
            continue
        vid, rest = m.groups()
        if vid not in names:
            names[vid] = rest
        elif rest == "CACHED":
            ends[vid] = ("cached", 0.0)
        elif done := re.match(r"^DONE (\d+(?:\.\d+)?)s$", rest):
            ends[vid] = ("done", float(done.group(1)))
        elif rest.startswith("ERROR"):
            ends[vid] = ("error", None)
    return [
        Step(name, *ends.get(vid, ("running", None)))
        for vid, name in names.items()
        if re.match(r"^\[(?:\S+\s+)?\d+/\d+\] ", name)  # "[runtime  2/10] RUN ..." (BuildKit pads)
    ]


@dataclass
class RoundTrip:
    engine: Any  # conftest.SecondEngine
    client: docker.DockerClient  # of the second engine
    registry: LocalRegistry
    cache_ref: str
    first: subprocess.CompletedProcess[str]
    second: subprocess.CompletedProcess[str]
    first_s: float
    prune_s: float
    second_s: float
    image_id: str
    refs: list[str]


def built_refs(out: str) -> list[str]:
    """The tags `imgbuild build` prints under its `built IMAGE` line."""
    return re.findall(r"^  (\S+:\S+)\s*$", out, re.M)


@pytest.fixture(scope="module")
def remote(second_engine: Any) -> Iterator[docker.DockerClient]:
    """A client of the second engine. Afterwards the images the tests built there go (and any container of them);
    its base images and build cache stay (a later session's first build reuses that cache)."""
    client = docker.DockerClient(base_url=second_engine.unix, timeout=600)
    yield client
    for image in client.images.list(name="imgbuild/cpu"):
        for container in client.containers.list(all=True, filters={"ancestor": image.id}):
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image.id, force=True)
    client.close()


@pytest.fixture(scope="module")
def round_trip(
    second_engine: Any, remote: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RoundTrip]:
    root = tmp_path_factory.mktemp("cache-registry")
    registry = LocalRegistry(root).start()
    cache_ref = f"{registry.host}/imgbuild-cache/cpu:{uuid.uuid4().hex[:12]}"
    try:
        # (a) build on the second engine (its unix socket), exporting the cache
        t0 = time.monotonic()
        first = imgbuild(second_engine.env(), "build", "cpu", "--cache-to", cache_ref)
        first_s = time.monotonic() - t0
        assert first.returncode == 0, show(first)
        refs = built_refs(first.stdout)
        image_id = re.search(r"^built (sha256:[0-9a-f]{64})", first.stdout, re.M)
        assert image_id and refs, show(first)

        # (b) the image and that engine's whole build cache go: nothing local is left to reuse
        t0 = time.monotonic()
        remote.images.remove(image_id.group(1), force=True)
        remote.api.prune_builds(all=True)
        prune_s = time.monotonic() - t0
        for ref in refs:
            with pytest.raises(docker.errors.ImageNotFound):
                remote.images.get(ref)

        # (c) rebuild through tcp://127.0.0.1, from the registry's cache only
        t0 = time.monotonic()
        second = imgbuild(second_engine.env(second_engine.tcp), "build", "cpu", "--cache-from", cache_ref)
        second_s = time.monotonic() - t0
        assert second.returncode == 0, show(second)
        yield RoundTrip(
            second_engine, remote, registry, cache_ref, first, second, first_s, prune_s, second_s,
            image_id.group(1), refs,
        )  # fmt: skip
    finally:
        registry.stop()
        shutil.rmtree(root, ignore_errors=True)  # the cache's blobs


def test_build_exports_its_cache_to_the_registry(round_trip: RoundTrip) -> None:
    rt = round_trip
    out = rt.first.stdout
    assert "inline cache" in out and f"cache pushed: {rt.cache_ref}" in out, show(rt.first)
    repo, tag = rt.cache_ref.split("/", 1)[1].rsplit(":", 1)
    head = requests.head(
        f"http://{rt.registry.host}/v2/{repo}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"}, timeout=10,
    )  # fmt: skip
    assert head.status_code == 200, f"the registry has no {rt.cache_ref}: {head.status_code}"
    assert not rt.client.images.list(name=rt.cache_ref.rsplit(":", 1)[0]), "the push's temporary tag was left"
    steps = re.search(r"^\d+ of \d+ steps run, \d+ cached", out, re.M)
    print(
        f"\nfirst build on the second engine with --cache-to: {rt.first_s:.1f}s "
        f"({steps.group(0) if steps else '?'}; the engine's own cache as a last session left it); "
        f"removing the image and pruning the build cache: {rt.prune_s:.1f}s"
    )


def test_rebuild_takes_the_heavy_steps_from_the_registry(round_trip: RoundTrip) -> None:
    """Every step of the first build that downloads is, in the rebuild, either cached (its layer comes from the
    registry) or not needed at all (BuildKit skips a stage whose results later steps take from the cache); none
    runs again."""
    rt = round_trip
    first, second = steps_of(log_path(rt.first.stdout)), steps_of(log_path(rt.second.stdout))
    heavy_first = [s for s in first if HEAVY.search(s.name)]
    assert heavy_first, f"no apt-get install / pip install step in the first build's log: {[s.name for s in first]}"
    state = {s.name: s for s in second}
    ran = [f"{s.name[:140]} ({s.state}, {s.seconds}s)" for s in second if HEAVY.search(s.name) and s.state != "cached"]
    assert not ran, "downloaded again instead of taken from the registry cache:\n" + "\n".join(ran)
    cached = [s for s in heavy_first if s.name in state]
    assert cached, "no heavy step of the first build appears (cached) in the rebuild"
    # the CLI's own plain progress says so too: a step's end line is its name (cut at 100 characters), then "cached"
    # or its seconds
    cached_lines = [line for line in rt.second.stderr.splitlines() if line.endswith(" cached")]
    for step in (s for s in second if HEAVY.search(s.name)):
        assert any(line.startswith(step.name[:60]) for line in cached_lines), f"{step.name[:60]}:\n{show(rt.second)}"
    summary = re.search(r"^(\d+) of (\d+) steps run, (\d+) cached", rt.second.stdout, re.M)
    assert summary, show(rt.second)
    work = sum(s.seconds or 0 for s in heavy_first)
    skipped = [s.name[:100] for s in heavy_first if s.name not in state]
    print(
        f"\nrebuild from the registry cache over tcp: {rt.second_s:.1f}s (first build {rt.first_s:.1f}s, ratio "
        f"{rt.second_s / rt.first_s:.2f}); heavy steps of the first build ({work:.1f}s of work there): "
        f"{len(cached)} cached, {len(skipped)} not needed {skipped}; {summary.group(0)}"
    )


def test_verify_on_the_second_engine(round_trip: RoundTrip) -> None:
    rt = round_trip
    t0 = time.monotonic()
    one = imgbuild(rt.engine.env(rt.engine.tcp), "verify", "cpu", timeout=900)
    one_s = time.monotonic() - t0
    assert one.returncode == 0, show(one)
    t0 = time.monotonic()
    two = imgbuild(rt.engine.env(), "verify", "cpu", "--nodes", "2", timeout=900)
    two_s = time.monotonic() - t0
    assert two.returncode == 0, show(two)
    image = rt.client.images.get(rt.refs[0])
    leftover = [c.name for c in rt.client.containers.list(all=True, filters={"ancestor": image.id})]
    assert leftover == [], f"verify left containers on the second engine: {leftover}"
    networks = [n.name for n in rt.client.networks.list() if n.name not in ("bridge", "host", "none")]
    assert networks == [], f"verify --nodes left networks on the second engine: {networks}"
    print(f"\nverify cpu on the second engine: {one_s:.1f}s; --nodes 2: {two_s:.1f}s")


def doctor(env: dict[str, str]) -> dict[str, Any]:
    proc = imgbuild(env, "doctor", "cpu", "--json", timeout=300)
    assert proc.returncode == 0, show(proc)
    return dict(json.loads(proc.stdout))


def assert_second_engine(data: dict[str, Any], engine: Any) -> None:
    """doctor asked the second engine (its data root is in the disk row) and names the builder it builds with."""
    checks = {c["name"]: c for c in data["checks"]}
    assert engine.data_root in checks["disk"]["detail"], f"not the second engine: {checks['disk']}"
    builder = data["builder"]
    assert builder and builder["kind"] in ("buildkit", "buildx") and builder["why"], builder
    assert checks["builder"]["status"] == "ok" and builder["cli"] in checks["builder"]["detail"]
    # Debian's 20.10 CLI: its own BuildKit; a CLI with buildx: the engine's default builder (docker driver)
    assert builder["registry_cache"] is False and builder["engine_store"] is True, builder


def test_doctor_names_the_builder_of_the_second_engine(round_trip: RoundTrip) -> None:
    rt = round_trip
    assert_second_engine(doctor(rt.engine.env(rt.engine.tcp)), rt.engine)
    assert_second_engine(doctor(rt.engine.env()), rt.engine)


def make_context(engine: Any, config: Path) -> dict[str, str]:
    """A docker context `imgbuild-second` for the second engine's tcp address, in a CLI config folder of its own;
    the environment to use it with (no DOCKER_HOST)."""
    env = {k: v for k, v in engine.env().items() if k != "DOCKER_HOST"}
    env["DOCKER_CONFIG"] = str(config)
    created = subprocess.run(
        ["docker", "context", "create", "imgbuild-second", "--docker", f"host={engine.tcp}"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    return env


def test_docker_context_in_use_reaches_the_second_engine(round_trip: RoundTrip, tmp_path: Path) -> None:
    """`docker context use` (the CLI's config names the context) picks the engine as DOCKER_HOST does: doctor, and
    the builder it reports, talk to the second engine."""
    env = make_context(round_trip.engine, tmp_path / "docker-config")
    used = subprocess.run(
        ["docker", "context", "use", "imgbuild-second"], env=env, capture_output=True, text=True, check=False
    )
    assert used.returncode == 0, used.stderr
    assert_second_engine(doctor(env), round_trip.engine)


@pytest.mark.xfail(
    strict=True,
    reason="engine._from_context looks the context up through docker-py, whose context store is found only next to "
    "an existing config.json (docker.utils.config.find_config_file): with DOCKER_CONTEXT and a CLI config folder "
    "without config.json the docker CLI finds the context, imgbuild reports no engine (exit 13)",
)
def test_docker_context_variable_reaches_the_second_engine(round_trip: RoundTrip, tmp_path: Path) -> None:
    """DOCKER_CONTEXT alone, as `docker context create` leaves the CLI's folder (no config.json)."""
    env = make_context(round_trip.engine, tmp_path / "docker-config")
    assert not (tmp_path / "docker-config" / "config.json").exists()
    env["DOCKER_CONTEXT"] = "imgbuild-second"
    assert_second_engine(doctor(env), round_trip.engine)
