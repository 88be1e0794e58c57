"""The shipped `debian-cuda` recipe for real: the GPU stack's compile steps run here. Built once with
`--files tests/data/upstream/sources` (the three source archives: aws-ofi-nccl from GitHub's archive of its tag, with
autogen.sh; nccl-tests with MPI=1; GDRCopy's library), CUDA 13's toolkit from the cuda-toolkit wheels in the builder,
mpi4py compiled from its sdist against Debian's Open MPI 5 (the docker lane's one compile of a pip mpi4py). Then
`imgbuild verify` in one container and across 2, through the CLI.

With no GPU here, the GPU checks skip with their reason; everything that needs no GPU must pass: the plugin's
libraries resolve and it exports a net-plugin API the image's NCCL loads, nccl-tests link the image's one NCCL and its
MPI, libfabric has the efa provider, mpirun + mpi4py and DDP across 2 nodes.

Marked docker and slow; in CI (CI=true) a missing engine fails these tests instead of skipping them.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import REPO
from imgbuild.cli import app
from imgbuild.pin import lock

pytestmark = pytest.mark.docker

FILES = REPO / "tests" / "data" / "upstream" / "sources"
# What must pass without a GPU: the compiled parts, the fabric, the one NCCL, PyTorch.
STACK_CHECKS = (
    "aws-ofi-nccl-plugin",
    "aws-ofi-nccl-api",
    "nccl-tests-binaries",
    "nccl-tests-links",
    "libfabric-version",
    "libfabric-providers",
    "openmpi-version",
    "mpi4py-version",
    "gdrcopy-library",
    "one-nccl",
    "nccl-runtime-version",
    "pytorch-version",
    "torch-nccl-version",
    "torch-loaded-nccl",
    "sshd-listening",
)
GPU_CHECKS = ("aws-ofi-nccl-loaded", "gpu-torch-cuda", "gpu-nccl-allreduce")


@pytest.fixture(scope="session")
def debian_cuda_image(docker_client: Any) -> Any:
    """`imgbuild build debian-cuda --files tests/data/upstream/sources`, the way CI and users without GitHub build it
    (the engine's cache makes a rebuild seconds)."""
    from imgbuild import build

    return build.build(*lock.for_ref("debian-cuda"), ca_bundle=build.ca_bundle_from(None), files=FILES)


def verify_json(args: list[str], tmp_path: Path) -> tuple[int, str, dict[str, Any]]:
    out = tmp_path / f"verify-{uuid.uuid4().hex[:6]}.json"
    res = CliRunner().invoke(app, ["verify", *args, "--json", str(out)])
    return res.exit_code, res.output, json.loads(out.read_text()) if out.exists() else {}


def by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in data["results"]}


def test_verify_passes_the_gpu_stack_checks_and_skips_the_gpu_ones(debian_cuda_image: Any, tmp_path: Path) -> None:
    code, output, data = verify_json(["debian-cuda"], tmp_path)
    assert code == 0, output
    results = by_name(data)
    assert {n: results.get(n, {}).get("status") for n in STACK_CHECKS} == dict.fromkeys(STACK_CHECKS, "pass"), output
    # no GPU here: skipped, with the reason, never passed
    for name in GPU_CHECKS:
        assert results[name]["status"] == "skip" and results[name]["reason"], results[name]
    # mpi4py from pip (`mpi4py: {source: pip}`: its sdist by hash, compiled against the image's Open MPI) is the
    # lock's version (the one compile of a pip mpi4py the docker lane runs; its lock is test_wheels' network test)
    _, resolved = lock.for_ref("debian-cuda")
    assert results["mpi4py-version"]["found"] == resolved.pins["mpi4py"].version == "4.1.2", results["mpi4py-version"]
    # `fi_info -l` lists Debian's efa provider (no device needed to list it)
    assert "efa" in results["libfabric-providers"]["details"]["listed"]
    assert data["image"] == str(debian_cuda_image.refs[0])


def test_verify_two_nodes_runs_mpi4py_and_ddp_under_the_image_mpirun(debian_cuda_image: Any, tmp_path: Path) -> None:
    code, output, data = verify_json(["debian-cuda", "--nodes", "2"], tmp_path)
    assert code == 0, output
    results = by_name(data)
    for name in ("multinode: mpi4py gather", "multinode: ddp (mpirun)", "multinode: ddp (torchrun)"):
        assert results[name]["status"] == "pass", (name, output)
    assert "Open MPI v5.0.7" in json.dumps(results["multinode: mpi4py gather"]["details"])


def test_the_image_has_no_toolkit_and_no_rocm(debian_cuda_image: Any, docker_client: Any) -> None:
    """The toolkit stays in the builder; ROCm's HIP and HSA runtimes (libucx0's dependencies) are empty stand-ins, and
    Open MPI's libucp resolves without them; the plugin and nccl-tests find libcudart and libnccl in PyTorch's
    wheels."""
    script = (
        "set -e; test ! -e /usr/local/cuda; ! command -v nvcc; "
        "dpkg-query -W -f '${Package} ${Version}\\n' libamdhip64-5 libhsa-runtime64-1; "
        "! dpkg-query -W libamd-comgr2 libllvm17t64 2>/dev/null; "
        "ldd /usr/lib/*-linux-gnu/libucp.so.0; "
        "ldd /opt/aws-ofi-nccl/lib/libnccl-net-ofi.so | grep -E 'libfabric|libhwloc'; "
        "ldd /opt/nccl-tests/all_reduce_perf | grep -E 'libnccl|libcudart|libmpi'"
    )
    out = docker_client.containers.run(
        str(debian_cuda_image.refs[0]), ["bash", "-c", script], entrypoint=[], remove=True
    ).decode()
    assert "libamdhip64-5 99:0+imgbuild.stub" in out and "libhsa-runtime64-1 99:0+imgbuild.stub" in out, out
    assert "not found" not in out, out
    assert "/opt/venv/lib/python3.13/site-packages/nvidia/nccl/lib/libnccl.so.2" in out, out
    assert "/opt/venv/lib/python3.13/site-packages/nvidia/cu13/lib/libcudart.so.13" in out, out
