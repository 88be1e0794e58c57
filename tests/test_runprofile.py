"""Runtime profiles (`docker run` command lines) and `imgbuild run`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from conftest import locked_user_recipe
from imgbuild import recipe
from imgbuild.cli import app as imgbuild_app
from imgbuild.core.errors import EngineError
from imgbuild.engine import runprofile
from imgbuild.image import identity, render
from imgbuild.pin.lock import resolved_for
from imgbuild.pin.resolver import Resolved

HABANA = (
    "--runtime=habana -e HABANA_VISIBLE_DEVICES=all -e OMPI_MCA_btl_vader_single_copy_mechanism=none "
    "--cap-add=sys_nice --net=host --ipc=host"
)


def resolved(name: str) -> Resolved:
    return resolved_for(recipe.load(name))


def line(name: str, cmd: tuple[str, ...] = (), devices: tuple[str, ...] = (), interactive: bool = False) -> str:
    argv = runprofile.docker_run_args(
        resolved(name), "IMG", list(cmd), host_devices=list(devices), interactive=interactive
    )
    return runprofile.command_line(argv)


def test_gaudi_profile_exactly() -> None:
    assert line("gaudi-1.15") == f"docker run --rm {HABANA} --ulimit memlock=-1:-1 IMG"


def test_gaudi_with_efa_devices_and_a_terminal() -> None:
    devices = ("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1")
    assert line("gaudi-1.15", ("hl-smi",), devices, interactive=True) == (
        f"docker run --rm -it {HABANA} --device=/dev/infiniband/uverbs0 --device=/dev/infiniband/uverbs1 "
        "--ulimit memlock=-1:-1 IMG hl-smi"
    )


def test_cpu_profile() -> None:
    # No accelerator, no EFA devices even when the host has some; its own /dev/shm size.
    assert line("cpu", ("bash", "-c", "echo 'a b'"), ("/dev/infiniband/uverbs0",)) == (
        "docker run --rm --ulimit memlock=-1:-1 --shm-size=1g IMG bash -c 'echo '\"'\"'a b'\"'\"''"
    )
    argv = runprofile.docker_run_args(resolved("cpu").recipe, "IMG", ["bash", "-c", "echo 'a b'"], host_devices=[])
    assert argv[-3:] == ["bash", "-c", "echo 'a b'"]


def test_a100_profile() -> None:
    # Host networking (issue 10): sshd on 3022 and NCCL's bootstrap socket must be reachable from other instances.
    assert line("a100", ("nvidia-smi",), ("/dev/infiniband/uverbs0",)) == (
        "docker run --rm --net=host --ipc=host --gpus all --device=/dev/infiniband/uverbs0 --ulimit memlock=-1:-1 "
        "IMG nvidia-smi"
    )
    assert line("a100") == "docker run --rm --net=host --ipc=host --gpus all --ulimit memlock=-1:-1 IMG"


def test_default_shm_without_host_ipc(recipe_dir: Path) -> None:
    mine = recipe_dir / "mine.yaml"
    mine.write_text("extends: a100\nruntime: {ipc: null, network: null, memlock_unlimited: false}\n")
    loaded = recipe.load(mine)
    argv = runprofile.docker_run_args(loaded, "IMG", [], host_devices=[])
    assert shlex.join(argv) == "docker run --rm --gpus all --shm-size=1g IMG"


def test_host_efa_devices_in_numeric_order(tmp_path: Path) -> None:
    for n in (10, 2, 0, 1):
        (tmp_path / f"uverbs{n}").touch()
    (tmp_path / "rdma_cm").touch()
    found = runprofile.host_efa_devices(str(tmp_path / "uverbs*"))
    assert [Path(p).name for p in found] == ["uverbs0", "uverbs1", "uverbs2", "uverbs10"]


# --------------------------------------------------------------------------------------------------------------
# The command


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    """The imgbuild CLI, on a host without EFA devices (as this one is)."""
    monkeypatch.setattr(runprofile, "host_efa_devices", lambda pattern=runprofile.EFA_DEVICE_GLOB: [])
    return imgbuild_app


runner = CliRunner()


def image_of(name: str) -> str:
    return render.plan(resolved(name)).image_refs[0]


DL1_EFA = " ".join(f"--device=/dev/infiniband/uverbs{n}" for n in range(4))  # dl1.24xlarge: 4 EFA devices


@pytest.mark.parametrize("runtimes", [["runc", "habana"], ["runc"], None])
def test_run_print_gaudi_is_the_dl1_line_whatever_this_host_is(
    app: typer.Typer, monkeypatch: pytest.MonkeyPatch, runtimes: list[str] | None
) -> None:
    """`--print` gives the line to paste on the recipe's target host (dl1.24xlarge): Habana's runtime and its 4 EFA
    devices, the same on a Gaudi host's engine, on one without the habana runtime, and with no engine to ask; stderr
    says what `imgbuild run` would drop here and why, so stdout stays one pasteable line."""
    monkeypatch.setattr(runprofile, "engine_runtimes", lambda: runtimes)
    result = runner.invoke(app, ["run", "gaudi-1.15", "--print"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"docker run --rm {HABANA} {DL1_EFA} --ulimit memlock=-1:-1 {image_of('gaudi-1.15')}\n"
    assert "note: the line is for the recipe's target host, dl1.24xlarge (4 EFA devices)" in result.stderr
    assert (
        "note: this host would drop --device=/dev/infiniband/{uverbs0,uverbs1,uverbs2,uverbs3}: it has none "
        "(/dev/infiniband/uverbs*)"
    ) in result.stderr
    dropped = "note: this host would drop --runtime=habana: the engine has no 'habana' runtime"
    assert (dropped in result.stderr) is (runtimes == ["runc"]), result.stderr


def test_run_without_print_adapts_to_this_host(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`imgbuild run` itself keeps adapting to the host (runprofile.for_host): on an engine without Habana's runtime
    it starts without it and says so, before it asks the engine for the image (missing here: exit 8)."""
    monkeypatch.setattr(runprofile, "engine_runtimes", lambda: ["runc"])
    result = runner.invoke(app, ["run", "gaudi-1.15", "--image", "imgbuild/no-such-image:nothing", "--", "true"])
    assert result.exit_code == EngineError.exit_code, result.output
    assert "note: the engine has no 'habana' runtime: started without --runtime=habana" in result.stderr
    assert "would drop" not in result.stderr and "target host" not in result.stderr
    argv = runprofile.docker_run_args(resolved("gaudi-1.15"), "IMG", host_devices=[], engine=(["runc"], False))
    assert "--runtime=habana" not in argv and not any(a.startswith("--device=") for a in argv)
    argv = runprofile.docker_run_args(
        resolved("gaudi-1.15"), "IMG", host_devices=["/dev/infiniband/uverbs0"], engine=(["runc", "habana"], False)
    )
    assert "--runtime=habana" in argv and [a for a in argv if a.startswith("--device=")] == [
        "--device=/dev/infiniband/uverbs0"
    ]


def test_run_print_a100_has_its_gpus_and_p4ds_efa_devices(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    """a100's target is p4d.24xlarge: --gpus all and 4 EFA devices on any host; a host with 2 of them is told it
    would drop the other two, one without a GPU that it would drop --gpus."""
    monkeypatch.setattr(runprofile, "engine_runtimes", lambda: ["runc", "nvidia"])
    monkeypatch.setattr(runprofile, "host_has_gpu", lambda device=runprofile.GPU_DEVICE: False)
    two = ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]
    monkeypatch.setattr(runprofile, "host_efa_devices", lambda pattern=runprofile.EFA_DEVICE_GLOB: two)
    result = runner.invoke(app, ["run", "a100", "--print", "--", "nvidia-smi"])
    assert result.exit_code == 0, result.output
    p4d = " ".join(f"--device=/dev/infiniband/uverbs{n}" for n in range(4))
    assert result.stdout == (
        f"docker run --rm --net=host --ipc=host --gpus all {p4d} --ulimit memlock=-1:-1 {image_of('a100')} nvidia-smi\n"
    )
    assert "note: the line is for the recipe's target host, p4d.24xlarge (4 EFA devices)" in result.stderr
    assert "note: this host would drop --gpus all: no GPU on this host (/dev/nvidia0)" in result.stderr
    assert (
        "note: this host would drop --device=/dev/infiniband/{uverbs2,uverbs3}: it has only 2 (/dev/infiniband/uverbs*)"
    ) in result.stderr


def test_run_print_cpu_is_the_same_line_anywhere(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    """No accelerator, no EFA, no instance type: the line has no devices and there is nothing to drop."""
    monkeypatch.setattr(runprofile, "engine_runtimes", lambda: ["runc"])
    monkeypatch.setattr(runprofile, "host_efa_devices", lambda pattern=runprofile.EFA_DEVICE_GLOB: ["/dev/x/uverbs0"])
    result = runner.invoke(app, ["run", "cpu", "--print"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"docker run --rm --ulimit memlock=-1:-1 --shm-size=1g {image_of('cpu')}\n"
    assert "note:" not in result.stderr


def test_print_without_a_known_target_uses_this_hosts_efa_devices(recipe_dir: Path) -> None:
    """A recipe that wants EFA but names no instance type whose EFA devices are known: the target's line has this
    host's EFA devices, and a note says to add the target's own (what `run --print` prints on stderr)."""
    mine = recipe_dir / "mine.yaml"
    mine.write_text("extends: a100\nplatform: {instance_types: []}\n")
    notes: list[str] = []
    here = ["/dev/infiniband/uverbs0"]
    argv = runprofile.docker_run_args(recipe.load(mine), "IMG", host_devices=here, target=True, notes=notes)
    assert runprofile.command_line(argv) == (
        "docker run --rm --net=host --ipc=host --gpus all --device=/dev/infiniband/uverbs0 --ulimit memlock=-1:-1 IMG"
    )
    assert notes == [
        "the recipe names no instance type whose EFA devices imgbuild knows (platform.instance_types): the line has "
        "this host's 1; on the target add --device=/dev/infiniband/uverbsN for each of its own"
    ]


def test_run_print_with_a_command(app: typer.Typer) -> None:
    result = runner.invoke(app, ["run", "cpu", "--print", "--", "bash", "-c", "fi_info -p tcp | head"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"docker run --rm --ulimit memlock=-1:-1 --shm-size=1g {image_of('cpu')} bash -c 'fi_info -p tcp | head'\n"
    )
    result = runner.invoke(app, ["run", "cpu", "--print", "--image", "registry.example/x:1"])
    assert result.stdout.rstrip().endswith(" registry.example/x:1")


@pytest.mark.parametrize(
    ("runtimes", "gpu", "hook", "kept", "note"),
    [
        (
            ["runc"],
            True,
            False,
            False,
            "NVIDIA's container toolkit is not set up (no 'nvidia' runtime, no nvidia-container-runtime-hook)",
        ),
        (["runc"], True, True, True, None),  # the toolkit's hook alone serves Docker's --gpus
        (["runc", "nvidia"], False, False, False, "no GPU on this host (/dev/nvidia0)"),
        (["runc", "nvidia"], True, False, True, None),
        (None, False, False, True, None),  # no engine to ask: the recipe's whole profile, to paste on a GPU host
    ],
)
def test_run_gpus_only_where_the_engine_can_give_them(
    app: typer.Typer,
    monkeypatch: pytest.MonkeyPatch,
    runtimes: list[str] | None,
    gpu: bool,
    hook: bool,
    kept: bool,
    note: str | None,
) -> None:
    """`imgbuild run` and verify share one rule (runprofile.for_host): Docker refuses `--gpus` without NVIDIA's
    toolkit (its `nvidia` runtime or its hook on PATH), so it is passed only where the host has a GPU and the toolkit
    serves it (the engine and host are faked here). `--print` keeps it (the line is for the target's GPUs) and says
    that this host would drop it."""
    monkeypatch.setattr(runprofile, "engine_runtimes", lambda: runtimes)
    monkeypatch.setattr(runprofile, "host_has_gpu", lambda device=runprofile.GPU_DEVICE: gpu)
    monkeypatch.setattr(runprofile, "nvidia_hook_present", lambda: hook)
    result = runner.invoke(app, ["run", "pytorch", "--print"])
    assert result.exit_code == 0, result.output
    assert " --gpus all " in result.stdout
    dropped = f"note: this host would drop --gpus all: {note}"
    assert (dropped in result.stderr) if note else "--gpus" not in result.stderr, result.stderr
    result = runner.invoke(app, ["run", "pytorch", "--image", "imgbuild/no-such-image:nothing", "--", "true"])
    assert result.exit_code == EngineError.exit_code, result.output  # the image is not there; the notes came first
    started = f"note: {note}: started without --gpus all"
    assert (started in result.stderr) if note else "--gpus" not in result.stderr, result.stderr
    argv = runprofile.docker_run_args(
        resolved("pytorch"), "IMG", host_devices=[], engine=None if runtimes is None else (runtimes, gpu)
    )
    assert ("all" in argv and "--gpus" in argv) is kept


@pytest.mark.docker
def test_run_on_this_engine_has_no_gpu_request(
    app: typer.Typer, cpu_image: Any, recipe_dir: Path, docker_client: Any
) -> None:
    """This engine has no nvidia runtime: `imgbuild run` leaves `--gpus` out, and Docker starts the container."""
    assert "nvidia" not in (docker_client.info().get("Runtimes") or {})
    result = runner.invoke(app, ["run", "pytorch", "--print"])  # the target's line keeps it, and says this host can't
    assert result.exit_code == 0 and " --gpus all " in result.stdout, result.output
    assert "note: this host would drop --gpus all: " in result.stderr
    text = "extends: cpu\nruntime: {gpus: all, memlock_unlimited: false}\n"
    mine = locked_user_recipe(recipe_dir / "mine.yaml", text)
    result = runner.invoke(app, ["run", str(mine), "--image", cpu_image.refs[0], "--", "true"])
    assert result.exit_code == 0, result.output
    assert "started without --gpus all" in result.stderr


def test_run_unknown_recipe(app: typer.Typer) -> None:
    result = runner.invoke(app, ["run", "a10", "--print"])
    assert result.exit_code == 3 and "did you mean 'a100'" in result.stderr


@pytest.mark.docker
def test_run_exit_status_and_missing_image(app: typer.Typer, cpu_image: Any, recipe_dir: Path) -> None:
    # Without the memlock ulimit: an engine that itself runs in a container may not be allowed to raise it.
    mine = locked_user_recipe(recipe_dir / "mine.yaml", "extends: cpu\nruntime: {memlock_unlimited: false}\n")
    result = runner.invoke(app, ["run", str(mine), "--image", cpu_image.refs[0], "--", "bash", "-c", "exit 7"])
    assert result.exit_code == 7, result.output
    result = runner.invoke(app, ["run", "cpu", "--image", "imgbuild/no-such-image:nothing", "--", "true"])
    assert result.exit_code == EngineError.exit_code, result.output
    assert "no image imgbuild/no-such-image:nothing" in result.stderr


@pytest.mark.parametrize("name", ["cpu", "a100", "gaudi-1.15"])
def test_cli_arguments_and_docker_py_options_are_one_profile(name: str) -> None:
    """`imgbuild run --print` and verify / verify --nodes (docker-py) start containers from one RunSpec."""
    devices = ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]
    spec = runprofile.run_spec(resolved(name).recipe.runtime, devices)
    args, kwargs = spec.docker_args(), spec.docker_py()
    assert [a.split("=", 1)[1] for a in args if a.startswith("--device=")] == list(spec.devices)
    assert [d.split(":")[0] for d in kwargs.get("devices", [])] == list(spec.devices)
    assert dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-e") == kwargs.get("environment", {})
    assert [a.split("=", 1)[1] for a in args if a.startswith("--cap-add=")] == kwargs.get("cap_add", [])
    assert ("--ulimit" in args) == ("ulimits" in kwargs) == spec.memlock_unlimited
    assert ("--net=host" in args) == (kwargs.get("network_mode") == "host")
    assert ("--ipc=host" in args) == (kwargs.get("ipc_mode") == "host")
    assert ("--gpus" in args) == ("device_requests" in kwargs)
    assert (f"--shm-size={kwargs['shm_size']}" in args) if "shm_size" in kwargs else not any("shm" in a for a in args)
    cli = runprofile.docker_run_args(resolved(name), "IMG", [], host_devices=devices)
    assert cli == ["docker", "run", "--rm", *args, "IMG"]


def test_gdrcopy_images_ask_for_gdrdrv_where_the_host_has_it(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gdrcopy block's one rule: the image's ENV enables the toolkit's injection (NVIDIA_GDRCOPY=enabled),
    and the run profile passes /dev/gdrdrv only where the host has it (a missing device stops `docker run`)."""

    def manifest_of(name: str) -> tuple[str, dict[str, Any]]:
        plan = render.plan(resolved(name))
        raw = next(f.content for f in plan.files if f.path == "imgbuild/manifest.json")
        return plan.dockerfile, json.loads(raw)

    dockerfile, manifest = manifest_of("a100")
    assert '    NVIDIA_GDRCOPY="enabled" \\\n' in dockerfile
    assert manifest["runtime"]["host_devices"] == ["/dev/gdrdrv"] and "NVIDIA_GDRCOPY" in manifest["image_env"]
    dockerfile, manifest = manifest_of("cpu")  # no gdrcopy
    assert manifest["runtime"]["host_devices"] == [] and "NVIDIA_GDRCOPY" not in dockerfile
    monkeypatch.setattr(runprofile, "engine_runtimes", lambda: None)
    assert not runprofile.device_present("/dev/gdrdrv")  # this host: no gdrdrv module
    assert "gdrdrv" not in " ".join(runprofile.docker_run_args(resolved("a100"), "IMG", host_devices=[]))
    monkeypatch.setattr(runprofile, "device_present", lambda path: path == "/dev/gdrdrv")  # a host with gdrdrv
    assert "--device=/dev/gdrdrv" in runprofile.docker_run_args(resolved("a100"), "IMG", host_devices=[])
    # --print's line is for any p4d: one without gdrdrv would refuse the device, so it is left out, with a note
    result = runner.invoke(app, ["run", "a100", "--print"])
    assert result.exit_code == 0 and "gdrdrv" not in result.stdout, result.output
    assert "note: --device=/dev/gdrdrv left out: passed only where a host has it" in result.stderr
    result = runner.invoke(app, ["run", "cpu", "--print"])
    assert "gdrdrv" not in result.stdout + result.stderr


def test_verify_reports_gdrdrv() -> None:
    """verify's gdrcopy-device check, on this host (no /dev/gdrdrv): skipped with the reason; failed when the
    device was passed to the container yet is missing in it."""
    import testinfra

    from imgbuild import checks
    from imgbuild.blocks import gdrcopy

    host = testinfra.get_host("local://")
    ctx = checks.CheckContext(host=host, scope="host", components={"gdrcopy": {"version": "2.5.1"}})
    result = gdrcopy.gdrcopy_device(ctx)
    assert result.status == "skip" and "no /dev/gdrdrv: the host has no gdrdrv module loaded" in result.reason
    passed_in = checks.CheckContext(host=host, scope="host", components={}, devices=("/dev/gdrdrv",))
    assert gdrcopy.gdrcopy_device(passed_in).status == "fail"
    null = checks.CheckContext(host=host, scope="host", components={})
    assert gdrcopy.GDRDRV == "/dev/gdrdrv" and gdrcopy.gdrcopy_device(null).status in {"skip", "pass"}


def test_gpu_containers_get_the_hosts_imex_channels(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run rule (run_spec) passes the host's IMEX channels to containers of CUDA images, only where the host has
    them (none here: IMEX makes them per job), so `imgbuild run` and verify alike get them; never to a CPU image, and
    never in `run --print`'s line for the target (a host without the channel would refuse it)."""
    from imgbuild import verify
    from imgbuild.image.manifest import Manifest

    assert runprofile.host_imex_channels() == [] or runprofile.host_imex_channels()[0].endswith("channel0")
    channels = [f"/dev/nvidia-caps-imex-channels/channel{n}" for n in (0, 1)]
    monkeypatch.setattr(runprofile, "engine_runtimes", lambda: None)
    monkeypatch.setattr(runprofile, "host_imex_channels", lambda: list(channels))  # a GB200 host in an IMEX job
    line = runprofile.docker_run_args(resolved("gb200"), "IMG", host_devices=[])
    assert [a for a in line if "imex" in a] == [f"--device={c}" for c in channels]
    assert not [a for a in runprofile.docker_run_args(resolved("cpu"), "IMG", host_devices=[]) if "imex" in a]
    gb200 = resolved("gb200")
    manifest = Manifest.model_validate(render.manifest(gb200, identity.of(gb200)).as_data())
    options = verify.run_options(manifest, [], ["runc", "nvidia"], has_gpu=True)
    assert [d for d in options.spec.devices_inside if "imex" in d] == channels
    result = runner.invoke(app, ["run", "gb200", "--print"])
    assert result.exit_code == 0 and "imex" not in result.stdout, result.output
    spec = runprofile.run_spec(resolved("a100").recipe.runtime, [], imex_channels=channels[:1])
    assert spec.devices == (channels[0],)
