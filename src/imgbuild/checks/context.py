"""What a check looks at: the `CheckContext` (the machine, the pins expected there, what the run passed in) and what
it asks of it (`Host`, a command's `Ran`, the image's key scan). A check reads a pin through `PinView`, the three
fields checks use, so that this floor, below the blocks, names no block's type.

This module does not import docker or testinfra: `imgbuild.verify` connects, this module only asks questions.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Scope = Literal["container", "host"]
BOTH: tuple[Scope, ...] = ("container", "host")
CONTAINER: tuple[Scope, ...] = ("container",)

COMMAND_TIMEOUT_S = 60


class PinView(Protocol):
    """What a check reads of a pin (`imgbuild.blocks.Pin` is one): its version, its source mode, its block's typed
    details (a check of block B reads B's own details, e.g. `.prefix`)."""

    @property
    def version(self) -> str | None: ...

    @property
    def source(self) -> str: ...

    @property
    def details(self) -> Any: ...


class CommandOutput(Protocol):
    rc: int

    @property
    def stdout(self) -> str: ...

    @property
    def stderr(self) -> str: ...


class Host(Protocol):
    """testinfra's Host, as far as checks use it."""

    def run(self, command: str, *args: str) -> CommandOutput: ...


@dataclass(frozen=True)
class Ran:
    """One command's outcome."""

    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self) -> str:
        """The end of stderr (or stdout) to explain a failure."""
        text = (self.err.strip() or self.out.strip() or f"exit status {self.rc}").splitlines()
        return " | ".join(text[-3:])[:300]


@dataclass(frozen=True)
class ImageScan:
    """Key material found in the image's own filesystem (a container whose entrypoint did not run)."""

    files: tuple[str, ...] = ()
    error: str | None = None


@dataclass
class CheckContext:
    """Everything a check may look at.

    components: the expected pins by component, with their typed details (the lock's when there is one).
    manifest: the manifest found in the image / on the host (None when there is none).
    expected_manifest: the manifest the lock renders (None without a lock).
    """

    host: Host
    scope: Scope
    components: Mapping[str, PinView]
    manifest: dict[str, Any] | None = None
    expected_manifest: dict[str, Any] | None = None
    manifest_note: str = ""
    python: str = "python3"
    devices: tuple[str, ...] = ()  # device paths as the container (or host) sees them
    efa_devices: tuple[str, ...] = ()  # the EFA uverbs devices among them
    expect_efa: bool = False
    gpu: bool = False
    gpu_reason: str = "no GPU"
    image_scan: Callable[[], ImageScan] | None = None
    # What `uname -m` must say (x86_64, aarch64): the machine of the manifest's architecture, which the caller
    # looks up (core.platforms.MACHINE); None where no manifest says which.
    machine: str | None = None
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _key_locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)

    def run(self, command: str, *, timeout_s: int | None = COMMAND_TIMEOUT_S) -> Ran:
        """Run a shell command on the target (bounded by `timeout` when the target has it)."""
        if timeout_s:
            command = (
                f"if command -v timeout >/dev/null 2>&1; then timeout {timeout_s} /bin/sh -c {shlex.quote(command)}; "
                f"else /bin/sh -c {shlex.quote(command)}; fi"
            )
        result = self.host.run(command)
        return Ran(int(result.rc), _text(result.stdout), _text(result.stderr))

    def python_json(self, code: str, *args: str, timeout_s: int = COMMAND_TIMEOUT_S) -> tuple[Any, Ran]:
        """Run a Python snippet on the target that prints one JSON document; (the document or None, the run)."""
        cmd = " ".join(shlex.quote(a) for a in (self.python, "-c", code, *args))
        ran = self.run(cmd, timeout_s=timeout_s)
        lines = [line for line in ran.out.splitlines() if line.startswith(("{", "["))]
        try:
            return (json.loads(lines[-1]) if lines and ran.ok else None), ran
        except json.JSONDecodeError:
            return None, ran

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """Compute a probe once per verification, however many checks (in threads) ask for it."""
        with self._memo_lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._memo:
                self._memo[key] = compute()
            return self._memo[key]

    def has(self, component: str) -> bool:
        return component in self.components

    def version(self, component: str) -> str | None:
        pin = self.components.get(component)
        return str(pin.version) if pin is not None and pin.version else None

    def details(self, component: str) -> Any:
        """The component's typed pin details (None when it is not expected here)."""
        pin = self.components.get(component)
        return pin.details if pin is not None else None

    def prefix(self, component: str) -> str | None:
        """Where the component is installed (its pin's prefix; None: absent or in the system's paths)."""
        details = self.details(component)
        return details.prefix if details is not None else None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value or "")
