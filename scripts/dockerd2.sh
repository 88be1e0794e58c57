#!/usr/bin/env bash
# A second Docker engine on this machine, for testing builds against a remote BuildKit (tests/test_remote_builder.py)
# when no buildkitd or buildx is at hand (Debian 12 packages neither): its own dockerd, socket, data, bridge and
# address pool, started next to the main engine and never touching it.
#
#   scripts/dockerd2.sh start    start it (idempotent: a running one with the same settings is left as it is), copy
#                                the base images it lacks from the main engine, print where it listens
#   scripts/dockerd2.sh stop     stop it, remove its bridge and firewall rules (its images and cache stay on disk,
#                                its networks do not)
#   scripts/dockerd2.sh status   exit 0 when it runs (3 when not), with its addresses
#   scripts/dockerd2.sh env      the DOCKER_HOST line to point a shell at it: eval "$(scripts/dockerd2.sh env)"
#
# Then DOCKER_HOST=unix:///run/imgbuild-docker2.sock (or tcp://127.0.0.1:2385) imgbuild build cpu builds on it.
#
# Its own bridge (imgbuild-br2) and a default address pool in 10.213.0.0/16 keep its networks off the main engine's
# (172.17-172.31 and 192.168 by default). It runs with --iptables=false: a dockerd that manages iptables re-creates
# the chains it shares with the main engine (DOCKER, DOCKER-ISOLATION-STAGE-*) and drops the main engine's rules in
# them. This script adds the two rules its networks need instead (forward and masquerade its pool), with the comment
# "imgbuild-docker2", and removes them on stop.
#
# The tcp listener has no TLS: any local user who can reach 127.0.0.1 can drive this engine as root. It is for test
# machines; set DOCKERD2_TCP= to listen on the root-only socket alone.
#
# Environment (the same values must be given to start, stop and status):
#   DOCKERD2_NAME     the instance (default imgbuild-docker2): names its run folder, socket, data root, log and
#                     firewall rules. Another name is another engine beside this one (tests/conftest.py starts
#                     imgbuild-docker-test for the tests, so that a benchmark pruning imgbuild-docker2 and the tests
#                     never share one); it needs its own DOCKERD2_BRIDGE, DOCKERD2_POOL and DOCKERD2_TCP.
#   DOCKERD2_BRIDGE   its bridge, at most 15 characters (default imgbuild-br2)
#   DOCKERD2_SOCKET   unix socket (default /run/$DOCKERD2_NAME.sock)
#   DOCKERD2_TCP      HOST:PORT to listen on too, without TLS (default 127.0.0.1:2385; empty: socket only)
#   DOCKERD2_DATA     data root: images, build cache (default /var/lib/$DOCKERD2_NAME)
#   DOCKERD2_POOL     its address pool, a /16 given as A.B.0.0/16 (default 10.213.0.0/16); the bridge takes A.B.0.1/24
#                     and user networks the /24s after it
#   DOCKERD2_IMAGES   images copied from the main engine when this one lacks them (default: $IMGBUILD_BASE_IMAGES,
#                     else debian:bookworm-slim; set and empty: none, an engine that starts empty, as
#                     scripts/fresh-ci.sh's does); nothing can be pulled on an offline machine
#   DOCKERD2_LOG      its log (default /var/log/$DOCKERD2_NAME.log)
set -Eeuo pipefail

NAME="${DOCKERD2_NAME:-imgbuild-docker2}"
BRIDGE="${DOCKERD2_BRIDGE:-imgbuild-br2}"
SOCKET="${DOCKERD2_SOCKET:-/run/${NAME}.sock}"
TCP="${DOCKERD2_TCP-127.0.0.1:2385}"
DATA="${DOCKERD2_DATA:-/var/lib/${NAME}}"
POOL="${DOCKERD2_POOL:-10.213.0.0/16}"
IMAGES="${DOCKERD2_IMAGES-${IMGBUILD_BASE_IMAGES:-debian:bookworm-slim}}"
LOG="${DOCKERD2_LOG:-/var/log/${NAME}.log}"
RUN_DIR="/run/${NAME}"
PID_FILE="${RUN_DIR}/dockerd.pid"
CONFIG_FILE="${RUN_DIR}/daemon.json"  # empty: /etc/docker/daemon.json (the main engine's settings) is not read
COMMENT="${NAME}"
START_TIMEOUT_S=60
STOP_TIMEOUT_S=40

die() {
    printf 'dockerd2.sh: error: %s\n' "$*" >&2
    exit 1
}
log() { printf 'dockerd2.sh: %s\n' "$*" >&2; }

[[ "${NAME}" =~ ^[a-z0-9][a-z0-9_.-]*$ ]] || die "DOCKERD2_NAME=${NAME}: lowercase letters, digits, '_', '.', '-'"
[[ "${BRIDGE}" =~ ^[a-zA-Z0-9_.-]{1,15}$ ]] || die "DOCKERD2_BRIDGE=${BRIDGE}: an interface name, at most 15 characters"
[[ "${POOL}" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.0\.0/16$ ]] || die "DOCKERD2_POOL=${POOL}: give a /16 as A.B.0.0/16"
PREFIX="${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
BRIDGE_CIDR="${PREFIX}.0.1/24"
[[ -z "${TCP}" || "${TCP}" =~ ^[^[:space:]/]+:[0-9]+$ ]] || die "DOCKERD2_TCP=${TCP}: give HOST:PORT, or nothing"

hosts() {
    printf -- '--host\nunix://%s\n' "${SOCKET}"
    [[ -z "${TCP}" ]] || printf -- '--host\ntcp://%s\n' "${TCP}"
}

# dockerd's arguments, one a line (compared with /proc/PID/cmdline to tell a running one's settings).
arguments() {
    hosts
    printf '%s\n' --config-file "${CONFIG_FILE}" --data-root "${DATA}" --exec-root "${RUN_DIR}/exec" \
        --pidfile "${PID_FILE}" --bridge "${BRIDGE}" --iptables=false \
        --default-address-pool "base=${POOL},size=24"
}

pid() {
    [[ -f "${PID_FILE}" ]] || return 1
    local p
    p="$(cat "${PID_FILE}")"
    [[ "${p}" =~ ^[0-9]+$ ]] && kill -0 "${p}" 2>/dev/null || return 1
    printf '%s\n' "${p}"
}

answers() { timeout 10 docker -H "unix://${SOCKET}" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

docker2() { docker -H "unix://${SOCKET}" "$@"; }

# The main engine: DOCKER_HOST unless it points here (a shell after `eval "$(dockerd2.sh env)"`), else the default.
docker1() {
    case "${DOCKER_HOST:-}" in
    "unix://${SOCKET}" | "tcp://${TCP}") DOCKER_HOST="" docker -H unix:///var/run/docker.sock "$@" ;;
    *) docker "$@" ;;
    esac
}

# iptables rules for the pool: forward its traffic both ways (the FORWARD policy is DROP where the main engine runs)
# and masquerade what leaves it; each checked first (-C) so that start is idempotent.
RULES=(
    "filter FORWARD -s ${POOL} -j ACCEPT"
    "filter FORWARD -d ${POOL} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    "nat POSTROUTING -s ${POOL} ! -d ${POOL} -j MASQUERADE"
)

rules_add() {
    command -v iptables >/dev/null 2>&1 || { log "no iptables: containers of this engine get no outside network"; return; }
    local rule table chain spec
    for rule in "${RULES[@]}"; do
        read -r table chain spec <<<"${rule}"
        # shellcheck disable=SC2086  # spec is a list of iptables words on purpose
        iptables -t "${table}" -C "${chain}" ${spec} -m comment --comment "${COMMENT}" 2>/dev/null \
            || iptables -t "${table}" -I "${chain}" 1 ${spec} -m comment --comment "${COMMENT}"
    done
}

rules_remove() {
    command -v iptables >/dev/null 2>&1 || return 0
    local rule table chain spec
    for rule in "${RULES[@]}"; do
        read -r table chain spec <<<"${rule}"
        # shellcheck disable=SC2086
        while iptables -t "${table}" -D "${chain}" ${spec} -m comment --comment "${COMMENT}" 2>/dev/null; do :; done
    done
}

bridge_up() {
    local other
    other="$(ip -4 route show "${POOL}" 2>/dev/null; ip -4 route show match "${PREFIX}.0.1" 2>/dev/null || true)"
    other="$(grep -v '^default' <<<"${other}" || true)"
    other="$(grep -v " dev ${BRIDGE} " <<<"${other}" | grep . || true)"
    [[ -z "${other}" ]] || die "DOCKERD2_POOL=${POOL} is routed elsewhere already (${other//$'\n'/; }): give this engine" \
        "another pool (and DOCKERD2_BRIDGE, DOCKERD2_TCP if another instance runs)"
    if ! ip link show "${BRIDGE}" >/dev/null 2>&1; then
        ip link add name "${BRIDGE}" type bridge
    fi
    local have
    have="$(ip -4 -o addr show dev "${BRIDGE}" | awk '{print $4}')"
    if [[ -z "${have}" ]]; then
        ip addr add "${BRIDGE_CIDR}" dev "${BRIDGE}"
    elif [[ "${have}" != "${BRIDGE_CIDR}" ]]; then
        die "bridge ${BRIDGE} has ${have//$'\n'/ }, not ${BRIDGE_CIDR}: stop this engine (or ip link del ${BRIDGE})"
    fi
    ip link set "${BRIDGE}" up
}

copy_images() {
    local image
    for image in ${IMAGES}; do
        docker2 image inspect "${image}" >/dev/null 2>&1 && continue
        if ! docker1 image inspect "${image}" >/dev/null 2>&1; then
            log "${image}: neither engine has it (scripts/setup.sh bootstraps it into the main engine)"
            continue
        fi
        log "${image}: copying it from the main engine"
        docker1 save "${image}" | docker2 load >/dev/null
    done
}

where() {
    printf '%s: DOCKER_HOST=unix://%s' "${NAME}" "${SOCKET}"
    [[ -z "${TCP}" ]] || printf ' or tcp://%s' "${TCP}"
    printf ' (pid %s, Docker %s, data %s, pool %s)\n' "$(pid)" \
        "$(docker2 version --format '{{.Server.Version}}' 2>/dev/null || echo '?')" "${DATA}" "${POOL}"
}

start() {
    [[ "${EUID}" -eq 0 ]] || die "run as root (it starts dockerd and adds a bridge)"
    command -v dockerd >/dev/null 2>&1 || die "no dockerd: apt-get install docker.io (scripts/setup.sh does)"
    command -v docker >/dev/null 2>&1 || die "no docker CLI: apt-get install docker.io"
    local p
    if p="$(pid)"; then
        local want running
        want="$(arguments)"
        running="$(tr '\0' '\n' <"/proc/${p}/cmdline" | tail -n +2)"
        if [[ "${running}" != "${want}" ]]; then
            die "a dockerd with other settings runs on ${PID_FILE} (pid ${p}): $(tr '\n' ' ' <<<"${running}")" \
                "-- stop it first: $0 stop"
        fi
    else
        [[ -S "${SOCKET}" ]] && rm -f "${SOCKET}"
        mkdir -p "${RUN_DIR}" "${DATA}" "$(dirname "${LOG}")"
        [[ -s "${CONFIG_FILE}" ]] || echo '{}' >"${CONFIG_FILE}"
        # dockerd keeps its networks in this store and would give the bridge the address stored there (an earlier
        # DOCKERD2_POOL, or a dockerd started by hand) instead of its own: networks do not outlive a stop.
        rm -f "${DATA}/network/files/local-kv.db"
        bridge_up
        rules_add
        local -a argv
        mapfile -t argv < <(arguments)
        argv=("$(command -v dockerd)" "${argv[@]}")
        log "starting ${argv[*]} (log: ${LOG})"
        # setsid + nohup: it outlives this script and the shell (or pytest) that ran it
        setsid nohup "${argv[@]}" >>"${LOG}" 2>&1 </dev/null &
        disown || true
    fi
    local t0=${SECONDS}
    until answers; do
        if ((SECONDS - t0 > START_TIMEOUT_S)); then
            { grep -v 'level=info' "${LOG}" | tail -n 20; } >&2 2>/dev/null || true
            die "${NAME} did not answer on unix://${SOCKET} within ${START_TIMEOUT_S}s (log: ${LOG})"
        fi
        if ((SECONDS - t0 > 3)) && ! pid >/dev/null; then
            { grep -v 'level=info' "${LOG}" | tail -n 20; } >&2 2>/dev/null || true
            die "dockerd exited (log: ${LOG})"
        fi
        sleep 0.5
    done
    bridge_up  # a dockerd started by hand before may have left it down
    rules_add
    copy_images
    where
}

stop() {
    local p
    if p="$(pid)"; then
        kill -TERM "${p}"
        local t0=${SECONDS}
        while kill -0 "${p}" 2>/dev/null; do
            if ((SECONDS - t0 > STOP_TIMEOUT_S)); then
                log "dockerd (pid ${p}) still runs after ${STOP_TIMEOUT_S}s; killing it"
                kill -KILL "${p}" 2>/dev/null || true
                break
            fi
            sleep 0.5
        done
        echo "stopped ${NAME} (pid ${p})"
    else
        echo "${NAME} is not running"
    fi
    rules_remove
    if ip link show "${BRIDGE}" >/dev/null 2>&1; then
        ip link del "${BRIDGE}"
    fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
    if pid >/dev/null && answers; then
        where
    else
        echo "${NAME} is not running"
        exit 3
    fi
    ;;
env) printf 'export DOCKER_HOST=unix://%s\n' "${SOCKET}" ;;
*) die "usage: $0 start | stop | status | env" ;;
esac
