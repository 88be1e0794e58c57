"""The thin edge that talks to the Docker engine. Builds themselves run on BuildKit through a docker CLI
(`build.builders`).

- client.py: connect (DOCKER_HOST, else the docker context in use, else the local socket), `engine_error` (the one
  translator from a docker-py / requests failure to an `EngineError`), `inspect_image` (the one image lookup),
  base images made sure of, the build log's file;
- containers.py: containers started and always removed; runprofile.py: how containers of an image start;
- rootfs.py: base images from a debootstrap root filesystem, imported.
"""

from imgbuild.engine.client import (
    BOOTSTRAP_HINT,
    DEFAULT_SOCKET,
    ENGINE_ERRORS,
    SETUP_HINT,
    check_docker_host,
    connect,
    create_log,
    engine_error,
    ensure_base_images,
    inspect_image,
    malformed_host,
    new_client,
    reason,
)

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
