"""Tests for imgbuild.engine and imgbuild.build.builders against a real Docker engine and real docker CLIs (BuildKit).

The base image is made on the spot from the host's own /bin/sh and sleep plus the libraries they load
(`docker import`, well under a second, no registry, no network) and tagged with a unique name, so these
tests neither wait for nor clash with images other people build on the same engine. Every image the tests
create is removed, and the build cache records of their steps are pruned by id (never the engine's whole
cache: others build on it); "no containers left" is checked on the containers that derive from that unique
base, so other users' containers on a shared engine do not disturb the checks.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from rich.console import Console

import imgbuild
from imgbuild import engine
from imgbuild.build import builders
from imgbuild.build.builders import Builder, BuildOutcome
from imgbuild.build.builders.tags import TagSnapshot
from imgbuild.core.errors import BaseImageMissing, BuildError, EngineError, UsageError
from imgbuild.engine import client as engine_client
from imgbuild.engine import connect, ensure_base_images
from imgbuild.ui.progress import BuildProgress

TEST_REPO = "imgbuild-test/engine"
MISSING_IMAGE = "imgbuild-test.invalid/definitely-missing:nope"  # .invalid never resolves: fails fast
SRC_DIR = Path(imgbuild.__file__).resolve().parents[1]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# --------------------------------------------------------------------------------------------------------
# fixtures


def _host_rootfs_tar() -> bytes:
    """A tarball holding /bin/sh, sleep and the shared libraries they need, taken from this host."""
    files: set[str] = set()
    for binary in ("/bin/sh", "/bin/sleep"):
        real = os.path.realpath(binary)
        files.add(real)
        ldd = subprocess.run(["ldd", real], capture_output=True, text=True, check=False).stdout
        files.update(m.group(1) for m in re.finditer(r"(/\S+)", ldd))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(files):
            tar.add(os.path.realpath(path), arcname=path.lstrip("/"))
        for link in ("/bin/sh", "/bin/sleep"):
            target = os.path.realpath(link)
            if target != link:
                info = tarfile.TarInfo(link.lstrip("/"))
                info.type = tarfile.SYMTYPE
                info.linkname = target
                tar.addfile(info)
        marker = f"{uuid.uuid4()}\n".encode()  # makes the image id unique to this test session
        info = tarfile.TarInfo("etc/imgbuild-test-id")
        info.size = len(marker)
        tar.addfile(info, io.BytesIO(marker))
    return buf.getvalue()


@pytest.fixture(scope="session")
def base_image(docker_client: docker.DockerClient) -> Iterator[str]:
    name = f"{TEST_REPO}-base:{uuid.uuid4().hex[:12]}"
    repo, tag = name.rsplit(":", 1)
    docker_client.api.import_image_from_data(_host_rootfs_tar(), repository=repo, tag=tag)
    docker_client.images.get(name)
    yield name
    for c in _derived_containers(docker_client, docker_client.images.get(name).id):
        docker_client.api.remove_container(c, force=True)
    docker_client.images.remove(name, force=True)


@pytest.fixture
def make_tag(docker_client: docker.DockerClient) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def make() -> str:
        made.append(f"{TEST_REPO}:{uuid.uuid4().hex[:12]}")
        return made[-1]

    yield make
    for tag in made:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(tag, force=True)


def _derived_containers(client: docker.DockerClient, base_id: str) -> set[str]:
    """Ids of all containers whose image is base_id or built on top of it."""
    found: set[str] = set()
    for c in client.api.containers(all=True):
        image_id = c.get("ImageID", "")
        for _ in range(100):
            if not image_id:
                break
            if image_id == base_id:
                found.add(c["Id"])
                break
            try:
                image_id = client.api.inspect_image(image_id).get("Parent", "")
            except docker.errors.NotFound:
                break
    return found


def _wait_no_containers(client: docker.DockerClient, base_id: str, timeout_s: float) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = _derived_containers(client, base_id)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.25)


def _context(tmp_path: Path, dockerfile: str) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(textwrap.dedent(dockerfile).lstrip())
    return ctx


@pytest.fixture(scope="session")
def builder(docker_client: docker.DockerClient) -> Builder:
    """The builder this machine builds with (a real docker CLI); in CI a machine without one FAILS."""
    try:
        return builders.select()
    except EngineError as exc:
        if _in_ci():
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture
def marker(docker_client: docker.DockerClient) -> Iterator[str]:
    """A word unique to one test, put in its RUN steps; the build cache records that hold it are pruned afterwards
    (by id: the engine's other cache stays)."""
    word = f"imgbuild-test-{uuid.uuid4().hex[:12]}"
    yield word
    _prune_cache_of(docker_client, word)


def _prune_cache_of(client: docker.DockerClient, word: str) -> None:
    """Prune the build cache records whose description holds `word`, children first (a record a later step's
    record builds on is kept while that one is there), until none is left."""
    for _ in range(10):
        records = [r for r in client.df().get("BuildCache") or [] if word in str(r.get("Description") or "")]
        if not records:
            return
        for rec in records:
            with contextlib.suppress(docker.errors.APIError):
                client.api.prune_builds(filters={"id": [rec["ID"]]})


def _build(
    builder: Builder,
    client: docker.DockerClient,
    ctx: Path,
    tags: list[str],
    log: Path,
    *,
    labels: dict[str, str] | None = None,
    nocache: bool = False,
    progress: BuildProgress | None = None,
    cache: builders.Cache | None = None,
) -> BuildOutcome:
    return builders.build(
        builder, client, ctx, tags=tags, labels=labels or {}, nocache=nocache, log_path=log, progress=progress,
        cache=cache,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------------
# builds


@pytest.mark.docker
def test_build_tiny_image(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    marker: str,
) -> None:
    ctx = _context(
        tmp_path,
        f"""
        FROM {base_image}
        RUN echo hello-from-build {marker} && sleep 1
        ENV IMGBUILD_TEST=1
        LABEL org.example.test=yes
        """,
    )
    tag, extra = make_tag(), make_tag()
    log = tmp_path / "logs" / "deep" / "build.log"
    out = _build(builder, docker_client, ctx, [tag, extra], log, labels={"imgbuild.recipe": "tiny"})

    image = docker_client.images.get(tag)
    assert out.image_id == image.id  # from the iidfile
    assert docker_client.images.get(extra).id == image.id
    assert out.tags == (tag, extra)
    assert out.log_path == log
    # BuildKit's steps are FROM and RUN (ENV and LABEL change only the image config)
    assert [s.name.split("] ", 1)[0] + "]" for s in out.steps] == ["[1/2]", "[2/2]"]
    from_step, run_step = out.steps
    assert run_step.name == f"[2/2] RUN echo hello-from-build {marker} && sleep 1"
    assert not run_step.cached and 1.0 <= run_step.seconds < 30
    assert (out.steps_total, out.steps_run) == (2, 1)
    assert out.steps_cached == (1 if from_step.cached else 0)
    assert out.duration_s >= run_step.seconds
    assert out.digest is None or out.digest.startswith("sha256:")
    assert image.labels["imgbuild.recipe"] == "tiny"
    assert image.labels["org.example.test"] == "yes"
    assert "IMGBUILD_TEST=1" in image.attrs["Config"]["Env"]
    text = log.read_text()
    assert "#1 " in text and f"hello-from-build {marker}" in text and "# imgbuild: built" in text


@pytest.mark.docker
def test_second_build_is_all_cache(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    marker: str,
) -> None:
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo {marker} > /a\nRUN echo two-{marker} > /b\nENV A=1\n")
    tag = make_tag()
    first = _build(builder, docker_client, ctx, [tag], tmp_path / "1.log")
    out = io.StringIO()
    second = _build(builder, docker_client, ctx, [tag], tmp_path / "2.log",
                    progress=BuildProgress(Console(file=out), live=False))  # fmt: skip
    assert first.steps_run == 2 and [s.cached for s in first.steps[1:]] == [False, False]
    assert second.steps_run == 0
    assert second.steps_total == first.steps_total == 3
    assert [s.cached for s in second.steps[1:]] == [True, True] and second.steps_cached >= 2
    assert second.image_id == first.image_id
    assert "CACHED" in (tmp_path / "2.log").read_text()
    assert f"[2/3] RUN echo {marker} > /a cached\n" in out.getvalue()  # the plain end line says so


@pytest.mark.docker
def test_failing_run_names_step_and_leaves_no_container(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    marker: str,
) -> None:
    base_id = docker_client.images.get(base_image).id
    before = _derived_containers(docker_client, base_id)
    ctx = _context(
        tmp_path, f"FROM {base_image}\nRUN echo {marker} && echo hello-from-step && echo last-line && exit 3\nENV A=1\n"
    )
    log = tmp_path / "fail.log"
    tag = make_tag()
    with pytest.raises(BuildError) as info:
        _build(builder, docker_client, ctx, [tag], log)
    err = info.value
    assert not isinstance(err, BaseImageMissing)
    assert err.exit_code == 9
    msg = str(err)
    assert f"failed at [2/2] RUN echo {marker} && echo hello-from-step" in msg
    tail = msg.split("--- last", 1)[1]
    assert "hello-from-step" in tail and "last-line" in tail  # the step's own output, not just the instruction
    assert "exit code: 3" in msg
    assert str(log) in msg
    assert "hello-from-step" in log.read_text()
    assert _wait_no_containers(docker_client, base_id, 5) - before == set()
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)


@pytest.mark.docker
def test_dockerfile_error_before_first_step(
    docker_client: docker.DockerClient, builder: Builder, base_image: str, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    ctx = _context(tmp_path, f"FROM {base_image}\nNOTANINSTRUCTION foo\n")
    with pytest.raises(BuildError) as info:
        _build(builder, docker_client, ctx, [make_tag()], tmp_path / "bad.log")
    assert "before its first step" in str(info.value)
    assert "notaninstruction" in str(info.value).lower()


@pytest.mark.docker
def test_missing_base_image(docker_client: docker.DockerClient, base_image: str) -> None:
    ensure_base_images(docker_client, [base_image, "scratch"], pull=False)  # present: no error
    with pytest.raises(BaseImageMissing) as info:
        ensure_base_images(docker_client, [base_image, MISSING_IMAGE], pull=False)
    err = info.value
    assert err.exit_code == 10
    assert f"base image {MISSING_IMAGE} is not in the engine and could not be pulled" in err.message
    assert err.hint is not None and f"imgbuild base bootstrap {MISSING_IMAGE}" in err.hint


@pytest.mark.docker
def test_inspect_image_present_absent_and_malformed(docker_client: docker.DockerClient, base_image: str) -> None:
    found = engine.inspect_image(docker_client, base_image)
    assert found is not None and found["Id"] == docker_client.images.get(base_image).id
    assert base_image in found["RepoTags"]
    assert engine.inspect_image(docker_client, MISSING_IMAGE) is None
    assert engine.inspect_image(docker_client, "Not/A:Valid:Reference") is None  # 400: names no image


@pytest.mark.docker
def test_missing_base_image_pull_fails(docker_client: docker.DockerClient) -> None:
    with pytest.raises(BaseImageMissing) as info:
        ensure_base_images(docker_client, [MISSING_IMAGE], pull=True)
    assert "could not be pulled: " in info.value.message
    assert info.value.hint is not None and "imgbuild base bootstrap" in info.value.hint


@pytest.mark.docker
def test_build_with_missing_from_raises_base_image_missing(
    docker_client: docker.DockerClient, builder: Builder, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    ctx = _context(tmp_path, f"FROM {MISSING_IMAGE}\nRUN true\n")
    with pytest.raises(BaseImageMissing) as info:
        _build(builder, docker_client, ctx, [make_tag()], tmp_path / "m.log")
    assert info.value.exit_code == 10
    assert f"base image {MISSING_IMAGE} is not in the engine and could not be pulled" in str(info.value)
    assert info.value.hint is not None and f"imgbuild base bootstrap {MISSING_IMAGE}" in info.value.hint


@pytest.mark.docker
def test_plain_progress_shows_steps_with_times_and_no_escape_codes(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    marker: str,
) -> None:
    monkeypatch.setenv("CI", "1")
    out = io.StringIO()
    # Even a console that claims to be a terminal gets the plain rendering when CI is set.
    progress = BuildProgress.auto(Console(file=out, force_terminal=True, width=100))
    assert not progress.live
    ctx = _context(
        tmp_path,
        f"""
        FROM {base_image} AS one
        RUN echo {marker} && sleep 2 && echo from-one
        FROM {base_image} AS two
        RUN echo {marker} && sleep 2 && echo from-two
        FROM {base_image}
        COPY --from=one /etc/imgbuild-test-id /one
        COPY --from=two /etc/imgbuild-test-id /two
        RUN printf '\\033[31mred\\033[0m text\\rover\\n' && echo second-line && echo {marker}
        """,
    )
    result = _build(builder, docker_client, ctx, [make_tag()], tmp_path / "p.log", progress=progress)
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text
    assert f"[one 2/2] RUN echo {marker} && sleep 2 && echo from-one\n" in text  # the start line
    assert re.search(rf"^\[one 2/2\] RUN echo {marker} && sleep 2 && echo from-one \d+\.\ds$", text, re.M)  # its end
    assert re.search(rf"^\[two 2/2\] RUN echo {marker} && sleep 2 && echo from-two \d+\.\ds$", text, re.M)
    assert "\n    from-one\n" in text and "\n    from-two\n" in text
    assert "\n    second-line\n" in text
    assert "\n    over\n" in text  # the carriage-return overwrite keeps only what a terminal would show
    assert "\nbuilt " in text and f"{result.steps_run} of {result.steps_total} steps run" in text
    # the two stages ran at once (the CLI may print each one's lines together: BuildKit 20.10's plain printer does)
    one, two = (next(st for st in result.steps if st.name.startswith(f"[{s} 2/2]")) for s in ("one", "two"))
    assert one.seconds >= 2 and two.seconds >= 2 and result.duration_s < one.seconds + two.seconds


@pytest.mark.docker
def test_live_progress_on_a_terminal(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    marker: str,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    out = io.StringIO()
    progress = BuildProgress.auto(Console(file=out, force_terminal=True, width=160))
    assert progress.live
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo {marker} && sleep 1\n")
    _build(builder, docker_client, ctx, [make_tag()], tmp_path / "l.log", progress=progress)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert re.search(rf"\[2/2\] RUN echo {marker} && sleep 1  \(\d+\.\ds\)", text), text
    assert "built " in text and "steps run" in text


@pytest.mark.docker
def test_tags_a_build_moved_are_put_back(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    marker: str,
) -> None:
    """What a cancelled or failed build does to its tags: one it made is removed, one it moved goes back to the
    image it named before."""
    base_id = docker_client.images.get(base_image).id
    made, moved, other = make_tag(), make_tag(), make_tag()
    docker_client.api.tag(base_id, *moved.rsplit(":", 1))
    held = TagSnapshot(docker_client, [made, moved])
    assert held.before == {made: None, moved: base_id}
    new_id = _build(builder, docker_client, _context(tmp_path, f"FROM {base_image}\nRUN echo {marker} > /x\n"),
                    [other], tmp_path / "b.log").image_id  # fmt: skip
    for tag in (made, moved):  # as BuildKit's exporter names the new image
        docker_client.api.tag(new_id, *tag.rsplit(":", 1))
    assert held.not_restored() == [made, moved]
    assert held.restore() == [made, moved]
    assert held.not_restored() == []
    assert engine.inspect_image(docker_client, made) is None
    assert docker_client.images.get(moved).id == base_id
    assert docker_client.images.get(other).id == new_id  # what the build did not tag stays


INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    from pathlib import Path
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    from imgbuild.build import builders
    from imgbuild.engine import connect
    from imgbuild.core.interrupts import terminable
    from imgbuild.ui.progress import BuildProgress
    from imgbuild.core.errors import ImgbuildError
    ctx, log, tag = sys.argv[1:4]

    @terminable
    def main():
        builders.build(builders.select(), connect(), Path(ctx), tags=[tag], log_path=Path(log),
                       progress=BuildProgress.auto())

    try:
        main()
    except ImgbuildError as exc:
        print(f"ERROR: {exc}", flush=True)
        sys.exit(exc.exit_code)
    print("finished without interruption", flush=True)
    """
)


def _processes_with(word: str) -> list[int]:
    """Processes on this machine whose command line holds `word` (the engine's BuildKit runs steps here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if word.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _local_engine() -> bool:
    return os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")


@pytest.mark.docker
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_interrupt_cancels_build_and_leaves_no_container_nor_tag(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    marker: str,
    sig: signal.Signals,
    code: int,
) -> None:
    base_id = docker_client.images.get(base_image).id
    before = {c["Id"] for c in docker_client.api.containers(all=True)}
    seconds = f"61.{uuid.uuid4().int % 10**6:06d}"  # the step's sleep, found by its unique argument
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo {marker} && echo step-started && sleep {seconds}\nENV A=1\n")
    log = tmp_path / "interrupt.log"
    tag = make_tag()
    env = {
        **os.environ,
        "CI": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_SCRIPT, str(ctx), str(log), tag],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text() if log.exists() else ""
            if re.search(r"^#\d+ \d+\.\d+ step-started$", text, re.M):  # the step's output, not its command
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the build never reached its RUN step; log:\n{log.read_text() if log.exists() else ''}")
        if _local_engine():
            assert _processes_with(f"sleep {seconds}"), "the step's sleep should be running"
        t0 = time.monotonic()
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, output
    assert "build cancelled" in output and "no image tagged" in output
    assert ("terminated (SIGTERM)" in output) == (sig == signal.SIGTERM)
    assert f"[2/2] RUN echo {marker} && echo step-started" in output
    assert "\n    step-started\n" in output
    assert "\x1b" not in output and "Traceback" not in output
    assert took < builders.CANCEL_WAIT_S, f"the CLI took {took:.1f}s to stop: it was killed, not cancelled"
    text = log.read_text()
    assert "interrupted" in text and "CANCELED" in text  # BuildKit cancelled the step itself
    if _local_engine():
        deadline = time.monotonic() + 15
        while _processes_with(f"sleep {seconds}") and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _processes_with(f"sleep {seconds}") == [], "the step's process outlived the build"
    assert {c["Id"] for c in docker_client.api.containers(all=True)} - before == set() or (
        _wait_no_containers(docker_client, base_id, 5) == set()
    )
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)


@pytest.mark.docker
def test_a_killed_imgbuild_does_not_leave_its_build_running(
    docker_client: docker.DockerClient, builder: Builder, base_image: str, make_tag: Callable[[], str],
    tmp_path: Path, marker: str,
) -> None:  # fmt: skip
    """SIGKILL gives imgbuild no chance to cancel: the CLI gets SIGINT from the kernel (PR_SET_PDEATHSIG) instead."""
    if not _local_engine():
        pytest.skip("watches the step's process on this machine")
    seconds = f"62.{uuid.uuid4().int % 10**6:06d}"
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo {marker} && echo step-started && sleep {seconds}\n")
    log, tag = tmp_path / "killed.log", make_tag()
    env = {**os.environ, "CI": "1", "PYTHONPATH": os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")])}
    # The killed imgbuild cannot remove its work folder (iidfile, secrets): it makes it in tmp_path, not in /tmp.
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPT_SCRIPT, str(ctx), str(log), tag],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _processes_with(f"sleep {seconds}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with(f"sleep {seconds}"), "the step never started"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while (_processes_with(f"sleep {seconds}") or _processes_with(str(ctx))) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _processes_with(f"sleep {seconds}") == [], "the build went on after imgbuild was killed"
    assert _processes_with(str(ctx)) == [], "the docker CLI outlived imgbuild"
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)


# --------------------------------------------------------------------------------------------------------
# the cache between machines


@pytest.fixture(scope="module")
def local_registry(tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1:<free port> (test_publish's), which the engine trusts over HTTP."""
    from test_publish import LocalRegistry

    reg = LocalRegistry(tmp_path_factory.mktemp("cache-registry")).start()
    yield reg.host
    reg.stop()


@pytest.mark.docker
def test_inline_cache_round_trip_through_a_registry(
    docker_client: docker.DockerClient,
    builder: Builder,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    marker: str,
    local_registry: str,
) -> None:
    """Build with the inline cache and push it (--cache-to); prune this build's cache records and remove the image;
    the rebuild with --cache-from takes every step from the registry instead of running it."""
    if builder.registry_cache:
        pytest.skip("this builder exports a registry cache; the inline cache is for the others")
    ctx = _context(
        tmp_path,
        f"FROM {base_image}\nRUN echo {marker} > /a && sleep 2\nRUN echo two-{marker} > /b && sleep 1\nENV A=1\n",
    )
    ref = f"{local_registry}/imgbuild-test/cache:{marker}"
    cache = builders.cache_plan(builder, [], ref)
    assert cache.mode == "inline" and cache.push_ref == ref
    assert "--build-arg" in cache.args and "BUILDKIT_INLINE_CACHE=1" in cache.args
    tag = make_tag()
    first = _build(builder, docker_client, ctx, [tag], tmp_path / "1.log", cache=cache)
    assert first.steps_run == 2
    digest = builders.push_inline_cache(docker_client, first.image_id, ref)
    assert digest.startswith("sha256:")
    assert engine.inspect_image(docker_client, ref) is None  # the push's local tag is gone again
    layers = docker_client.images.get(tag).attrs["RootFS"]["Layers"]
    docker_client.images.remove(tag, force=True)
    _prune_cache_of(docker_client, marker)
    cold = _build(builder, docker_client, ctx, [tag], tmp_path / "2.log")  # no --cache-from: the steps run again
    assert cold.steps_run == 2, (tmp_path / "2.log").read_text()
    docker_client.images.remove(tag, force=True)
    _prune_cache_of(docker_client, marker)

    warm = builders.cache_plan(builder, [ref])
    assert warm.args == ("--cache-from", ref)
    again = _build(builder, docker_client, ctx, [tag], tmp_path / "3.log", cache=warm)
    log = (tmp_path / "3.log").read_text()
    assert again.steps_run == 0, log
    assert [s.cached for s in again.steps[1:]] == [True, True]
    # the same layers (the image id differs: the first one's config carries the inline cache metadata)
    assert docker_client.images.get(tag).attrs["RootFS"]["Layers"] == layers
    assert ref.split("/", 1)[1].split(":")[0] in log  # the cache came from the registry


@pytest.mark.docker
def test_a_failed_cache_push_leaves_no_tag(docker_client: docker.DockerClient, base_image: str, tmp_path: Path) -> None:
    from imgbuild.core.errors import PushError
    from test_publish import free_port

    ref = f"127.0.0.1:{free_port()}/imgbuild-test/cache:nothing-listens"
    image_id = docker_client.images.get(base_image).id
    with pytest.raises(PushError) as info:
        builders.push_inline_cache(docker_client, image_id, ref)
    assert "127.0.0.1" in str(info.value)
    assert engine.inspect_image(docker_client, ref) is None


# --------------------------------------------------------------------------------------------------------
# which builder: real docker CLIs


def _cli(path: str) -> tuple[int, bool] | None:
    """(major version, has buildx) of the docker CLI at path; None when there is none."""
    if not os.access(path, os.X_OK):
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"version (\d+)\.", out)
    if m is None:
        return None
    buildx = subprocess.run([path, "buildx", "version"], capture_output=True, check=False).returncode == 0
    return int(m.group(1)), buildx


NEW_CLI, OLD_CLI = "/usr/local/bin/docker", "/usr/bin/docker"


def _need_new_cli_without_buildx() -> None:
    got = _cli(NEW_CLI)
    if got is None or got[0] < builders.BUILDX_MIN_CLASSIC or got[1]:
        pytest.skip(f"needs a docker CLI >= 23 without buildx at {NEW_CLI} (found: {got})")


def _need_old_cli() -> None:
    got = _cli(OLD_CLI)
    if got is None or got[0] >= builders.BUILDX_MIN_CLASSIC or got[1]:
        msg = f"needs Debian's docker CLI 20.10 (docker.io) without buildx at {OLD_CLI} (found: {got})"
        if _in_ci():
            pytest.fail(msg)
        pytest.skip(msg)


def test_a_new_cli_without_buildx_is_refused_with_the_reason() -> None:
    _need_new_cli_without_buildx()
    with pytest.raises(EngineError) as info:
        builders.select(env={**os.environ, builders.CLI_ENV: NEW_CLI})
    err = info.value
    assert err.exit_code == 8
    assert f"tried {NEW_CLI} (" in err.message and "no buildx plugin" in err.message
    assert "from docker CLI 23.0 on, `docker build` needs buildx" in err.message
    assert err.hint is not None and "docker-buildx-plugin" in err.hint and "cli-plugins" in err.hint
    assert "20.10" in err.hint and "docker.io" in err.hint


def test_the_old_cli_after_a_new_one_on_path_is_picked() -> None:
    _need_new_cli_without_buildx()
    _need_old_cli()
    env = {k: v for k, v in os.environ.items() if k not in (builders.CLI_ENV, builders.BUILDER_ENV)}
    chosen = builders.select(env={**env, "PATH": "/usr/local/bin:/usr/bin"})
    assert (chosen.kind, chosen.cli) == ("buildkit", OLD_CLI)
    assert chosen.cli_version.startswith("20.10") and chosen.engine_store and not chosen.registry_cache
    assert [s.cli for s in chosen.skipped] == [NEW_CLI]
    assert "needs buildx" in chosen.skipped[0].reason
    assert "its own BuildKit client" in chosen.why and chosen.describe().startswith(
        f"DOCKER_BUILDKIT=1 docker build through {OLD_CLI}"
    )
    # /usr/bin/docker is tried even when PATH leaves it out
    only_new = builders.select(env={**env, "PATH": os.path.dirname(NEW_CLI)})
    assert only_new.cli == OLD_CLI


def test_builder_name_without_buildx_is_an_engine_error_naming_the_option() -> None:
    _need_old_cli()
    env = {k: v for k, v in os.environ.items() if k not in (builders.CLI_ENV, builders.BUILDER_ENV)}
    with pytest.raises(EngineError) as info:
        builders.select("team-builder", env={**env, "PATH": "/usr/local/bin:/usr/bin"})
    assert info.value.exit_code == 8
    assert "--builder team-builder" in info.value.message and "no docker CLI here has buildx" in info.value.message
    with pytest.raises(EngineError) as info:
        builders.select(env={**env, builders.BUILDER_ENV: "team-builder"})
    assert "--builder team-builder (IMGBUILD_BUILDER)" in info.value.message


def test_no_docker_cli_at_all(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as info:
        builders.select(env={"PATH": str(tmp_path), builders.CLI_ENV: str(tmp_path / "docker")})
    assert "not an executable file" in info.value.message and info.value.hint and "buildx" in info.value.hint
    if not os.path.exists(OLD_CLI):
        with pytest.raises(EngineError, match="no docker CLI found"):
            builders.select(env={"PATH": str(tmp_path)})


def test_cache_refs_and_the_command_line() -> None:
    """What --cache-from / --cache-to become for each kind of builder (the command line is built, not run)."""
    buildkit = Builder("buildkit", OLD_CLI, "20.10.24")
    docker_driver = Builder("buildx", NEW_CLI, "28.2.2", driver="docker", buildx_version="v0.25.0")
    remote = Builder("buildx", NEW_CLI, "28.2.2", name="team", driver="remote", buildx_version="v0.25.0")
    ref = "123456789012.dkr.ecr.us-east-1.amazonaws.com/imgbuild/cache:cpu"
    for b in (buildkit, docker_driver):
        plan = builders.cache_plan(b, [ref, "127.0.0.1:5000/c:x"], ref)
        assert plan.mode == "inline" and plan.push_ref == ref
        assert plan.args == ("--cache-from", ref, "--cache-from", "127.0.0.1:5000/c:x", "--build-arg",
                             "BUILDKIT_INLINE_CACHE=1")  # fmt: skip
    plan = builders.cache_plan(remote, [ref], ref)
    assert plan.mode == "registry" and plan.push_ref is None
    assert plan.args == (
        "--cache-from", f"type=registry,ref={ref}",
        "--cache-to", f"type=registry,ref={ref},mode=max,image-manifest=true,oci-mediatypes=true",
    )  # fmt: skip
    assert builders.cache_plan(buildkit).mode == "none"
    with pytest.raises(UsageError, match="--cache-from"):
        builders.cache_plan(buildkit, ["Not A Ref"])
    with pytest.raises(UsageError, match="--cache-to"):
        builders.cache_plan(buildkit, [], "x/y@sha256:" + "0" * 64)
    ctx, iid, meta = Path("/ctx"), Path("/w/iid"), Path("/w/meta.json")
    common = dict(tags=["a:1", "b:2"], labels={"k": "v"}, build_args={"X": "1"}, nocache=True, pull=False,
                  secrets={"imgbuild-ca": Path("/s/ca.pem")}, iidfile=iid, metadata_file=meta)  # fmt: skip
    argv = builders.command(buildkit, ctx, cache=builders.cache_plan(buildkit), **common)  # type: ignore[arg-type]
    assert argv == [OLD_CLI, "build", "--progress=plain", "--iidfile", "/w/iid", "-t", "a:1", "-t", "b:2",
                    "--label", "k=v", "--build-arg", "X=1", "--no-cache", "--secret", "id=imgbuild-ca,src=/s/ca.pem",
                    "-f", "/ctx/Dockerfile", "/ctx"]  # fmt: skip
    assert builders.cli_env(buildkit, {})["DOCKER_BUILDKIT"] == "1"
    argv = builders.command(remote, ctx, cache=plan, **common)  # type: ignore[arg-type]
    assert argv[:10] == [NEW_CLI, "buildx", "build", "--builder", "team", "--progress=plain", "--iidfile", "/w/iid",
                         "--metadata-file", "/w/meta.json"]  # fmt: skip
    assert "--load" in argv and "type=registry,ref=" + ref in argv
    assert "--load" not in builders.command(docker_driver, ctx, cache=plan, **common)  # type: ignore[arg-type]
    assert (buildkit.engine_store, docker_driver.engine_store, remote.engine_store) == (True, True, False)
    assert (buildkit.registry_cache, docker_driver.registry_cache, remote.registry_cache) == (False, False, True)


# --------------------------------------------------------------------------------------------------------
# no engine needed


STAND_IN_CLI = textwrap.dedent(
    """
    import signal, sys, time
    def stop(signum, frame):
        print("#2 CANCELED", flush=True)
        sys.exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == "deaf" else stop)
    print("#1 [1/2] RUN true", flush=True)
    print("#1 DONE 0.1s", flush=True)
    if sys.argv[1] == "ends":
        sys.exit(3)
    print("#2 [2/2] RUN sleep 60", flush=True)
    time.sleep(60)
    """
)


def test_the_cli_process_hands_on_its_lines_and_is_cancelled_or_killed() -> None:
    """`process.CliProcess` with a real process standing in for the docker CLI: every line reaches the caller in
    order and the exit code comes back; a CLI that heeds SIGINT stops by itself (its last lines still read), one
    that ignores it is killed once the wait is over."""
    from imgbuild.build.builders.process import CliProcess

    seen: list[str] = []
    ends = CliProcess([sys.executable, "-c", STAND_IN_CLI, "ends"], os.environ, seen.append)
    ends.start()
    assert ends.follow() == 3
    assert seen == ["#1 [1/2] RUN true", "#1 DONE 0.1s"]

    def interrupt_at_the_second_step(line: str) -> None:
        seen.append(line)
        if line.startswith("#2 [2/2]"):
            raise KeyboardInterrupt  # as Ctrl-C arrives while the CLI builds

    for how, killed in (("heeds", False), ("deaf", True)):
        seen.clear()
        cli = CliProcess([sys.executable, "-c", STAND_IN_CLI, how], os.environ, interrupt_at_the_second_step)
        cli.start()
        with pytest.raises(KeyboardInterrupt):
            cli.follow()
        t0 = time.monotonic()
        assert cli.cancel(1.0) is killed, how
        assert time.monotonic() - t0 < 15, how
        assert seen[-1] == ("#2 [2/2] RUN sleep 60" if killed else "#2 CANCELED"), seen
        assert cli._started().poll() is not None, f"the stand-in that {how} still runs"
    with pytest.raises(OSError):
        CliProcess(["/nonexistent/docker"], os.environ, seen.append).start()


class _Told:
    """A `BuildObserver` that notes what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def vertex_started(self, vid: str, name: str) -> None:
        self.events.append(("started", vid, name))

    def vertex_output(self, vid: str, line: str) -> None:
        self.events.append(("output", vid, line))

    def vertex_status(self, vid: str, text: str) -> None:
        self.events.append(("status", vid, text))

    def vertex_done(self, vid: str, name: str, state: str, seconds: float) -> None:
        self.events.append(("done", vid, state))


def test_buildkits_plain_stream_is_read_into_vertices() -> None:
    """`stream.Stream` on lines as BuildKit's plain stream interleaves them: each line goes to the log, each vertex
    is told to the observer once started and once ended, the finished steps and the failed one are known, with the
    failed step's last lines."""
    from imgbuild.build.builders.stream import Stream

    log, told = io.StringIO(), _Told()
    stream = Stream(log, told)  # type: ignore[arg-type]
    lines = [
        "#1 [internal] load build definition from Dockerfile",
        "#1 DONE 0.0s",
        "#2 [base 1/3] FROM docker.io/library/debian:bookworm-slim",
        "#2 CACHED",
        "#3 [base 2/3] RUN echo one",
        "#4 [other 2/2] RUN false",
        "#3 0.101 \x1b[1mone\x1b[0m",
        "#4 0.200 no luck",
        "#3 DONE 1.5s",
        '#4 ERROR: process "/bin/sh -c false" did not complete successfully: exit code: 1',
        "#5 exporting to image",
        "#5 exporting layers 0.3s done",
        "------",
        "ERROR: failed to solve: exit code: 1",
    ]
    for line in lines:
        stream.line(line)
    assert log.getvalue() == "".join(line + "\n" for line in lines)
    assert [(v.name, v.state) for v in stream.steps()] == [
        ("[base 1/3] FROM docker.io/library/debian:bookworm-slim", "cached"),
        ("[base 2/3] RUN echo one", "done"),
    ]
    assert stream.steps()[1].seconds == 1.5 and stream.steps()[0].is_from
    failed = stream.failed()
    assert failed is not None and failed.name == "[other 2/2] RUN false"
    assert failed.error.startswith('process "/bin/sh -c false" did not complete successfully')
    assert list(failed.tail) == ["no luck"]
    assert [v.name for v in stream.running()] == ["exporting to image"]
    assert list(stream.trailer) == ["ERROR: failed to solve: exit code: 1"]
    assert ("output", "3", "\x1b[1mone\x1b[0m") in told.events  # the observer cleans what it shows
    assert ("status", "5", "exporting layers 0.3s done") in told.events
    assert [e for e in told.events if e[0] == "done"] == [
        ("done", "1", "done"),
        ("done", "2", "cached"),
        ("done", "3", "done"),
        ("done", "4", "error"),
    ]


def test_connect_names_docker_host_when_unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    with pytest.raises(EngineError) as info:
        connect()
    text = str(info.value)
    assert f"DOCKER_HOST=unix://{tmp_path}/no-such.sock" in text
    assert "scripts/setup.sh" in text and "imgbuild doctor" in text
    assert "Traceback" not in text


def test_connect_names_default_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)

    def refuse() -> None:
        raise docker.errors.DockerException("Error while fetching server API version: boom")

    monkeypatch.setattr(engine_client.docker, "from_env", refuse)
    with pytest.raises(EngineError) as info:
        connect()
    assert "/var/run/docker.sock" in str(info.value) and "DOCKER_HOST is unset" in str(info.value)


def test_inspect_image_with_the_engine_gone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    host = f"unix://{tmp_path}/gone.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    client = docker.DockerClient(base_url=host, version="1.41")  # a fixed API version: no request on creation
    with pytest.raises(EngineError) as info:
        engine.inspect_image(client, "debian:bookworm-slim")
    message = info.value.message
    assert message.startswith(
        f"lost the Docker engine at DOCKER_HOST={host} while looking up image debian:bookworm-slim: "
    )
    assert "No such file or directory" in message and "Traceback" not in message
    assert info.value.hint == engine.SETUP_HINT


def test_engine_error_for_a_refusal_names_what_was_done() -> None:
    refused = docker.errors.APIError("500 Server Error", explanation="write /var/lib/docker: no space left on device")
    err = engine.engine_error(refused, "tagging abc as x/y:1")
    assert (
        err.message
        == "the Docker engine failed while tagging abc as x/y:1: write /var/lib/docker: no space left on device"
    )
    assert err.hint is None
    noted = engine.engine_error(refused, "building x/y:1", note="full log: /tmp/build.log")
    assert noted.message.endswith(": write /var/lib/docker: no space left on device\nfull log: /tmp/build.log")


def test_progress_auto_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert BuildProgress.auto(Console(file=io.StringIO(), force_terminal=True)).live
    assert not BuildProgress.auto(Console(file=io.StringIO())).live
    monkeypatch.setenv("CI", "true")
    assert not BuildProgress.auto(Console(file=io.StringIO(), force_terminal=True)).live


def test_a_builds_own_lines_and_its_cache_push_show_on_its_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build floor reports through `builders.BuildObserver`: its own lines (`say`) and the push of its inline
    cache (`push_observer`) go where the build's progress goes, rendered the same way (plain in CI, bars on a
    terminal)."""
    from imgbuild.ui.progress import LivePushProgress, PlainPushProgress

    monkeypatch.delenv("CI", raising=False)
    buf = io.StringIO()
    plain = BuildProgress.auto(Console(file=buf, width=200))
    plain.say("local file torch-2.9.0.whl: sha256 matches the lock")
    pushing = plain.push_observer()
    assert isinstance(pushing, PlainPushProgress)
    pushing.start("registry.example:5000/team/cache:h100", 1)
    assert buf.getvalue().splitlines() == [
        "local file torch-2.9.0.whl: sha256 matches the lock",
        "pushing registry.example:5000/team/cache:h100",
    ]
    live = BuildProgress.auto(Console(file=io.StringIO(), force_terminal=True))
    assert isinstance(live.push_observer(), LivePushProgress)


# ------------------------------------------------------------------------------------------------------------
# The host's address on Docker's bridge (conftest.docker_bridge_address: where containers reach moto's S3 server)


def test_bridge_address_is_the_gateway_an_engine_states_else_its_interface() -> None:
    from conftest import bridge_address

    newer = {"Name": "bridge", "IPAM": {"Config": [{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]}}
    unread = lambda name: pytest.fail(f"{name} read although the gateway is stated")  # noqa: E731
    assert bridge_address(newer, unread) == "172.17.0.1"
    # docker.io 20.10 started afresh: no Gateway in the record, docker0 holds the address
    fresh = {
        "Name": "bridge",
        "IPAM": {"Config": [{"Subnet": "172.18.0.0/16"}]},
        "Options": {"com.docker.network.bridge.name": "br-test"},
    }
    asked: list[str] = []
    assert bridge_address(fresh, lambda name: asked.append(name) or "172.18.0.1") == "172.18.0.1"
    assert asked == ["br-test"]
    with pytest.raises(pytest.fail.Exception, match="outside the bridge network's subnets"):
        bridge_address(fresh, lambda name: "10.1.2.3")
    with pytest.raises(pytest.fail.Exception, match="has no IPv4 address"):
        bridge_address({"Name": "bridge", "IPAM": {"Config": None}}, lambda name: None)


@pytest.mark.docker
def test_bridge_address_is_the_default_route_of_a_container(docker_client: docker.DockerClient) -> None:
    """What the S3 tests bind moto to is the gateway a container on the default bridge routes through, whether
    or not the engine's record states it (a fresh 20.10 engine does not)."""
    from conftest import docker_bridge_address

    out = docker_client.containers.run(
        "debian:bookworm-slim", ["cat", "/proc/net/route"], network_mode="bridge", remove=True
    ).decode()
    default = next(line.split() for line in out.splitlines()[1:] if line.split()[1] == "00000000")
    gateway = ".".join(str(b) for b in bytes.fromhex(default[2])[::-1])  # the kernel prints it little-endian
    assert docker_bridge_address(docker_client) == gateway
