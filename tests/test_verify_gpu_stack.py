"""verify's checks of the GPU stack: the NCCL net plugin (its libraries resolve, it exports an API version the image's
NCCL loads, NCCL loads and uses it on a GPU), nccl-tests' links (the image's one NCCL, its MPI) and libfabric's efa
provider wherever the plugin is.

The docker tests run each check in a container of the real cpu image (Debian 12: Debian's libfabric, which has no efa
provider, and Open MPI; the NCCL wheel) into which a test puts small ELF files compiled here with the host's gcc,
standing in for the plugin and nccl-tests' binaries: linked like them (libfabric.so.1; libnccl.so.2 and libmpi.so.40),
exporting or not the plugin's symbols. Each check passes on the good container and fails on one broken on purpose (a
library removed, a second NCCL first on a binary's RPATH, a plugin without the API NCCL looks for). The GPU check reads
the real NCCL logs of tests/data/upstream, as a GPU host would print them.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import EFA_TWO_NODE_LOG, UPSTREAM, one_host_log
from imgbuild import checks
from imgbuild.blocks import Pin, aws_ofi_nccl, libfabric, nccl_tests
from imgbuild.blocks.aws_ofi_nccl import plugin_file
from imgbuild.image.manifest import read_entry
from imgbuild.probes import elfsyms
from imgbuild.verify import gpuchecks
from test_multinode import manifest_of

CPU: dict[str, dict[str, Any]] = {
    "libfabric": {"version": "1.17.0", "source": "distro", "prefix": "/usr"},
    "openmpi": {"version": "4.1.4", "source": "distro", "prefix": "/usr/lib/x86_64-linux-gnu/openmpi"},
    "nccl": {"version": "2.27.5", "source": "wheel", "package": "nvidia-nccl-cu12",
             "prefix": "/opt/venv/lib/python3.11/site-packages/nvidia/nccl"},
    "python": {"version": "3.11", "prefix": "/opt/venv"},
}  # fmt: skip
PLUGIN = {"version": "1.21.1", "source": "release", "prefix": "/opt/aws-ofi-nccl", "tested_nccl": "2.31.2"}
TESTS = {"version": "2.18.3", "source": "release", "prefix": "/opt/nccl-tests"}


def pins(flat: dict[str, dict[str, Any]]) -> dict[str, Pin]:
    base = {"version": None, "source": "test", "origin": "test"}
    return {name: Pin.model_validate(read_entry(name, {**base, **entry})) for name, entry in flat.items()}


# --------------------------------------------------------------------------------------------------------------
# plain data


def test_the_net_plugin_api_table_covers_every_series_the_plugin_supports() -> None:
    from imgbuild.blocks.nccl import net_plugin_api

    oldest = plugin_file().oldest_nccl.split(".")
    for minor in range(int(oldest[1]), 31):
        versions = net_plugin_api(f"2.{minor}.1")
        assert versions and list(versions) == sorted(versions, reverse=True), minor
    assert net_plugin_api("2.30.7") == (12, 11, 10, 9, 8, 7, 6)  # debian-cuda's (PyTorch 2.15's pin)
    assert net_plugin_api("2.29.7") == (11, 10, 9, 8, 7, 6)  # PyTorch 2.13's pin
    assert net_plugin_api("2.27.5") == (10, 9, 8, 7, 6)
    assert net_plugin_api("2.31.0") is None


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is not on this machine to compare with")
@pytest.mark.parametrize("lib", ["libc.so.6", "libz.so.1", "libstdc++.so.6"])
def test_the_elf_reader_lists_what_nm_lists(lib: str) -> None:
    path = next((p for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")
                 if (p := Path(d) / lib).exists()), None)  # fmt: skip
    if path is None:
        pytest.skip(f"no {lib} here")
    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    want = sorted({line.split()[-1].split("@")[0] for line in nm.splitlines() if line.strip()})
    assert elfsyms.dynamic_symbols(path.read_bytes()) == want
    with pytest.raises(ValueError, match="not an ELF file"):
        elfsyms.dynamic_symbols(b"#!/bin/sh\n")


@dataclass
class Out:
    rc: int
    stdout: str = ""
    stderr: str = ""


class _Host:
    """A GPU host as the check sees it: nvidia-smi lists GPUs, and all_reduce_perf prints a real NCCL log."""

    def __init__(self, log: str, gpus: int = 1, rc: int = 0) -> None:
        self.log, self.gpus, self.rc = log, gpus, rc
        self.commands: list[str] = []

    def run(self, command: str, *args: str) -> Out:
        self.commands.append(command)
        if "nvidia-smi -L" in command:
            return Out(0, "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\n" for i in range(self.gpus)))
        return Out(self.rc, self.log)


@pytest.mark.parametrize(
    ("log", "nccl", "plugin", "efa", "status", "why"),
    [
        # EFA used: the plugin loaded and NCCL used it
        ("slurm-pcluster_2x-g7e.8xlarge_nccl-2.29.2_ofi-1.18.0_efa.log", "2.29.2", "1.18.0", True, "pass", ""),
        # the plugin loaded, found no EFA device and NCCL fell back to sockets: a skip without EFA devices ...
        ("ec2-p4d.24xlarge_training_nccl-2.27.7_ofi-1.17.1_ofi-init-failed_socket-fallback.log", "2.27.7", "1.17.1",
         False, "skip", "no EFA device here: aws-ofi-nccl 1.17.1 loaded, but NCCL used Socket"),
        ("eks-pytorch-training_4x-g6e.8xlarge_nccl-2.27.3_ofi-1.16.2_no-eligible-providers_socket-fallback.log",
         "2.27.3", "1.16.2", False, "skip", "No eligible providers"),
        # ... and a failure where EFA devices are passed in
        ("ec2-p4d.24xlarge_training_nccl-2.27.7_ofi-1.17.1_ofi-init-failed_socket-fallback.log", "2.27.7", "1.17.1",
         True, "fail", "failed to initialize"),
        # sockets with no plugin line at all: NCCL never loaded the plugin, a failure even without EFA
        ("eks-mpijob_2x-g4dn_socket_efa-disabled_excerpt.log", None, "1.5.0", False, "fail",
         "NCCL did not load the plugin"),
        # another plugin than the image's
        ("slurm-pcluster_2x-g7e.8xlarge_nccl-2.29.2_ofi-1.18.0_efa.log", "2.29.2", "1.21.1", True, "fail",
         "not the image's 1.21.1"),
    ],
)  # fmt: skip
def test_the_plugin_loaded_check_reads_nccl_logs(
    log: str, nccl: str | None, plugin: str, efa: bool, status: str, why: str
) -> None:
    text = (UPSTREAM / "nccl-tests" / log).read_text(encoding="utf-8", errors="replace")
    components = _plugin_components(nccl, plugin)
    host = _Host(text, gpus=2)
    res = gpuchecks.aws_ofi_nccl_loaded(_plugin_context(host, components, efa))
    assert res.status == status, res.reason
    assert why in res.reason
    # the image's mpirun line, on every GPU, with NCCL_DEBUG=INFO, nccl-tests from the pin's prefix
    (run,) = [c for c in host.commands if "all_reduce_perf" in c]
    assert "mpirun --allow-run-as-root" in run and "-np 2" in run and "NCCL_DEBUG=INFO" in run
    assert "/opt/nccl-tests/all_reduce_perf -b 8" in run and "localhost slots=2" in run
    # a run that failed is a failure whatever the log says
    assert gpuchecks.aws_ofi_nccl_loaded(_plugin_context(_Host(text, rc=1), components, False)).status == "fail"


def _plugin_components(nccl: str | None, plugin: str) -> dict[str, Any]:
    return {**CPU, "nccl": {**CPU["nccl"], "version": nccl}, "aws_ofi_nccl": {**PLUGIN, "version": plugin},
            "nccl_tests": TESTS}  # fmt: skip


def _plugin_context(host: _Host, components: dict[str, Any], efa: bool) -> checks.CheckContext:
    """The check's context in a container of the cpu image on a GPU host, with an EFA device passed in or not."""
    return checks.CheckContext(host=host, scope="container", components=pins(components), gpu=True,
                               manifest=manifest_of("cpu").as_data(),
                               efa_devices=("/dev/infiniband/uverbs0",) if efa else ())  # fmt: skip


def test_the_plugin_loaded_check_on_one_efa_node() -> None:
    """verify in the image on one host with an EFA device (the run's ranks all on that node): NCCL loaded the plugin
    and selected EFA, which the check judges although a report on one node leaves the network unjudged; the same
    host where NCCL loaded the plugin but chose sockets (NCCL_NET=Socket) fails, and without EFA it is a skip."""
    text = one_host_log(EFA_TWO_NODE_LOG, "gpu-st-ml-1")
    components = _plugin_components("2.29.2", "1.18.0")
    res = gpuchecks.aws_ofi_nccl_loaded(_plugin_context(_Host(text), components, True))
    assert res.status == "pass", res.reason
    assert res.reason == "NCCL used Libfabric with provider efa"
    # as with NCCL_NET=Socket: NCCL's own lines name Socket where they named Libfabric, the plugin's lines stay
    sockets = "".join(
        line if "NET/OFI" in line else line.replace("Libfabric", "Socket") for line in text.splitlines(keepends=True)
    )
    res = gpuchecks.aws_ofi_nccl_loaded(_plugin_context(_Host(sockets), components, True))
    assert res.status == "fail" and "aws-ofi-nccl 1.18.0 loaded, yet NCCL used Socket" in res.reason, res.reason
    res = gpuchecks.aws_ofi_nccl_loaded(_plugin_context(_Host(sockets), components, False))
    assert res.status == "skip" and res.reason.startswith("no EFA device here: aws-ofi-nccl 1.18.0 loaded"), res.reason


def test_the_gpu_check_skips_without_a_gpu_with_the_reason() -> None:
    ctx = checks.CheckContext(host=_Host(""), scope="container",
                              components=pins({**CPU, "aws_ofi_nccl": PLUGIN, "nccl_tests": TESTS}),
                              gpu_reason="no GPU on this host")  # fmt: skip
    res = gpuchecks.aws_ofi_nccl_loaded(ctx)
    assert (res.status, res.reason) == ("skip", "no GPU on this host")


# --------------------------------------------------------------------------------------------------------------
# in containers of the cpu image


def _gcc(out: Path, name: str, source: str, *args: str) -> Path:
    path = out / name
    src = out / f"{name}.c"
    src.write_text(source)
    subprocess.run(["gcc", "-O0", "-o", str(path), str(src), *args], check=True, capture_output=True)
    return path


def _stub(out: Path, soname: str, symbol: str) -> Path:
    """An empty library with `soname` and one function: what the stand-ins link against (the image has the real one)."""
    folder = out / soname.split(".")[0]
    folder.mkdir(exist_ok=True)
    _gcc(folder, soname, f"int {symbol}(void) {{ return 0; }}\n", "-shared", "-fPIC", f"-Wl,-soname,{soname}")
    (folder / f"{soname.split('.so')[0]}.so").symlink_to(soname)
    return folder


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The plugin and nccl-tests' binaries as small ELF files linked like the real ones (compiled here)."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is not on this machine (scripts/setup.sh installs it): the stand-ins are compiled with it")
    out = tmp_path_factory.mktemp("elf")
    fabric, nccl, mpi = _stub(out, "libfabric.so.1", "fi_getinfo"), _stub(out, "libnccl.so.2", "ncclGetVersion"), \
        _stub(out, "libmpi.so.40", "MPI_Init")  # fmt: skip
    plugin_src = "".join(f"int ncclNetPlugin_v{v} = {v};\n" for v in (8, 9, 10, 11, 12)) + (
        "extern int fi_getinfo(void);\nint use_fabric(void) { return fi_getinfo(); }\n"
    )
    shared = ["-shared", "-fPIC", "-Wl,--no-as-needed"]
    main = "extern int ncclGetVersion(void);\nint main(void) { return ncclGetVersion(); }\n"
    mpi_main = (
        "extern int ncclGetVersion(void);\nextern int MPI_Init(void);\n"
        "int main(void) { return ncclGetVersion() + MPI_Init(); }\n"
    )
    return {
        "plugin": _gcc(out, "plugin.so", plugin_src, *shared, f"-L{fabric}", "-lfabric"),
        "newer-plugin": _gcc(out, "newer.so", "int ncclNetPlugin_v11 = 11;\nint ncclNetPlugin_v12 = 12;\n", *shared),
        "perf": _gcc(out, "perf", mpi_main, "-Wl,--no-as-needed", f"-L{nccl}", "-lnccl", f"-L{mpi}", "-lmpi"),
        "perf-no-mpi": _gcc(out, "perf-no-mpi", main, "-Wl,--no-as-needed", f"-L{nccl}", "-lnccl"),
        "perf-rpath": _gcc(out, "perf-rpath", mpi_main, "-Wl,--no-as-needed", f"-L{nccl}", "-lnccl", f"-L{mpi}",
                           "-lmpi", "-Wl,--disable-new-dtags,-rpath,/opt/other-nccl"),
    }  # fmt: skip


@pytest.fixture
def container(cpu_image: Any, docker_client: Any) -> Iterator[Any]:
    c = docker_client.containers.run(cpu_image.refs[0], entrypoint=["sleep", "infinity"], detach=True,
                                      labels={"io.imgbuild.test": "verify-gpu-stack"})  # fmt: skip
    try:
        yield c
    finally:
        c.remove(force=True)


def _put(container: Any, files: dict[str, Path]) -> None:
    """Copy files into the container (path in it -> file here), executable."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dest, src in files.items():
            info = tar.gettarinfo(str(src), arcname=dest.lstrip("/"))
            info.mode = 0o755
            with src.open("rb") as f:
                tar.addfile(info, f)
    assert container.put_archive("/", buf.getvalue())


def _sh(container: Any, script: str) -> None:
    rc, out = container.exec_run(["sh", "-c", script])
    assert rc == 0, out


def _ctx(container: Any, extra: dict[str, dict[str, Any]]) -> checks.CheckContext:
    import testinfra

    return checks.CheckContext(host=testinfra.get_host(f"docker://{container.id}"), scope="container",
                               components=pins({**CPU, **extra}), python="/opt/venv/bin/python3")  # fmt: skip


@pytest.mark.docker
def test_plugin_checks_pass_on_a_plugin_nccl_loads_and_fail_on_broken_ones(
    container: Any, stand_ins: dict[str, Path]
) -> None:
    lib = "/opt/aws-ofi-nccl/lib/libnccl-net-ofi.so"
    _put(container, {lib: stand_ins["plugin"]})
    _sh(container, "ln -s libnccl-net-ofi.so /opt/aws-ofi-nccl/lib/libnccl-net.so")
    ctx = _ctx(container, {"aws_ofi_nccl": PLUGIN})
    res = aws_ofi_nccl.aws_ofi_nccl_plugin(ctx)
    assert res.status == "pass" and res.details["libraries"] == [
        "/opt/aws-ofi-nccl/lib/libnccl-net-ofi.so", "/opt/aws-ofi-nccl/lib/libnccl-net.so"]  # fmt: skip
    api = aws_ofi_nccl.aws_ofi_nccl_api(ctx)
    # NCCL 2.27.5 (the wheel in the image) looks for v10 first: the plugin exports v8 to v12
    assert api.status == "pass", api.reason
    assert f"{lib}: ncclNetPlugin_v10 (exports v8, v9, v10, v11, v12)" in api.found
    # a plugin newer than NCCL's API: NCCL 2.27 looks for v6 to v10, this one exports v11 and v12 only
    _put(container, {lib: stand_ins["newer-plugin"]})
    api = aws_ofi_nccl.aws_ofi_nccl_api(_ctx(container, {"aws_ofi_nccl": PLUGIN}))
    assert api.status == "fail" and f"{lib} exports v11, v12" in api.reason
    assert "NCCL 2.27.5 looks for v6, v7, v8, v9, v10" in api.reason
    # a library that is no plugin at all (the image's libfabric under the plugin's name)
    _sh(container, f"cp /usr/lib/x86_64-linux-gnu/libfabric.so.1 {lib}")
    api = aws_ofi_nccl.aws_ofi_nccl_api(_ctx(container, {"aws_ofi_nccl": PLUGIN}))
    assert api.status == "fail" and f"{lib} exports none" in api.reason
    # the plugin again, its libfabric gone: ldd says so, for both names
    _put(container, {lib: stand_ins["plugin"]})
    _sh(container, "rm -f /usr/lib/x86_64-linux-gnu/libfabric.so.1*")
    res = aws_ofi_nccl.aws_ofi_nccl_plugin(_ctx(container, {"aws_ofi_nccl": PLUGIN}))
    assert res.status == "fail" and f"{lib}: libfabric.so.1 not found" in res.reason
    assert "/opt/aws-ofi-nccl/lib/libnccl-net.so: libfabric.so.1 not found" in res.reason
    # and no plugin at all
    _sh(container, "rm -rf /opt/aws-ofi-nccl")
    ctx = _ctx(container, {"aws_ofi_nccl": PLUGIN})
    assert aws_ofi_nccl.aws_ofi_nccl_plugin(ctx).status == "fail"
    assert "no libnccl-net*.so under /opt/aws-ofi-nccl" in aws_ofi_nccl.aws_ofi_nccl_api(ctx).reason


@pytest.mark.docker
def test_libfabric_must_have_efa_wherever_the_plugin_is(container: Any) -> None:
    # Debian 12's libfabric 1.17 has no efa provider: fine for the cpu image, not under the NCCL plugin
    alone = libfabric.libfabric_providers(_ctx(container, {}))
    assert alone.status == "pass" and alone.expected == "tcp"
    res = libfabric.libfabric_providers(_ctx(container, {"aws_ofi_nccl": PLUGIN}))
    assert (res.status, res.expected, res.reason) == ("fail", "tcp,efa", "provider(s) missing: efa")


@pytest.mark.docker
def test_nccl_tests_link_the_images_one_nccl_and_its_mpi(container: Any, stand_ins: dict[str, Path]) -> None:
    perf = {f"/opt/nccl-tests/{b}": stand_ins["perf"] for b in nccl_tests.NCCL_TESTS_BINARIES}
    _put(container, perf)
    extra = {"aws_ofi_nccl": PLUGIN, "nccl_tests": TESTS}
    res = nccl_tests.nccl_tests_links(_ctx(container, extra))
    assert res.status == "pass", res.reason
    assert res.found == (
        "4 binaries: /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2, "
        "/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4"
    )
    # a second NCCL ahead of the image's on one binary's RPATH
    _put(container, {"/opt/nccl-tests/broadcast_perf": stand_ins["perf-rpath"]})
    _sh(container, "mkdir -p /opt/other-nccl && cp /opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2 "
                   "/opt/other-nccl/")  # fmt: skip
    res = nccl_tests.nccl_tests_links(_ctx(container, extra))
    assert res.status == "fail"
    assert res.reason == (
        "broadcast_perf links /opt/other-nccl/libnccl.so.2, not the NCCL in "
        "/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib"
    )
    # built without MPI=1; then the image's libmpi gone
    _put(container, {"/opt/nccl-tests/broadcast_perf": stand_ins["perf-no-mpi"]})
    res = nccl_tests.nccl_tests_links(_ctx(container, extra))
    assert res.reason == "broadcast_perf does not link libmpi (built without MPI=1)"
    _sh(container, "rm -f /usr/lib/x86_64-linux-gnu/libmpi.so.40*")
    res = nccl_tests.nccl_tests_links(_ctx(container, extra))
    assert res.status == "fail" and "all_reduce_perf: libmpi.so.40 not found" in res.reason
