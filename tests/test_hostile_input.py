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
def test_a_lock_path_that_is_no_file_is_a_lock_error(tmp_path: Path, kind: str) -> None:
    shutil.copy(REPO / "recipes" / "cpu.yaml", tmp_path / "cpu.yaml")
    lock = tmp_path / "cpu.lock.json"
    {"a folder": lambda: lock.mkdir(), "a symlink loop": lambda: lock.symlink_to(lock.name),
     "/dev/null": lambda: lock.symlink_to("/dev/null")}[kind]()  # fmt: skip
    for args in (["show", str(tmp_path / "cpu.yaml")], ["lock", str(tmp_path / "cpu.yaml"), "--offline"]):
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
