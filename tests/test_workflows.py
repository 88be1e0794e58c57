"""The GitHub workflows: valid against the workflow schema (check-jsonschema's vendored copy, offline), and
wired the way publishing needs: OIDC to AWS, the ECR login, the job matrix from `imgbuild matrix --json`,
self-hosted runners for GPU and Gaudi, and only `imgbuild` commands and matrix keys that exist."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from conftest import REPO
from imgbuild.publish import matrix

WORKFLOWS = REPO / ".github" / "workflows"
FILES = ["ci.yml", "publish.yml"]


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    if True in data:  # YAML 1.1 reads the key `on` as a boolean
        data["on"] = data.pop(True)
    return data


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job.get("steps", []))


def uses(job: dict[str, Any], action: str) -> dict[str, Any]:
    found = [s for s in steps(job) if str(s.get("uses", "")).startswith(action + "@")]
    assert found, f"no step uses {action}"
    return found[0]


def run_text(name: str) -> str:
    data = load(name)
    return "\n".join(str(s.get("run", "")) for job in data["jobs"].values() for s in steps(job))


@pytest.mark.parametrize("name", FILES)
def test_workflow_schema(name: str) -> None:
    """check-jsonschema's command (a click command) run in this process, as its console script runs it: the
    process would spend seconds importing jsonschema, which this one has already."""
    try:
        from check_jsonschema import main
    except ImportError:
        pytest.fail("check-jsonschema is not installed (pip install check-jsonschema, part of the dev extra)")
    from click.testing import CliRunner as ClickRunner

    result = ClickRunner().invoke(main, ["--builtin-schema", "vendor.github-workflows", str(WORKFLOWS / name)])
    assert result.exit_code == 0, result.output


def test_ci_jobs() -> None:
    wf = load("ci.yml")
    assert set(wf["on"]) == {"pull_request", "push"}
    assert wf["permissions"] == {"contents": "read"}
    jobs = wf["jobs"]
    lint = "\n".join(str(s.get("run", "")) for s in steps(jobs["lint"]))
    assert "ruff check" in lint and "ruff format --check" in lint and "mypy" in lint
    assert "check-jsonschema --builtin-schema vendor.github-workflows" in lint
    assert "actionlint" in lint
    unit = "\n".join(str(s.get("run", "")) for s in steps(jobs["unit"]))
    assert 'pytest -p no:cacheprovider -n auto -m "not docker and not network and not gpu"' in unit
    render = "\n".join(str(s.get("run", "")) for s in steps(jobs["render"]))
    assert "imgbuild render" in render and "hadolint --config .hadolint.yaml" in render
    cpu = jobs["cpu"]
    cpu_run = "\n".join(str(s.get("run", "")) for s in steps(cpu))
    assert cpu["env"]["CI"] == "true", "Docker-marked tests must fail, not skip, without an engine"
    assert "bash .ci/run" in cpu_run and "imgbuild build cpu" in cpu_run and "imgbuild verify cpu" in cpu_run
    assert "docker-registry" in cpu_run, "the publish tests need the registry binary"
    assert set(cpu["needs"]) == {"lint", "unit", "render"}


def test_ci_builds_cpu_on_a_docker_container_builder() -> None:
    """The cpu job keeps running the test command on the engine's own builder, then builds cpu once more on the
    docker-container buildx builder setup-buildx-action made (publish.yml's kind), found by root through one
    DOCKER_CONFIG."""
    cpu = load("ci.yml")["jobs"]["cpu"]
    buildx = uses(cpu, "docker/setup-buildx-action")
    assert buildx["id"] == "buildx"
    assert buildx["with"]["driver"] == "docker-container"
    assert buildx["with"]["use"] is False, "the tests share the engine's own builder (its images, its layer cache)"
    assert cpu["env"]["DOCKER_CONFIG"].startswith("${{ github.workspace }}/"), "one buildx folder for runner and root"
    order = [s.get("name", s.get("uses", "")) for s in steps(cpu)]
    assert (
        order.index("buildx (docker-container builder)")
        < order.index("setup + all tests")
        < order.index("build cpu")
        < order.index("verify cpu")
    )
    build = next(s for s in steps(cpu) if s.get("name") == "build cpu")
    assert build["env"]["IMGBUILD_BUILDER"] == "${{ steps.buildx.outputs.name }}"
    assert "imgbuild build cpu" in build["run"] and "sudo -E" in build["run"], "root keeps IMGBUILD_BUILDER"


def test_publish_builds_with_an_ecr_registry_cache() -> None:
    """Each recipe builds on a docker-container builder with its registry cache in ECR (imgbuild-cache:RECIPE, a
    mutable repository made here), read and written by the same build; skipped with the build when published."""
    job = load("publish.yml")["jobs"]["publish"]
    by_name = {s.get("name"): s for s in steps(job)}
    buildx = uses(job, "docker/setup-buildx-action")
    assert buildx["id"] == "buildx" and buildx["with"]["driver"] == "docker-container"
    cache, build = by_name["build cache repository"], by_name["build"]
    assert cache["id"] == "cache"
    assert cache["env"]["REGISTRY"] == "${{ steps.ecr.outputs.registry }}"
    assert 'repo="${ECR_PREFIX:+${ECR_PREFIX}/}imgbuild-cache"' in cache["run"]
    assert "aws ecr create-repository" in cache["run"] and "--image-tag-mutability MUTABLE" in cache["run"]
    assert "RepositoryAlreadyExistsException" in cache["run"], "parallel matrix jobs race to create it"
    assert 'echo "ref=${REGISTRY}/${repo}:${RECIPE}" >> "${GITHUB_OUTPUT}"' in cache["run"]
    assert build["env"] == {
        "IMGBUILD_BUILDER": "${{ steps.buildx.outputs.name }}",
        "CACHE": "${{ steps.cache.outputs.ref }}",
    }
    assert build["run"].strip() == 'imgbuild build "${RECIPE}" --cache-from "${CACHE}" --cache-to "${CACHE}"'
    skip = "steps.published.outputs.published != 'true'"
    assert buildx["if"] == cache["if"] == build["if"] == skip
    order = [s.get("name", s.get("uses", "")) for s in steps(job)]
    assert order.index("ECR login") < order.index("build cache repository") < order.index("build")
    assert order.index("buildx (docker-container builder)") < order.index("build")


def test_publish_triggers_and_oidc() -> None:
    wf = load("publish.yml")
    assert wf["on"]["push"] == {"branches": ["main"], "tags": ["v*"]}
    assert wf["permissions"] == {"contents": "read"}, "id-token: write only where AWS is assumed"
    matrix_job, job = wf["jobs"]["matrix"], wf["jobs"]["publish"]
    assert "imgbuild matrix --json" in "\n".join(str(s.get("run", "")) for s in steps(matrix_job))
    assert matrix_job["outputs"]["matrix"] == "${{ steps.matrix.outputs.matrix }}"
    assert job["needs"] == "matrix"
    assert job["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert job["strategy"]["fail-fast"] is False
    assert job["runs-on"] == "${{ matrix.runs_on }}"
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    creds = uses(job, "aws-actions/configure-aws-credentials")
    assert "AWS_ROLE_ARN" in creds["with"]["role-to-assume"] and "aws-region" in creds["with"]
    assert not {"aws-access-key-id", "aws-secret-access-key"} & set(creds["with"]), "OIDC only: no stored keys"
    login = uses(job, "aws-actions/amazon-ecr-login")
    assert login["id"] == "ecr"
    order = [s.get("name", s.get("uses", "")) for s in steps(job)]
    assert order.index("build") < order.index("verify") < order.index("push to ECR")
    push = next(s for s in steps(job) if s.get("name") == "push to ECR")
    assert 'imgbuild push "${RECIPE}" --ecr --registry' in push["run"]
    assert push["env"]["REGISTRY"] == "${{ steps.ecr.outputs.registry }}"


@pytest.mark.parametrize("name", FILES)
def test_shell_is_bash_with_pipefail(name: str) -> None:
    assert load(name)["defaults"]["run"]["shell"] == "bash"


def test_matrix_keys_used_by_publish_exist() -> None:
    text = (WORKFLOWS / "publish.yml").read_text()
    used = set(re.findall(r"(?<![.\w])matrix\.(\w+)", text))
    rows = matrix.matrix()["include"]
    assert used and used <= set(rows[0]), f"publish.yml uses matrix keys the matrix lacks: {used - set(rows[0])}"
    runners = {tuple(r["runs_on"]) for r in rows}
    assert runners <= {("ubuntu-latest",), ("self-hosted", "gpu"), ("self-hosted", "gaudi")}


def known_commands() -> set[str]:
    """The commands and command groups of `imgbuild`."""
    from imgbuild import cli

    return set(typer.main.get_command(cli.app).commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", FILES)
def test_workflows_call_existing_commands(name: str) -> None:
    called = set(re.findall(r"\bimgbuild ([a-z][a-z-]*)", run_text(name)))
    missing = called - known_commands()
    assert not missing, f"{name} calls imgbuild commands that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("name", FILES)
def test_workflows_pass_existing_options(name: str) -> None:
    """Every --option a workflow gives an `imgbuild` command is one that command has (--cache-from, --json ...)."""
    import click

    from imgbuild import cli

    root = typer.main.get_command(cli.app)
    text = run_text(name).replace("\\\n", " ")  # continued lines are one command
    used: list[tuple[str, str]] = []
    for m in re.finditer(r"\bimgbuild ([a-z][a-z-]*)([^|;&>\n]*)", text):
        command = root.commands[m[1]]  # type: ignore[attr-defined]
        rest = m[2].split()
        while isinstance(command, click.Group) and rest and rest[0] in command.commands:
            command = command.commands[rest.pop(0)]
        known = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
        used += [(m[1], word.split("=", 1)[0]) for word in rest if word.startswith("--")]
        unknown = [word for word in rest if word.startswith("--") and word.split("=", 1)[0] not in known]
        assert not unknown, f"{name}: imgbuild {m[1]} has no option {unknown}"
    assert used, f"{name} passes no option to imgbuild?"


def test_actionlint() -> None:
    """actionlint (with shellcheck on every `run:`): among others, actions on a runtime GitHub is removing (node20,
    removal scheduled for 2026-09) and inputs an action does not have."""
    exe = shutil.which("actionlint")
    if exe is None:
        pytest.fail("actionlint is not installed (pip install -e '.[dev]' brings it)")
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (scripts/setup.sh installs it): actionlint would skip `run:` scripts")
    proc = subprocess.run(
        [exe, "-oneline", *(str(WORKFLOWS / name) for name in FILES)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)(?P<rest>.*)$")


@pytest.mark.parametrize("name", FILES)
def test_third_party_actions_are_pinned_by_commit(name: str) -> None:
    """Anything not under actions/ runs at a full commit SHA, with the release it is in a comment (`# vX.Y.Z`): a
    tag can be moved by whoever controls that repository."""
    lines = [m for line in (WORKFLOWS / name).read_text().splitlines() if (m := USES_LINE.match(line))]
    assert lines, f"{name} uses no action?"
    for m in lines:
        action, _, ref = m["ref"].partition("@")
        if action.startswith(("actions/", "./")):
            continue
        assert re.fullmatch(r"[0-9a-f]{40}", ref), f"{name}: {m['ref']} is not pinned by a full commit SHA"
        assert re.fullmatch(r"\s+# v\d+\.\d+\.\d+", m["rest"]), f"{name}: {m['ref']} lacks its '# vX.Y.Z' comment"


def test_ci_run_passes_its_arguments_to_pytest(tmp_path: Path) -> None:
    """ci.yml's `.ci/run --junitxml=...` reaches pytest in both lanes, the fast one first (not docker, not network,
    over xdist workers) and then the docker and network lane: the real .ci/run and scripts/test.sh, in a copy of
    the tree whose setup and interpreter only record what they were given."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    for script in ("test.sh", "phases.sh"):
        shutil.copy(REPO / "scripts" / script, tmp_path / "scripts" / script)
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    (tmp_path / "scripts" / "ca-env.sh").write_text("")
    calls = tmp_path / "calls.jsonl"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\""
        f" >> {shlex.quote(str(calls))}\n"
    )
    python.chmod(0o755)
    line = next(s for s in run_text("ci.yml").splitlines() if ".ci/run" in s)
    args = shlex.split(line.split(".ci/run", 1)[1])
    assert args, "ci.yml passes pytest options to .ci/run"
    proc = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run"), *args],
        env={**os.environ, "PYTHON": str(python)}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pytest_calls = [c for c in map(json.loads, calls.read_text().splitlines()) if c[:2] == ["-m", "pytest"]]
    assert len(pytest_calls) == 2
    fast, rest = pytest_calls
    assert fast[fast.index("-m", 2) + 1 :][:1] == ["not docker and not network and not gpu"] and "-n" in fast
    assert rest[rest.index("-m", 2) + 1 :][:1] == ["(docker or network) and not gpu"]
    assert "the gpu lane (pytest -m gpu, tests/test_gpu.py) is deselected here" in proc.stdout
    for call in pytest_calls:
        assert call[-len(args) :] == args, f"pytest got {call}, ci.yml gave {args}"
