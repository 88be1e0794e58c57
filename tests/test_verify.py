"""`imgbuild verify`: the checks on plain data (a fake host), then the cpu image and images broken on purpose.

The docker tests use the real cpu image (the `cpu_image` fixture) and small images derived from it, each broken
in one way (mpirun gone, sshd on another port, another libnccl, a baked private key): verify must name the check
that catches it, exit with VerifyError's code, and leave no container behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from imgbuild import checks, verify
from imgbuild.blocks import Pin, aws_ofi_nccl, nccl, pytorch, runtime_order, sshd
from imgbuild.checks import registry as check_registry
from imgbuild.checks.results import CheckResult, Status
from imgbuild.cli import verify as cli_verify
from imgbuild.core.errors import Interrupted, VerifyError
from imgbuild.image import identity
from imgbuild.image.manifest import MANIFEST_PATH, Manifest, read_entry
from imgbuild.verify import command as verify_command
from imgbuild.verify import gpuchecks
from trees import write_tree

runner = CliRunner()


def cli_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """test app"""

    cli_verify.register(app)
    return app


# --------------------------------------------------------------------------------------------------------------
# A fake host: canned answers by command substring


@dataclass
class Out:
    rc: int
    stdout: str = ""
    stderr: str = ""


class FakeHost:
    def __init__(self, answers: dict[str, Out]) -> None:
        self.answers = answers
        self.commands: list[str] = []

    def run(self, command: str, *args: str) -> Out:
        self.commands.append(command)
        for key, out in self.answers.items():
            if key in command:
                return out
        return Out(127, "", f"unexpected command: {command[:80]}")


CPU_COMPONENTS: dict[str, dict[str, Any]] = {
    "openmpi": {"version": "4.1.4", "source": "distro"},
    "sshd": {"ports": [3022], "permit_root_login": "prohibit-password", "version": None},
    "nccl": {"version": "2.21.5", "source": "wheel", "package": "nvidia-nccl-cu12"},
    "python": {"version": "3.11", "prefix": "/opt/venv"},
}


def pins(flat: dict[str, dict[str, Any]]) -> dict[str, Pin]:
    """Manifest-style flat entries -> typed pins, through each block's details model (as verify reads them)."""
    base = {"version": None, "source": "test", "origin": "test"}
    return {name: Pin.model_validate(read_entry(name, {**base, **entry})) for name, entry in flat.items()}


def ctx_for(answers: dict[str, Out], **kw: Any) -> checks.CheckContext:
    return checks.CheckContext(host=FakeHost(answers), scope="container", components=pins(CPU_COMPONENTS), **kw)


# --------------------------------------------------------------------------------------------------------------
# plain data


def test_registry_runs_only_the_checks_of_components_in_the_manifest() -> None:
    names = [c.name for c in checks.selected(["openmpi", "sshd"], "container", runtime_order())]
    assert "openmpi-version" in names and "sshd-config" in names and "sshd-listening" in names
    assert "manifest" in names and "no-keys-in-image" in names and "gpu-nvidia-smi" in names
    assert not {"nccl-runtime-version", "aws-ofi-nccl-plugin", "sagemaker-contract"} & set(names)
    # libfabric's checks come with either component, once
    assert [c.name for c in checks.selected(["efa", "libfabric"], "container", runtime_order())].count(
        "libfabric-version"
    ) == 1
    # --host: no image-only checks
    host_names = [c.name for c in checks.selected(["openmpi", "sshd", "nccl"], "host", runtime_order())]
    assert "nccl-runtime-version" in host_names and "openmpi-version" in host_names
    assert not {"sshd-config", "env", "no-keys-in-image", "ca-bundle-absent"} & set(host_names)
    assert all(c.doc for items in checks.REGISTRY.values() for c in items)


def test_nccl_version_codes() -> None:
    assert nccl.nccl_code("2.21.5") == 22105
    assert nccl.nccl_code("2.8.4") == 2804
    assert nccl.code_to_version(22105) == "2.21.5"
    assert nccl.code_to_version(2804) == "2.8.4"


def test_compare_matches_pins_and_records_unpinned() -> None:
    assert checks.compare("3.11", "3.11.2", "Python").status == "pass"
    assert checks.compare("2.7.0amzn2.0", "2.7.0amzn2.0", "libfabric").status == "pass"
    assert checks.compare("1.17.0", "1.17.01", "libfabric").status == "fail"
    assert checks.compare("4.1.4", "4.1.5", "Open MPI").status == "fail"
    unpinned = checks.compare(None, "4.1.5", "Open MPI")
    assert (unpinned.status, unpinned.found) == ("pass", "4.1.5")
    assert checks.compare("4.1.4", None, "Open MPI").status == "fail"


def test_listening_ports_from_proc_net_tcp() -> None:
    text = (
        "  sl  local_address rem_address   st\n"
        "   0: 00000000:0BCE 00000000:0000 0A 00000000:00000000\n"  # 3022 LISTEN
        "   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000\n"  # 8080 ESTABLISHED
        "   0: 00000000000000000000000000000000:0BCE 00000000000000000000000000000000:0000 0A\n"
    )
    assert sshd.listening_ports(text) == {3022}


SSHD_T = "port 3022\npasswordauthentication no\npermitrootlogin without-password\npermitemptypasswords no\n"


def test_sshd_config_passes_and_catches_ports_and_passwords() -> None:
    ok = sshd.sshd_config(ctx_for({"sshd -T": Out(0, SSHD_T)}))
    assert ok.status == "pass", ok
    bad = SSHD_T.replace("port 3022", "port 4022").replace("passwordauthentication no", "passwordauthentication yes")
    res = sshd.sshd_config(ctx_for({"sshd -T": Out(0, bad)}))
    assert res.status == "fail"
    assert "ports [4022], the manifest says [3022]" in res.reason and "passwordauthentication yes" in res.reason


def test_nccl_runtime_check_reads_the_probe() -> None:
    probe = {"lib": "/opt/venv/x/libnccl.so.2", "candidates": ["/opt/venv/x/libnccl.so.2"], "code": 22005, "rc": 0,
             "header": {"path": "/opt/venv/include/nccl.h", "MAJOR": "2", "MINOR": "20", "PATCH": "5"}}  # fmt: skip
    host = FakeHost({"/opt/venv/bin/python": Out(0, json.dumps(probe) + "\n")})
    ctx = checks.CheckContext(
        host=host, scope="container", components=pins(CPU_COMPONENTS), python="/opt/venv/bin/python"
    )
    runtime = nccl.nccl_runtime_version(ctx)
    assert (runtime.status, runtime.expected, runtime.found) == ("fail", "22105 (2.21.5)", "22005 (2.20.5)")
    header = nccl.nccl_header_version(ctx)
    assert (header.status, header.found) == ("fail", "2.20.5")
    assert sum("ncclGetVersion" in c for c in host.commands) == 1  # probed once


class LocalHost:
    """Runs commands on this machine with extra environment (what testinfra's local:// does, plus env)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}

    def run(self, command: str, *args: str) -> Out:
        p = subprocess.run(command, shell=True, capture_output=True, text=True, env=self.env)
        return Out(p.returncode, p.stdout, p.stderr)


def test_nccl_probe_finds_the_wheel_next_to_torch_on_a_host(tmp_path: Path) -> None:
    # A DLAMI-like host: torch and nvidia-nccl-cu12 in the current Python's site-packages, nothing in /opt/nccl.
    site = tmp_path / "site-packages"
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "include").mkdir()
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"not an ELF file")
    (site / "nvidia" / "nccl" / "include" / "nccl.h").write_text(
        "#define NCCL_MAJOR 2\n#define NCCL_MINOR 21\n#define NCCL_PATCH 5\n"
    )
    ctx = checks.CheckContext(host=LocalHost({"PYTHONPATH": str(site)}), scope="host",
                              components=pins(CPU_COMPONENTS), python=sys.executable)  # fmt: skip
    header = nccl.nccl_header_version(ctx)
    assert (header.status, header.found) == ("pass", "2.21.5"), header
    runtime = nccl.nccl_runtime_version(ctx)
    assert runtime.status == "fail" and str(site / "nvidia/nccl/lib/libnccl.so.2") in runtime.reason


def test_gpu_checks_skip_without_a_gpu_and_run_with_one() -> None:
    components = {**CPU_COMPONENTS, "pytorch": {"version": "2.9.1"}}
    none = checks.CheckContext(
        host=FakeHost({}), scope="container", components=pins(components), gpu_reason="no GPU here"
    )
    for fn in (checks.gpu_nvidia_smi, pytorch.gpu_torch_cuda, pytorch.gpu_nccl_allreduce):
        res = fn(none)
        assert (res.status, res.reason) == ("skip", "no GPU here")
    answers = {
        "nvidia-smi -L": Out(
            0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
        ),
        "is_available": Out(0, "[true, 2]\n"),
        "init_process_group": Out(0, '{"value": 2.0, "nccl": [2, 27, 5]}\n'),
    }
    gpu = checks.CheckContext(host=FakeHost(answers), scope="container", components=pins(components), gpu=True)
    smi = checks.gpu_nvidia_smi(gpu)
    assert smi.status == "pass" and smi.found.startswith("2 GPU(s): GPU 0: NVIDIA H100")
    assert pytorch.gpu_torch_cuda(gpu).found == "2 device(s)"
    assert pytorch.gpu_nccl_allreduce(gpu).status == "pass"
    hung = checks.CheckContext(host=FakeHost({"init_process_group": Out(124, "", "")}), scope="container",
                               components=pins(components), gpu=True)  # fmt: skip
    assert pytorch.gpu_nccl_allreduce(hung).status == "fail"
    lean = checks.CheckContext(host=FakeHost(answers), scope="container", components=pins(CPU_COMPONENTS), gpu=True)
    for fn in (pytorch.gpu_torch_cuda, pytorch.gpu_nccl_allreduce):
        assert (fn(lean).status, fn(lean).reason) == ("skip", "PyTorch is not in the image")
    # the platform's checks run last, in this order, on every image (the torch ones are the pytorch block's)
    platform = [c.name for c in checks.selected([], "container", runtime_order()) if c.components == ("platform",)]
    assert platform == ["gpu-nvidia-smi", "gpu-torch-cuda", "gpu-nccl-allreduce", "gpu-driver", "imex-channel"]


def test_plugin_with_an_unresolved_library_fails() -> None:
    components = {
        **CPU_COMPONENTS,
        "aws_ofi_nccl": {"version": "1.16.3", "prefix": "/opt/amazon/ofi-nccl", "tested_nccl": "2.27.7"},
    }
    lib = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so"
    ldd_bad = "\tlibfabric.so.1 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n"
    bad = checks.CheckContext(host=FakeHost({"libnccl-net*": Out(0, lib + "\n"), "ldd": Out(0, ldd_bad)}),
                              scope="container", components=pins(components))  # fmt: skip
    res = aws_ofi_nccl.aws_ofi_nccl_plugin(bad)
    assert res.status == "fail" and "libfabric.so.1 not found" in res.reason and "sockets" in res.reason
    none = checks.CheckContext(
        host=FakeHost({"libnccl-net*": Out(0, "")}), scope="container", components=pins(components)
    )
    assert aws_ofi_nccl.aws_ofi_nccl_plugin(none).status == "fail"
    ldd_ok = "\tlibfabric.so.1 => /opt/amazon/efa/lib/libfabric.so.1 (0x1)\n"
    ok = checks.CheckContext(host=FakeHost({"libnccl-net*": Out(0, lib + "\n"), "ldd": Out(0, ldd_ok)}),
                             scope="container", components=pins(components))  # fmt: skip
    assert aws_ofi_nccl.aws_ofi_nccl_plugin(ok).status == "pass"


def test_host_mode_runs_only_host_checks_against_the_lock() -> None:
    report = verify.verify("cpu", host="local")
    names = {r.name for r in report.results}
    assert report.where == "local://" and report.image and report.image.startswith("imgbuild/cpu:lock-")
    assert {"openmpi-version", "nccl-runtime-version", "nccl-header-version", "libfabric-version"} <= names
    assert not {"sshd-config", "sshd-listening", "no-keys-in-image", "sagemaker-contract", "env"} & names
    assert {"checks_s", "total_s"} <= set(report.timings)


def test_a_crashing_check_is_a_failure_not_a_crash() -> None:
    def boom(ctx: checks.CheckContext) -> CheckResult:
        raise RuntimeError("oops")

    item = checks.Check("boom", ("image",), checks.BOTH, boom, "boom")
    [res] = checks.run_checks(ctx_for({}), [item])
    assert (res.name, res.status, res.component) == ("boom", "fail", "image")
    assert "RuntimeError: oops" in res.reason


def test_manifest_diffs_name_each_difference() -> None:
    want = {"recipe": "cpu", "lock_digest": "a" * 64, "components": {"nccl": {"version": "2.21.5"}}, "env": {}}
    found = {"recipe": "cpu", "lock_digest": "b" * 64, "components": {"nccl": {"version": "2.20.5"}, "x": {}},
             "env": {}}  # fmt: skip
    diffs = checks.manifest_diffs(want, found)
    assert any(d.startswith("lock_digest:") for d in diffs)
    assert "nccl: lock 2.21.5, image 2.20.5" in diffs and "x: in the image, not in the lock" in diffs
    assert checks.manifest_diffs(want, want) == []


def cpu_resolved() -> Any:
    from imgbuild import recipe
    from imgbuild.pin import lock

    return lock.resolved_for(recipe.load("cpu"))


def manifest_with(**over: Any) -> Manifest:
    """The cpu image's manifest with some sections replaced."""
    resolved = cpu_resolved()
    return Manifest.model_validate({**verify.expected_manifest(resolved, identity.of(resolved)).as_data(), **over})


def test_the_lock_gives_the_manifest_render_writes() -> None:
    from imgbuild.image import render

    resolved = cpu_resolved()
    written = next(f.content for f in render.plan(resolved).files if f.path == "imgbuild/manifest.json")
    assert verify.expected_manifest(resolved, identity.of(resolved)).to_json().encode() == written


def test_run_options_follow_the_runtime_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    efa = ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1", "/dev/infiniband/uverbs10", "/dev/infiniband/uverbs2"]
    monkeypatch.setattr(verify_command, "host_efa_devices", lambda: sorted(efa, key=lambda d: int(d.rsplit("s", 1)[1])))
    manifest = manifest_with(platform={"accelerator": "nvidia", "gpu_arch": "sm_80"},
                             runtime={"efa_devices": True, "gpus": "all", "ipc": "host", "env": {"A": "1"},
                                      "runtime": "habana", "memlock_unlimited": True})  # fmt: skip
    opts = verify.run_options(manifest, ["/dev/fuse", "/dev/infiniband/uverbs1"], runtimes=["runc", "nvidia"],
                              has_gpu=True)  # fmt: skip
    order = (
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs1",
        "/dev/infiniband/uverbs2",
        "/dev/infiniband/uverbs10",
    )
    assert opts.spec.devices_inside == ("/dev/fuse", "/dev/infiniband/uverbs1", *order[:1], *order[2:])
    assert opts.efa_devices == ("/dev/infiniband/uverbs1", *order[:1], *order[2:])
    kwargs = opts.spec.docker_py()
    assert opts.gpu and "device_requests" in kwargs and kwargs["ipc_mode"] == "host" and "shm_size" not in kwargs
    assert kwargs["devices"][:2] == ["/dev/fuse:/dev/fuse:rwm", "/dev/infiniband/uverbs1:/dev/infiniband/uverbs1:rwm"]
    assert "runtime" not in kwargs and "network_mode" not in kwargs and any("habana" in n for n in opts.notes)
    # the CLI's `imgbuild run` gets the same profile from the same function, devices in the same order
    from imgbuild.engine import runprofile

    cli = runprofile.run_spec(
        manifest.runtime, verify_command.host_efa_devices(), ["/dev/fuse", "/dev/infiniband/uverbs1"]
    )
    assert cli.devices == opts.spec.devices
    assert cli.docker_args()[cli.docker_args().index("--gpus") :][:2] == ["--gpus", "all"]
    # A GPU host without NVIDIA's toolkit: Docker would refuse --gpus (the rule `imgbuild run` uses)
    monkeypatch.setattr(runprofile, "nvidia_hook_present", lambda: False)
    no_toolkit = verify.run_options(manifest, [], runtimes=["runc"], has_gpu=True)
    assert "device_requests" not in no_toolkit.spec.docker_py()
    assert any("toolkit is not set up" in n and "started without --gpus all" in n for n in no_toolkit.notes)
    cpu = verify.run_options(manifest_with(), [], [], has_gpu=True)
    assert not cpu.gpu and cpu.gpu_reason == "the recipe is not for NVIDIA GPUs" and not cpu.spec.devices
    assert cpu.spec.docker_py()["shm_size"] == "1g"


def test_a_broken_manifest_is_a_clear_error() -> None:
    good = manifest_with().to_json()
    assert Manifest.parse(good, "img:1") == manifest_with()
    with pytest.raises(VerifyError, match=f"img:1: {MANIFEST_PATH} is not JSON"):
        Manifest.parse("{", "img:1")
    with pytest.raises(VerifyError, match="has schema 2; this imgbuild reads schema 1"):
        Manifest.parse(good.replace('"schema": 1', '"schema": 2'), "img:1")
    bad = json.loads(good)
    bad["components"]["sshd"]["ports"] = ["x"]
    del bad["mpirun"]
    with pytest.raises(VerifyError) as err:
        Manifest.parse(json.dumps(bad), "img:1")
    assert "components.sshd.ports.0" in err.value.message and "mpirun: Field required" in err.value.message


def test_the_manifest_tells_what_verify_needs() -> None:
    m = manifest_with()
    assert (m.python, m.ssh_ports, m.slots) == ("/opt/venv/bin/python", (3022,), 1)
    assert {"FI_PROVIDER", "OMPI_MCA_btl_vader_single_copy_mechanism", "PATH"} <= set(m.rank_env)
    assert len(m.rank_env) == len(set(m.rank_env)) and set(m.env) <= set(m.rank_env)
    assert m.component_dicts()["nccl"] == {"version": "2.27.5", "source": "wheel", "origin": "recipe",
                                           "package": "nvidia-nccl-cu12",
                                           "prefix": "/opt/venv/lib/python3.11/site-packages/nvidia/nccl"}  # fmt: skip
    assert m.details("sshd").permit_root_login == "prohibit-password"


def test_host_spec() -> None:
    assert verify.host_spec("local") == "local://"
    assert verify.host_spec("ssh://ubuntu@10.0.0.5") == "ssh://ubuntu@10.0.0.5"
    with pytest.raises(VerifyError):
        verify.host_spec("10.0.0.5")


def test_target_for_an_image_takes_the_lock_its_label_names() -> None:
    t = verify.target_for_image("my/img:1", {"io.imgbuild.recipe": "cpu"})
    assert t.resolved is not None and t.expected_manifest is not None
    assert t.expected_manifest.components["nccl"].version == "2.27.5"
    other = verify.target_for_image("my/img:1", {"io.imgbuild.recipe": "mine"})
    assert other.resolved is None and "not a shipped recipe" in other.note
    assert "no io.imgbuild.recipe label" in verify.target_for_image("x:1", {}).note


def canned_report(status: Status) -> verify.VerifyReport:
    results = [
        CheckResult("openmpi-version", "pass", "4.1.4", "4.1.4", component="openmpi", duration_s=0.1),
        CheckResult("sshd-config", status, "ports 3022", "ports 4022", "ports differ", component="sshd"),
        CheckResult("gpu-nvidia-smi", "skip", reason="no GPU", component="platform"),
    ]
    return verify.VerifyReport("cpu", "imgbuild/cpu:lock-x", "cpu", "container", "", results,
                               {"container_start_s": 0.5, "checks_s": 1.0, "total_s": 1.6})  # fmt: skip


@pytest.mark.parametrize("status", ["pass", "fail"])
def test_cli_writes_junit_and_json_and_exits_on_failures(
    status: Status, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_verify(what: verify.Target | str, **kw: Any) -> verify.VerifyReport:
        seen.update(kw, what=what)
        return canned_report(status)

    monkeypatch.setattr(verify_command, "verify", fake_verify)
    junit, js = tmp_path / "r.xml", tmp_path / "r.json"
    args = ["verify", "cpu", "--device", "/dev/fuse", "--expect-efa", "--junit", str(junit), "--json", str(js)]
    result = runner.invoke(cli_app(), args)
    target = seen.pop("what")  # the recipe, read once by the command with its lock, handed down as its target
    assert isinstance(target, verify.Target) and (target.ref, target.kind, target.recipe) == ("cpu", "recipe", "cpu")
    assert target.resolved is not None and target.image == identity.of(target.resolved).ref()
    assert seen == {"host": None, "devices": ["/dev/fuse"], "expect_efa": True, "nodes": 1, "arch": None}
    assert result.exit_code == (0 if status == "pass" else VerifyError.exit_code), result.output
    assert "sshd-config" in result.stdout and "container start 0.5s" in result.stdout
    if status == "fail":
        assert "1 of 3 checks failed: sshd-config" in result.output
    data = json.loads(js.read_text())
    assert data["timings"]["container_start_s"] == 0.5 and data["summary"]["skip"] == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (
        suite is not None and suite.get("tests") == "3" and suite.get("failures") == ("1" if status == "fail" else "0")
    )
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["gpu-nvidia-smi"].find("skipped") is not None
    assert (cases["sshd-config"].find("failure") is not None) == (status == "fail")


def test_cli_refuses_nodes_with_host() -> None:
    result = runner.invoke(cli_app(), ["verify", "cpu", "--host", "local", "--nodes", "2"])
    assert result.exit_code == VerifyError.exit_code
    assert "cannot be combined with --host" in result.output


# --------------------------------------------------------------------------------------------------------------
# the real engine


MINE = re.compile(r"^imgbuild-verify-[0-9a-f]{10}-(read|scan|main|main-retry)$")  # not multinode's (-node-K)


def _leftovers(client: Any, image: str) -> list[str]:
    """Containers of `image`, or labelled by a verification, that a single-container verify started."""
    by_image = client.containers.list(all=True, filters={"ancestor": image})
    by_label = client.containers.list(all=True, filters={"label": verify.LABEL_VERIFY})
    return sorted({c.name for c in [*by_image, *by_label] if MINE.match(c.name)})


@pytest.mark.docker
def test_verify_passes_on_the_cpu_image(cpu_image: Any, docker_client: Any, tmp_path: Path) -> None:
    junit, js = tmp_path / "cpu.xml", tmp_path / "cpu.json"
    result = runner.invoke(cli_app(), ["verify", "cpu", "--junit", str(junit), "--json", str(js)])
    assert result.exit_code == 0, result.output
    data = json.loads(js.read_text())
    assert data["image"] == cpu_image.refs[0]
    by_name = {r["name"]: r for r in data["results"]}
    assert all(r["status"] == "pass" or (r["status"] == "skip" and r["reason"]) for r in data["results"]), data
    for name, found in {
        "nccl-runtime-version": "22705 (2.27.5)",
        "nccl-header-version": "2.27.5",
        "openmpi-version": "4.1.4",
        "sshd-listening": "3022",
        "no-keys-in-image": "none found",
        "libfabric-version": "1.17.0",
    }.items():
        assert by_name[name]["status"] == "pass" and by_name[name]["found"] == found, by_name[name]
    for name in ("manifest", "sagemaker-contract", "sshd-config", "env", "ca-bundle-absent", "mpi4py-version"):
        assert by_name[name]["status"] == "pass", by_name[name]
    assert by_name["gpu-nvidia-smi"]["status"] == "skip"
    assert {"container_start_s", "checks_s", "total_s"} <= set(data["timings"])
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and int(suite.get("tests", 0)) == len(data["results"])
    assert _leftovers(docker_client, cpu_image.refs[0]) == []


@pytest.mark.docker
def test_containers_are_removed_on_errors_and_ctrl_c(
    cpu_image: Any, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kw: Any) -> list[CheckResult]:
        assert _leftovers(docker_client, cpu_image.refs[0]), "the container should be running now"
        raise KeyboardInterrupt

    monkeypatch.setattr(check_registry, "run_checks", interrupted)
    with pytest.raises(Interrupted):
        verify.verify(cpu_image.refs[0])
    assert _leftovers(docker_client, cpu_image.refs[0]) == []

    def broken(*args: Any, **kw: Any) -> list[CheckResult]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(check_registry, "run_checks", broken)
    with pytest.raises(RuntimeError):
        verify.verify("cpu")
    assert _leftovers(docker_client, cpu_image.refs[0]) == []


def _ca_bundle() -> Path | None:
    for env in ("IMGBUILD_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(env)
        if value and Path(value).is_file():
            return Path(value)
    return None


BROKEN = {
    "no-mpirun": ("RUN rm -f /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orterun", {"openmpi-version"}),
    "sshd-port": (
        "RUN sed -i 's/^Port 3022/Port 4022/' /etc/ssh/sshd_config",
        {"sshd-config", "sshd-listening"},
    ),
    "other-nccl": (
        "COPY ca.crt /tmp/ca.crt\n"
        "RUN PIP_CERT=/tmp/ca.crt /opt/venv/bin/pip install --no-cache-dir nvidia-nccl-cu12==2.20.5 && rm /tmp/ca.crt",
        {"nccl-runtime-version", "nccl-header-version"},
    ),
    "baked-key": ("RUN ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/id_ed25519", {"no-keys-in-image"}),
    # package documentation with AWS's example access key, as boto3's CloudFront example had it
    "baked-token": (
        "RUN printf '%s\\n' \"key_id = 'AKIAIOSFODNN7EXAMPLE'\" > /opt/venv/lib/python3.11/site-packages/example.rst",
        {"no-keys-in-image"},
    ),
    # the entrypoint's `sshd -t` refuses the config and the container exits: the image-level checks still run
    "sshd-invalid": ("RUN echo 'NoSuchOption yes' >> /etc/ssh/sshd_config", {"container-start"}),
}


@pytest.fixture
def broken_image(request: pytest.FixtureRequest, cpu_image: Any, docker_client: Any, tmp_path: Path) -> Iterator[str]:
    """An image FROM the cpu image with one RUN that breaks it (it keeps the label io.imgbuild.recipe=cpu)."""
    run = BROKEN[request.param][0]
    context = tmp_path / "ctx"
    context.mkdir()
    ca = _ca_bundle()
    if ca is not None:
        shutil.copyfile(ca, context / "ca.crt")
    else:
        (context / "ca.crt").write_text("")  # no proxy here: pip uses the system's trust store
        run = run.replace("PIP_CERT=/tmp/ca.crt ", "")
    (context / "Dockerfile").write_text(f"FROM {cpu_image.refs[0]}\n{run}\n")
    tag = f"imgbuild-test/verify-{request.param}:{uuid.uuid4().hex[:8]}"
    docker_client.images.build(path=str(context), tag=tag, rm=True, forcerm=True)
    try:
        yield tag
    finally:
        for c in docker_client.containers.list(all=True, filters={"ancestor": tag}):
            c.remove(force=True)
        docker_client.images.remove(tag, force=True, noprune=False)


@pytest.mark.docker
@pytest.mark.parametrize(
    "broken_image",
    [
        "no-mpirun",
        "sshd-port",
        pytest.param("other-nccl", marks=pytest.mark.network),
        "baked-key",
        "baked-token",
        "sshd-invalid",
    ],
    indirect=True,
)
def test_broken_images_fail_their_check(broken_image: str, docker_client: Any, tmp_path: Path) -> None:
    case = broken_image.split("verify-", 1)[1].split(":", 1)[0]
    js = tmp_path / "r.json"
    result = runner.invoke(cli_app(), ["verify", broken_image, "--json", str(js)])
    assert result.exit_code == VerifyError.exit_code, result.output
    data = json.loads(js.read_text())
    failed = {r["name"] for r in data["results"] if r["status"] == "fail"}
    assert failed == BROKEN[case][1], data["results"]
    assert data["recipe"] == "cpu" and "lock of shipped recipe 'cpu'" in data["note"]
    by_name = {r["name"]: r for r in data["results"]}
    assert by_name["manifest"]["status"] == "pass"  # the manifest still equals the lock: the image lies
    assert _leftovers(docker_client, broken_image) == []


@pytest.mark.docker
def test_devices_passed_in_are_visible(cpu_image: Any, docker_client: Any) -> None:
    report = verify.verify("cpu", devices=["/dev/null:/dev/imgbuild-null"])
    (dev,) = [r for r in report.results if r.name == "devices"]
    assert (dev.status, dev.expected) == ("pass", "/dev/imgbuild-null")
    assert report.ok and _leftovers(docker_client, cpu_image.refs[0]) == []


@pytest.mark.docker
@pytest.mark.parametrize("nodes", [1, 2])
def test_sigterm_mid_verify_removes_what_it_started_and_exits_143(
    cpu_image: Any, docker_client: Any, tmp_path: Path, nodes: int
) -> None:
    """SIGTERM while verify's containers run (with --nodes 2: the multi-node phase, its network and key folder):
    all of it is removed, exit 143."""
    import signal
    import time

    label = verify.LABEL_VERIFY
    # the engine's raw list throughout: docker-py's list inspects each container, and one may be gone by then
    before = {c["Id"] for c in docker_client.api.containers(all=True, filters={"label": label})}
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "CI": "1", "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "imgbuild.cli", "verify", "cpu", "--nodes", str(nodes)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    runs: set[str] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            listed = docker_client.api.containers(all=True, filters={"label": label})
            mine = [c for c in listed if c["Id"] not in before]
            if len(mine) >= nodes:
                runs = {c["Labels"][label] for c in mine}
                break
            time.sleep(0.05)
        assert runs, f"no verify container appeared (exit {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=90)
        assert proc.returncode == 143, output
        assert "Traceback" not in output and "unexpected error" not in output
        assert list(tmp.iterdir()) == []  # multinode's key folder
        for run in runs:
            assert docker_client.api.containers(all=True, filters={"label": f"{label}={run}"}) == [], run
            assert docker_client.networks.list(filters={"label": f"{label}={run}"}) == [], run
    finally:
        if proc.poll() is None:
            proc.kill()
        for run in runs:  # a failed run's leftovers must not disturb other tests
            for c in docker_client.api.containers(all=True, filters={"label": f"{label}={run}"}):
                docker_client.api.remove_container(c["Id"], force=True)


def test_gpu_driver_check_compares_the_hosts_driver_with_the_images_cuda() -> None:
    """gpu-driver: skipped without a GPU or without CUDA; on a GPU, the driver (nvidia-smi's query, else the kernel
    module's /proc file) against the lock's cuda pin by NVIDIA's table, with what to do when it is behind."""
    cuda = {"version": "13.0.1", "gpu_arch": "sm_90", "gencode": "-gencode=arch=compute_90,code=sm_90"}
    cuda13 = pins({**CPU_COMPONENTS, "cuda": cuda})
    none = checks.CheckContext(host=FakeHost({}), scope="container", components=cuda13, gpu_reason="no GPU here")
    assert (gpuchecks.gpu_driver(none).status, gpuchecks.gpu_driver(none).reason) == ("skip", "no GPU here")
    no_cuda = checks.CheckContext(host=FakeHost({}), scope="container", components=pins(CPU_COMPONENTS), gpu=True)
    assert gpuchecks.gpu_driver(no_cuda).status == "skip"

    def on(out: Out, components: dict[str, Pin] = cuda13) -> CheckResult:
        ctx = checks.CheckContext(host=FakeHost({"driver_version": out}), scope="container", components=components,
                                  gpu=True)  # fmt: skip
        return gpuchecks.gpu_driver(ctx)

    ok = on(Out(0, "580.95.05\n"))
    assert (ok.status, ok.expected, ok.found) == ("pass", "driver >= 580 (CUDA 13.0.1)", "580.95.05 (nvidia-smi)")
    proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.144.03  Mon Dec 30 17:44:08 UTC 2024\n"
    behind = on(Out(0, proc))
    assert behind.status == "fail" and behind.found == "550.144.03 (/proc/driver/nvidia/version)"
    assert "upgrade the host's NVIDIA driver to 580 or newer" in behind.reason
    assert behind.details["status"] == "behind" and behind.details["needs"] == "580"
    assert on(Out(1, "")).status == "fail"  # a GPU, yet no driver answers
    torch_wheel = pins({**CPU_COMPONENTS, "pytorch": {"version": "2.9.1", "cuda": "12.8"}})
    assert on(Out(0, "550.144.03\n"), torch_wheel).status == "pass"  # torch's CUDA 12.8 runs on 550


def test_imex_channel_check() -> None:
    """imex-channel: none here (this host), skipped with what IMEX needs; a channel the container cannot use, or
    one passed to it yet missing in it, fails."""
    import testinfra

    here = checks.CheckContext(host=testinfra.get_host("local://"), scope="host", components={})
    if not os.path.isdir("/dev/nvidia-caps-imex-channels"):
        res = gpuchecks.imex_channel(here)
        assert res.status == "skip" and "/dev/nvidia-caps-imex-channels/channelN" in res.reason
    channel = "/dev/nvidia-caps-imex-channels/channel0"
    good = gpuchecks.imex_channel(ctx_for({"channel*": Out(0, f"ok {channel}\ndone\n")}, devices=(channel,)))
    assert (good.status, good.found) == ("pass", channel)
    bad = gpuchecks.imex_channel(ctx_for({"channel*": Out(0, f"bad {channel}\ndone\n")}))
    assert bad.status == "fail" and "read and write" in bad.reason
    lost = gpuchecks.imex_channel(ctx_for({"channel*": Out(0, "done\n")}, devices=(channel,)))
    assert lost.status == "fail" and "passed to the container but not in it" in lost.reason


def _scan(root: Path) -> set[str]:
    """verify's image scan (SCAN_SCRIPT, run by /bin/sh as in the image) over `root` instead of /."""
    ran = subprocess.run(["sh", "-c", verify.SCAN_SCRIPT, "sh", str(root)], capture_output=True, text=True, check=True)
    assert ran.stdout.rstrip().endswith("IMGBUILD-SCAN-DONE"), ran.stdout
    return {str(Path(p).relative_to(root)) for p in verify.scan_findings(ran.stdout)}


def test_the_image_scan_finds_credential_shaped_text_anywhere_in_a_line(tmp_path: Path) -> None:
    """What AWS's deep-learning-containers sanity scan flagged in the cpu image's venv (boto3's CloudFront example:
    an access key ID; botocore's IAM examples: a private-key header inside a JSON string) is what verify's scan flags
    too; key files by name as before; prose, longer tokens and binary files are not findings."""
    files: dict[str, str | bytes] = {
        "site/boto3/examples/cloudfront.rst": "    key_id = 'AKIAIOSFODNN7EXAMPLE'\n",
        "site/botocore/data/iam/examples-1.json": '{"PrivateKey": "-----BEGIN DSA PRIVATE KEY-----<a key>"}\n',
        "etc/credentials": "[default]\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
        "etc/pem": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbg==\n-----END OPENSSH PRIVATE KEY-----\n",
        "root/.ssh/id_ed25519": "",
        # not findings
        "doc/prose.txt": "An access key ID starts with AKIA; a PEM private key with a BEGIN line.\n",
        "doc/longer.txt": "XAKIAIOSFODNN7EXAMPLEX and AKIAIOSFODNN7EXAMPLE0123 are other tokens\n",
        "doc/public.pem": "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n",
        "lib/binary.so": b"\0\x7fELF -----BEGIN RSA PRIVATE KEY----- AKIAIOSFODNN7EXAMPLE\0",
    }
    write_tree(tmp_path, files)
    assert _scan(tmp_path) == {
        "site/boto3/examples/cloudfront.rst",
        "site/botocore/data/iam/examples-1.json",
        "etc/credentials",
        "etc/pem",
        "root/.ssh/id_ed25519",
    }


def test_verify_host_over_ssh_that_does_not_answer_is_a_verify_error(tmp_path: Path) -> None:
    """`verify RECIPE --host ssh://...` to a host whose sshd does not answer (a closed port on loopback): exit 11,
    naming the host and ssh's words, never testinfra's RuntimeError (exit 1)."""
    ran = subprocess.run(
        [sys.executable, "-m", "imgbuild", "verify", "cpu", "--host", "ssh://root@127.0.0.1:1"],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert ran.returncode == VerifyError.exit_code, ran.stderr
    assert "--host 'ssh://root@127.0.0.1:1': ssh could not reach the host" in ran.stderr
    assert "port 1" in ran.stderr and "unexpected error" not in ran.stderr
