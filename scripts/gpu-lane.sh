#!/usr/bin/env bash
# The GPU lane (tests/test_gpu.py, pytest marker `gpu`) on a GPU host that has no network: pack here, run there.
#
#   bash scripts/gpu-lane.sh pack [DIR]   on a machine that reaches the package index (default DIR: .gpu-lane, which
#                                         git ignores): DIR/wheels holds imgbuild's wheel (built from this checkout)
#                                         and the wheels of its dependencies, pytest and pytest-testinfra that the
#                                         GPU host lacks; DIR/files the pinned source archives the lane builds
#                                         (tests/data/upstream/sources, with their SHA256SUMS). It prints its size
#                                         and fails over the budget (the project's GPU machine takes 64 MiB of the
#                                         tree and carried folders together; this checkout is about 8 MiB of it).
#   bash scripts/gpu-lane.sh run [DIR]    on the GPU host, from this checkout: a virtual environment that sees the
#                                         host's packages (its PyTorch, CUDA's and NCCL's wheels), imgbuild and what
#                                         the host lacks installed from DIR/wheels alone (pip --no-index: a
#                                         requirement neither the host nor DIR satisfies is named and stops it),
#                                         then `pytest -m gpu tests/test_gpu.py`. Its JUnit file (gpu-lane.xml), the
#                                         lane's output (gpu-lane.log) and the tests' logs (nccl-tests' make and run,
#                                         the report, the DDP runs) go to $OUT (default: DIR/out). Exit: pytest's.
#
# Environment for pack:
#   PYTHON                    the interpreter that builds the wheel and runs pip (default: python3)
#   GPU_LANE_PYTHON_VERSION   the GPU host's Python, X.Y (default: 3.12, the project's GPU machine's)
#   GPU_LANE_PLATFORMS        its wheel platform tags (default: the manylinux x86_64 ones)
#   GPU_LANE_HAVE             a file naming the distributions the GPU host has, one per line (default:
#                             scripts/gpu-lane.have, the project's GPU machine's); "none" packs every dependency
#   GPU_LANE_BUDGET_MIB       the most DIR may hold (default: 52)
# The dependencies are packed at the versions PYTHON's environment has (pip list as constraints): what runs there is
# what was tested here.
# Environment for run: PYTHON (default: python3), OUT, and what tests/test_gpu.py reads (IMGBUILD_GPU_RECIPE).
set -Eeuo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# What a run leaves only while it runs: its temporary folder, and a pack folder it made until the pack is whole (on
# any exit, an error or a signal included, the EXIT trap removes them).
SCRATCH=""
PARTIAL=()
cleanup() {
    [[ -z "${SCRATCH}" ]] || rm -rf "${SCRATCH}"
    ((${#PARTIAL[@]} == 0)) || rm -rf "${PARTIAL[@]}"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
die() {
    echo "gpu-lane.sh: error: $*" >&2
    exit 1
}
usage() {
    echo "usage: gpu-lane.sh pack|run [DIR]" >&2
    exit 2
}

# A distribution's name as pip compares them (PEP 503): lower case, runs of -_. as one -.
normalize() { tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/-/g'; }

pack() {
    local dir="$1" version="${GPU_LANE_PYTHON_VERSION:-3.12}" have="${GPU_LANE_HAVE:-${REPO_ROOT}/scripts/gpu-lane.have}"
    local budget="${GPU_LANE_BUDGET_MIB:-52}"
    local platforms="${GPU_LANE_PLATFORMS:-manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64}"
    [[ ! -e "${dir}" || -z "$(ls -A "${dir}")" ]] || die "${dir} is not empty: give a new folder (or remove it)"
    [[ "${have}" == none || -f "${have}" ]] || die "GPU_LANE_HAVE=${have}: no such file"
    if [[ -e "${dir}" ]]; then PARTIAL=("${dir}/wheels" "${dir}/files"); else PARTIAL=("${dir}"); fi
    mkdir -p "${dir}/wheels" "${dir}/files"
    SCRATCH="$(mktemp -d)"
    local tmp="${SCRATCH}"
    echo "==> imgbuild's wheel (from ${REPO_ROOT})"
    "${PYTHON}" -m pip wheel -q --no-deps -w "${tmp}/own" "${REPO_ROOT}"
    local own
    own="$(ls "${tmp}"/own/imgbuild-*.whl)"
    echo "==> its dependencies, pytest and pytest-testinfra for Python ${version} (${platforms%% *}, ...)"
    local args=(--only-binary=:all: --python-version "${version}" --implementation cp)
    for p in ${platforms}; do args+=(--platform "${p}"); done
    # The versions of this environment's packages (its pytest, its dependencies' as setup.sh installed them), so that
    # what runs there is what was tested here, whatever the index published since.
    "${PYTHON}" -m pip list --format=freeze --exclude-editable | grep -v ' @ ' >"${tmp}/constraints.txt"
    "${PYTHON}" -m pip download -q "${args[@]}" -c "${tmp}/constraints.txt" -d "${tmp}/all" "${own}" pytest \
        pytest-testinfra
    cp "${own}" "${dir}/wheels/"
    # the names the GPU host has, normalized once
    if [[ "${have}" == none ]]; then : >"${tmp}/have"; else grep -v '^#' "${have}" | normalize >"${tmp}/have"; fi
    local skipped=()
    for whl in "${tmp}"/all/*.whl; do
        local name
        name="$(basename "${whl}" | cut -d- -f1 | normalize)"
        [[ "${name}" == imgbuild ]] && continue
        if grep -qx -- "${name}" "${tmp}/have"; then
            skipped+=("${name}")
        else
            cp "${whl}" "${dir}/wheels/"
        fi
    done
    echo "    the GPU host has (not packed): ${skipped[*]:-none}"
    echo "==> the pinned source archives"
    cp "${REPO_ROOT}"/tests/data/upstream/sources/*.tar.gz "${REPO_ROOT}/tests/data/upstream/sources/SHA256SUMS" \
        "${dir}/files/"
    (cd "${dir}/files" && sha256sum -c --quiet SHA256SUMS)
    local bytes
    bytes="$(du -sb "${dir}" | cut -f1)"
    find "${dir}/wheels" -name '*.whl' -printf '%s %f\n' | sort -rn | head -5 |
        awk '{printf "    largest: %5.1f MiB %s\n", $1 / 1048576, $2}'
    printf '==> %s: %s wheels, %s archives, %s MiB (budget %s MiB)\n' "${dir}" \
        "$(find "${dir}/wheels" -name '*.whl' | wc -l)" "$(find "${dir}/files" -name '*.tar.gz' | wc -l)" \
        "$((bytes / 1048576))" "${budget}"
    ((bytes <= budget * 1048576)) || die "${dir} would hold more than GPU_LANE_BUDGET_MIB=${budget} MiB (removed)"
    PARTIAL=()
}

run() {
    local dir out venv rc=0
    dir="$(cd "$1" && pwd)" || die "$1: no such folder (make it with: gpu-lane.sh pack $1)"
    [[ -d "${dir}/wheels" && -d "${dir}/files" ]] || die "${dir} is no pack (no wheels/ or files/): gpu-lane.sh pack"
    out="${OUT:-${dir}/out}"
    mkdir -p "${out}"
    out="$(cd "${out}" && pwd)"
    SCRATCH="$(mktemp -d)"
    venv="${SCRATCH}/venv"
    unset PYTHONPATH # the lane runs the packed imgbuild, not a checkout's src/ that the caller's environment names
    echo "==> a virtual environment over this host's packages: ${venv}"
    "${PYTHON}" -m venv --system-site-packages "${venv}"
    # imgbuild from the pack even where the host's Python has one (an editable checkout, an older release)
    "${venv}/bin/python" -m pip install -q --no-index --no-deps --ignore-installed --no-cache-dir --no-compile \
        "${dir}"/wheels/imgbuild-*.whl
    "${venv}/bin/python" -m pip install -q --no-index --find-links "${dir}/wheels" --no-cache-dir --no-compile \
        imgbuild pytest pytest-testinfra ||
        die "a requirement is neither on this host nor in ${dir}/wheels (pip named it above): pack it (GPU_LANE_HAVE)"
    "${venv}/bin/python" -c 'import imgbuild, sys; print("imgbuild from", imgbuild.__file__, "on Python", sys.version.split()[0])'
    echo "==> pytest -m gpu tests/test_gpu.py (logs: ${out})"
    cd "${REPO_ROOT}"
    IMGBUILD_GPU_OUT="${out}" IMGBUILD_GPU_FILES="${dir}/files" PYTHONUNBUFFERED=1 \
        "${venv}/bin/python" -m pytest -p no:cacheprovider -m gpu -v -s -rA --junitxml "${out}/gpu-lane.xml" \
        tests/test_gpu.py 2>&1 | tee "${out}/gpu-lane.log" || rc=$?
    return "${rc}"
}

case "${1:-}" in
pack) pack "${2:-${REPO_ROOT}/.gpu-lane}" ;;
run) run "${2:-${REPO_ROOT}/.gpu-lane}" ;;
*) usage ;;
esac
