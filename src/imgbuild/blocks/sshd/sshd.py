"""sshd: the OpenSSH server mpirun reaches other containers through; hardened, and NO keys in the image.

Host keys are generated and the run's authorized key installed by its entrypoint hook (sshd/files/50-sshd.sh) when
the container starts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Literal

from pydantic import field_validator

from imgbuild.blocks._block import Block, ImageFacts, LaunchLines, RecipeRules, ShipsFiles
from imgbuild.blocks._core import Context, Contribution, Details, Pin, Resolution, Target
from imgbuild.checks import CONTAINER, CheckContext, check, fail, passed
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import Port, Strict

SSHD_WAIT_S = 10


DEFAULT_PORT = 3022  # where sshd listens unless the recipe says (not 22: the host's own sshd has it under --net=host)
SSHD_LOG = "/var/log/imgbuild-sshd.log"  # sshd's log (`sshd -E`, its entrypoint hook); train and verify read it
SSH_KEY_DIR = "/run/imgbuild/ssh"  # the run's ssh keys, mounted (sshd's hook installs them; verify --nodes mounts them)


class Sshd(Strict):
    """OpenSSH server for mpirun between containers: hardened config and NO keys in the image.

    Host keys are generated and the run's authorized key installed by the entrypoint at container start.
    """

    ports: tuple[Port, ...] = (DEFAULT_PORT,)
    """Where sshd listens (not 22: the host's own sshd has it under --net=host)."""
    permit_root_login: Literal["prohibit-password", "no"] = "prohibit-password"
    """Whether root may log in with a key (prohibit-password) or not at all (no)."""

    @field_validator("ports")
    @classmethod
    def _unique(cls, ports: tuple[int, ...]) -> tuple[int, ...]:
        if not ports:
            raise ValueError("at least one port")
        if len(set(ports)) != len(ports):
            raise ValueError(f"distinct ports, got {list(ports)}")
        return ports


class SshdDetails(Details):
    """sshd's pin: the ports it listens on and whether root may log in (with a key only, or not at all)."""

    ports: tuple[Port, ...]
    permit_root_login: Literal["prohibit-password", "no"]


# The host's own sshd listens here: a container on the host's network cannot take it.
HOST_SSH_PORT = 22


class SshdBlock(Block, ShipsFiles, RecipeRules):
    name = "sshd"
    options = Sshd
    modes = {"distro": "fragment"}
    details = SshdDetails
    files = (
        ("imgbuild/sshd_config", "blocks/sshd/sshd_config.j2", 0o644),
        ("imgbuild/ssh_config", "blocks/sshd/ssh_config.j2", 0o644),
        ("imgbuild/sshd/50-sshd.sh", "sshd/files/50-sshd.sh", 0o644),
    )

    def resolve(self, s: Sshd, rs: Resolution) -> Pin:
        return Pin(
            version=None,
            source="distro",
            origin=f"{rs.os_id} openssh-server",
            details=SshdDetails(ports=s.ports, permit_root_login=s.permit_root_login),
        )

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="sshd")
        c.runtime_packages.add("openssh-server")
        c.post_install.append("rm -f /etc/ssh/ssh_host_*")  # the package makes host keys: none in the image
        return c

    def recipe_rule(self, recipe: Target) -> tuple[tuple[str, ...], str] | None:
        """sshd on port 22 in a recipe whose containers use the host's network (runtime.network: host, as the GPU
        targets' do): the host's own sshd has that port on every node, so the image's sshd could not listen there."""
        sshd = recipe.components.sshd
        if sshd is None or recipe.runtime.network != "host" or HOST_SSH_PORT not in sshd.ports:
            return None
        return (
            ("components", "sshd", "ports"),
            f"port {HOST_SSH_PORT} is the host's own sshd's, and this recipe's containers use the host's network "
            f"(runtime.network: host): the image's sshd would clash with it on every node; expected another port "
            f"(the default is 3022)",
        )

    # the entrypoint hook's data: where the run's keys are mounted and where sshd logs
    def data(self, pin: Pin, manifest: ImageFacts, launch: LaunchLines) -> Mapping[str, str]:
        return {"imgbuild/sshd/sshd.conf": f"SSH_KEY_DIR={SSH_KEY_DIR}\nSSHD_LOG={SSHD_LOG}\n"}


BLOCK = SshdBlock()


@check("sshd-config", "sshd", scopes=CONTAINER)
def sshd_config(ctx: CheckContext) -> CheckResult:
    """`sshd -T`: the manifest's ports, no passwords, root only with keys."""
    sshd: SshdDetails = ctx.details("sshd")
    ports = sorted(sshd.ports)
    permit = sshd.permit_root_login
    allowed = {"prohibit-password", "without-password"} if permit == "prohibit-password" else {permit}
    expected = f"ports {','.join(map(str, ports))}; passwordauthentication no; permitrootlogin {permit}"
    ran = ctx.run("/usr/sbin/sshd -T 2>&1 || sshd -T")
    if not ran.ok:
        return fail(f"sshd -T: {ran.why()}", expected=expected)
    conf: dict[str, list[str]] = {}
    for line in ran.out.splitlines():
        key, _, value = line.strip().partition(" ")
        conf.setdefault(key.lower(), []).append(value.strip())
    got_ports = sorted(int(p) for p in conf.get("port", []) if p.isdigit())
    pw = conf.get("passwordauthentication", ["?"])[0]
    root = conf.get("permitrootlogin", ["?"])[0]
    empty = conf.get("permitemptypasswords", ["no"])[0]
    found = f"ports {','.join(map(str, got_ports))}; passwordauthentication {pw}; permitrootlogin {root}"
    problems = []
    if got_ports != ports:
        problems.append(f"ports {got_ports}, the manifest says {ports}")
    if pw != "no":
        problems.append(f"passwordauthentication {pw}")
    if empty != "no":
        problems.append(f"permitemptypasswords {empty}")
    if root not in allowed:
        problems.append(f"permitrootlogin {root}")
    if problems:
        return fail("; ".join(problems), expected, found)
    return passed(expected, found)


def listening_ports(proc_net_tcp: str) -> set[int]:
    """TCP ports in LISTEN state (0A) from /proc/net/tcp and /proc/net/tcp6 text."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3] == "0A" and ":" in parts[1]:
            ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


@check("sshd-listening", "sshd", scopes=CONTAINER)
def sshd_listening(ctx: CheckContext) -> CheckResult:
    """Once the entrypoint ran, sshd listens on the manifest's ports."""
    ports = set(ctx.details("sshd").ports)
    expected = ",".join(map(str, sorted(ports)))
    # sshd binds after it daemonizes: give it a moment, but not long once it listens elsewhere (a wrong port).
    start = time.monotonic()
    listening: set[int] = set()
    while True:
        ran = ctx.run("cat /proc/net/tcp /proc/net/tcp6 2>/dev/null")
        before, listening = listening, listening_ports(ran.out)
        waited = time.monotonic() - start
        if ports <= listening or waited > SSHD_WAIT_S or (listening and listening == before and waited > 1):
            break
        time.sleep(0.3)
    found = ",".join(map(str, sorted(listening))) or "nothing"
    if not ports <= listening:
        missing = ",".join(map(str, sorted(ports - listening)))
        log = ctx.run(f"tail -n 5 {SSHD_LOG} 2>/dev/null")
        why = f"; sshd log: {' | '.join(log.out.strip().splitlines())}" if log.out.strip() else ""
        return fail(f"nothing listens on {missing}{why}", expected, found)
    return passed(expected, found)
