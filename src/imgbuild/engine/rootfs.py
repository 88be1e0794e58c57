"""Offline base images: a root filesystem for `debian:*` / `ubuntu:*` made with debootstrap, imported to the engine.

Used where no container registry can be reached (CI machines behind a proxy that only lets Debian's
archive through). `bootstrap_base()` runs debootstrap into a temporary directory, trims the tree like the
official images do (the "-slim" names drop docs, man pages and locales), writes the apt sources, packs the
tree with numeric owners and imports it with `docker import`. The temporary tree and tarball are always
removed, on failure and on Ctrl-C too, after unmounting anything debootstrap left mounted inside it.
Its command line is `imgbuild base bootstrap NAME [--suite S] [--mirror M] [--variant V] [--platform P]`.

Another architecture (`--platform linux/arm64` on an x86 machine) is bootstrapped with `debootstrap --arch`, its
second stage running under QEMU (binfmt_misc's qemu-aarch64, which scripts/setup.sh enables), and named
`NAME-<arch>` in the engine (imgbuild.pin.content.local_ref: the engine keeps one image per name). It is loaded as a
docker-archive whose config records the architecture: `docker import --platform` on engine 20.10 still records the
engine's own, and BuildKit then looks a `FROM` of the wrong architecture up on Docker Hub instead of the local store.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from imgbuild.core import imageref, platforms, validate
from imgbuild.core.errors import BuildError, Interrupted, UsageError
from imgbuild.pin.content import local_ref, sha256_file

DEBIAN_MIRROR = "http://deb.debian.org/debian"
UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
TEMP_PREFIX = "imgbuild-bootstrap-"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VARIANTS = ("minbase", "buildd", "default")

Distro = Literal["debian", "ubuntu"]

DEBIAN_VERSIONS = {"10": "buster", "11": "bullseye", "12": "bookworm", "13": "trixie"}
UBUNTU_VERSIONS = {"18.04": "bionic", "20.04": "focal", "22.04": "jammy", "24.04": "noble"}
DEBIAN_SUITES = frozenset(DEBIAN_VERSIONS.values()) | {"sid", "unstable", "testing", "stable"}
UBUNTU_SUITES = frozenset(UBUNTU_VERSIONS.values())

# What Debian's slim images keep out of the tree, and the dpkg config that keeps it out on later installs
# (the same lists as debuerreotype-slimify).
SLIM_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/groff/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
)
SLIM_INCLUDES = ("/usr/share/doc/*/copyright",)

# The "minimizing config" every official Debian/Ubuntu image carries (debuerreotype-minimizing-config).
APT_CONFIG = {
    "etc/apt/apt.conf.d/docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb'
        ' /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb'
        ' /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
    ),
    "etc/apt/apt.conf.d/docker-autoremove-suggests": ('Apt::AutoRemove::SuggestsImportant "false";\n'),
    "etc/apt/apt.conf.d/docker-no-languages": 'Acquire::Languages "none";\n',
    "etc/apt/apt.conf.d/docker-gzip-indexes": (
        'Acquire::GzipIndexes "true";\nAcquire::CompressionTypes::Order:: "gz";\n'
    ),
    "etc/dpkg/dpkg.cfg.d/docker-apt-speedup": "force-unsafe-io\n",
}
POLICY_RC_D = "#!/bin/sh\n# Services cannot be started during `docker build`; tell invoke-rc.d not to try.\nexit 101\n"

ProgressPrint = Callable[[str], Any]

# What NAME, --suite and --mirror may be (checked before debootstrap runs, as root, for minutes): Docker's reference
# grammar (validate.image_ref) without a digest (`docker import` takes a name and a tag), a suite name debootstrap has
# a script for, and an archive URL without spaces or control characters (it is written into the image's
# sources.list, one line).
_SUITE_RE = re.compile(r"[a-z][a-z0-9.-]{0,63}", re.ASCII)
_MIRROR_RE = re.compile(r"(https?|file)://[!-~]+", re.ASCII)


class BootstrapError(BuildError):
    """debootstrap could not make the tree (not installed, not root, a failed run) or its mounts stay behind."""


@dataclass(frozen=True)
class BaseSpec:
    """What to bootstrap: the image name to create and where its packages come from."""

    name: str
    distro: Distro
    suite: str
    mirror: str
    variant: str = "minbase"
    slim: bool = False
    arch: str = platforms.DEFAULT_ARCH  # platform.arch's name (amd64, arm64): debootstrap --arch and the image's config

    @property
    def image_name(self) -> str:
        """The name the engine holds the image under: NAME, or NAME-<arch> for another architecture's copy."""
        return local_ref(self.name, self.arch)

    @property
    def repository(self) -> str:
        return split_name(self.image_name)[0]

    @property
    def tag(self) -> str:
        return split_name(self.image_name)[1]


def split_name(name: str) -> tuple[str, str]:
    """`repo[:tag]` -> (repo, tag); a colon that is part of a registry's host:port is not a tag (core/imageref)."""
    parsed = imageref.parse(name, where="the image name", error=UsageError)
    return parsed.repository, parsed.tag or "latest"


def _distro_of_repo(repo: str) -> Distro | None:
    short = repo.removeprefix("docker.io/").removeprefix("library/")
    if short == "debian":
        return "debian"
    if short == "ubuntu":
        return "ubuntu"
    return None


def spec_for(
    name: str,
    *,
    suite: str | None = None,
    mirror: str | None = None,
    variant: str = "minbase",
    arch: str = platforms.DEFAULT_ARCH,
) -> BaseSpec:
    """Work out suite, mirror and trimming for an image name such as `debian:bookworm-slim`.

    debian:bookworm, debian:12 (each also -slim), ubuntu:22.04 / ubuntu:jammy are known; `suite` and
    `mirror` override what the name implies. A name that is neither debian nor ubuntu needs both. `arch`
    (platform.arch's names; platforms.parse_platform reads `--platform linux/arm64`) picks the architecture.
    """
    name = name.strip()
    if arch not in platforms.MACHINE:
        raise UsageError(f"unknown architecture {validate.shown(arch)}; use one of {', '.join(platforms.MACHINE)}")
    if not _image_name(name):
        raise UsageError(
            f"not an image name: {validate.shown(name)}; expected [REGISTRY/]REPOSITORY[:TAG] in lowercase "
            "(Docker's reference grammar, no digest), e.g. debian:bookworm-slim"
        )
    if variant not in VARIANTS:
        raise UsageError(f"unknown debootstrap variant {validate.shown(variant)}; use one of {', '.join(VARIANTS)}")
    if suite is not None and not _SUITE_RE.fullmatch(suite):
        raise UsageError(
            f"not a suite name: {validate.shown(suite)}; expected a distribution's suite, e.g. bookworm, jammy"
        )
    if mirror is not None and not _MIRROR_RE.fullmatch(mirror):
        raise UsageError(
            f"--mirror must be an http(s):// or file:// URL without spaces, got {validate.shown(mirror)}",
            hint=f"e.g. --mirror {DEBIAN_MIRROR}",
        )
    repo, tag = split_name(name)
    slim = tag.endswith("-slim")
    version = tag.removesuffix("-slim")
    distro = _distro_of_repo(repo)

    if distro is None:
        if not suite or not mirror:
            raise UsageError(
                f"cannot tell which distribution {name!r} is",
                hint=f"give both --suite and --mirror, e.g. --suite bookworm --mirror {DEBIAN_MIRROR}",
            )
        ubuntu = suite in UBUNTU_SUITES or (suite not in DEBIAN_SUITES and "ubuntu" in mirror)
        distro = "ubuntu" if ubuntu else "debian"
    elif suite is None:
        table = DEBIAN_VERSIONS if distro == "debian" else UBUNTU_VERSIONS
        known = DEBIAN_SUITES if distro == "debian" else UBUNTU_SUITES
        if version in table:
            suite = table[version]
        elif version in known:
            suite = version
        else:
            raise UsageError(
                f"cannot tell which {distro} suite {name!r} is",
                hint="give --suite (and --mirror for a non-default archive); known tags: "
                + ", ".join(sorted([*table, *known])),
            )
    if mirror is None:
        mirror = DEBIAN_MIRROR if distro == "debian" else UBUNTU_MIRROR
    return BaseSpec(
        name=name, distro=distro, suite=suite, mirror=mirror.rstrip("/"), variant=variant, slim=slim, arch=arch
    )


def can_bootstrap(name: str) -> bool:
    """Whether `imgbuild base bootstrap NAME` works without --suite/--mirror."""
    try:
        spec_for(name)
    except UsageError:
        return False
    return True


def _image_name(name: str) -> bool:
    """Whether `name` is an image reference with no digest (Docker's grammar, validate.image_ref)."""
    try:
        validate.image_ref(name)
    except ValueError:
        return False
    return "@" not in name


def sources_list(spec: BaseSpec) -> str:
    """The apt sources of the new image, all from the given mirror (plus Debian's security archive)."""
    lines = [f"deb {spec.mirror} {spec.suite} main"]
    if spec.suite not in ("sid", "unstable"):
        lines.append(f"deb {spec.mirror} {spec.suite}-updates main")
        if spec.distro == "ubuntu":
            lines.append(f"deb {spec.mirror} {spec.suite}-security main")
        elif spec.mirror == DEBIAN_MIRROR:
            lines.append(f"deb {DEBIAN_MIRROR}-security {spec.suite}-security main")
    return "\n".join(lines) + "\n"


# --- mounts -------------------------------------------------------------------------------------------


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, deepest first."""
    root = str(path.resolve())
    found: list[str] = []
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _unmount_all(path: Path) -> list[str]:
    """Unmount everything below `path`; returns what could not be unmounted."""
    for point in _mounts_under(path):
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)
    return _mounts_under(path)


def _remove_tree(path: Path, progress_print: ProgressPrint) -> None:
    if not path.exists():
        return
    left = _unmount_all(path)
    if left:
        # Never rm -rf through a bind mount of the host's /dev or /proc.
        progress_print(f"warning: {path} still has mounts ({', '.join(left)}); not removed")
        return
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # read-only or immutable leftovers
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True)


# --- steps --------------------------------------------------------------------------------------------


def _debootstrap(spec: BaseSpec, rootfs: Path, progress_print: ProgressPrint) -> None:
    exe = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)), None
    )
    if exe is None:
        raise BootstrapError("debootstrap is not installed", hint="apt-get install debootstrap (or scripts/setup.sh)")
    scripts = Path(os.environ.get("DEBOOTSTRAP_DIR", "/usr/share/debootstrap")) / "scripts"
    if scripts.is_dir() and not (scripts / spec.suite).exists():
        raise BootstrapError(
            f"this debootstrap does not know suite {spec.suite!r}",
            hint="upgrade debootstrap (apt-get install -t <newer suite> debootstrap)",
        )
    cmd = [exe]
    if spec.variant != "default":
        cmd.append(f"--variant={spec.variant}")
    if spec.arch != host_arch():
        _check_emulation(spec.arch)
        cmd.append(f"--arch={spec.arch}")
    cmd += [spec.suite, str(rootfs), spec.mirror]
    progress_print("$ " + validate.redact(" ".join(cmd)))  # a mirror URL may hold a password
    env = {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}
    tail: collections.deque[str] = collections.deque(maxlen=30)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            progress_print(line)
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if rc != 0:
        hint = None
        if spec.distro == "ubuntu" and not Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg").exists():
            hint = "bootstrapping Ubuntu needs Ubuntu's archive keyring (apt-get install ubuntu-keyring)"
        raise BootstrapError(f"debootstrap {spec.suite} failed (exit {rc}):\n" + "\n".join(tail), hint=hint)


def host_arch() -> str:
    """This machine's architecture in platform.arch's names (amd64, arm64); `uname -m` where it is neither."""
    import platform

    machine = platform.machine()
    return next((arch for arch, m in platforms.MACHINE.items() if m == machine), machine)


BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")


def emulation_problem(arch: str) -> str | None:
    """Why this machine cannot run `arch`'s binaries (None: it is its own architecture, or binfmt_misc hands them to
    QEMU with the F flag, so that containers and chroots, which lack the interpreter, run them too)."""
    if arch == host_arch():
        return None
    machine = platforms.MACHINE[arch]
    entry = BINFMT_DIR / f"qemu-{machine}"
    try:
        lines = entry.read_text().splitlines()
    except OSError:
        where = "binfmt_misc is not mounted" if not (BINFMT_DIR / "status").exists() else f"{entry} does not exist"
        return f"{platforms.docker_platform(arch)} binaries cannot run here: {where}"
    if "enabled" not in lines:
        return f"{platforms.docker_platform(arch)} binaries cannot run here: {entry} is disabled"
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    if "F" not in flags:
        return f"{entry} lacks the F flag: containers and chroots cannot find its interpreter"
    return None


def emulation_hint(arch: str) -> str:
    """How to make this machine run `arch`'s binaries (what scripts/setup.sh does)."""
    return (
        "run scripts/setup.sh, or: apt-get install qemu-user-static binfmt-support; mount -t binfmt_misc "
        f"binfmt_misc /proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-{platforms.MACHINE[arch]}"
    )


def _check_emulation(arch: str) -> None:
    if problem := emulation_problem(arch):
        raise BootstrapError(problem, hint=emulation_hint(arch))


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _clear(directory: Path, pattern: str = "*") -> None:
    for p in directory.glob(pattern):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _slimify(rootfs: Path) -> None:
    import fnmatch

    for pattern in SLIM_EXCLUDES:
        top = rootfs / pattern.lstrip("/").removesuffix("/*")
        if not top.is_dir():
            continue
        for dirpath, _dirs, files in os.walk(top, topdown=False):
            for f in files:
                full = Path(dirpath, f)
                rel = "/" + str(full.relative_to(rootfs))
                if any(fnmatch.fnmatch(rel, keep) for keep in SLIM_INCLUDES):
                    continue
                full.unlink(missing_ok=True)
            if Path(dirpath) != top:
                with contextlib.suppress(OSError):  # only when empty: keeps dirs of kept copyright files
                    os.rmdir(dirpath)
    lines = [
        '# This is the "slim" variant of the base image. Files that containers do not need are',
        "# excluded, and this configuration keeps them out on every later package install.",
    ]
    lines += [f"path-exclude {p}" for p in SLIM_EXCLUDES]
    lines += ["# copyright files are kept for legal reasons"]
    lines += [f"path-include {p}" for p in SLIM_INCLUDES]
    _write(rootfs / "etc/dpkg/dpkg.cfg.d/docker", "\n".join(lines) + "\n")


def _finish_tree(spec: BaseSpec, rootfs: Path) -> None:
    if spec.slim:
        _slimify(rootfs)
    for rel, text in APT_CONFIG.items():
        _write(rootfs / rel, text)
    policy = rootfs / "usr/sbin/policy-rc.d"
    if not policy.exists():
        _write(policy, POLICY_RC_D, 0o755)
    (rootfs / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
    for stale in (rootfs / "etc/apt/sources.list.d").glob("*.sources"):
        stale.unlink()
    _write(rootfs / "etc/apt/sources.list", sources_list(spec))
    # apt lists and caches, debootstrap's .debs, logs, and host files docker provides at run time.
    _clear(rootfs / "var/lib/apt/lists")
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    _clear(rootfs / "var/cache/apt", "*.bin")
    _clear(rootfs / "var/cache/apt/archives", "*.deb")
    _clear(rootfs / "var/cache/apt/archives/partial")
    _clear(rootfs / "var/log/apt")
    for rel in (
        "var/log/dpkg.log",
        "var/log/bootstrap.log",
        "var/log/alternatives.log",
        "var/cache/ldconfig/aux-cache",
        "etc/resolv.conf",
        "etc/hostname",
    ):
        (rootfs / rel).unlink(missing_ok=True)
    _write(rootfs / "etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    machine_id = rootfs / "etc/machine-id"
    if machine_id.exists():
        machine_id.write_text("")


def _tar_rootfs(rootfs: Path, tar_path: Path) -> None:
    """Pack the tree as `docker import` wants it: numeric owners, no /dev, /proc, /sys contents."""
    skip = {"dev", "proc", "sys"}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = info.name.split("/")
        if len(parts) > 2 and parts[1] in skip:  # "./dev/null" -> [".", "dev", "null"]
            return None
        info.uname = info.gname = ""
        return info

    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(str(rootfs), arcname=".", recursive=True, filter=keep)


def _import(client: Any, spec: BaseSpec, tar_path: Path) -> str:
    from imgbuild.engine.client import ENGINE_ERRORS, engine_error

    if spec.arch != platforms.DEFAULT_ARCH:
        return _load(client, spec, tar_path)
    changes = ['CMD ["bash"]', f"ENV PATH={IMAGE_PATH}"]
    try:
        client.api.import_image(src=str(tar_path), repository=spec.repository, tag=spec.tag, changes=changes)
        return str(client.images.get(f"{spec.repository}:{spec.tag}").id)
    except ENGINE_ERRORS as exc:
        raise engine_error(exc, f"importing {spec.name}") from exc


def image_config(spec: BaseSpec, diff_id: str) -> dict[str, Any]:
    """The image config of a one-layer base (what `docker import` writes, with `spec.arch` as its architecture)."""
    return {
        "architecture": spec.arch,
        "os": "linux",
        "config": {"Cmd": ["bash"], "Env": [f"PATH={IMAGE_PATH}"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [
            {"created_by": f"imgbuild base bootstrap {spec.name} --platform {platforms.docker_platform(spec.arch)}"}
        ],
    }


def _load(client: Any, spec: BaseSpec, tar_path: Path) -> str:
    """`docker load` the tree as a docker-archive whose config records spec.arch (`docker import --platform` on engine
    20.10 records the engine's architecture whatever it is told)."""
    import hashlib
    import io
    import json

    from imgbuild.engine.client import ENGINE_ERRORS, engine_error

    layer_hex = sha256_file(tar_path)
    config = json.dumps(image_config(spec, f"sha256:{layer_hex}"), sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [spec.image_name], "Layers": [f"{layer_hex}/layer.tar"]}]
    archive = tar_path.with_name("image.tar")
    try:
        with tarfile.open(archive, "w") as tar:
            for name, data in ((config_name, config), ("manifest.json", json.dumps(manifest).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            tar.add(str(tar_path), arcname=f"{layer_hex}/layer.tar")
        tar_path.unlink()  # the archive holds it now: one copy on disk, not two
        with archive.open("rb") as f:
            client.images.load(f)
        image = client.images.get(spec.image_name)
    except ENGINE_ERRORS as exc:
        raise engine_error(exc, f"loading {spec.image_name}") from exc
    recorded = image.attrs.get("Architecture")
    if recorded != spec.arch:
        raise BootstrapError(f"the engine recorded {spec.image_name} as {recorded}, not {spec.arch}")
    return str(image.id)


def bootstrap_base(client: Any, spec: BaseSpec, *, progress_print: ProgressPrint = print) -> str:
    """Create image `spec.name` from scratch with debootstrap; returns the new image's id."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise BootstrapError("debootstrap needs root", hint="run as root (sudo imgbuild base bootstrap ...)")
    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    rootfs = workdir / "rootfs"
    tar_path = workdir / "rootfs.tar"
    try:
        progress_print(
            f"bootstrapping {spec.image_name}: {spec.distro} {spec.suite} ({spec.variant}"
            f"{', slim' if spec.slim else ''}, {platforms.docker_platform(spec.arch)}) from {spec.mirror}"
        )
        rootfs.mkdir()
        _debootstrap(spec, rootfs, progress_print)
        t1 = time.monotonic()
        progress_print(f"debootstrap done in {t1 - t0:.1f}s")
        left = _unmount_all(rootfs)
        if left:
            raise BootstrapError(f"debootstrap left mounts behind that cannot be unmounted: {', '.join(left)}")
        _finish_tree(spec, rootfs)
        _tar_rootfs(rootfs, tar_path)
        size_mb = tar_path.stat().st_size / 1e6
        t2 = time.monotonic()
        progress_print(f"trimmed and packed {size_mb:.0f} MB in {t2 - t1:.1f}s; importing {spec.image_name}")
        image_id = _import(client, spec, tar_path)
        progress_print(f"imported {spec.image_name} as {image_id[:19]} in {time.monotonic() - t2:.1f}s")
        return image_id
    except KeyboardInterrupt as exc:
        raise Interrupted("bootstrap interrupted; temporary files removed") from exc
    finally:
        _remove_tree(workdir, progress_print)
        progress_print(f"total {time.monotonic() - t0:.1f}s")
