"""`imgbuild build` on the real engine: the cpu image, caching, failures, base images, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import locked_user_recipe
from imgbuild import build, recipe
from imgbuild.cli import app
from imgbuild.core.errors import BaseImageMissing, BuildError
from imgbuild.image import render
from imgbuild.pin import lock

pytestmark = pytest.mark.docker
runner = CliRunner()


def cpu_plan() -> render.BuildPlan:
    return render.plan(lock.resolved_for(recipe.load("cpu")))


def containers_of(client, image_ids: set[str]) -> list[str]:
    return [c.name for c in client.containers.list(all=True) if c.attrs.get("Image") in image_ids]


def test_cpu_builds_with_labels_and_manifest(cpu_image, docker_client) -> None:
    plan = cpu_plan()
    assert list(cpu_image.refs[:2]) == plan.image_refs
    image = docker_client.images.get(plan.image_refs[0])
    assert image.id == cpu_image.image_id
    assert set(plan.image_refs) <= set(image.tags)
    labels = image.labels
    assert labels["io.imgbuild.lock-digest"] == plan.lock_digest
    assert labels["org.opencontainers.image.title"] == "imgbuild/cpu"
    assert labels["io.imgbuild.component.nccl"] == "2.27.5"
    raw = docker_client.containers.run(
        plan.image_refs[0], ["/etc/imgbuild/manifest.json"], entrypoint="cat", remove=True
    )
    shipped = json.loads(next(f.content for f in plan.files if f.path == "imgbuild/manifest.json"))
    assert json.loads(raw) == shipped
    # The build's CA bundle stays in the builder stage.
    out = docker_client.containers.run(
        plan.image_refs[0], ["-c", "ls /usr/local/share/ca-certificates/ | wc -l"], entrypoint="bash", remove=True
    )
    assert out.strip() == b"0"


def test_second_build_runs_no_step(cpu_image) -> None:
    again = build.build(*lock.for_ref("cpu"), ca_bundle=build.ca_bundle_from(None))
    assert again.image_id == cpu_image.image_id
    assert again.steps_run == 0, again.log_path.read_text()[-3000:]


def test_the_cli_says_builder_cache_steps_and_time(cpu_image) -> None:
    result = runner.invoke(app, ["build", "cpu"], env={"CI": "1"})
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert out[0] == f"built {cpu_image.image_id}"
    assert out[1:3] == [f"  {ref}" for ref in cpu_image.refs[:2]]
    assert any(line.startswith("builder: ") and "docker" in line for line in out)
    assert "cache: no cache between machines" in out
    assert re.fullmatch(r"0 of (\d+) steps run, (\d+) cached, in \d+\.\ds; log: \S+\.log", out[-1]), out[-1]
    # plain progress on stderr: each step's end line says cached
    assert re.search(r"^\[runtime +\d+/\d+\] .* cached$", result.stderr, re.M), result.stderr[-3000:]


def test_builder_option_without_buildx_is_exit_8_naming_it(docker_client) -> None:
    from imgbuild.build import builders

    try:
        if builders.select().kind == "buildx":
            pytest.skip("this machine's docker CLI has buildx")
    except Exception as exc:
        pytest.fail(f"no builder: {exc}")
    result = runner.invoke(app, ["build", "cpu", "--builder", "team-remote"])
    assert result.exit_code == 8, result.output
    assert "--builder team-remote names a buildx builder" in result.stderr and "buildx" in result.stderr
    result = runner.invoke(app, ["build", "cpu"], env={"IMGBUILD_BUILDER": "team-remote"})
    assert result.exit_code == 8 and "--builder team-remote (IMGBUILD_BUILDER)" in result.stderr


def user_recipe(tmp_path: Path, text: str) -> Path:
    """A user's recipe, locked as a user locks one before building it."""
    return locked_user_recipe(tmp_path / "broken.yaml", text)


STEP_START = re.compile(r"^\[[^\]]*\d+/\d+\] ")  # a plain-mode step line: `[runtime 3/9] RUN ...`
STEP_END = re.compile(r" (\d+\.\ds|cached|canceled|failed after \d+\.\ds)$")


def build_until_its_apt_step(recipe: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`imgbuild build RECIPE --no-cache` in a subprocess, two seconds into the output of its apt step; the process
    and what it printed so far. (--no-cache: an interrupted step is never cached, but a run stopped outside the
    test, its parent killed, may have finished it once.)"""
    proc = subprocess.Popen(
        [sys.executable, "-m", "imgbuild.cli", "build", str(recipe), "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    seen, current = "", ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        text = line.rstrip("\n")
        if STEP_START.match(text):
            current = "" if STEP_END.search(text) else text
        elif text.startswith("    ") and "apt-get update" in current:  # the apt step's own output: it runs
            time.sleep(2)
            return proc, seen
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"the build never reached its apt step:\n{seen[-2000:]}")


def test_failing_step_is_reported(tmp_path: Path, docker_client) -> None:
    p = user_recipe(tmp_path, "extends: cpu\nos: {packages: [imgbuild-no-such-package]}\n")
    before = {c.id for c in docker_client.containers.list(all=True)}
    result = runner.invoke(app, ["build", str(p)])
    assert result.exit_code == BuildError.exit_code, result.output
    assert re.search(r"failed at \[runtime +\d+/\d+\] RUN .*apt-get update", result.stderr), result.stderr
    assert "Unable to locate package imgbuild-no-such-package" in result.stderr  # the log tail
    assert "full log:" in result.stderr
    after = {c.id for c in docker_client.containers.list(all=True)}
    assert after - before == set()


def test_unknown_base_image(tmp_path: Path) -> None:
    p = user_recipe(tmp_path, "extends: cpu\nbase: {image: imgbuild-test.invalid/nothing, tag: '1'}\n")
    with pytest.raises(BaseImageMissing) as info:
        build.build(*lock.for_ref(str(p)), pull=False)
    assert "imgbuild-test.invalid/nothing:1" in str(info.value)
    assert info.value.hint and "imgbuild base bootstrap" in info.value.hint
    result = runner.invoke(app, ["build", str(p), "--no-pull"])
    assert result.exit_code == BaseImageMissing.exit_code
    assert "imgbuild base bootstrap" in result.stderr


def recipe_tags(client, recipe_path: Path) -> dict[str, str | None]:
    """Each tag of the recipe's image and the image it names now (None: no such tag)."""
    plan = render.plan(lock.resolved_for(recipe_load(recipe_path)))
    return {ref: next((i["Id"] for i in client.api.images(name=ref)), None) for ref in plan.image_refs}


def interrupted_build_left_nothing(docker_client, recipe: Path, before: set[str], tags: dict, rest: str) -> None:
    """No container appeared (BuildKit runs steps in its own executor), and no tag of the recipe's image moved."""
    assert "build cancelled" in rest and "no image tagged" in rest and "Traceback" not in rest
    assert "canceled" in rest  # the plain end line of the step BuildKit cancelled
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = {c.id for c in docker_client.containers.list(all=True)} - before
        if not left:
            break
        time.sleep(0.5)
    assert left == set()
    assert recipe_tags(docker_client, recipe) == tags, "a cancelled build tagged an image"


def recipe_load(path: Path) -> recipe.LoadedRecipe:
    return recipe.load(str(path)).concrete()


def test_ctrl_c_leaves_no_container(tmp_path: Path, docker_client, cpu_image) -> None:
    # A recipe whose OS step is slow enough to interrupt (apt with a package list no other build has).
    p = user_recipe(tmp_path, "extends: cpu\nos: {packages: [ca-certificates, iproute2, procps, less]}\n")
    before = {c.id for c in docker_client.containers.list(all=True)}
    tags = recipe_tags(docker_client, p)
    from imgbuild.core import paths

    logdir = paths.state_dir() / "logs"
    proc, seen = build_until_its_apt_step(p, {**os.environ, "CI": "1"})
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + rest
    interrupted_build_left_nothing(docker_client, p, before, tags, rest)
    assert logdir.exists()


def test_context_holds_only_what_the_dockerfile_copies(tmp_path: Path) -> None:
    from imgbuild.build import dockercontext

    plan = cpu_plan()
    written = dockercontext.write(plan, tmp_path / "ctx")
    rel = sorted(str(p.relative_to(tmp_path / "ctx")) for p in written)
    on_disk = sorted(str(p.relative_to(tmp_path / "ctx")) for p in (tmp_path / "ctx").rglob("*") if p.is_file())
    assert rel == on_disk
    assert on_disk == sorted(["Dockerfile", *(f.path for f in plan.files)])  # no CA bundle: it is a build secret


def _context_folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("imgbuild-context-*"))


# Those left by something before this test session (a build killed with SIGKILL, say) are not this run's to judge.
CONTEXTS_BEFORE = _context_folders()


def test_build_leaves_no_context_folder(cpu_image) -> None:
    assert _context_folders() - CONTEXTS_BEFORE == set()


def test_a_build_the_disk_cannot_hold_is_refused_with_the_figures() -> None:
    from imgbuild import build, recipe
    from imgbuild.core.errors import BuildError
    from imgbuild.image import render
    from imgbuild.pin.lock import resolved_for

    plan = render.plan(resolved_for(recipe.load("pytorch")))
    assert plan.disk_gb >= 16  # torch's wheels: measured about 16 GB while the layer is committed
    with pytest.raises(BuildError, match=r"building pytorch needs about 18 GB free .*; 9.5 GB is free") as err:
        build.check_disk(None, plan, free_bytes=9_500_000_000)
    assert err.value.exit_code == 9
    build.check_disk(None, plan, free_bytes=40_000_000_000)  # enough: no error
    small = render.plan(resolved_for(recipe.load("cpu")))
    assert small.disk_gb < 5


def test_sigterm_cancels_like_ctrl_c_and_exits_143(tmp_path: Path, docker_client, cpu_image) -> None:
    """SIGTERM (timeout, docker stop, a cancelled CI job) mid-build: the build is cancelled, no container, no tag,
    no context folder and no secret are left, exit 143."""
    p = user_recipe(tmp_path, "extends: cpu\nos: {packages: [ca-certificates, iproute2, procps, less]}\n")
    tmp, state = tmp_path / "tmp", tmp_path / "state"
    tmp.mkdir()
    env = {**os.environ, "CI": "1", "TMPDIR": str(tmp), "IMGBUILD_STATE_DIR": str(state)}
    before = {c.id for c in docker_client.containers.list(all=True)}
    tags = recipe_tags(docker_client, p)
    proc, seen = build_until_its_apt_step(p, env)
    assert list(tmp.glob("imgbuild-context-*")), "the build context should be in TMPDIR while the build runs"
    assert list(tmp.glob("imgbuild-secrets-*")), "the CA secret should be in TMPDIR (outside the context) meanwhile"
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, seen + rest
    assert "terminated (SIGTERM)" in rest
    assert list(tmp.iterdir()) == []  # no context folder, no secret, no iidfile folder
    log = "".join(f.read_text() for f in (state / "logs").glob("*.log"))
    assert "interrupted; cancelling the build" in log and "CANCELED" in log, log[-2000:]
    interrupted_build_left_nothing(docker_client, p, before, tags, rest)
