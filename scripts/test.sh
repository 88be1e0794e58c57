#!/usr/bin/env bash
# The test command (README, .ci/run): set up this machine (scripts/setup.sh: Docker engine, debootstrap, base
# images, the package), then ruff, mypy and two lanes, the fast one first; a failure anywhere stops there:
#   1. the fast lane: every test not marked docker or network, spread over the cores (pytest-xdist), in a network
#      namespace that has only loopback when this shell can make one (root), so that a test reaching the package
#      index without its `network` mark fails rather than passing by luck;
#   2. the docker and network lane. In CI (CI=true) a test that needs the engine fails, never skips, when none
#      answers.
# `bash scripts/test.sh --fast`: ruff, mypy and the fast lane alone, with no setup (the package and its dev extra
# installed already).
# Other arguments go to pytest in both lanes (e.g. -k NAME, --junitxml=FILE: the second lane's file replaces the
# first's). IMGBUILD_TEST_WORKERS sets the fast lane's xdist workers (default: one more than the cores, as its tests
# also wait on subprocesses, sockets and sleeps: 113 s with 3 workers on 2 cores, 128 s with 2; 0: none).
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each phase's time, printed at the end whatever happens (the phase that failed says so).
# shellcheck source=scripts/phases.sh
source scripts/phases.sh
summary() {
    local rc=$?
    phase_end "$( ((rc == 0)) || echo " (failed: exit ${rc})")"
    echo "==> test.sh phases"
    printf '%s\n' "${PHASES[@]}"
    printf '%6ss  in all (exit %s)\n' "${SECONDS}" "${rc}"
    exit "${rc}"
}
trap summary EXIT

fast_only=0
if [[ ${1:-} == --fast ]]; then
    fast_only=1
    shift
fi
PYTHON="${PYTHON:-python3}"
if ((!fast_only)); then
    phase "setup (scripts/setup.sh)"
    bash scripts/setup.sh
    source scripts/ca-env.sh
fi

# Run "$@" with loopback as the only network, where this shell may make a namespace (root, unshare, ip).
offline() {
    if [[ $(id -u) == 0 ]] && command -v unshare >/dev/null && command -v ip >/dev/null &&
        unshare --net true 2>/dev/null; then
        unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh "$@"
    else
        echo "(no loopback-only network namespace here: the fast lane runs with the network on)" >&2
        "$@"
    fi
}

phase "ruff"
"${PYTHON}" -m ruff check src tests benchmarks
"${PYTHON}" -m ruff format --check src tests benchmarks
phase "mypy"
"${PYTHON}" -m mypy
# pytest keeps each test module's rewritten bytecode beside it (tests/__pycache__, ignored by git) unless
# PYTHONDONTWRITEBYTECODE is set, which then costs every worker the rewrite of every module at each run: unset here.
unset PYTHONDONTWRITEBYTECODE
# The gpu lane (tests/test_gpu.py: an NVIDIA GPU and its driver) is deselected in both lanes: scripts/gpu-lane.sh
# runs it on a GPU host.
echo "==> the gpu lane (pytest -m gpu, tests/test_gpu.py) is deselected here: it needs an NVIDIA GPU (scripts/gpu-lane.sh)"
phase "pytest: fast lane (not docker, not network, not gpu; loopback only)"
workers="${IMGBUILD_TEST_WORKERS:-$(($(nproc) + 1))}"
offline "${PYTHON}" -m pytest -p no:cacheprovider -n "${workers}" --dist worksteal --durations=10 \
    -m "not docker and not network and not gpu" "$@"
if ((fast_only)); then
    exit 0
fi
phase "pytest: docker and network lane (not gpu)"
"${PYTHON}" -m pytest -p no:cacheprovider --durations=40 -m "(docker or network) and not gpu" "$@"
