"""SIGTERM in `terminable` commands (build, push, verify, sbom, sources fetch, lock, outdated) takes Ctrl-C's
cleanup path and ends with exit 143 (tests/test_hostile_input.py SIGTERMs real lock and outdated processes).

These run the real CLI in-process with the command's work replaced by one that signals itself; the Docker tests
(test_build, test_verify, test_publish: `test_sigterm_*`) send SIGTERM to real `imgbuild` processes.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import REPO
from imgbuild.build import command as build_command
from imgbuild.cli import app
from imgbuild.core import interrupts
from imgbuild.core.errors import Interrupted, Terminated
from imgbuild.publish import command as publish_command
from imgbuild.verify import command as verify_command

runner = CliRunner()


class Fallback(Exception):
    """What SIGTERM raises in this test process outside a terminable command (so no test can kill pytest)."""


@pytest.fixture(autouse=True)
def fallback_handler() -> Iterator[Any]:
    def handler(signum: int, frame: Any) -> None:
        raise Fallback

    previous = signal.signal(signal.SIGTERM, handler)
    yield handler
    assert signal.getsignal(signal.SIGTERM) is handler, "the command did not put the SIGTERM handler back"
    signal.signal(signal.SIGTERM, previous)


def sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises before this ends
    raise AssertionError("SIGTERM did not stop the command")


COMMANDS = [
    (build_command, "build", ["build", "cpu"]),
    (publish_command, "publish", ["push", "cpu", "--registry", "127.0.0.1:5000"]),
    (verify_command, "verify", ["verify", "cpu"]),
]


@pytest.mark.parametrize(("module", "name", "args"), COMMANDS, ids=[c[1] for c in COMMANDS])
def test_sigterm_before_anything_started_exits_143(module: Any, name: str, args: list[str], monkeypatch) -> None:
    monkeypatch.setattr(module, name, lambda *a, **k: sigterm_self())
    result = runner.invoke(app, args)
    assert result.exit_code == Terminated.exit_code == 143, result.output
    assert "terminated (SIGTERM)" in result.stderr


@pytest.mark.parametrize(("module", "name", "args"), COMMANDS, ids=[c[1] for c in COMMANDS])
def test_sigterm_takes_the_ctrl_c_cleanup_path(module: Any, name: str, args: list[str], monkeypatch) -> None:
    """The command's own `except KeyboardInterrupt` cleanup runs (a second SIGTERM meanwhile does not cut it
    short), and its Interrupted becomes exit 143 with the cleanup's message."""
    cleaned: list[str] = []

    def work(*a: Any, **k: Any) -> None:
        try:
            sigterm_self()
        except KeyboardInterrupt:
            os.kill(os.getpid(), signal.SIGTERM)  # `docker stop` again, or a CI runner's second signal
            time.sleep(0.2)
            cleaned.append("containers")
            raise Interrupted("cancelled; nothing left behind") from None

    monkeypatch.setattr(module, name, work)
    result = runner.invoke(app, args)
    assert cleaned == ["containers"]
    assert result.exit_code == 143, result.output
    assert "cancelled; nothing left behind" in result.stderr


def test_sigterm_while_cleaning_up_waits_for_the_cleanup_then_stops(monkeypatch) -> None:
    """A SIGTERM that arrives during a normal cleanup (`sigint_deferred`) is held, then stops the command."""
    done: list[str] = []

    def work(*a: Any, **k: Any) -> None:
        with interrupts.sigint_deferred("the build's containers"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            done.append("removed")
        done.append("carried on")

    monkeypatch.setattr(build_command, "build", work)
    result = runner.invoke(app, ["build", "cpu"])
    assert done == ["removed"]
    assert result.exit_code == 143, result.output
    assert "still removing the build's containers" in result.stderr


def test_ctrl_c_still_exits_130(monkeypatch) -> None:
    def work(*a: Any, **k: Any) -> None:
        raise Interrupted("build cancelled; no containers left behind")

    monkeypatch.setattr(build_command, "build", work)
    result = runner.invoke(app, ["build", "cpu"])
    assert result.exit_code == 130, result.output


def test_lock_turns_sigterm_into_its_cleanup_and_puts_the_handler_back(tmp_path: Path, monkeypatch) -> None:
    """`lock` runs long (uv, the index, the engine) and writes files: SIGTERM takes its Ctrl-C path while it works,
    and the process's own handler is back when it is done (the fixture checks)."""
    from imgbuild.pin import lock

    seen: list[Any] = []
    original = lock.write

    def write(*a: Any, **k: Any) -> Any:
        seen.append(signal.getsignal(signal.SIGTERM))
        return original(*a, **k)

    for name in ("cpu.yaml", "cpu.lock.json"):  # relocked offline: its requirement sets from its own lock
        shutil.copy(REPO / "recipes" / name, tmp_path / name)
    monkeypatch.setattr(lock, "write", write)
    result = runner.invoke(app, ["lock", str(tmp_path / "cpu.yaml"), "--offline"])
    assert result.exit_code == 0, result.output
    assert seen == [interrupts._on_sigterm]
