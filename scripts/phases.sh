# shellcheck shell=bash
# Phase timing for the project's scripts, sourced by scripts/test.sh and scripts/fresh-ci.sh: `phase NAME` ends the
# phase that runs and starts NAME (printing "==> ${PHASE_PREFIX}NAME"), `phase_end [SUFFIX]` ends the one that runs
# (SUFFIX, e.g. " (failed: exit 1)", after its name), and PHASES holds a line for each ended phase: its seconds, its
# name.
PHASES=()
PHASE=""
PHASE_T0=${SECONDS}
PHASE_PREFIX="${PHASE_PREFIX:-}"

phase_end() {
    [[ -z "${PHASE}" ]] || PHASES+=("$(printf '%6ss  %s%s' "$((SECONDS - PHASE_T0))" "${PHASE}" "${1:-}")")
    PHASE=""
}

phase() {
    phase_end
    PHASE="$1"
    PHASE_T0=${SECONDS}
    echo "==> ${PHASE_PREFIX}$1"
}
