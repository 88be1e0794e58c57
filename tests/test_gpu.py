"""The GPU lane: what imgbuild does on a host with a real NVIDIA GPU (a DLAMI, a Slurm node, the project's GPU
machine), run by `scripts/gpu-lane.sh run` there. CI has no GPU and deselects the lane (`-m "not gpu"`).

Every test here needs an NVIDIA GPU and its driver, and FAILS without one (the lane was asked for on a host that
cannot run it). A step that needs what the host lacks (an MPI with headers, mpi4py, the NCCL headers) is a skip
that names what is missing.

- the driver finding (`imgbuild doctor --json`) read from the real nvidia-smi, against the kernel module's own
  /proc/driver/nvidia/version;
- `imgbuild verify RECIPE --host local`: its GPU checks pass on the host (its version checks judge the host against
  the image, and fail where the host is not the image: not asserted);
- nccl-tests from the recipe's pinned archive (its sha256 the lock's), built with the make variables the recipe's
  plan renders (`blocks.nccl_tests.make_variables`: MPI, gencode) with the host's CUDA, NCCL and MPI in place of the
  image's, run on every GPU with the arguments `cluster job` runs (`nccltests.command.args`), its log judged by
  `imgbuild cluster report`;
- the DDP probe on CUDA (nccl backend) under the recipe's torchrun line and under its mpirun line, with the host's
  Python in place of the image's (`image.launch.launch_for`).
- where the host has them (a DLAMI on an EFA instance), the EFA plugin and GDRCopy's device as verify judges them;
  a skip naming what the host lacks elsewhere.

The recipe is the shipped one whose -gencode flags carry the GPU's architecture, the one named after the GPU first
(h200 on an H200), or IMGBUILD_GPU_RECIPE. Logs go to IMGBUILD_GPU_OUT when set (the runner's output folder), else
the test's tmp_path. The archives come from IMGBUILD_GPU_FILES (the runner's pack), else tests/data/upstream/sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import UPSTREAM
from imgbuild import probes, recipe
from imgbuild.blocks import nccl_tests
from imgbuild.image import identity, render
from imgbuild.image.launch import launch_for
from imgbuild.nccltests import command
from imgbuild.pin import lock
from imgbuild.pin.content import download_name

pytestmark = pytest.mark.gpu

NCCL_TESTS_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300
Checks = dict[str, dict[str, Any]]  # verify's results by check name (its --json report)
DDP_RE = re.compile(r'^(\{"ddp": .*\})\s*$', re.MULTILINE)  # the probe's one line on rank 0


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_cap: str  # "9.0"
    driver: str

    @property
    def sm(self) -> str:
        return "sm_" + self.compute_cap.replace(".", "")


def imgbuild(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """The CLI as users run it (a process of its own)."""
    return subprocess.run(
        [sys.executable, "-m", "imgbuild", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def out_dir(tmp_path: Path) -> Path:
    given = os.environ.get("IMGBUILD_GPU_OUT")
    folder = Path(given) if given else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def gpus() -> list[Gpu]:
    """The host's GPUs, from nvidia-smi; the lane fails (never skips) without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.fail("the gpu lane needs an NVIDIA GPU and its driver: nvidia-smi is not on PATH")
    query = "--query-gpu=index,name,compute_cap,driver_version"
    ran = subprocess.run([smi, query, "--format=csv,noheader"], capture_output=True, text=True, timeout=60, check=False)
    if ran.returncode != 0:
        pytest.fail(f"the gpu lane needs an NVIDIA GPU: nvidia-smi exited {ran.returncode}: {ran.stderr.strip()}")
    found = [Gpu(int(i), name, cap, driver) for i, name, cap, driver in (
        [f.strip() for f in line.split(",")] for line in ran.stdout.strip().splitlines()
    )]  # fmt: skip
    if not found:
        pytest.fail("the gpu lane needs an NVIDIA GPU: nvidia-smi lists none")
    print(f"GPUs: {', '.join(f'{g.index}: {g.name} ({g.sm}, driver {g.driver})' for g in found)}")
    return found


@pytest.fixture(scope="module")
def gpu_recipe(gpus: list[Gpu]) -> str:
    """IMGBUILD_GPU_RECIPE, else the shipped recipe whose gencode carries the first GPU's architecture: the one named
    after the GPU where there is one (h200 on an NVIDIA H200), else the first by name."""
    given = os.environ.get("IMGBUILD_GPU_RECIPE")
    if given:
        return given
    sm, gpu_name = gpus[0].sm, gpus[0].name.lower()
    # the recipe named after the GPU first (h200 on an "NVIDIA H200"), then the rest in order
    for name in sorted(recipe.shipped_names(), key=lambda n: n not in gpu_name.split()):
        _, resolved = lock.for_ref(name)
        if "nccl_tests" not in resolved.pins:
            continue
        ctx, _ = render.contributions(resolved)
        if ctx.gencode and f"code={sm}" in ctx.gencode:
            print(f"recipe {name}: {ctx.gencode}")
            return name
    pytest.fail(f"no shipped recipe builds for {sm} ({gpus[0].name}): name one with IMGBUILD_GPU_RECIPE")


@pytest.fixture(scope="module")
def torch_facts() -> dict[str, str]:
    """The host's PyTorch: version, CUDA, the NCCL it loads and the NCCL wheel's folder (a skip without torch)."""
    probe = (
        "import json, torch\n"
        "facts = {'torch': torch.__version__, 'cuda': str(torch.version.cuda),"
        " 'nccl': '.'.join(map(str, torch.cuda.nccl.version())), 'nccl_dir': ''}\n"
        "try:\n"
        "    import nvidia.nccl\n"
        "    facts['nccl_dir'] = list(nvidia.nccl.__path__)[0]\n"
        "except ImportError:\n"
        "    pass\n"
        "print(json.dumps(facts))\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    if ran.returncode != 0:
        pytest.skip(f"this host's Python has no PyTorch with CUDA: {ran.stderr.strip()[-300:]}")
    facts: dict[str, str] = json.loads(ran.stdout.strip().splitlines()[-1])
    return facts


# --- the driver, doctor and verify --host local --------------------------------------------------------------------


def test_doctor_reads_the_driver_from_nvidia_smi(gpus: list[Gpu]) -> None:
    ran = imgbuild("doctor", "--json")
    report = json.loads(ran.stdout)  # doctor exits non-zero on a host without an engine; its JSON is whole
    driver = report["driver"]
    assert driver["source"] == "nvidia-smi" and driver["version"] == gpus[0].driver, driver
    module = Path("/proc/driver/nvidia/version")
    if module.is_file():  # the kernel module's own word, which doctor does not read
        assert f" {driver['version']} " in module.read_text(), module.read_text()
    judged = {name: image["status"] for image in driver["images"] for name in image["recipes"]}
    print(f"driver {driver['version']}: " + ", ".join(f"{n} {s}" for n, s in sorted(judged.items())))
    assert judged and set(judged.values()) <= {"ok", "behind"}, driver


@pytest.fixture(scope="module")
def host_checks(gpus: list[Gpu], gpu_recipe: str, tmp_path_factory: pytest.TempPathFactory) -> Checks:
    """`imgbuild verify RECIPE --host local --json`, run once: its results by check name. It exits 11 where a check
    fails, as its version checks do on a host that is not the image."""
    report_path = out_dir(tmp_path_factory.mktemp("verify")) / f"verify-{gpu_recipe}.json"
    ran = imgbuild("verify", gpu_recipe, "--host", "local", "--json", str(report_path))
    assert ran.returncode in (0, 11), ran.stdout[-2000:] + ran.stderr[-2000:]
    return {c["name"]: c for c in json.loads(report_path.read_text())["results"]}


def print_checks(checks: Checks, names: list[str] | tuple[str, ...]) -> None:
    for name in names:
        print(f"{name}: {checks[name]['status']}: {checks[name].get('found', '')}")


def test_verify_host_local_passes_its_gpu_checks(gpus: list[Gpu], host_checks: Checks) -> None:
    names = ("gpu-nvidia-smi", "gpu-torch-cuda", "gpu-nccl-allreduce", "gpu-driver")
    print_checks(host_checks, names)
    statuses = {n: host_checks[n]["status"] for n in names}
    assert statuses == dict.fromkeys(statuses, "pass"), {n: host_checks[n] for n in statuses}
    assert f"{len(gpus)} GPU(s)" in host_checks["gpu-nvidia-smi"]["found"]


# --- nccl-tests: the recipe's archive and make variables, the host's homes --------------------------------------


@dataclass(frozen=True)
class HostHomes:
    cuda: str
    nccl: str
    mpi: str | None  # None: no MPI with headers on the host (MPI=0)
    why_no_mpi: str = ""
    mpirun: str = ""  # the mpirun of that MPI


def host_homes(tmp_path: Path, nccl_dir: str) -> HostHomes:
    """The host's CUDA (nvcc's), NCCL (the wheel PyTorch loads, with the libnccl.so link the link step needs) and
    Open MPI (mpicc's, when it has one)."""
    nvcc = shutil.which("nvcc") or (
        str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc") if os.environ.get("CUDA_HOME") else None
    )
    if nvcc is None or not Path(nvcc).is_file():
        pytest.skip("this host has no CUDA compiler (nvcc on PATH or under CUDA_HOME): nccl-tests cannot be built")
    cuda = str(Path(nvcc).resolve().parent.parent)
    if not nccl_dir or not (Path(nccl_dir) / "include" / "nccl.h").is_file():
        pytest.skip(f"this host's NCCL has no headers (nvidia.nccl at {nccl_dir or 'none'}): nccl-tests needs nccl.h")
    nccl = tmp_path / "nccl-home"
    (nccl / "lib").mkdir(parents=True)
    (nccl / "include").symlink_to(Path(nccl_dir) / "include")
    for name in ("libnccl.so", "libnccl.so.2"):
        (nccl / "lib" / name).symlink_to(Path(nccl_dir) / "lib" / "libnccl.so.2")
    # Open MPI as its compiler wrapper places it (a distribution's headers are not under PREFIX/include): a home of
    # links, as for NCCL, since nccl-tests reads MPI_HOME/include and MPI_HOME/lib.
    mpicc, mpirun = shutil.which("mpicc"), shutil.which("mpirun")
    if mpicc is None or mpirun is None:
        return HostHomes(cuda, str(nccl), None, "no mpicc and mpirun (Open MPI's headers) on this host")
    dirs = {}
    for what in ("incdirs", "libdirs"):
        ran = subprocess.run([mpicc, f"--showme:{what}"], capture_output=True, text=True, timeout=60, check=False)
        if ran.returncode != 0 or not ran.stdout.split():
            return HostHomes(cuda, str(nccl), None, f"mpicc --showme:{what} says nothing (not Open MPI's wrapper?)")
        dirs[what] = ran.stdout.split()[0]
    mpi = tmp_path / "mpi-home"
    mpi.mkdir()
    (mpi / "include").symlink_to(dirs["incdirs"])
    (mpi / "lib").symlink_to(dirs["libdirs"])
    return HostHomes(cuda, str(nccl), str(mpi), mpirun=mpirun)


def archive(url: str, sha256: str | None) -> Path:
    """The pinned archive from IMGBUILD_GPU_FILES or tests/data/upstream/sources, checked against the lock."""
    folder = Path(os.environ.get("IMGBUILD_GPU_FILES") or UPSTREAM / "sources")
    path = folder / download_name(url)
    if not path.is_file():
        pytest.fail(f"{path} is missing: the lane builds nccl-tests from the pinned archive ({url})")
    assert sha256 is not None, f"the lock records no sha256 for {url}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256, f"{path} is not the archive the lock pins"
    return path


def test_nccl_tests_built_with_the_recipes_make_variables_run_and_report(
    gpus: list[Gpu], gpu_recipe: str, torch_facts: dict[str, str], tmp_path: Path
) -> None:
    facts = torch_facts
    _, resolved = lock.for_ref(gpu_recipe)
    ctx, _ = render.contributions(resolved)
    pin = resolved.pins["nccl_tests"]
    url = nccl_tests.source_url(str(pin.version))
    tarball = archive(url, ctx.recorded(url).sha256)
    homes = host_homes(tmp_path, facts["nccl_dir"])
    variables = nccl_tests.make_variables(ctx)
    image_homes = {k: variables[k] for k in ("MPI_HOME", "CUDA_HOME", "NCCL_HOME")}
    variables.update(CUDA_HOME=homes.cuda, NCCL_HOME=homes.nccl)
    if homes.mpi is None:
        variables.update(MPI="0")
        del variables["MPI_HOME"]
        print(f"MPI=0: {homes.why_no_mpi}")
    else:
        variables["MPI_HOME"] = homes.mpi
    print(f"make variables: {variables} (the image's homes: {image_homes})")
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    src = tmp_path / f"nccl-tests-{pin.version}"
    out = out_dir(tmp_path)
    made = subprocess.run(
        ["make", "-C", str(src), f"-j{os.cpu_count() or 2}", *(f"{k}={v}" for k, v in variables.items())],
        capture_output=True, text=True, timeout=NCCL_TESTS_TIMEOUT_S, check=False,
    )  # fmt: skip
    (out / "nccl-tests-make.log").write_text(made.stdout + made.stderr)
    assert made.returncode == 0, (made.stdout + made.stderr)[-3000:]
    binary = src / "build" / "all_reduce_perf"
    assert binary.is_file()

    args = list(command.args(None))  # what `cluster job` and the nodes' check run: -g 1 per rank
    env = {
        **os.environ,
        "NCCL_DEBUG": "INFO",
        "LD_LIBRARY_PATH": f"{homes.nccl}/lib:{os.environ.get('LD_LIBRARY_PATH', '')}",
    }
    if homes.mpi is None:  # one process drives every GPU
        args[args.index("-g") + 1] = str(len(gpus))
        argv = [str(binary), *args]
    else:  # one rank per GPU, as the jobs run it
        argv = [homes.mpirun, "--allow-run-as-root", "-np", str(len(gpus)), "-x", "NCCL_DEBUG",
                "-x", "LD_LIBRARY_PATH", str(binary), *args]  # fmt: skip
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=NCCL_TESTS_TIMEOUT_S, env=env, check=False)
    log = out / "all_reduce_perf.log"
    log.write_text(ran.stdout + ran.stderr)
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    for line in ran.stdout.splitlines():
        if re.match(r"^\s+(134217728|1073741824)\s", line) or "Avg bus" in line or "Out of bounds" in line:
            print(line)

    report_path = out / "all_reduce_perf.report.json"
    judged = imgbuild("cluster", "report", str(log), "--nccl-version", facts["nccl"], "--json", str(report_path))
    print(judged.stdout[-3000:])
    assert judged.returncode == 0, judged.stdout[-3000:] + judged.stderr[-2000:]
    rep = json.loads(report_path.read_text())
    statuses = {c["name"]: c["status"] for c in rep["criteria"]}
    assert rep["nodes"] == 1 and statuses["results"] == "PASS" and statuses["NCCL version"] == "PASS", statuses
    assert statuses["network"] == "SKIP" and statuses["bandwidth"] == "SKIP", statuses


# --- the DDP probe on CUDA under the recipe's launch lines --------------------------------------------------------


def test_ddp_on_cuda_under_torchrun_and_mpirun(
    gpus: list[Gpu], gpu_recipe: str, torch_facts: dict[str, str], tmp_path: Path
) -> None:
    facts = torch_facts
    _, resolved = lock.for_ref(gpu_recipe)
    manifest = render.manifest(resolved, identity.of(resolved))
    launch = launch_for(manifest.mpirun, manifest.rank_env, sys.executable)
    program = tmp_path / "ddp_train.py"
    program.write_text(probes.text("ddp_train.py"))
    env = {**os.environ, "IMGBUILD_MASTER_ADDR": "127.0.0.1"}
    env.update(dict(d.split("=", 1) for d in launch.defaults_for(list(os.environ))))
    n = len(gpus)
    out = out_dir(tmp_path)
    results: dict[str, dict[str, object]] = {}

    torchrun = launch.torchrun_argv(
        nnodes=1, nproc_per_node=n, endpoint="127.0.0.1:29500", run_id=uuid.uuid4().hex[:12], local_addr="127.0.0.1",
        program=[str(program)],
    )  # fmt: skip
    runs = {"torchrun": torchrun}
    mpi4py = subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True, text=True, check=False)
    mpirun = shutil.which(launch.mpirun[0]) if launch.mpirun else None
    if mpirun is None or mpi4py.returncode != 0:
        print(f"mpirun line not run: {'no mpirun on PATH' if mpirun is None else 'no mpi4py in this Python'}")
    else:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text(f"localhost slots={n}\n")
        runs["mpirun"] = launch.mpirun_argv(
            hostfile=str(hostfile), np=n, program=[sys.executable, str(program)], wdir=str(tmp_path)
        )
    for launcher, argv in runs.items():
        ran = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=tmp_path, check=False
        )
        (out / f"ddp-{launcher}.log").write_text(f"$ {' '.join(argv)}\n{ran.stdout}{ran.stderr}")
        assert ran.returncode == 0, (launcher, (ran.stdout + ran.stderr)[-3000:])
        m = DDP_RE.search(ran.stdout)
        assert m, (launcher, ran.stdout[-2000:])
        results[launcher] = json.loads(m.group(1))
        print(f"{launcher}: {results[launcher]}")
    for launcher, data in results.items():
        assert data["ddp"] == "ok" and data["backend"] == "nccl", (launcher, data)
        assert data["world_size"] == n and data["nccl"] == facts["nccl"], (launcher, data)
    if "mpirun" not in runs:
        pytest.skip("torchrun passed; the mpirun line needs mpirun on PATH and mpi4py in this Python")


# --- what the host may lack: the EFA plugin's libfabric, GDRCopy's kernel module ---------------------------------


def host_libfabric() -> str | None:
    """Where this host's libfabric is (the EFA installer's /opt/amazon/efa, else a distribution's), None without."""
    for prefix in ("/opt/amazon/efa", "/usr"):
        if (Path(prefix) / "include" / "rdma" / "fabric.h").is_file() or list(Path(prefix).glob("lib*/libfabric.so*")):
            return prefix
    return None


def test_the_hosts_efa_plugin_and_gdrcopy_as_verify_judges_them(
    gpus: list[Gpu], request: pytest.FixtureRequest
) -> None:
    """Where the host has libfabric (an EFA instance's DLAMI: the EFA installer, its aws-ofi-nccl) and GDRCopy's
    gdrdrv module, `verify --host local` finds the plugin with the API the recipe's NCCL looks for, and the device;
    elsewhere a skip says which of them the host lacks (the project's GPU machine has neither: no EFA, no module)."""
    lacks = []
    if host_libfabric() is None:
        lacks.append("libfabric (no /opt/amazon/efa, no libfabric.so): the EFA plugin cannot load or be built here")
    if not Path("/dev/gdrdrv").exists():
        lacks.append("/dev/gdrdrv (GDRCopy's gdrdrv kernel module is not loaded)")
    if lacks:
        pytest.skip("this host lacks " + "; ".join(lacks))
    checks: Checks = request.getfixturevalue("host_checks")  # verify's run, once the host has both
    wanted = [n for n in ("aws-ofi-nccl-plugin", "aws-ofi-nccl-api", "gdrcopy-device") if n in checks]
    print_checks(checks, wanted)
    assert wanted and all(checks[n]["status"] == "pass" for n in wanted), {n: checks[n] for n in wanted}
