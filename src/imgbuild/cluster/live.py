"""The multi-node checks on containers already running on hosts: `run_live(hosts)` -> `VerifyReport`, which
`imgbuild cluster test --hosts H1,H2[,...]` (cli/cluster.py) shows and writes as `imgbuild verify` does.

The containers were started by the user on each host (`imgbuild run RECIPE`: the recipe's run profile, host
network, the job's ssh keys installed by the entrypoint). From this machine, imgbuild reaches each of them over
ssh on the image's sshd port (`SshNodes`, one connection per host kept open for the run) and runs the very
checks of `imgbuild verify --nodes` (nodechecks.run_checks) from the first host: every node's sshd reached from
it, the image's mpirun line across the hosts (allreduce, every rank's environment), plain ssh sessions'
environment, fi_pingpong, the DDP training under mpirun and torchrun where the image has PyTorch, and
nccl-tests' all_reduce_perf judged by nccltests.verdict where the hosts have GPUs.

What the run needs from the hosts: ssh from this machine to each container as `--user` (root) with `--ssh-key`
(or ssh's own defaults), and ssh between the containers with the job's key (what mpirun needs anyway). It
leaves nothing behind: its files go to /tmp/imgbuild-cluster-<run> on each host, removed at the end. Host keys
are made when a container starts, so they are trusted on first use for this run only (a known_hosts file of
the run's own), as mpirun between the containers does.

This is an edge module: it runs the OpenSSH client.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.core import validate
from imgbuild.core.errors import VerifyError

if TYPE_CHECKING:
    from imgbuild.checks.results import CheckResult
    from imgbuild.engine.containers import Exec
    from imgbuild.image.manifest import Manifest
    from imgbuild.verify.report import VerifyReport

CONNECT_TIMEOUT_S = 10
CONNECT_WAIT_S = 30.0
KILL_GRACE_S = 5


@dataclass
class _Spawned:
    proc: subprocess.Popen[bytes]
    started: float
    timeout_s: float


class SshNodes:
    """The hosts of a live check, reached from this machine over ssh (a `nodesession.Nodes` executor).

    hosts: the names (or addresses) this machine and the first host reach the others by; they are the hostfile's
    names too. One master connection per host (OpenSSH's ControlMaster) carries every command of the run."""

    def __init__(self, hosts: list[str], *, port: int, user: str, key: Path | None) -> None:
        self.names = tuple(hosts)
        self.port, self.user, self.key = port, user, key
        self.dir = Path(tempfile.mkdtemp(prefix="imgbuild-cluster-ssh-"))
        self.known_hosts = self.dir / "known_hosts"
        exe = shutil.which("ssh")
        if exe is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise VerifyError(
                "the OpenSSH client (ssh) is not installed on this machine", hint="apt-get install openssh-client"
            )
        self.exe = exe

    def _argv(self, host: str, *extra: str) -> list[str]:
        argv = [
            self.exe, "-p", str(self.port), "-l", self.user,
            "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "LogLevel=ERROR",
            "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", f"ControlPath={self.dir}/%C", "-o", "ServerAliveInterval=15",
        ]  # fmt: skip
        if self.key is not None:
            argv += ["-i", str(self.key), "-o", "IdentitiesOnly=yes"]
        return [*argv, *extra, "--", validate.argument(host, "--hosts")]  # after `--`: never an option of ssh

    def connect(self, wait_s: float = CONNECT_WAIT_S) -> list[tuple[str, str]]:
        """Open the master connection to every host, trying again for up to wait_s seconds (a container that has
        just started makes its host keys first); (host, ssh's last error) for each that could not be reached."""
        deadline = time.monotonic() + wait_s
        pending = list(self.names)
        errors: dict[str, str] = {}
        while True:
            procs = [
                (h, subprocess.Popen(self._argv(h, "-M", "-N", "-f", "-o", "ControlPersist=yes"),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
                for h in pending
            ]  # fmt: skip
            for host, proc in procs:
                try:
                    _, err = proc.communicate(timeout=CONNECT_TIMEOUT_S + 20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                    err = err or b"timed out"
                if proc.returncode == 0:
                    errors.pop(host, None)
                else:
                    errors[host] = err.decode(errors="replace").strip() or f"ssh exit {proc.returncode}"
            pending = [h for h in pending if h in errors]
            if not pending or time.monotonic() >= deadline:
                return [(h, errors[h]) for h in pending]
            time.sleep(0.5)

    def close(self) -> None:
        """Close the master connections and remove the run's ssh folder (its known_hosts). The folder goes whatever
        happens; a master that does not answer `-O exit` within 15 s is left running, its socket removed."""
        try:
            for host in self.names:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    subprocess.run(self._argv(host, "-O", "exit"), stdin=subprocess.DEVNULL, capture_output=True,
                                   timeout=15, check=False)  # fmt: skip
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _command(self, script: str, timeout_s: float) -> str:
        limit = max(1, math.ceil(timeout_s))
        return f"timeout -k {KILL_GRACE_S} {limit} bash -c {shlex.quote(script)} 2>&1"

    def spawn(self, k: int, script: str, *, timeout_s: float, label: str) -> _Spawned:
        argv = [*self._argv(self.names[k]), self._command(script, timeout_s)]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return _Spawned(proc, time.monotonic(), timeout_s)

    def wait(self, handle: _Spawned, *, timeout_s: float) -> Exec:
        from imgbuild.engine.containers import Exec

        give_up = handle.started + math.ceil(handle.timeout_s) + KILL_GRACE_S + 10
        rc: int | None
        try:
            output, _ = handle.proc.communicate(timeout=max(0.1, give_up - time.monotonic()))
            rc = handle.proc.returncode
        except subprocess.TimeoutExpired:
            handle.proc.kill()
            output, _ = handle.proc.communicate()
            rc = None
        return Exec(rc, (output or b"").decode(errors="replace"), time.monotonic() - handle.started)

    def run(self, k: int, script: str, *, timeout_s: float, label: str) -> Exec:
        return self.wait(self.spawn(k, script, timeout_s=timeout_s, label=label), timeout_s=timeout_s)

    def put_files(self, files: dict[str, tuple[bytes, int]]) -> None:
        from imgbuild.engine.containers import _tar  # the same archive docker's put_archive takes

        data = _tar(files, {})
        for host in self.names:
            proc = subprocess.run([*self._argv(host), "tar -x -C / -f -"], input=data, capture_output=True,
                                  timeout=60, check=False)  # fmt: skip
            if proc.returncode != 0:
                why = proc.stderr.decode(errors="replace").strip()
                raise VerifyError(f"cannot copy the check's files to {host}: {why or f'ssh exit {proc.returncode}'}")

    def diagnose(self, k: int) -> str:
        return ""


# --------------------------------------------------------------------------------------------------------
# the run


def run_live(
    hosts: list[str],
    *,
    port: int | None = None,
    user: str = "root",
    key: Path | None = None,
    expected: Manifest | None = None,
    master_port: int | None = None,
    timeout_s: float | None = None,
    connect_wait_s: float = CONNECT_WAIT_S,
) -> VerifyReport:
    """The multi-node checks on the containers running on `hosts` (see the module's docstring).

    port: their sshd port (default: the expected manifest's, else 3022); connect_wait_s: how long to keep trying
    to reach a host that refuses (a container that has just started); expected: the manifest of the image that
    should be running (a recipe's lock, or a local image's), else the first host's is the reference.
    Returns a VerifyReport ("cluster: ..." results, then timings); a `VerifyError` when no host can be reached."""
    from imgbuild.checks.results import CheckResult
    from imgbuild.verify import nodechecks, nodesession
    from imgbuild.verify.report import VerifyReport

    if not hosts:
        raise VerifyError("--hosts: expected one host or more, e.g. --hosts 10.0.0.1,10.0.0.2")
    if len(set(hosts)) != len(hosts):
        raise VerifyError(f"--hosts: {','.join(hosts)} names a host twice")
    for value, check, what in [*((h, validate.host, "--hosts") for h in hosts), (user, validate.user_name, "--user")]:
        try:
            check(value)
        except ValueError as exc:
            raise VerifyError(f"{what}: {exc}") from None
    from imgbuild.blocks.sshd import DEFAULT_PORT  # imgbuild's sshd default (components.sshd.ports)

    port = port or (expected.ssh_ports[0] if expected is not None and expected.ssh_ports else DEFAULT_PORT)
    began = time.monotonic()
    timings: dict[str, float] = {}
    nodes = SshNodes(hosts, port=port, user=user, key=key)
    run_id = secrets.token_hex(5)
    workdir = f"/tmp/imgbuild-cluster-{run_id}"
    results: list[CheckResult] = []
    session = None
    unreachable: list[tuple[str, str]] = []
    try:
        t = time.monotonic()
        unreachable = nodes.connect(connect_wait_s)
        timings["connect_s"] = round(time.monotonic() - t, 3)
        if unreachable:
            raise VerifyError(
                "cannot reach " + "; ".join(f"{h} ({why})" for h, why in unreachable) + f" over ssh on port {port} "
                f"as {user}",
                hint="start the image's container on each host (imgbuild run RECIPE), with this machine's public key "
                "authorized (--ssh-key names the private one)",
            )
        manifest, image_results, probe = _inspect(nodes, expected)
        results += image_results
        if manifest is None:
            return VerifyReport(",".join(hosts), None, None, f"ssh -p {port}", "", results, timings)
        wants_gpu = manifest.platform.accelerator == "nvidia" or bool(manifest.runtime.gpus)
        gpus = probe["gpus"] if wants_gpu else 0
        slots = min(manifest.slots, gpus) if gpus else manifest.slots
        expect_efa = "efa" in manifest.components and probe["efa_devices"] > 0
        if timeout_s is None:
            timeout_s = nodesession.BASE_TIMEOUT_S + 2 * nodesession.DDP_TIMEOUT_S + nodesession.NCCL_TESTS_TIMEOUT_S
        session = nodesession.Session(
            nodes,
            manifest,
            probe["env"],
            began + timeout_s,
            prefix="cluster",
            workdir=workdir,
            gpus=gpus > 0,
            slots=slots,
            expect_efa=expect_efa,
            master_port=master_port or nodesession.MASTER_PORT,
            timings=timings,
        )
        if "efa" in manifest.components and not expect_efa:
            session.notes.append(f"the image has EFA, {hosts[0]} has no /dev/infiniband/uverbs*: tcp instead")
        if wants_gpu and not gpus:
            session.notes.append(f"{hosts[0]} has no GPU (/dev/nvidia*): the checks run on CPUs")
        results += nodechecks.run_checks(session)
    finally:
        t = time.monotonic()
        down = {h for h, _ in unreachable}
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            for k in (k for k, h in enumerate(hosts) if h not in down):
                nodes.run(k, f"rm -rf {shlex.quote(workdir)}", timeout_s=15, label="cleanup")
        nodes.close()
        timings["cleanup_s"] = round(time.monotonic() - t, 3)
        timings["total_s"] = round(time.monotonic() - began, 3)
    assert session is not None
    results += [CheckResult("cluster: note", "skip", reason=note) for note in session.notes]
    results.append(nodechecks.timings_result(session, ",".join(hosts), len(hosts)))
    name = manifest.recipe
    return VerifyReport(",".join(hosts), None, name, f"ssh -p {port} {user}@{hosts[0]}", "", results, timings)


_PROBE = r"""
echo "IMGBUILD-MANIFEST $(base64 -w0 /etc/imgbuild/manifest.json 2>/dev/null)"
echo "IMGBUILD-ENVIRON $(base64 -w0 /proc/1/environ 2>/dev/null)"
echo "IMGBUILD-GPUS $(ls /dev | grep -cE '^nvidia[0-9]+$')"
echo "IMGBUILD-EFA $(ls /dev/infiniband 2>/dev/null | grep -c '^uverbs')"
"""


def _inspect(nodes: SshNodes, expected: Manifest | None) -> tuple[Manifest | None, list[CheckResult], dict[str, Any]]:
    """Every host's image manifest (all the same, and the expected one), and the first host's environment, GPUs
    and EFA devices."""
    import base64

    from imgbuild.checks.results import CheckResult
    from imgbuild.core.paths import MANIFEST_PATH
    from imgbuild.image.manifest import Manifest

    seen: dict[str, Manifest | str] = {}
    probe: dict[str, Any] = {}
    for k, host in enumerate(nodes.names):
        res = nodes.run(k, _PROBE, timeout_s=30, label="probe")
        fields = {
            line.partition(" ")[0]: line.partition(" ")[2]
            for line in res.output.splitlines()
            if line.startswith("IMGBUILD-")
        }
        raw = base64.b64decode(fields.get("IMGBUILD-MANIFEST", "").strip() or b"")
        if not raw:
            seen[host] = f"no {MANIFEST_PATH} (exit {res.rc}): {res.tail(3)}"
            continue
        try:
            seen[host] = Manifest.parse(raw, f"{host}:{nodes.port}")
        except VerifyError as exc:
            seen[host] = exc.message
        if k == 0:
            pid1 = base64.b64decode(fields.get("IMGBUILD-ENVIRON", "").strip() or b"").decode(errors="replace")
            probe["environ"] = dict(item.split("=", 1) for item in pid1.split("\0") if "=" in item)
            probe["gpus"] = int(fields.get("IMGBUILD-GPUS", "0").strip() or 0)
            probe["efa_devices"] = int(fields.get("IMGBUILD-EFA", "0").strip() or 0)
    first = seen[nodes.names[0]]
    reference = expected if expected is not None else (first if isinstance(first, Manifest) else None)
    want = f"lock {reference.lock_digest[:12]} ({reference.recipe})" if reference is not None else "an imgbuild image"
    results = []
    for host, m in seen.items():
        if isinstance(m, str):
            results.append(CheckResult("cluster: image", "fail", want, "no manifest", reason=m, node=host))
        elif reference is not None and m.lock_digest != reference.lock_digest:
            found = f"lock {m.lock_digest[:12]} ({m.recipe})"
            why = "not the image expected" if expected is not None else f"not the image {nodes.names[0]} runs"
            results.append(CheckResult("cluster: image", "fail", want, found, reason=why, node=host))
        else:
            results.append(CheckResult("cluster: image", "pass", want, f"lock {m.lock_digest[:12]}", node=host))
    if any(r.status == "fail" for r in results) or not isinstance(first, Manifest):
        return None, results, probe
    # What every rank and ssh session must see: the container's own environment (the image's ENV and what
    # `docker run -e` set, as its first process holds it), for the variables the image sets and the profile's.
    environ: dict[str, str] = probe.get("environ", {})
    names = [*first.rank_env, *sorted(first.runtime.env)]
    probe["env"] = {name: environ[name] for name in names if name in environ}
    return first, results, probe
