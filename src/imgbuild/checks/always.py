"""The checks that run for every image, registered under the pseudo-components "image" (the manifest against the
lock, the machine, the recipe's environment, the build's CA bundle, keys, devices) and "platform" (GPUs, where one
is present); `first_executable`, which blocks' checks share."""

from __future__ import annotations

import shlex
from typing import Any

from imgbuild.checks.context import CONTAINER, CheckContext
from imgbuild.checks.registry import check
from imgbuild.checks.results import CheckResult
from imgbuild.checks.verdicts import fail, passed, skip
from imgbuild.core.paths import MANIFEST_PATH

SECRETS_DIR = "/run/secrets"  # where BuildKit mounts build secrets (dockerfile.CA_SECRET_PATH is one of them)
LEGACY_CA_DIR = "/usr/local/share/ca-certificates/imgbuild"  # where builds before BuildKit's secrets put the bundle


# --------------------------------------------------------------------------------------------------------------
# image: the manifest, the environment, keys, the build's CA, devices


@check("manifest", "image")
def manifest_matches_lock(ctx: CheckContext) -> CheckResult:
    """/etc/imgbuild/manifest.json is present and equals the lock (component versions and lock digest)."""
    found, want = ctx.manifest, ctx.expected_manifest
    if found is None:
        if ctx.scope == "host":
            return skip(f"no {MANIFEST_PATH} on this host (not an imgbuild image)")
        return fail(f"no {MANIFEST_PATH} in the image", expected="present", found="missing")
    digest = str(found.get("lock_digest", ""))[:12]
    got = f"lock {digest or '?'}, {len(found.get('components', {}))} components"
    if want is None:
        return skip(ctx.manifest_note or "no lock to compare with", found=got)
    diffs = manifest_diffs(want, found)
    expected = f"lock {str(want.get('lock_digest', ''))[:12]}, {len(want.get('components', {}))} components"
    if diffs:
        return fail("; ".join(diffs), expected=expected, found=got, differences=diffs)
    return passed(expected, got, ctx.manifest_note)


def manifest_diffs(want: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """What differs between the lock's manifest and the image's, one line each (empty when equal)."""
    diffs = []
    for key in ("recipe", "lock_digest"):
        if want.get(key) != found.get(key):
            diffs.append(f"{key}: lock {want.get(key)!r}, image {found.get(key)!r}")
    # Which of the recipe's architectures: a manifest written before platform.arch existed is amd64's (its default).
    if want.get("arch", "amd64") != found.get("arch", "amd64"):
        diffs.append(f"arch: expected {want.get('arch', 'amd64')!r}, image {found.get('arch', 'amd64')!r}")
    wc, fc = want.get("components", {}), found.get("components", {})
    for name in sorted(set(wc) | set(fc)):
        if name not in fc:
            diffs.append(f"{name}: in the lock, not in the image")
        elif name not in wc:
            diffs.append(f"{name}: in the image, not in the lock")
        elif wc[name].get("version") != fc[name].get("version"):
            diffs.append(f"{name}: lock {wc[name].get('version')}, image {fc[name].get('version')}")
    if want.get("env") != found.get("env"):
        diffs.append(f"env: lock {want.get('env')}, image {found.get('env')}")
    return diffs


@check("machine", "image")
def machine_matches(ctx: CheckContext) -> CheckResult:
    """`uname -m` is the machine of the manifest's architecture (aarch64 for arm64, run under QEMU on x86 hosts)."""
    if ctx.machine is None:
        return skip("no manifest says which architecture this is")
    ran = ctx.run("uname -m")
    found = ran.out.strip()
    if not ran.ok or not found:
        return fail(f"uname -m failed: {ran.why()}", expected=ctx.machine)
    if found != ctx.machine:
        return fail(f"uname -m says {found}, the manifest's architecture is {ctx.machine}", ctx.machine, found)
    return passed(ctx.machine, found)


@check("env", "image", scopes=CONTAINER)
def recipe_env(ctx: CheckContext) -> CheckResult:
    """The recipe's environment variables (the manifest's `env`) are set in the container."""
    source = ctx.expected_manifest or ctx.manifest or {}
    want: dict[str, str] = {str(k): str(v) for k, v in source.get("env", {}).items()}
    if not want:
        return skip("the recipe sets no environment variables")
    ran = ctx.run("env")
    if not ran.ok:
        return fail(f"env failed: {ran.why()}")
    have = dict(line.split("=", 1) for line in ran.out.splitlines() if "=" in line)
    wrong = [f"{k}={have.get(k, '(unset)')}" for k, v in want.items() if have.get(k) != v]
    expected = ", ".join(f"{k}={v}" for k, v in want.items())
    if wrong:
        return fail(f"not as the recipe sets: {', '.join(wrong)}", expected=expected, found=", ".join(wrong))
    return passed(expected, f"{len(want)} set")


@check("ca-bundle-absent", "image", scopes=CONTAINER)
def ca_bundle_absent(ctx: CheckContext) -> CheckResult:
    """The build's CA bundle (a build secret, mounted only while a RUN downloads) did not reach the image: nothing
    under /run/secrets but empty mount points, no folder of extra CA certificates, and no environment variable of
    the image naming a path under /run/secrets (a tool pointed at a secret that is not there)."""
    ran = ctx.run(
        f"find {SECRETS_DIR} -mindepth 1 ! -empty 2>/dev/null | head -n 20 | sed 's/^/file /'; "
        f"if [ -e {LEGACY_CA_DIR} ]; then echo 'file {LEGACY_CA_DIR}'; fi; "
        f"env | grep -F '{SECRETS_DIR}/' | cut -d= -f1 | sed 's/^/env /'; echo done"
    )
    if not ran.out.rstrip().endswith("done"):
        return fail(f"could not look for the CA bundle: {ran.why()}", expected="absent")
    lines = ran.out.splitlines()
    files = [line[5:] for line in lines if line.startswith("file ")]
    env = [line[4:] for line in lines if line.startswith("env ")]
    problems = ([f"in the image: {', '.join(files)}"] if files else []) + (
        [f"the image's environment names {SECRETS_DIR}: {', '.join(env)}"] if env else []
    )
    if problems:
        return fail(
            f"the build's CA bundle leaked: {'; '.join(problems)}", expected="absent", found="; ".join(problems)
        )
    return passed("absent", "absent", f"nothing under {SECRETS_DIR}, no variable naming it")


@check("no-keys-in-image", "image", scopes=CONTAINER)
def no_keys_in_image(ctx: CheckContext) -> CheckResult:
    """No ssh host keys, no id_* private keys and no PEM private key anywhere in the image itself."""
    if ctx.image_scan is None:
        return skip("the image's own filesystem was not scanned")
    scan = ctx.image_scan()
    if scan.error:
        return fail(f"could not scan the image: {scan.error}", expected="no keys")
    if scan.files:
        shown = ", ".join(scan.files[:5]) + (f" (+{len(scan.files) - 5} more)" if len(scan.files) > 5 else "")
        return fail(f"key material baked into the image: {shown}", "no keys", shown, files=list(scan.files))
    return passed("no keys", "none found")


@check("devices", "image", scopes=CONTAINER)
def devices_visible(ctx: CheckContext) -> CheckResult:
    """The devices passed to the container (--device, EFA uverbs) are visible in it."""
    if not ctx.devices:
        return skip("no devices passed (--device, or the recipe's EFA devices on an EFA host)")
    paths = " ".join(shlex.quote(d) for d in ctx.devices)
    ran = ctx.run(f'for d in {paths}; do [ -e "$d" ] || echo "$d"; done')
    missing = [line for line in ran.out.split() if line]
    if missing:
        return fail(f"not visible in the container: {', '.join(missing)}", ", ".join(ctx.devices), "missing")
    return passed(", ".join(ctx.devices), "all visible")


def first_executable(ctx: CheckContext, candidates: list[str], name: str) -> str | None:
    """The first of `candidates` (shell words, may use $VARS) that is executable, else `name` on PATH."""
    words = " ".join(f'"{c}"' for c in candidates)
    ran = ctx.run(f'for f in {words} "$(command -v {name})"; do [ -n "$f" ] && [ -x "$f" ] && echo "$f" && exit 0; '
                  "done; exit 1")  # fmt: skip
    return ran.out.strip().splitlines()[0] if ran.ok and ran.out.strip() else None


# --------------------------------------------------------------------------------------------------------------
# GPUs (only where one is present)


@check("gpu-nvidia-smi", "platform")
def gpu_nvidia_smi(ctx: CheckContext) -> CheckResult:
    """nvidia-smi lists the GPUs."""
    if not ctx.gpu:
        return skip(ctx.gpu_reason)
    ran = ctx.run("nvidia-smi -L")
    gpus = [line for line in ran.out.splitlines() if line.startswith("GPU ")]
    if not ran.ok or not gpus:
        return fail(f"nvidia-smi -L: {ran.why()}", expected=">= 1 GPU", found="none")
    return passed(">= 1 GPU", f"{len(gpus)} GPU(s): {gpus[0].split('(')[0].strip()}", gpus=gpus)
