"""gdrcopy: GDRCopy's user-space library (libgdrapi), built from its release; the gdrdrv module is the host's.

Step 4 of AWS's EFA + NCCL guide: NCCL and aws-ofi-nccl use it for low-latency copies to and from GPU memory
(aws-ofi-nccl 1.21's GPU-initiated path needs >= 2.5; that rule is the plugin's).
"""

from __future__ import annotations

import shlex

import imgbuild.blocks._releases as releases
from imgbuild.blocks._block import Block, Downloads, Released
from imgbuild.blocks._core import Context, Contribution, FromTag, Installed, Pin, Resolution, tag_artifact
from imgbuild.checks import CheckContext, check, fail, ldd_missing, passed, skip
from imgbuild.checks.results import CheckResult
from imgbuild.core.fields import AbsPath, Strict, pin_validator


class GdrCopy(Strict):
    """GDRCopy's user-space library, built against the base image's CUDA."""

    version: str
    """The release tag without its `v` (e.g. 2.5.1)."""
    prefix: AbsPath = "/opt/gdrcopy"
    """Where it installs: `lib/libgdrapi.so*` (on LD_LIBRARY_PATH), `include/gdrapi.h`."""
    _pin = pin_validator("version")


# The library needs the host's gdrdrv device in the container. ONE rule, contributed here: the image's ENV sets
# NVIDIA_GDRCOPY=enabled, which the NVIDIA container toolkit (>= 1.15) reads from the container's environment (image
# ENV included) to inject /dev/gdrdrv (NVIDIA/gdrcopy#291; the runtime's feature-gated modifier,
# nvidia-container-toolkit internal/modifier/gated.go). Where the host has no gdrdrv the toolkit's GDRCopy
# discoverer finds no device and adds nothing, without an error (internal/discover/gdrcopy_test.go: "empty rootfs
# returns no devices"), so containers still start there. `imgbuild run` and verify also pass `--device
# /dev/gdrdrv` where the host has it (runtime.host_devices; plain `--gpus` through runc has no gated modifier);
# CDI edits replace a device of the same path, so the two don't clash. On Kubernetes the pods get the variable
# from the image ENV; pyxis/enroot's nvidia hook binds /dev/gdrdrv itself for compute containers (nofail).
GDRDRV = "/dev/gdrdrv"


def source_url(version: str) -> str:
    """GDRCopy's release: GitHub's archive of its tag (the one place its URL is written)."""
    return f"https://github.com/NVIDIA/gdrcopy/archive/refs/tags/v{version}.tar.gz"


class GdrcopyBlock(Block, Downloads, Released):
    name = "gdrcopy"
    options = GdrCopy
    modes = {"release": "fragment"}
    details = FromTag
    build_after = ("cuda",)
    template_globals = {"gdrcopy_source_url": source_url}
    artifact = tag_artifact(source_url)

    def resolve(self, g: GdrCopy, rs: Resolution) -> Pin:
        if rs.recipe.cuda is None:
            raise rs.fail("components.gdrcopy", "GDRCopy builds against CUDA (an nvidia platform)")
        commit = rs.tag_commit("gdrcopy", g.version, source_url(g.version))
        return Pin(
            version=g.version, source="release", origin="recipe", details=FromTag(prefix=g.prefix, commit=commit)
        )

    def contribute(self, pin: Pin, ctx: Context) -> Contribution:
        c = Contribution(name="gdrcopy")
        c.builder_packages |= {"curl", "ca-certificates", "build-essential"}
        c.ld_library_path.append(f"{pin.typed(Installed).prefix}/lib")
        c.env["NVIDIA_GDRCOPY"] = "enabled"
        c.host_devices.append(GDRDRV)
        return c

    def downloads(self, pin: Pin, ctx: Context) -> list[str]:
        return [source_url(str(pin.version))]

    def release_file(self) -> releases.ReleaseFile:
        return releases.tag_file("gdrcopy")


BLOCK = GdrcopyBlock()


@check("gdrcopy-library", "gdrcopy")
def gdrcopy_library(ctx: CheckContext) -> CheckResult:
    """libgdrapi.so.2 is in the GDRCopy prefix and `ldd` resolves all its libraries."""
    prefix = ctx.details("gdrcopy").prefix
    lib = f"{prefix}/lib/libgdrapi.so.2"
    ldd = ctx.run(f"ldd {shlex.quote(lib)}")
    if not ldd.ok:
        return fail(f"ldd {lib}: {ldd.why()}", expected=lib, found="missing")
    missing = ldd_missing(ldd.out)
    if missing:
        return fail(f"{lib}: {', '.join(missing)} not found", expected="resolves", found=lib)
    return passed(lib, "resolves")


@check("gdrcopy-device", "gdrcopy")
def gdrcopy_device(ctx: CheckContext) -> CheckResult:
    """/dev/gdrdrv (the host's gdrdrv module) is in the container: passed where the host has it, else skipped."""
    ran = ctx.run(f"test -c {GDRDRV} && echo present || echo absent")
    if "present" in ran.out:
        return passed(GDRDRV, "present")
    if GDRDRV in ctx.devices:
        return fail(f"{GDRDRV} was passed to the container but is not a character device in it", GDRDRV, "missing")
    return skip(f"no {GDRDRV}: the host has no gdrdrv module loaded, so GDRCopy is not used here", GDRDRV)
