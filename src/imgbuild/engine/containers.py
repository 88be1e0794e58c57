"""The containers a verification starts, through one helper: start, exec, copy in and out, remove.

`Containers` belongs to one run (`imgbuild verify`, or the nodes of `verify --nodes`): everything it makes is
named `imgbuild-verify-<run>-<role>` and labelled `io.imgbuild.verify=<run>`, so `remove_all` finds and removes
it all, also what a lost response left behind. Containers start with a `RunSpec` (runprofile.py); an engine
that refuses memlock=unlimited (rootless, or nested without CAP_SYS_RESOURCE) gets a second try without it,
noted. Commands run inside with a time limit (`timeout` in the container, and the host stops waiting a little
after that), so nothing hangs.

This is an edge module: it talks to the Docker engine (docker-py).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import secrets
import shlex
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import docker
import docker.errors

from imgbuild.core.errors import Interrupted
from imgbuild.engine.client import ENGINE_ERRORS
from imgbuild.engine.runprofile import RunSpec, without_memlock

LABEL = "io.imgbuild.verify"
NAME_PREFIX = "imgbuild-verify-"
EXEC_DIR = "/tmp/imgbuild-exec"  # where a command's output goes inside the container
TAIL_LINES = 15
# How long remove_all waits for a create that an interrupt cut short (sent, unanswered) before its second pass.
TEARDOWN_GRACE_S = 1.0


@dataclass
class Exec:
    """One command's outcome inside a container."""

    rc: int | None  # None: the host gave up waiting
    output: str
    duration_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc in (None, 124, 137)

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


class Containers:
    """The containers (and network) of one run; `remove_all` removes every one of them."""

    def __init__(self, client: docker.DockerClient, run_id: str | None = None) -> None:
        self.client = client
        self.run_id = run_id or secrets.token_hex(5)
        self.names: list[str] = []
        self.networks: list[str] = []
        self._lock = threading.Lock()
        self._closed = False  # remove_all has begun: no container of the run may be made after it
        self._pending: set[str] = set()  # creates sent and not answered (an interrupt can land mid-request)

    @property
    def prefix(self) -> str:
        return f"{NAME_PREFIX}{self.run_id}"

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL: self.run_id}

    def name(self, role: str) -> str:
        """The name of the run's container for `role` (recorded, so that it is removed even without an id)."""
        name = f"{self.prefix}-{role}"
        with self._lock:
            if self._closed:  # another thread (the image scan) after an interrupt: it would outlive the teardown
                raise Interrupted(f"{name}: not created, the run's containers are being removed")
            self.names.append(name)
        return name

    # ---- start

    def network(self) -> str:
        """A private bridge network for the run (internal: no way out); its name."""
        self.client.networks.create(self.prefix, driver="bridge", internal=True, labels=self.labels)
        self.networks.append(self.prefix)
        return self.prefix

    def create(self, image: str, command: list[str], role: str, *, spec: RunSpec | None = None, **options: Any) -> Any:
        """Create (not start) the container for `role` with the run profile `spec` and docker-py `options`. A bind
        mount's host path is made absolute here, where it leaves the process: the engine resolves nothing against our
        working directory (a relative one was its `400 Client Error`)."""
        kwargs = {**(spec.docker_py() if spec is not None else {}), **options}
        if isinstance(kwargs.get("volumes"), dict):
            kwargs["volumes"] = {os.path.abspath(host): bind for host, bind in kwargs["volumes"].items()}
        name = self.name(role)
        with self._lock:
            self._pending.add(name)
        container = self.client.containers.create(image, command, name=name, labels=self.labels, **kwargs)
        with self._lock:  # not in a finally: a create an interrupt cut short stays pending for remove_all
            self._pending.discard(name)
        return container

    def start(
        self,
        image: str,
        command: list[str],
        role: str,
        spec: RunSpec,
        *,
        files: dict[str, tuple[bytes, int]] | None = None,
        dirs: dict[str, int] | None = None,
        **options: Any,
    ) -> tuple[Any, RunSpec, str | None]:
        """Create, copy `files` in (`copy_in`), start. Returns the container, the spec it started with and a
        note when the engine refused memlock=unlimited and it started without."""
        note = None
        for attempt in (1, 2):
            container = self.create(image, command, role if attempt == 1 else f"{role}-retry", spec=spec, **options)
            if files:
                self.copy_in(container, files, dirs)
            try:
                container.start()
                return container, spec, note
            except docker.errors.APIError as exc:
                why = memlock_refused(exc)
                if attempt == 2 or why is None or not spec.memlock_unlimited:
                    raise
                with contextlib.suppress(*ENGINE_ERRORS):
                    container.remove(force=True, v=True)
                spec = without_memlock(spec)
                note = f"the engine refused memlock=unlimited ({why}): ran with its host's default limit"
        raise AssertionError("unreachable")

    # ---- commands

    def spawn(self, container: Any, script: str, *, timeout_s: float, label: str) -> str:
        """Start bash `script` in the background in the container (output to EXEC_DIR/label.out); the exec id."""
        limit = max(1, math.ceil(timeout_s))
        out = f"{EXEC_DIR}/{label}.out"
        wrapped = f"mkdir -p {EXEC_DIR} && timeout -k 5 {limit} bash -c {shlex.quote(script)} >{out} 2>&1"
        exec_id = str(self.client.api.exec_create(container.id, ["bash", "-c", wrapped])["Id"])
        self.client.api.exec_start(exec_id, detach=True)
        return exec_id

    def wait(self, container: Any, exec_id: str, *, timeout_s: float, label: str, started: float) -> Exec:
        """Poll the exec until it ends (or the host's own limit, a little past the one in the container)."""
        give_up = started + math.ceil(timeout_s) + 10
        pause = 0.02
        rc: int | None = None
        while True:
            info = self.client.api.exec_inspect(exec_id)
            if not info.get("Running"):
                rc = int(info.get("ExitCode") or 0)
                break
            if time.monotonic() >= give_up:
                break
            time.sleep(pause)
            pause = min(0.25, pause * 1.5)
        duration = time.monotonic() - started
        raw = self.copy_out(container, f"{EXEC_DIR}/{label}.out")
        return Exec(rc, (raw or b"").decode(errors="replace"), duration)

    def exec(self, container: Any, script: str, *, timeout_s: float, label: str) -> Exec:
        """Run bash `script` in the container, at most `timeout_s` seconds; its exit status and output."""
        started = time.monotonic()
        exec_id = self.spawn(container, script, timeout_s=timeout_s, label=label)
        return self.wait(container, exec_id, timeout_s=timeout_s, label=label, started=started)

    def run_to_end(
        self, image: str, command: list[str], role: str, *, timeout_s: float, **options: Any
    ) -> tuple[int, str]:
        """A one-off container of `image` running `command` to its end: its exit status and stdout."""
        container = self.create(image, command, role, **options)
        try:
            container.start()
            status = container.wait(timeout=timeout_s)
            out = bytes(container.logs(stdout=True, stderr=False)).decode("utf-8", "replace")
            return int(status.get("StatusCode", -1)), out
        finally:
            with contextlib.suppress(*ENGINE_ERRORS):
                container.remove(force=True, v=True)

    # ---- files

    def copy_in(self, container: Any, files: dict[str, tuple[bytes, int]], dirs: dict[str, int] | None = None) -> None:
        """Put files (absolute path -> (content, mode)) into the container; their folders are made 0755, or
        with the mode `dirs` gives (path -> mode)."""
        container.put_archive("/", _tar(files, dirs or {}))

    def copy_out(self, container: Any, path: str) -> bytes | None:
        """A file of the container (running or not); None when it is not there."""
        try:
            stream, _ = self.client.api.get_archive(container.id, path)
        except docker.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member is not None else None
            return f.read() if f is not None else None

    def read_image_file(self, image: str, path: str) -> bytes | None:
        """A file of the image, read from a created (never started) container; None when it is not there."""
        container = self.create(image, ["/bin/true"], "read", entrypoint=[], network_disabled=True)
        try:
            return self.copy_out(container, path)
        finally:
            with contextlib.suppress(*ENGINE_ERRORS):
                container.remove(force=True, v=True)

    def logs(self, container: Any, lines: int = TAIL_LINES) -> str:
        """The end of the container's output (for a container that stopped when it should run)."""
        with contextlib.suppress(*ENGINE_ERRORS):
            return bytes(container.logs(tail=lines)).decode(errors="replace").rstrip() or "(no output)"
        return "(logs unavailable)"

    # ---- teardown

    def remove_all(self) -> list[str]:
        """Remove every container and network of the run; what could not be removed (empty: all gone)."""
        with self._lock:
            self._closed = True
            names, pending = list(self.names), bool(self._pending)
        left = self._remove_containers(names)
        if pending:  # a create the engine was still answering makes its container after that pass: once more
            time.sleep(TEARDOWN_GRACE_S)
            left = self._remove_containers(names)
        nets: set[str] = set(self.networks)
        with contextlib.suppress(*ENGINE_ERRORS):
            nets |= {n.name for n in self.client.networks.list(filters={"label": f"{LABEL}={self.run_id}"})}
        for net in sorted(nets):
            try:
                self.client.api.remove_network(net)
            except docker.errors.NotFound:
                pass
            except ENGINE_ERRORS:
                left.append(f"network {net}")
        return left

    def _remove_containers(self, names: list[str]) -> list[str]:
        """One pass: remove the run's containers, found by its label (the engine's raw list: no inspect of a container
        that is being removed) and by the names given; what could not be removed."""
        found: set[str] = set()
        with contextlib.suppress(*ENGINE_ERRORS):
            listed = self.client.api.containers(all=True, filters={"label": f"{LABEL}={self.run_id}"})
            found = {str(c["Names"][0]).lstrip("/") for c in listed if c.get("Names")}
        left = []
        for name in sorted(found | set(names)):
            try:
                self.client.api.remove_container(name, force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if "removal of container" not in str(exc):  # already being removed
                    left.append(f"container {name}")
            except ENGINE_ERRORS:
                left.append(f"container {name}")
        return left


def memlock_refused(exc: BaseException) -> str | None:
    """Why the engine refused memlock=unlimited, when that is what `exc` says; else None."""
    text = str(getattr(exc, "explanation", None) or exc)
    if "rlimit" not in text:
        return None
    m = re.search(r"error setting rlimit[^\"()]*", text)
    return m.group(0).strip() if m else text.strip().splitlines()[-1]


def _tar(files: dict[str, tuple[bytes, int]], dirs: dict[str, int]) -> bytes:
    """A tar of files at absolute paths with their own folders (not the folders above those: the engine makes
    missing ones, and an entry for /tmp would reset its mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in sorted({str(PurePosixPath(path).parent) for path in files} | set(dirs)):
            info = tarfile.TarInfo(d.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, dirs.get(d, 0o755)
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
