# shellcheck shell=bash
# Phase timing for the project's scripts, sourced by scripts/test.sh and scripts/fresh-ci.sh: `phase NAME` ends the
# phase that runs and starts NAME (printing "==> ${PHASE_PREFIX}NAME"), `phase_end [SUFFIX]` ends the one that runs
# (SUFFIX, e.g. " (failed: exit 1)", after its name), and PHASES holds a line for each ended phase: its seconds, the
# machine's busy CPU seconds in it (every process, the engine's builds included, from /proc/stat) and what share of
# all cores that is, its name. The CPU share tells a phase that waits (downloads, sleeps) from one the cores bound.
PHASES=()
PHASE=""
PHASE_T0=${SECONDS}
PHASE_PREFIX="${PHASE_PREFIX:-}"
PHASE_CORES=$(nproc 2>/dev/null || echo 1)
PHASE_HZ=$(getconf CLK_TCK 2>/dev/null || echo 100)

# The machine's busy CPU time since boot, in clock ticks: user, nice, system, irq, softirq and steal of /proc/stat's
# first line (idle and iowait left out); 0 where there is no /proc/stat.
cpu_busy_ticks() {
    local _cpu user nice system _idle _iowait irq softirq steal _rest
    if read -r _cpu user nice system _idle _iowait irq softirq steal _rest </proc/stat 2>/dev/null; then
        echo $((user + nice + system + irq + softirq + steal))
    else
        echo 0
    fi
}
PHASE_CPU0=$(cpu_busy_ticks)

phase_end() {
    if [[ -n "${PHASE}" ]]; then
        local wall=$((SECONDS - PHASE_T0)) cpu=$((($(cpu_busy_ticks) - PHASE_CPU0) / PHASE_HZ))
        PHASES+=("$(printf '%6ss  cpu %6ss %3s%% of %s cores  %s%s' "${wall}" "${cpu}" \
            "$((wall > 0 ? 100 * cpu / (wall * PHASE_CORES) : 0))" "${PHASE_CORES}" "${PHASE}" "${1:-}")")
    fi
    PHASE=""
}

phase() {
    phase_end
    PHASE="$1"
    PHASE_T0=${SECONDS}
    PHASE_CPU0=$(cpu_busy_ticks)
    echo "==> ${PHASE_PREFIX}$1"
}
