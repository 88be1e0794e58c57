"""The client of the Docker engine: connect, look up images, make sure base images are there, and the build log's
file. Builds themselves run on BuildKit through a docker CLI (`build.builders`).

Docker failures never escape as raw tracebacks: they become `EngineError` (engine unreachable or refused a request)
or `BaseImageMissing`. `engine_error` is the one translator from a docker-py / requests failure to an `EngineError`,
for this module and every other that calls the engine; `inspect_image` is the one image lookup ("no such image" is
None, not an error).

The engine is the one DOCKER_HOST names, else the docker context DOCKER_CONTEXT (or `docker context use`) names,
else the local socket: the same engine the docker CLI builds on.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, TextIO

import docker
import docker.errors
import requests
import requests.exceptions

from imgbuild.core import validate
from imgbuild.core.errors import BaseImageMissing, BuildError, EngineError
from imgbuild.core.text import truncate

__all__ = [
    "BOOTSTRAP_HINT",
    "DEFAULT_SOCKET",
    "ENGINE_ERRORS",
    "SETUP_HINT",
    "check_docker_host",
    "connect",
    "create_log",
    "engine_error",
    "ensure_base_images",
    "inspect_image",
    "malformed_host",
    "new_client",
    "reason",
]

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
SETUP_HINT = (
    "install and start a Docker engine on this machine (e.g. `sudo systemctl start docker`), or set DOCKER_HOST to "
    "one that answers (ssh://USER@HOST, tcp://HOST:2376 with DOCKER_TLS_VERIFY=1); `imgbuild doctor` shows what "
    "is missing (from a checkout of imgbuild, `scripts/setup.sh` installs and starts one)"
)
BOOTSTRAP_HINT = "imgbuild base bootstrap {image}  (builds it from a Debian/Ubuntu archive)"

LOG_NAME_TRIES = 100  # <recipe>-<second>.log, then -2 ... -100: builds of one recipe started in one second

# What a call to the engine raises: docker-py's errors (APIError when the engine answered with an error) and
# requests' when the connection to the engine fails or breaks (the socket went away, a timeout).
ENGINE_ERRORS: tuple[type[BaseException], ...] = (docker.errors.DockerException, requests.exceptions.RequestException)
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*ENGINE_ERRORS, OSError)  # docker.from_env reads cert files


# --------------------------------------------------------------------------------------------------------
# connect


def _engine_host() -> str:
    host = os.environ.get("DOCKER_HOST")
    if host:
        return f"DOCKER_HOST={validate.redact(host)}"
    context = _context_name()
    if context:
        return f"docker context {context}" + (" (DOCKER_CONTEXT)" if os.environ.get("DOCKER_CONTEXT") else "")
    return f"the default socket {DEFAULT_SOCKET} (DOCKER_HOST is unset)"


def _context_name() -> str | None:
    """The docker context the docker CLI uses when DOCKER_HOST is unset (DOCKER_CONTEXT, else `docker context use`'s
    choice in the CLI's config); None for the default one."""
    if os.environ.get("DOCKER_HOST"):
        return None
    import docker.context.config

    name = os.environ.get("DOCKER_CONTEXT") or docker.context.config.get_current_context_name()
    return None if not name or name == "default" else name


def new_client(timeout: int | None = None) -> docker.DockerClient:
    """A client (not yet pinged) for the engine of DOCKER_HOST, else of the docker context in use, else the local
    socket; docker-py's own exceptions (and `EngineError` for a context that does not exist, or a DOCKER_HOST that
    `check_docker_host` refuses) escape."""
    check_docker_host()
    context = _context_name()
    if context:
        return _from_context(context, timeout)
    return docker.from_env(timeout=timeout) if timeout else docker.from_env()


def _from_context(name: str, timeout: int | None = None) -> docker.DockerClient:
    """A client for the engine of docker context `name` (the CLI's own store of endpoints and TLS material): docker-py's
    `from_env` reads DOCKER_HOST only, and the CLI that builds must talk to the same engine as this client."""
    import docker.context

    context = docker.context.ContextAPI.get_context(name)
    if context is None or not context.Host:
        raise EngineError(
            f"docker context {name!r} (DOCKER_CONTEXT or `docker context use`) does not exist or names no engine",
            hint="`docker context ls` lists them; unset DOCKER_CONTEXT or set DOCKER_HOST instead",
        )
    extra = {"timeout": timeout} if timeout else {}
    return docker.DockerClient(base_url=context.Host, tls=context.TLSConfig or False, **extra)


# How docker-py says DOCKER_HOST is no address it can use (docker.utils.parse_host, and urllib3 parsing the URL made
# of it); urllib's own ValueError ("Port could not be cast to integer value", "Invalid IPv6 URL") comes unwrapped.
_MALFORMED_HOST = (
    "Invalid bind address",
    "Failed to parse:",
    "protocol is not implemented",
    "only supported on Windows",
)
DOCKER_HOST_FORMS = (
    "unix:///PATH/docker.sock, tcp://HOST:PORT (PORT 1-65535, an IPv6 HOST in [ ]), ssh://[USER@]HOST[:PORT] or "
    "npipe:////./pipe/NAME (Windows)"
)


def connect() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH (else by the docker
    context DOCKER_CONTEXT or `docker context use` names, as the docker CLI would), pinged once.

    A DOCKER_HOST that is no engine address (`tcp://:abc`, a port out of range, an unknown scheme) is an
    `EngineError` naming the variable and the forms it takes; an engine that does not answer, one with the
    setup hint."""
    try:
        client = new_client()
        client.ping()
    except ValueError as exc:  # urllib parsing DOCKER_HOST; without DOCKER_HOST it is no address problem: a bug
        raise (malformed_host(exc) or exc) from exc
    except _CONNECT_ERRORS as exc:
        raise (malformed_host(exc) or EngineError(
            f"cannot reach the Docker engine at {_engine_host()}: {reason(exc)}", hint=SETUP_HINT
        )) from exc  # fmt: skip
    return client


def malformed_host(exc: BaseException) -> EngineError | None:
    """The `EngineError` naming DOCKER_HOST and the forms it takes when `exc`, raised making or pinging a client
    (`new_client`), says DOCKER_HOST is no engine address; None for any other failure (`doctor` shows the same)."""
    host = os.environ.get("DOCKER_HOST")
    if isinstance(exc, EngineError):
        return exc
    if host and (isinstance(exc, ValueError) or any(marker in str(exc) for marker in _MALFORMED_HOST)):
        return _malformed_host(host, exc)
    return None


def check_docker_host() -> None:
    """What docker-py and the docker CLI would take from DOCKER_HOST and should not: a password
    (`ssh://USER:PASSWORD@HOST`, `tcp://USER:PASSWORD@HOST:PORT`: ssh logs in with keys or an agent, and the docker CLI
    refuses it too), an ssh address without a host, and an ssh user or host starting with '-' (the docker CLI hands
    them to ssh: an option of ssh, `ssh://-oProxyCommand=...`). `EngineError` naming the variable and its forms,
    never repeating the password; the rest of the grammar is docker-py's (`connect`)."""
    host = os.environ.get("DOCKER_HOST")
    if not host:
        return
    scheme, sep, rest = host.partition("://")
    authority = rest.split("/", 1)[0] if sep else ""
    user, at, address = authority.rpartition("@")
    if at and ":" in user:
        raise _malformed_host(host, "it holds a password (USER:PASSWORD@), which imgbuild does not repeat or pass on")
    if scheme.lower() == "ssh":
        name = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
        try:
            validate.argument(user, "DOCKER_HOST's user")
            validate.argument(name, "DOCKER_HOST's host")
        except ValueError as exc:
            raise _malformed_host(host, str(exc)) from None
        if not name:
            raise _malformed_host(host, "no host after ssh://")


def _malformed_host(host: str, exc: BaseException | str) -> EngineError:
    why = exc if isinstance(exc, str) else reason(exc)
    return EngineError(
        f"DOCKER_HOST={validate.shown(host)} is not the address of a Docker engine ({why}); "
        f"expected {DOCKER_HOST_FORMS}",
        hint="fix or unset DOCKER_HOST (unset: the local engine at " + DEFAULT_SOCKET + ")",
    )


def engine_error(exc: BaseException, doing: str, *, note: str = "") -> EngineError:
    """The `EngineError` for an engine call that failed while `doing` ("looking up image x", "pushing y").

    The engine answered with an error: "the Docker engine failed while <doing>: <its explanation>". The
    connection failed or broke: "lost the Docker engine at <DOCKER_HOST> while <doing>: <errno text>", with the
    setup hint. `note` goes on a line of its own after the message (where the full log is, say).
    """
    if isinstance(exc, docker.errors.APIError):
        message, hint = f"the Docker engine failed while {doing}: {reason(exc)}", None
    else:
        message, hint = f"lost the Docker engine at {_engine_host()} while {doing}: {reason(exc)}", SETUP_HINT
    return EngineError(f"{message}\n{note}" if note else message, hint=hint)


def reason(exc: BaseException) -> str:
    """A failure of docker-py or requests in one line: the engine's explanation, or the innermost errno text."""
    if isinstance(exc, docker.errors.APIError):
        text = exc.explanation or str(exc)
        return str(text).strip()
    text = str(exc).strip() or type(exc).__name__
    # requests/urllib3 nest reprs several levels deep; keep the innermost, most specific part.
    m = re.search(r"\[Errno \d+\] [^'\"()]+", text)
    if m:
        return m.group(0).strip()
    m = re.search(r"(\w+Error)\((\d+), '([^']+)'\)", text)
    if m:
        return f"{m.group(1)}: [Errno {m.group(2)}] {m.group(3)}"
    return truncate(text, 400)


# --------------------------------------------------------------------------------------------------------
# images


def inspect_image(client: docker.DockerClient, ref: str) -> dict[str, Any] | None:
    """`docker image inspect REF`: the engine's record of the image (Id, RepoTags, RepoDigests, Config...).

    None when the engine has no such image (404), or when REF is not a valid reference (400: it names no
    image). Any other failure is an `EngineError` (`engine_error`).
    """
    try:
        return dict(client.api.inspect_image(ref))
    except docker.errors.NotFound:
        return None
    except docker.errors.APIError as exc:
        if exc.status_code == 400:
            return None
        raise engine_error(exc, f"looking up image {ref}") from exc
    except ENGINE_ERRORS as exc:
        raise engine_error(exc, f"looking up image {ref}") from exc


def ensure_base_images(client: docker.DockerClient, images: list[str], *, pull: bool) -> None:
    """Make sure every image is in the engine, pulling it when allowed.

    Raises `BaseImageMissing` for the first one that is absent and cannot be pulled, `EngineError` when
    the engine itself fails.
    """
    for image in images:
        if image.lower() == "scratch":
            continue
        if inspect_image(client, image) is not None:
            continue
        why: str | None = "pulling is disabled"
        if pull:
            why = _try_pull(client, image)
            if why is None and inspect_image(client, image) is not None:
                continue
            why = why or "the pull finished but the image is still not in the engine"
        raise BaseImageMissing(
            f"base image {image} is not in the engine and could not be pulled: {why}",
            hint=BOOTSTRAP_HINT.format(image=image),
        )


def _try_pull(client: docker.DockerClient, image: str) -> str | None:
    """Pull one image; None on success, else the reason it failed."""
    repo, tag = docker.utils.parse_repository_tag(image)
    if tag is None:
        tag = "latest"
    try:
        for record in client.api.pull(repo, tag=tag, stream=True, decode=True):
            if isinstance(record, dict) and ("error" in record or "errorDetail" in record):
                detail = record.get("errorDetail") or {}
                return str(detail.get("message") or record.get("error") or "unknown pull error").strip()
    except ENGINE_ERRORS as exc:
        return reason(exc)
    return None


# --------------------------------------------------------------------------------------------------------
# the build log


def create_log(path: Path) -> tuple[TextIO, Path]:
    """A new build log at `path`, created exclusively (O_EXCL, O_NOFOLLOW): a file or symlink already there, whether
    another build of the recipe in the same second or a link planted to redirect the log, is never opened; the log
    is then `<name>-2.log`, `-3` ... instead. Returns the open log and its path; `BuildError` naming the path when it
    cannot be made."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, LOG_NAME_TRIES + 1):
            candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                fd = os.open(candidate, flags, 0o644)
            except FileExistsError:
                continue
            return open(fd, "w", encoding="utf-8", errors="replace"), candidate  # the caller closes it
    except OSError as exc:
        raise BuildError(f"cannot create the build log {path}: {exc.strerror or exc}") from exc
    raise BuildError(f"cannot create the build log {path}: it and {LOG_NAME_TRIES - 1} numbered names exist")
