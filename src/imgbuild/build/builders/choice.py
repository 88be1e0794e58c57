"""Which builder: `select` picks the docker CLI and the BuildKit it builds with, and says why.

The candidates are the CLI that IMGBUILD_DOCKER_CLI names (only it), else every `docker` on PATH in order, then
/usr/bin/docker:

* a CLI whose `docker buildx version` works builds with `docker buildx build` (kind "buildx"); `--builder NAME` /
  IMGBUILD_BUILDER names a buildx builder (a remote BuildKit, buildx's Kubernetes driver ...), and
  `docker buildx inspect [NAME]` tells its driver;
* else a CLI older than 23.0 builds with `DOCKER_BUILDKIT=1 docker build` (kind "buildkit"), its own BuildKit
  client (Debian 12's docker.io 20.10);
* else the CLI is skipped: from 23.0 on, `docker build` refuses BuildKit without the buildx plugin.

Nothing usable is an `EngineError` (exit 8) naming what was tried and what to install. The engine is the CLI's own
(DOCKER_HOST, DOCKER_CONTEXT): the environment is passed through.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from imgbuild.core.errors import EngineError
from imgbuild.core.text import clean, truncate

__all__ = ["BUILDER_ENV", "BUILDX_MIN_CLASSIC", "CLI_ENV", "Builder", "NoBuilder", "Skipped", "candidates", "select"]

CLI_ENV = "IMGBUILD_DOCKER_CLI"
BUILDER_ENV = "IMGBUILD_BUILDER"
FALLBACK_CLI = "/usr/bin/docker"
BUILDX_MIN_CLASSIC = 23  # from Docker CLI 23.0 on, `docker build` needs the buildx plugin for BuildKit
PROBE_TIMEOUT_S = 30.0

INSTALL_HINT = (
    "install the buildx plugin (Docker's docker-buildx-plugin package, or the docker-buildx binary in "
    "~/.docker/cli-plugins/), or a docker CLI 20.10-22.x (e.g. Debian 12's docker.io, /usr/bin/docker); "
    f"{CLI_ENV} names the docker CLI to use"
)

Kind = Literal["buildx", "buildkit"]


@dataclass(frozen=True)
class Skipped:
    """A docker CLI that cannot build with BuildKit, and why."""

    cli: str
    version: str | None
    reason: str


class NoBuilder(EngineError):
    """No docker CLI here can build with BuildKit (or none has buildx where a builder is named): exit 8, with the
    candidates tried and why each was skipped."""

    def __init__(self, message: str, *, hint: str | None = None, skipped: Sequence[Skipped] = ()) -> None:
        super().__init__(message, hint=hint)
        self.skipped = tuple(skipped)


@dataclass(frozen=True)
class Builder:
    """How images are built here: kind "buildx" (`docker buildx build`) or "buildkit" (`DOCKER_BUILDKIT=1 docker
    build`), through the CLI at `cli`; for buildx the builder's name (None: the CLI's current one) and driver."""

    kind: Kind
    cli: str
    cli_version: str
    name: str | None = None
    driver: str | None = None
    buildx_version: str | None = None
    why: str = ""
    skipped: tuple[Skipped, ...] = ()

    @property
    def registry_cache(self) -> bool:
        """Whether the builder can export a registry cache (`--cache-to type=registry`): buildx with a driver other
        than `docker` (docker-container, remote, kubernetes)."""
        return self.kind == "buildx" and self.driver not in (None, "docker")

    @property
    def engine_store(self) -> bool:
        """Whether the builder reads base images from and writes the image to the engine's own image store (kind
        buildkit, or buildx's docker driver); other drivers resolve FROM from registries and need `--load`."""
        return self.kind == "buildkit" or self.driver == "docker"

    def describe(self) -> str:
        """One line: what builds and through which CLI."""
        if self.kind == "buildx":
            name = self.name or "the current builder"
            return (
                f"docker buildx build (buildx {self.buildx_version or '?'}, builder {name}, driver "
                f"{self.driver or '?'}) through {self.cli} (docker CLI {self.cli_version})"
            )
        return f"DOCKER_BUILDKIT=1 docker build through {self.cli} (docker CLI {self.cli_version})"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cli": self.cli,
            "cli_version": self.cli_version,
            "buildx_version": self.buildx_version,
            "name": self.name,
            "driver": self.driver,
            "registry_cache": self.registry_cache,
            "engine_store": self.engine_store,
            "why": self.why,
            "skipped": [{"cli": s.cli, "version": s.version, "reason": s.reason} for s in self.skipped],
        }


def candidates(env: Mapping[str, str] | None = None) -> list[str]:
    """The docker CLIs `select` considers, in order: IMGBUILD_DOCKER_CLI alone when set, else every `docker` on PATH
    and then /usr/bin/docker (each file once, however many links lead to it)."""
    env = os.environ if env is None else env
    named = env.get(CLI_ENV, "").strip()
    if named:
        return [named if os.sep in named else (shutil.which(named, path=env.get("PATH")) or named)]
    found: list[str] = []
    seen: set[str] = set()
    paths = [os.path.join(d or ".", "docker") for d in env.get("PATH", os.defpath).split(os.pathsep)]
    for path in [*paths, FALLBACK_CLI]:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            found.append(path)
    return found


def _probe(argv: list[str], env: Mapping[str, str]) -> tuple[int, str]:
    """(exit code, stdout and stderr) of a short CLI call; 127 with the reason when it cannot run."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", env=dict(env), timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return 124, f"`{' '.join(argv[1:])}` did not answer within {PROBE_TIMEOUT_S:.0f}s"
    except OSError as exc:
        return 127, exc.strerror or str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


_VERSION_RE = re.compile(r"Docker version (\d+)\.(\d+)\.(\d+)\S*", re.I)


def _first_line(text: str) -> str:
    return truncate(clean(text.strip().splitlines()[0]) if text.strip() else "no output", 200)


def _inspect(cli: str, name: str | None, env: Mapping[str, str]) -> tuple[str | None, str | None, str]:
    """(builder name, driver, problem) from `docker buildx inspect [NAME]`."""
    rc, out = _probe([cli, "buildx", "inspect", *([name] if name else [])], env)
    if rc != 0:
        return None, None, _first_line(out)
    got_name = re.search(r"^Name:\s*(\S+)", out, re.M)
    driver = re.search(r"^Driver:\s*(\S+)", out, re.M)
    if driver is None:
        return None, None, f"`docker buildx inspect` named no driver: {_first_line(out)}"
    return (got_name.group(1) if got_name else name), driver.group(1), ""


def select(name: str | None = None, *, env: Mapping[str, str] | None = None) -> Builder:
    """The builder this machine builds with (see the module's docstring); `name` (--builder, else IMGBUILD_BUILDER)
    names a buildx builder. `EngineError` when no candidate can build with BuildKit, or when `name` is given and
    no candidate has buildx."""
    env = os.environ if env is None else env
    name = name or env.get(BUILDER_ENV, "").strip() or None
    option = f"--builder {name}" + (" (IMGBUILD_BUILDER)" if env.get(BUILDER_ENV, "").strip() == name else "")
    clis = candidates(env)
    skipped: list[Skipped] = []
    named_cli = bool(env.get(CLI_ENV, "").strip())
    for cli in clis:
        if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
            skipped.append(Skipped(cli, None, "not an executable file"))
            continue
        rc, out = _probe([cli, "--version"], env)
        m = _VERSION_RE.search(out) if rc == 0 else None
        if m is None:
            skipped.append(Skipped(cli, None, f"not a docker CLI (`docker --version`: {_first_line(out)})"))
            continue
        version = m.group(0).split()[-1].rstrip(",")
        major = int(m.group(1))
        rc, out = _probe([cli, "buildx", "version"], env)
        if rc == 0:
            buildx = " ".join(out.split()[1:2]) or _first_line(out)
            got_name, driver, problem = _inspect(cli, name, env)
            if problem:
                what = f"buildx builder {name}" if name else "its current buildx builder"
                skipped.append(Skipped(cli, version, f"buildx {buildx}: {what} does not answer: {problem}"))
                continue
            why = (
                "the CLI has the buildx plugin; "
                + (f"{option} names the builder" if name else "its current builder")
                + f", driver {driver}"
                + (": no registry cache export (inline cache instead)" if driver == "docker" else
                   ": registry cache export; images are loaded into the engine (--load)")
            )  # fmt: skip
            return Builder("buildx", cli, version, got_name, driver, buildx, why, tuple(skipped))
        no_buildx = f"no buildx plugin (`docker buildx version`: {_first_line(out)})"
        if name:
            skipped.append(Skipped(cli, version, f"{no_buildx}; {option} needs buildx"))
            continue
        if major < BUILDX_MIN_CLASSIC:
            why = (
                "no buildx plugin, and a docker CLI before 23.0 builds with its own BuildKit client; no registry "
                "cache export (inline cache instead)"
            )
            return Builder("buildkit", cli, version, why=why, skipped=tuple(skipped))
        skipped.append(
            Skipped(cli, version, f"{no_buildx}; from docker CLI 23.0 on, `docker build` needs buildx for BuildKit")
        )
    tried = (
        "; ".join(f"{s.cli}" + (f" ({s.version})" if s.version else "") + f": {s.reason}" for s in skipped) or "nothing"
    )
    where = f"{CLI_ENV}={env.get(CLI_ENV)}" if named_cli else "PATH and /usr/bin/docker"
    if not clis:
        raise NoBuilder(f"no docker CLI found ({where}): imgbuild builds through one", hint=INSTALL_HINT)
    if name:
        raise NoBuilder(
            f"{option} names a buildx builder, and no docker CLI here has buildx (tried {tried})",
            hint="install the buildx plugin (Docker's docker-buildx-plugin package, or the docker-buildx binary in "
            "~/.docker/cli-plugins/), or leave --builder / IMGBUILD_BUILDER out to build on the engine's BuildKit",
            skipped=skipped,
        )
    raise NoBuilder(f"no docker CLI here can build with BuildKit (tried {tried})", hint=INSTALL_HINT, skipped=skipped)
