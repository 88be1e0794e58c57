#!/usr/bin/env bash
# Prepare a fresh Debian/Ubuntu machine (as root) to build imgbuild images and to test imgbuild.
#
#   bash scripts/setup.sh          everything the tests need (scripts/test.sh, .ci/run)
#   bash scripts/setup.sh --main   only what the main job needs (scripts/main.sh): the engine, debootstrap,
#                                  iproute2 and openssh-client, the package without its dev extra, and the base image
#                                  the cpu recipe starts from
#
#   1. a running Docker engine (docker.io from the distribution; dockerd started in the background when
#      there is no init system to do it),
#   2. debootstrap, iproute2 and openssh-client (ssh-keygen for the multi-node runs); for the tests also
#      docker-registry, docker-compose, shellcheck and gcc, and for linux/arm64 images
#      (`imgbuild build cpu --platform linux/arm64`) qemu-user-static and binfmt-support, binfmt_misc mounted and
#      qemu-aarch64 enabled. The arm64 base is not made here: the arm64 tests bootstrap it when the engine lacks it,
#      as `imgbuild base bootstrap debian:bookworm-slim --platform linux/arm64` does (about 2.5 min under QEMU),
#   3. this repository installed with `pip install -e ".[dev]"` (`-e .` with --main),
#   4. the base images, bootstrapped offline with debootstrap when the engine does not have them,
#   5. for the SageMaker local-mode test (tests/test_sagemaker_sdk.py): docker-compose from the distribution and
#      the SageMaker Python SDK 2.x in a virtual environment of its own (it pins versions, e.g. packaging<25,
#      that this project's environment must not be held to). Not with --main.
# Idempotent: every step checks first and does nothing when its work is already done. Needs no TTY.
#
# Environment:
#   PYTHON                 interpreter to install into (default: python3)
#   IMGBUILD_BASE_IMAGES   base images to ensure, space-separated (default: debian:bookworm-slim debian:trixie-slim;
#                          the debian-cuda recipe starts from trixie; with --main: debian:bookworm-slim)
#   IMGBUILD_SKIP_BASE=1   skip step 4
#   IMGBUILD_SKIP_ARM64=1  skip the linux/arm64 emulation (refused when CI=true: CI builds arm64)
#   IMGBUILD_MIRROR        Debian archive mirror for debootstrap (default: the tool's own default)
#   DOCKERD_LOG            where a dockerd started here logs (default: /var/log/imgbuild-dockerd.log)
#   IMGBUILD_SAGEMAKER_SDK_VENV  the SDK's virtual environment (default: /opt/imgbuild/sagemaker-sdk2; the
#                          test reads the same variable with the same default)
set -Eeuo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
main_only=0
case "${1:-}" in
--main) main_only=1 ;;
"") ;;
*)
    printf 'setup.sh: error: unknown argument %q (usage: setup.sh [--main])\n' "$1" >&2
    exit 2
    ;;
esac
if ((main_only)); then
    BASE_IMAGES="${IMGBUILD_BASE_IMAGES:-debian:bookworm-slim}"
else
    BASE_IMAGES="${IMGBUILD_BASE_IMAGES:-debian:bookworm-slim debian:trixie-slim}"
fi
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/imgbuild-dockerd.log}"
DOCKER_SOCK="/var/run/docker.sock"
SDK_VENV="${IMGBUILD_SAGEMAKER_SDK_VENV:-/opt/imgbuild/sagemaker-sdk2}"
SDK_REQUIREMENT="sagemaker>=2.257,<3"
export DEBIAN_FRONTEND=noninteractive
export PIP_ROOT_USER_ACTION=ignore

T_START=$(date +%s)
STEP=""
STEP_T0=0
APT_UPDATED=0

log() { printf '%s\n' "$*"; }
die() {
    printf 'setup.sh: error: %s\n' "$*" >&2
    exit 1
}
step() {
    STEP="$1"
    STEP_T0=$(date +%s)
    log "==> ${STEP}"
}
step_done() {
    log "    ${1:-done} ($(($(date +%s) - STEP_T0))s)"
    STEP=""
}
on_error() {
    local rc=$? line=$1
    if [[ -n "${STEP}" ]]; then
        printf 'setup.sh: step "%s" failed (exit %s, line %s) after %ss\n' \
            "${STEP}" "${rc}" "${line}" "$(($(date +%s) - STEP_T0))" >&2
    fi
    exit "${rc}"
}
trap 'on_error ${LINENO}' ERR

have() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" || -x "/sbin/$1" ]]; }

apt_install() {
    have apt-get || die "apt-get not found: this script supports Debian/Ubuntu only (install $* by hand)"
    if [[ "${APT_UPDATED}" == 0 ]]; then
        log "    apt-get update"
        apt-get -o DPkg::Lock::Timeout=300 update -qq
        APT_UPDATED=1
    fi
    log "    apt-get install $*"
    local apt_log
    apt_log=$(mktemp /tmp/imgbuild-setup-apt.XXXXXX)
    if ! apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "$@" >"${apt_log}" 2>&1; then
        tail -n 25 "${apt_log}" >&2
        rm -f "${apt_log}"
        die "apt-get install $* failed"
    fi
    rm -f "${apt_log}"
}

docker_answers() { timeout 20 docker info >/dev/null 2>&1; }

[[ "${EUID}" -eq 0 ]] || die "run as root (it installs packages and starts dockerd): sudo $0"

cd "${REPO_ROOT}"
if ((main_only)); then
    log "imgbuild setup in ${REPO_ROOT} (--main: what scripts/main.sh needs)"
else
    log "imgbuild setup in ${REPO_ROOT}"
fi

# --- 1. Docker engine ----------------------------------------------------------------------------------
step "docker engine"
if have docker && docker_answers; then
    step_done "already running: $(docker version --format 'Docker {{.Server.Version}} (API {{.Server.APIVersion}})')"
else
    if ! have dockerd || ! have docker; then
        apt_install docker.io ca-certificates
    fi
    if docker_answers; then
        log "    an engine answers now (DOCKER_HOST or a mounted socket); not starting dockerd"
    elif pidof dockerd >/dev/null 2>&1; then
        log "    dockerd is running (pid $(pidof dockerd)) but not answering yet; waiting for it"
    else
        log "    starting dockerd in the background (log: ${DOCKERD_LOG})"
        mkdir -p "$(dirname "${DOCKERD_LOG}")"
        # No systemd on CI machines and containers: run it detached so it outlives this script.
        nohup dockerd >"${DOCKERD_LOG}" 2>&1 </dev/null &
        dockerd_pid=$!
        disown || true
    fi
    for _ in $(seq 1 60); do
        if docker_answers; then
            break
        fi
        if [[ -n "${dockerd_pid:-}" ]] && ! kill -0 "${dockerd_pid}" 2>/dev/null; then
            log "    dockerd exited" >&2
            break
        fi
        sleep 1
    done
    if ! docker_answers; then
        log "    dockerd did not answer on ${DOCKER_SOCK}; last warnings/errors in ${DOCKERD_LOG}:" >&2
        { grep -v 'level=info' "${DOCKERD_LOG}" | tail -n 20; } >&2 2>/dev/null || true
        die "Docker engine is not reachable (dockerd needs root with full privileges; see ${DOCKERD_LOG})"
    fi
    step_done "started: $(docker version --format 'Docker {{.Server.Version}} (API {{.Server.APIVersion}})')"
fi

# --- 2. host tools --------------------------------------------------------------------------------------
if ((main_only)); then
    step "host tools (debootstrap, iproute2, openssh-client)"
else
    step "host tools (debootstrap, iproute2, openssh-client, docker-registry, docker-compose, shellcheck, gcc)"
fi
missing=()
have debootstrap || missing+=(debootstrap)
have ip || missing+=(iproute2)
have ssh-keygen || missing+=(openssh-client)
if ((!main_only)); then
    have docker-registry || missing+=(docker-registry)  # a real registry for the push tests
    have docker-compose || missing+=(docker-compose)    # what SageMaker local mode starts the hosts with
    have shellcheck || missing+=(shellcheck)            # the rendered sbatch scripts and train are shellchecked
    have gcc || missing+=(gcc libc6-dev)                # the GPU-stack checks' tests compile stand-in ELF files
fi
if ((${#missing[@]})); then
    apt_install "${missing[@]}"
    step_done "installed ${missing[*]}"
else
    step_done "already installed"
fi

# --- 2b. linux/arm64 under emulation --------------------------------------------------------------------
# `imgbuild build cpu --platform linux/arm64` runs the arm64 image's RUN steps, and `imgbuild verify ... --platform
# linux/arm64` its containers, through QEMU: the kernel hands aarch64 binaries to qemu-aarch64-static (binfmt_misc,
# registered with the F flag so it works inside containers and chroots). IMGBUILD_SKIP_ARM64=1 skips this step, and
# so does --main (the main job builds for this machine's architecture).
if ((main_only)); then
    log "==> linux/arm64 emulation: not needed by the main job (--main)"
elif [[ "${IMGBUILD_SKIP_ARM64:-0}" == 1 && "${CI:-}" == true ]]; then
    die "IMGBUILD_SKIP_ARM64=1 with CI=true: CI builds and verifies the linux/arm64 image, so it needs QEMU"
elif [[ "${IMGBUILD_SKIP_ARM64:-0}" == 1 ]]; then
    log "==> linux/arm64 emulation: skipped (IMGBUILD_SKIP_ARM64=1)"
else
    step "linux/arm64 emulation (qemu-user-static, binfmt-support, binfmt_misc, qemu-aarch64)"
    done_what=()
    if ! have qemu-aarch64-static || ! have update-binfmts; then
        apt_install qemu-user-static binfmt-support
        done_what+=("installed qemu-user-static and binfmt-support")
    fi
    if [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
            || die "cannot mount binfmt_misc on /proc/sys/fs/binfmt_misc (a container needs --privileged for it)"
        done_what+=("mounted binfmt_misc")
    fi
    if ! grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
        update-binfmts --enable qemu-aarch64 || die "update-binfmts --enable qemu-aarch64 failed"
        done_what+=("enabled qemu-aarch64 in binfmt_misc")
    fi
    grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 \
        || die "qemu-aarch64 is not enabled in /proc/sys/fs/binfmt_misc after update-binfmts"
    interpreter="$(grep -m1 '^interpreter' /proc/sys/fs/binfmt_misc/qemu-aarch64 | cut -d' ' -f2)"
    if ((${#done_what[@]})); then
        joined="$(printf '%s; ' "${done_what[@]}")"
        step_done "${joined%; }: aarch64 binaries run through ${interpreter}"
    else
        step_done "already set up: qemu-aarch64 enabled (${interpreter})"
    fi
fi

# --- 3. the project -------------------------------------------------------------------------------------
extra="[dev]"
((main_only)) && extra=""
step "python package (pip install -e .${extra})"
have "${PYTHON}" || apt_install python3
"${PYTHON}" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$("${PYTHON}" --version 2>&1) is too old: imgbuild needs Python >= 3.10 (set PYTHON=...)"
if ! "${PYTHON}" -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip
fi
pip_args=(install --quiet --progress-bar off --disable-pip-version-check -e "${REPO_ROOT}${extra}")
# Debian 12 / Ubuntu 23.04+ mark the system interpreter as externally managed (PEP 668).
if "${PYTHON}" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))' \
    && [[ -z "${VIRTUAL_ENV:-}" ]]; then
    pip_args+=(--break-system-packages)
fi
"${PYTHON}" -m pip "${pip_args[@]}"
"${PYTHON}" -c 'import imgbuild' || die "imgbuild is not importable after pip install"
step_done "installed into $("${PYTHON}" -c 'import sys; print(sys.prefix)')"

# --- 4. base images -------------------------------------------------------------------------------------
if [[ "${IMGBUILD_SKIP_BASE:-0}" == 1 ]]; then
    log "==> base images: skipped (IMGBUILD_SKIP_BASE=1)"
else
    # The console script when it is on PATH, else the same CLI through the interpreter it was installed into.
    bootstrap_cmd=(imgbuild base bootstrap)
    have imgbuild || bootstrap_cmd=("${PYTHON}" -m imgbuild.cli base bootstrap)
    mirror_args=()
    [[ -n "${IMGBUILD_MIRROR:-}" ]] && mirror_args=(--mirror "${IMGBUILD_MIRROR}")
    for image in ${BASE_IMAGES}; do
        step "base image ${image}"
        if docker image inspect "${image}" >/dev/null 2>&1; then
            step_done "present: $(docker image inspect --format '{{.Id}}' "${image}" | cut -c1-19)"
        else
            log "    not in the engine; bootstrapping offline: ${bootstrap_cmd[*]} ${image} ${mirror_args[*]}"
            "${bootstrap_cmd[@]}" "${image}" "${mirror_args[@]}"
            docker image inspect "${image}" >/dev/null 2>&1 || die "bootstrap finished but ${image} is missing"
            step_done "bootstrapped"
        fi
    done
fi

# --- 5. SageMaker Python SDK for the local-mode test --------------------------------------------------------
if ((main_only)); then
    log "setup complete in $(($(date +%s) - T_START))s"
    exit 0
fi
step "SageMaker Python SDK (${SDK_REQUIREMENT}) in ${SDK_VENV}"
# The version, once what the test uses imports (the SDK prints a notice of its own on import: last line only).
sdk_version() {
    SAGEMAKER_SUPPRESS_V2_WARNING=1 "${SDK_VENV}/bin/python" -c 'import importlib.metadata, sagemaker.estimator, sagemaker.local
print(importlib.metadata.version("sagemaker"))' 2>/dev/null | tail -n 1
}
version="$(sdk_version)" || version=""
if [[ "${version}" == 2.* ]]; then
    step_done "present: sagemaker ${version}"
else
    if [[ ! -x "${SDK_VENV}/bin/python" ]]; then
        "${PYTHON}" -c 'import ensurepip' 2>/dev/null || apt_install python3-venv
        mkdir -p "$(dirname "${SDK_VENV}")"
        "${PYTHON}" -m venv "${SDK_VENV}"
    fi
    "${SDK_VENV}/bin/python" -m pip install --quiet --progress-bar off --disable-pip-version-check "${SDK_REQUIREMENT}"
    version="$(sdk_version)" || version=""
    [[ "${version}" == 2.* ]] || die "the SageMaker SDK is not importable from ${SDK_VENV} after pip install"
    step_done "installed sagemaker ${version}"
fi

log "setup complete in $(($(date +%s) - T_START))s"
