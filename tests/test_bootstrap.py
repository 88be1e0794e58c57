"""Tests of imgbuild.engine.rootfs (`imgbuild base bootstrap`): name -> spec mapping (pure), tree trimming and
packing (pure, on a fake tree), cleanup when debootstrap fails or is interrupted, and one real bootstrap into a
throwaway image."""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path

import pytest

from imgbuild.core.errors import ImgbuildError, Interrupted
from imgbuild.engine import rootfs
from imgbuild.engine.rootfs import (
    DEBIAN_MIRROR,
    TEMP_PREFIX,
    UBUNTU_MIRROR,
    BaseSpec,
    bootstrap_base,
    can_bootstrap,
    sources_list,
    spec_for,
    split_name,
)
from trees import write_tree


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Point tempfile at a private directory so leftovers of this test (and only this test) are visible."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def _leftovers(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(TEMP_PREFIX)]


def _need_debootstrap() -> None:
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root")
    if not (shutil.which("debootstrap") or os.path.exists("/usr/sbin/debootstrap")):
        if os.environ.get("CI"):
            pytest.fail("CI is set but debootstrap is not installed (run scripts/setup.sh)")
        pytest.skip("debootstrap is not installed")


# --- spec_for --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "distro", "suite", "slim"),
    [
        ("debian:bookworm-slim", "debian", "bookworm", True),
        ("debian:bookworm", "debian", "bookworm", False),
        ("debian:12", "debian", "bookworm", False),
        ("debian:12-slim", "debian", "bookworm", True),
        ("debian:11-slim", "debian", "bullseye", True),
        ("debian:trixie", "debian", "trixie", False),
        ("library/debian:bookworm", "debian", "bookworm", False),
        ("docker.io/library/debian:12", "debian", "bookworm", False),
        ("ubuntu:22.04", "ubuntu", "jammy", False),
        ("ubuntu:24.04", "ubuntu", "noble", False),
        ("ubuntu:jammy", "ubuntu", "jammy", False),
        ("ubuntu:20.04", "ubuntu", "focal", False),
    ],
)
def test_spec_for_known_names(name, distro, suite, slim):
    spec = spec_for(name)
    assert (spec.name, spec.distro, spec.suite, spec.slim, spec.variant) == (name, distro, suite, slim, "minbase")
    assert spec.mirror == (DEBIAN_MIRROR if distro == "debian" else UBUNTU_MIRROR)


def test_spec_for_overrides():
    spec = spec_for("debian:custom-slim", suite="bookworm", mirror="http://mirror.example/debian/", variant="buildd")
    assert spec == BaseSpec(
        name="debian:custom-slim",
        distro="debian",
        suite="bookworm",
        mirror="http://mirror.example/debian",
        variant="buildd",
        slim=True,
    )


def test_spec_for_other_name_needs_suite_and_mirror():
    with pytest.raises(ImgbuildError, match="--suite") as exc_info:
        spec_for("imgbuild-test/base:bookworm-slim")
    assert "--mirror" in str(exc_info.value)
    with pytest.raises(ImgbuildError, match="--mirror"):
        spec_for("imgbuild-test/base:bookworm-slim", suite="bookworm")
    spec = spec_for("imgbuild-test/base:bookworm-slim", suite="bookworm", mirror=DEBIAN_MIRROR)
    assert (spec.distro, spec.suite, spec.slim) == ("debian", "bookworm", True)
    spec = spec_for("reg.local:5000/base:2204", suite="jammy", mirror="http://mirror.local/ubuntu")
    assert (spec.distro, spec.repository, spec.tag) == ("ubuntu", "reg.local:5000/base", "2204")


@pytest.mark.parametrize("name", ["debian:latest", "debian:13.4", "ubuntu:23.99", "ubuntu", "debian:potatoes-slim"])
def test_spec_for_unknown_tag_asks_for_suite(name):
    with pytest.raises(ImgbuildError, match="--suite"):
        spec_for(name)
    assert not can_bootstrap(name)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"variant": "fat"}, "variant"),
        ({"mirror": "ftp.debian.org/debian"}, "mirror"),
    ],
)
def test_spec_for_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ImgbuildError, match=match):
        spec_for("debian:bookworm", **kwargs)


def test_spec_for_rejects_bad_names():
    for bad in ("", "debian: bookworm", "  "):
        with pytest.raises(ImgbuildError):
            spec_for(bad)


def test_split_name():
    assert split_name("debian:bookworm-slim") == ("debian", "bookworm-slim")
    assert split_name("debian") == ("debian", "latest")
    assert split_name("localhost:5000/base") == ("localhost:5000/base", "latest")
    assert split_name("localhost:5000/base:1") == ("localhost:5000/base", "1")


def test_sources_list():
    debian = sources_list(spec_for("debian:bookworm-slim"))
    assert debian.splitlines() == [
        f"deb {DEBIAN_MIRROR} bookworm main",
        f"deb {DEBIAN_MIRROR} bookworm-updates main",
        f"deb {DEBIAN_MIRROR}-security bookworm-security main",
    ]
    own = sources_list(spec_for("debian:12", mirror="http://mirror.local/debian"))
    assert "security" not in own and "deb http://mirror.local/debian bookworm main" in own
    ubuntu = sources_list(spec_for("ubuntu:22.04"))
    assert f"deb {UBUNTU_MIRROR} jammy-security main" in ubuntu


# --- trimming and packing on a fake tree -----------------------------------------------------------------


def _fake_rootfs(root: Path) -> None:
    files = {
        "usr/share/doc/bash/copyright": "c",
        "usr/share/doc/bash/README": "r",
        "usr/share/doc/bash/examples/x.sh": "x",
        "usr/share/man/man1/bash.1.gz": "m",
        "usr/share/locale/de/LC_MESSAGES/bash.mo": "l",
        "usr/share/info/bash.info.gz": "i",
        "usr/bin/bash": "#!",
        "var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease": "x",
        "var/cache/apt/pkgcache.bin": "x",
        "var/cache/apt/archives/bash_5.2_amd64.deb": "x",
        "var/log/bootstrap.log": "x",
        "etc/resolv.conf": "nameserver 10.0.0.1",
        "etc/hostname": "buildhost",
        "dev/null": "",
    }
    write_tree(root, files)
    (root / "proc").mkdir()


def test_finish_tree_slim(tmp_path):
    root = tmp_path / "rootfs"
    _fake_rootfs(root)
    rootfs._finish_tree(spec_for("debian:bookworm-slim"), root)
    assert (root / "usr/share/doc/bash/copyright").exists()
    for gone in (
        "usr/share/doc/bash/README",
        "usr/share/doc/bash/examples",
        "usr/share/man/man1",
        "usr/share/locale/de",
        "usr/share/info/bash.info.gz",
        "var/lib/apt/lists/deb.debian.org_dists_bookworm_InRelease",
        "var/cache/apt/pkgcache.bin",
        "var/cache/apt/archives/bash_5.2_amd64.deb",
        "var/log/bootstrap.log",
        "etc/resolv.conf",
        "etc/hostname",
    ):
        assert not (root / gone).exists(), gone
    assert (root / "usr/bin/bash").exists()
    dpkg_cfg = (root / "etc/dpkg/dpkg.cfg.d/docker").read_text()
    assert "path-exclude /usr/share/doc/*" in dpkg_cfg
    assert "path-exclude /usr/share/man/*" in dpkg_cfg
    assert "path-include /usr/share/doc/*/copyright" in dpkg_cfg
    assert "bookworm-updates" in (root / "etc/apt/sources.list").read_text()
    assert (root / "etc/apt/apt.conf.d/docker-clean").exists()
    assert os.access(root / "usr/sbin/policy-rc.d", os.X_OK)
    assert (root / "var/lib/apt/lists/partial").is_dir()


def test_finish_tree_not_slim_keeps_docs(tmp_path):
    root = tmp_path / "rootfs"
    _fake_rootfs(root)
    rootfs._finish_tree(spec_for("debian:bookworm"), root)
    assert (root / "usr/share/doc/bash/README").exists()
    assert (root / "usr/share/man/man1/bash.1.gz").exists()
    assert not (root / "etc/dpkg/dpkg.cfg.d/docker").exists()
    assert not (root / "var/cache/apt/pkgcache.bin").exists()


def test_tar_rootfs_numeric_owners_and_no_dev_contents(tmp_path):
    root = tmp_path / "rootfs"
    _fake_rootfs(root)
    (root / "usr/bin/sh").symlink_to("bash")
    tar_path = tmp_path / "rootfs.tar"
    rootfs._tar_rootfs(root, tar_path)
    with tarfile.open(tar_path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert "./usr/bin/bash" in members
    assert members["./usr/bin/sh"].issym() and members["./usr/bin/sh"].linkname == "bash"
    assert "./dev" in members and "./dev/null" not in members
    assert "./proc" in members
    st = (root / "usr/bin/bash").stat()
    assert (members["./usr/bin/bash"].uid, members["./usr/bin/bash"].gid) == (st.st_uid, st.st_gid)
    assert all(m.uname == "" and m.gname == "" for m in members.values())


# --- cleanup on failure and interruption (real debootstrap, no engine) --------------------------------------

UNREACHABLE = "http://127.0.0.1:1/debian"


def test_failed_debootstrap_raises_with_tail_and_cleans_up(private_tmp):
    _need_debootstrap()
    spec = spec_for("debian:bookworm-slim", mirror=UNREACHABLE)
    lines: list[str] = []
    with pytest.raises(ImgbuildError, match="debootstrap bookworm failed") as exc_info:
        bootstrap_base(object(), spec, progress_print=lines.append)
    assert "E:" in str(exc_info.value) or "127.0.0.1" in str(exc_info.value)
    assert any(line.startswith("total ") for line in lines)
    assert _leftovers(private_tmp) == []


def test_interrupt_during_debootstrap_cleans_up(private_tmp):
    _need_debootstrap()
    spec = spec_for("debian:bookworm-slim", mirror=UNREACHABLE)

    def interrupt_on_debootstrap_output(line: str) -> None:
        if line.startswith("I:") or line.startswith("E:"):
            raise KeyboardInterrupt

    with pytest.raises(Interrupted):
        bootstrap_base(object(), spec, progress_print=interrupt_on_debootstrap_output)
    assert _leftovers(private_tmp) == []


def test_unknown_suite_is_refused_before_debootstrap(private_tmp):
    _need_debootstrap()
    spec = spec_for("imgbuild-test/x:y", suite="no-such-suite", mirror=DEBIAN_MIRROR)
    with pytest.raises(ImgbuildError, match="does not know suite"):
        bootstrap_base(object(), spec, progress_print=lambda _line: None)
    assert _leftovers(private_tmp) == []


# --- the real thing --------------------------------------------------------------------------------------


@pytest.mark.docker
def test_bootstrap_real_image(docker_client, private_tmp):
    _need_debootstrap()
    import docker.errors

    repo = f"imgbuild-test/base-{uuid.uuid4().hex[:8]}"
    name = f"{repo}:bookworm-slim"
    spec = spec_for(name, suite="bookworm", mirror=DEBIAN_MIRROR)
    lines: list[str] = []
    try:
        image_id = bootstrap_base(docker_client, spec, progress_print=lines.append)
        assert image_id.startswith("sha256:")
        image = docker_client.images.get(name)
        assert image.id == image_id
        assert image.attrs["Config"]["Cmd"] == ["bash"]
        assert any(e.startswith("PATH=") and "/usr/bin" in e for e in image.attrs["Config"]["Env"])
        assert any(line.startswith("I: ") for line in lines), "debootstrap output was not streamed"
        assert any(line.startswith("total ") for line in lines)

        out = docker_client.containers.run(image_id, ["cat", "/etc/os-release"], remove=True).decode()
        assert "bookworm" in out
        out = docker_client.containers.run(
            image_id,
            [
                "bash",
                "-c",
                "ls /usr/share/doc/bash; cat /etc/dpkg/dpkg.cfg.d/docker; stat -c '%U:%G %a' /tmp /etc/shadow",
            ],
            remove=True,
        ).decode()
        assert out.splitlines()[0] == "copyright"
        assert "path-exclude /usr/share/doc/*" in out
        assert "root:root 1777" in out and "root:shadow 640" in out
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(name, force=True)
    assert _leftovers(private_tmp) == []
