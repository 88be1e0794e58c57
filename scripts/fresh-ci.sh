#!/usr/bin/env bash
# A rehearsal of CI on a fresh machine, on this one (as root): what `.ci/run` does on a clean checkout of main on a
# machine that has never run it, without giving up this machine's warm engine and caches.
#
#   bash scripts/fresh-ci.sh [--keep] [ARGS...]
#
#   1. clone: a clean clone of HEAD (committed work only: an uncommitted change is not rehearsed, and it says so);
#   2. engine: a Docker engine of its own with an empty data root (scripts/dockerd2.sh, instance imgbuild-fresh-ci:
#      no base image copied in, no build cache, no volume), and the tests' second engine (tests/conftest.py's
#      second_engine) started afresh with an empty data root too, instance imgbuild-fresh-test;
#   3. venv: a new virtual environment for the project (scripts/setup.sh installs into it) and another for the
#      SageMaker SDK, empty uv, pip and XDG caches;
#   4. ci: `CI=true bash .ci/run ARGS...` in the clone, against that engine (DOCKER_HOST), its output in
#      WORK/ci.log; setup.sh bootstraps the base images into the empty engine as on a fresh machine;
#   5. cleanup: both engines stopped, WORK removed (kept with --keep, or FRESH_CI_KEEP=1); .ci/run's output stays in
#      /var/tmp/imgbuild-fresh-ci-last.log.
# It prints each phase's time (its own, then .ci/run's from scripts/test.sh) and exits with .ci/run's status.
#
# When to run it: before landing any change to tests, fixtures, setup, locks or dependencies (CONTRIBUTING.md).
# It takes about as long as CI on a new machine (base images, every test image built cold).
#
# Environment: FRESH_CI_WORK (default: a new folder under /var/tmp), FRESH_CI_KEEP=1 (keep it). What stays shared
# with this machine: the apt packages setup.sh installs (Debian's archive is not a cache a test reads) and the Linux
# kernel's state (binfmt_misc for arm64).
set -Eeuo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
keep="${FRESH_CI_KEEP:-0}"
if [[ ${1:-} == --keep ]]; then
    keep=1
    shift
fi
[[ "${EUID}" -eq 0 ]] || {
    echo "fresh-ci.sh: error: run as root (it starts two dockerd and installs packages)" >&2
    exit 1
}
WORK="${FRESH_CI_WORK:-$(mktemp -d /var/tmp/imgbuild-fresh-ci.XXXXXX)}"
mkdir -p "${WORK}"
WORK="$(cd "${WORK}" && pwd)"
[[ -z "$(ls -A "${WORK}")" ]] || {
    echo "fresh-ci.sh: error: FRESH_CI_WORK=${WORK} is not empty: give a new folder" >&2
    exit 1
}

# The rehearsal's engine and the tests' second engine: names, bridges and pools of their own, beside any other.
ENGINE=(DOCKERD2_NAME=imgbuild-fresh-ci DOCKERD2_BRIDGE=imgbuild-brfci DOCKERD2_POOL=10.217.0.0/16 DOCKERD2_TCP=
    "DOCKERD2_DATA=${WORK}/engine" "DOCKERD2_LOG=${WORK}/dockerd.log" DOCKERD2_IMAGES=)
SOCKET=unix:///run/imgbuild-fresh-ci.sock
LAST_LOG=/var/tmp/imgbuild-fresh-ci-last.log  # .ci/run's output of the latest rehearsal, kept after cleanup
TEST_ENGINE=(IMGBUILD_TEST_DOCKERD2_NAME=imgbuild-fresh-test IMGBUILD_TEST_DOCKERD2_BRIDGE=imgbuild-brfct
    IMGBUILD_TEST_DOCKERD2_POOL=10.218.0.0/16 IMGBUILD_TEST_DOCKERD2_TCP=127.0.0.1:2388
    "IMGBUILD_TEST_DOCKERD2_DATA=${WORK}/engine-test" "IMGBUILD_TEST_DOCKERD2_LOG=${WORK}/dockerd-test.log")

T0=${SECONDS}
PHASE_PREFIX="fresh-ci: "
# shellcheck source=scripts/phases.sh
source "${REPO}/scripts/phases.sh"

stop_engines() {
    env "${TEST_ENGINE[@]/#IMGBUILD_TEST_/}" bash "${REPO}/scripts/dockerd2.sh" stop >/dev/null 2>&1 || true
    env "${ENGINE[@]}" bash "${REPO}/scripts/dockerd2.sh" stop >/dev/null 2>&1 || true
}

finish() {
    local rc=$?
    phase_end "$( ((rc == 0)) || echo " (failed: exit ${rc})")"
    phase "cleanup"
    stop_engines
    cp "${WORK}/ci.log" "${LAST_LOG}" 2>/dev/null || true
    if ((keep)); then
        echo "    kept ${WORK} (the clone, ci.log, the engines' data roots and logs)"
    else
        rm -rf "${WORK}"
        echo "    removed ${WORK}"
    fi
    phase_end
    echo "==> fresh-ci phases (HEAD ${HEAD:-?}; .ci/run's output: ${LAST_LOG})"
    printf '%s\n' "${PHASES[@]}"
    if [[ -f "${LAST_LOG}" ]]; then
        echo "==> .ci/run's phases"
        sed -n '/^==> test.sh phases$/,$p' "${LAST_LOG}" | tail -n +2
    fi
    printf '%6ss  in all: %s\n' "$((SECONDS - T0))" "$( ((rc == 0)) && echo green || echo "red (exit ${rc})")"
    exit "${rc}"
}
trap finish EXIT
trap 'exit 130' INT  # the EXIT trap then says so, and cleans up
trap 'exit 143' TERM

phase "clone"
HEAD="$(git -C "${REPO}" rev-parse --short HEAD)"
if [[ -n "$(git -C "${REPO}" status --porcelain)" ]]; then
    echo "    the work tree has uncommitted changes: they are not rehearsed (HEAD ${HEAD} is)"
fi
git clone --quiet --no-hardlinks "${REPO}" "${WORK}/src"
git -C "${WORK}/src" checkout --quiet --detach "${HEAD}"

phase "engine (empty data root)"
env "${ENGINE[@]}" bash "${REPO}/scripts/dockerd2.sh" start
test "$(DOCKER_HOST="${SOCKET}" docker images -q | wc -l)" -eq 0 || {
    echo "fresh-ci.sh: error: the rehearsal's engine is not empty" >&2
    exit 1
}

phase "venv (empty caches)"
mkdir -p "${WORK}/cache/uv" "${WORK}/cache/pip" "${WORK}/cache/xdg"
python3 -m venv "${WORK}/venv"

phase "ci (CI=true bash .ci/run $*)"
(
    cd "${WORK}/src"
    env CI=true DOCKER_HOST="${SOCKET}" DOCKERD_LOG="${WORK}/dockerd-main.log" \
        PATH="${WORK}/venv/bin:${PATH}" PYTHON="${WORK}/venv/bin/python" VIRTUAL_ENV="${WORK}/venv" \
        UV_CACHE_DIR="${WORK}/cache/uv" PIP_CACHE_DIR="${WORK}/cache/pip" XDG_CACHE_HOME="${WORK}/cache/xdg" \
        IMGBUILD_SAGEMAKER_SDK_VENV="${WORK}/sagemaker-sdk2" "${TEST_ENGINE[@]}" \
        bash .ci/run "$@"
) 2>&1 | tee "${WORK}/ci.log"
