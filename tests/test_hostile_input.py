"""A table of hostile inputs per command, through the real CLI: every one ends with a clear error and its own exit
code, never exit 1, a traceback or "unexpected error". Rows marked `# found` failed before their fix (exit 1 with
a Python error: ValueError, OSError ENAMETOOLONG, RecursionError, or an endless read of /dev/zero)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO
from imgbuild.cli import app

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


@pytest.mark.parametrize("command", [["show"], ["render"], ["lock", "--offline"]], ids=lambda c: c[0])
@pytest.mark.parametrize("case", sorted(RECIPES))
def test_hostile_recipes_are_recipe_errors(tmp_path: Path, case: str, command: list[str]) -> None:
    if case == "a FIFO" and command[0] != "show":
        pytest.skip("one command is enough for a FIFO")
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


def clean(result) -> None:  # type: ignore[no-untyped-def]
    """No traceback, no "unexpected error", no exit 1, and no Python exception escaping the command."""
    assert result.exit_code != 1, result.output[-2000:]
    assert "Traceback" not in result.output and "unexpected error" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
