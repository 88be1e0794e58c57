"""`imgbuild lock` reads what the EFA installer tarball bundles from the tarball itself (imgbuild.pin.artifacts,
issue 30): libfabric, Open MPI and aws-ofi-nccl from its package file names, so an installer release that
blocks/efa/releases.yaml does not list yet locks; where the tarball can't be read it falls back to the shipped data
and says so.

The tarballs here are made in tmp_path with the installer's layout. Member names follow real ones:
`aws-efa-installer/DEBS/UBUNTU2204/x86_64/libfabric1-aws_2.4.0amzn3.0_amd64.deb`, `.../libnccl-ofi_1.19.0-1_amd64.deb`,
`.../openmpi40-aws_4.1.7-1_amd64.deb`, `.../rdma-core/libibverbs1_61.0-1_amd64.deb` (third parties' Dockerfiles that
dpkg -i them from aws-efa-installer-latest.tar.gz) and `RPMS/ALINUX2023/x86_64/libfabric-aws-2.4.0amzn5.0-1.amzn2023
.x86_64.rpm`, `libnccl-ofi-1.20.0-1.amzn2023.x86_64.rpm`, `openmpi40-aws-4.1.7-3.x86_64.rpm`,
`openmpi50-aws-5.0.9amzn1-11.x86_64.rpm` (a third party's listing of installer 1.49.0's package_list.txt). The
DEBIAN12 folder name is inferred from the UBUNTU2204 / ALINUX2023 pattern.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from imgbuild.blocks.efa import bundled_in
from imgbuild.cli import app
from localindex import Index, make_wheel

NEW = "1.52.0"  # an installer release efa.yaml does not list (made up): only its tarball says what it bundles


def installer(folder: Path, version: str, os_dirs: dict[str, dict[str, str]]) -> Path:
    """aws-efa-installer-VERSION.tar.gz in `folder` with empty package files: {OS folder: {package: file version}}."""
    path = folder / f"aws-efa-installer-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for os_dir, pkgs in os_dirs.items():
            kind = "RPMS" if os_dir.startswith("ALINUX") else "DEBS"
            for machine, debarch in (("x86_64", "amd64"), ("aarch64", "arm64")):
                base = f"aws-efa-installer/{kind}/{os_dir}/{machine}"
                for pkg, ver in pkgs.items():
                    if kind == "DEBS":
                        name = f"{base}/{pkg}_{ver}_{debarch}.deb"
                    else:
                        name = f"{base}/{pkg}-{ver}.amzn2023.{machine}.rpm"
                    info = tarfile.TarInfo(name)
                    tar.addfile(info, io.BytesIO(b""))
        for extra in ("aws-efa-installer/efa_installer.sh", "aws-efa-installer/DEBS/DEBIAN12/x86_64/rdma-core/"
                      "libibverbs1_65.0-1_amd64.deb", "aws-efa-installer/DEBS/DEBIAN12/x86_64/libfabric-aws-dev_"
                      "2.7.0amzn3.0_amd64.deb"):  # fmt: skip
            tar.addfile(tarfile.TarInfo(extra), io.BytesIO(b""))
    return path


DEBIAN12 = {
    "libfabric1-aws": "2.7.0amzn3.0",
    "libnccl-ofi": "1.22.0-1",
    "openmpi40-aws": "4.1.8-1",
    "openmpi50-aws": "5.0.9amzn2-1",
}


@pytest.fixture
def mine(index_env: Index, recipe_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A debian12 image with the EFA installer NEW and its bundled plugin and libfabric; the NCCL wheel on the local
    index; every other connection sent to a closed port (the network unreachable)."""
    filename = "nvidia_nccl_cu12-2.27.5-py3-none-any.whl"
    index_env.add_wheel("nvidia-nccl-cu12", filename, make_wheel(tmp_path, filename, [], junk=2000))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    path = recipe_dir / "mine.yaml"
    path.write_text(
        "extends: cpu\nplatform: {arch: amd64}\ncomponents:\n  sagemaker: null\n"
        f"  efa: {{version: {NEW}}}\n  libfabric: {{source: efa}}\n  aws_ofi_nccl: {{source: efa}}\n"
    )
    return path


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_lock_reads_the_bundle_from_the_tarball_in_the_files_folder(mine: Path, tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    installer(folder, NEW, {"DEBIAN12": DEBIAN12, "UBUNTU2404": {**DEBIAN12, "libnccl-ofi": "1.21.1-1"},
                            "ALINUX2023": {"libfabric-aws": "2.7.0amzn3.0-1", "libnccl-ofi": "1.22.0-1"}})  # fmt: skip
    result = run("lock", str(mine), "--files", str(folder))
    assert result.exit_code == 0, result.output
    read_from = f"aws-efa-installer-{NEW}.tar.gz (--files)"
    assert (
        f"efa {NEW}: bundle read from {read_from}: aws_ofi_nccl 1.22.0, libfabric 2.7.0amzn3.0, openmpi4 4.1.8, "
        "openmpi5 5.0.9amzn2"
    ) in result.stdout
    locked = json.loads(mine.with_suffix(".lock.json").read_text())["pins"]
    assert locked["efa"]["details"]["bundle"] == {
        "aws_ofi_nccl": "1.22.0", "libfabric": "2.7.0amzn3.0", "openmpi4": "4.1.8", "openmpi5": "5.0.9amzn2",
        "read_from": read_from,
    }  # fmt: skip
    # the debian12 folder's versions (not ubuntu24.04's plugin), checked by the plugin's rules as a listed one is
    assert locked["aws_ofi_nccl"]["version"] == "1.22.0" and locked["libfabric"]["version"] == "2.7.0amzn3.0"
    assert locked["aws_ofi_nccl"]["details"]["tested_nccl"] == "2.31.2"
    # the lock's pins follow from the recipe with the bundle the lock records (no tarball needed to read it back)
    shown = run("show", str(mine), "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["from"] == "lock"


def test_without_the_tarball_the_shipped_data_is_used_and_said(mine: Path, tmp_path: Path) -> None:
    """The network unreachable and no --files copy: efa.yaml's row, which for an unlisted release knows no plugin."""
    result = run("lock", str(mine))
    assert result.exit_code == 5, result.output
    assert (
        f"efa {NEW}: bundle from the shipped data (blocks/efa/releases.yaml): the installer tarball was not read: "
        f"download https://efa-installer.amazonaws.com/aws-efa-installer-{NEW}.tar.gz: " in result.stdout
    )
    bundle = f"the aws-ofi-nccl version bundled with EFA installer {NEW} is not in blocks/efa/releases.yaml"
    assert bundle in result.stderr
    assert not mine.with_suffix(".lock.json").exists()
    # a listed release falls back to its row and locks, the lock recording no bundle (it reads as before)
    mine.write_text(mine.read_text().replace(NEW, "1.51.0"))
    result = run("lock", str(mine))
    assert result.exit_code == 0, result.output
    assert (
        "efa 1.51.0: bundle from the shipped data (blocks/efa/releases.yaml): the installer tarball was not read: "
        "download https://efa-installer.amazonaws.com/aws-efa-installer-1.51.0.tar.gz: " in result.stdout
    )
    locked = json.loads(mine.with_suffix(".lock.json").read_text())["pins"]
    assert "bundle" not in locked["efa"]["details"] and locked["aws_ofi_nccl"]["version"] == "1.22.0"


def test_a_tarball_without_the_targets_folder_is_not_guessed_from(mine: Path, tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    installer(folder, NEW, {"UBUNTU2404": DEBIAN12, "ALINUX2023": {"libnccl-ofi": "1.22.0-1"}})
    with tarfile.open(folder / f"aws-efa-installer-{NEW}.tar.gz") as tar:
        names = [n for n in tar.getnames() if "DEBIAN12" not in n]
    with pytest.raises(ValueError, match=r"it holds no x86_64 packages for debian12 \(DEBIAN12; it has: ALINUX2023, "
                       r"UBUNTU2404\)"):  # fmt: skip
        bundled_in(names, "debian12", ("x86_64",))
    assert bundled_in(names, "ubuntu24.04", ("x86_64", "aarch64"))["aws_ofi_nccl"] == "1.22.0"
    assert bundled_in(names, "ubuntu24.04", ("x86_64",))["libfabric"] == "2.7.0amzn3.0"  # not -dev's
    (folder / f"aws-efa-installer-{NEW}.tar.gz").write_bytes(b"not a tarball")
    result = run("lock", str(mine), "--files", str(folder))
    assert result.exit_code == 5, result.output
    assert (
        f"efa {NEW}: bundle from the shipped data (blocks/efa/releases.yaml): the installer tarball was not read: "
        "not a readable tar archive" in result.stdout
    )
