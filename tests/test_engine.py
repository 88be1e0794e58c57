"""Tests for imgbuild.engine against a real Docker engine (classic builder).

The base image is made on the spot from the host's own /bin/sh and sleep plus the libraries they load
(`docker import`, well under a second, no registry, no network) and tagged with a unique name, so these
tests neither wait for nor clash with images other people build on the same engine. Every image and
container the tests create is removed; "no containers left" is checked on the containers that derive
from that unique base, so other users' containers on a shared engine do not disturb the checks.
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
from imgbuild.engine import BuildOutcome, build_image, connect, ensure_base_images
from imgbuild.errors import BaseImageMissing, BuildError, EngineError
from imgbuild.progress import BuildProgress

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


def _build(
    client: docker.DockerClient,
    ctx: Path,
    tags: list[str],
    log: Path,
    *,
    labels: dict[str, str] | None = None,
    nocache: bool = False,
    progress: BuildProgress | None = None,
) -> BuildOutcome:
    return build_image(
        client,
        ctx,
        tags=tags,
        labels=labels or {},
        buildargs={},
        nocache=nocache,
        pull=False,
        log_path=log,
        progress=progress,
    )


# --------------------------------------------------------------------------------------------------------
# engine tests


@pytest.mark.docker
def test_build_tiny_image(
    docker_client: docker.DockerClient, base_image: str, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    ctx = _context(
        tmp_path,
        f"""
        FROM {base_image}
        RUN echo hello-from-build
        ENV IMGBUILD_TEST=1
        LABEL org.example.test=yes
        """,
    )
    tag, extra = make_tag(), make_tag()
    log = tmp_path / "logs" / "deep" / "build.log"
    out = _build(docker_client, ctx, [tag, extra], log, labels={"imgbuild.recipe": "tiny"})

    image = docker_client.images.get(tag)
    assert out.image_id == image.id
    assert docker_client.images.get(extra).id == image.id
    assert out.tags == (tag, extra)
    assert out.log_path == log
    assert out.steps_total >= 4  # the builder appends a LABEL step for the labels argument
    assert out.steps_run == out.steps_total - 1  # all but FROM
    assert out.duration_s > 0
    assert image.labels["imgbuild.recipe"] == "tiny"
    assert image.labels["org.example.test"] == "yes"
    assert "IMGBUILD_TEST=1" in image.attrs["Config"]["Env"]
    text = log.read_text()
    assert "Step 1/" in text and "hello-from-build" in text


@pytest.mark.docker
def test_second_build_is_all_cache(
    docker_client: docker.DockerClient, base_image: str, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo cached-{uuid.uuid4().hex}\nENV A=1\n")
    tag = make_tag()
    first = _build(docker_client, ctx, [tag], tmp_path / "1.log")
    second = _build(docker_client, ctx, [tag], tmp_path / "2.log")
    assert first.steps_run == 2
    assert second.steps_run == 0
    assert second.steps_total == first.steps_total == 3
    assert second.image_id == first.image_id
    assert "Using cache" in (tmp_path / "2.log").read_text()


@pytest.mark.docker
def test_failing_run_names_step_and_leaves_no_container(
    docker_client: docker.DockerClient, base_image: str, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    base_id = docker_client.images.get(base_image).id
    before = _derived_containers(docker_client, base_id)
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo hello-from-step && exit 3\nENV A=1\n")
    log = tmp_path / "fail.log"
    tag = make_tag()
    with pytest.raises(BuildError) as info:
        _build(docker_client, ctx, [tag], log, nocache=True)
    err = info.value
    assert not isinstance(err, BaseImageMissing)
    assert err.exit_code == 9
    msg = str(err)
    assert "Step 2/3" in msg
    assert "RUN echo hello-from-step && exit 3" in msg
    assert "hello-from-step" in msg.split("last", 1)[1]  # in the log tail, not just the instruction
    assert "non-zero code: 3" in msg
    assert str(log) in msg
    assert "hello-from-step" in log.read_text()
    assert _wait_no_containers(docker_client, base_id, 5) - before == set()
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)


@pytest.mark.docker
def test_dockerfile_error_before_first_step(
    docker_client: docker.DockerClient, base_image: str, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    ctx = _context(tmp_path, f"FROM {base_image}\nNOTANINSTRUCTION foo\n")
    with pytest.raises(BuildError) as info:
        _build(docker_client, ctx, [make_tag()], tmp_path / "bad.log")
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
    docker_client: docker.DockerClient, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    ctx = _context(tmp_path, f"FROM {MISSING_IMAGE}\nRUN true\n")
    with pytest.raises(BaseImageMissing) as info:
        _build(docker_client, ctx, [make_tag()], tmp_path / "m.log")
    assert "Step 1/2" in str(info.value)
    assert info.value.hint is not None and "imgbuild base bootstrap" in info.value.hint


@pytest.mark.docker
def test_plain_progress_has_no_escape_codes(
    docker_client: docker.DockerClient,
    base_image: str,
    make_tag: Callable[[], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CI", "1")
    out = io.StringIO()
    # Even a console that claims to be a terminal gets the plain rendering when CI is set.
    progress = BuildProgress.auto(Console(file=out, force_terminal=True, width=100))
    assert not progress.live
    ctx = _context(
        tmp_path,
        f"""
        FROM {base_image}
        RUN printf '\\033[31mred\\033[0m text\\rover\\n' && echo second-line
        ENV A=1
        """,
    )
    _build(docker_client, ctx, [make_tag()], tmp_path / "p.log", nocache=True, progress=progress)
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text
    assert "[step 1/3] FROM" in text
    assert "[step 2/3] RUN printf" in text
    assert "\n    second-line\n" in text
    assert "\n    over\n" in text  # the carriage-return overwrite keeps only what a terminal would show


SIGINT_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    from pathlib import Path
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    from imgbuild.engine import build_image, connect
    from imgbuild.progress import BuildProgress
    from imgbuild.errors import ImgbuildError
    ctx, log, tag = sys.argv[1:4]
    try:
        build_image(connect(), Path(ctx), tags=[tag], labels={}, buildargs={}, nocache=True, pull=False,
                    log_path=Path(log), progress=BuildProgress.auto())
    except ImgbuildError as exc:
        print(f"ERROR: {exc}", flush=True)
        sys.exit(exc.exit_code)
    print("finished without interruption", flush=True)
    """
)


@pytest.mark.docker
@pytest.mark.slow
def test_sigint_cancels_build_and_leaves_no_container(
    docker_client: docker.DockerClient, base_image: str, make_tag: Callable[[], str], tmp_path: Path
) -> None:
    base_id = docker_client.images.get(base_image).id
    before = _derived_containers(docker_client, base_id)
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo step-started && sleep 60\nENV A=1\n")
    log = tmp_path / "sigint.log"
    tag = make_tag()
    env = {
        **os.environ,
        "CI": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_SCRIPT, str(ctx), str(log), tag],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text() if log.exists() else ""
            if "Step 2/3" in text and re.search(r"^step-started$", text, re.M):  # the output, not the Step line
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the build never reached step 2; log:\n{log.read_text() if log.exists() else ''}")
        running = _derived_containers(docker_client, base_id) - before
        assert running, f"step 2 should be running; log:\n{log.read_text()}\n{docker_client.api.containers(all=True)}"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    assert "build cancelled; no containers left behind" in output
    assert "[step 2/3] RUN echo step-started" in output
    assert "\x1b" not in output
    assert _wait_no_containers(docker_client, base_id, 15) - before == set()
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(tag)
    assert "interrupted" in log.read_text()


# --------------------------------------------------------------------------------------------------------
# no engine needed


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

    monkeypatch.setattr(engine.docker, "from_env", refuse)
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
