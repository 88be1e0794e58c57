#!/usr/bin/env bash
# A throwaway local registry (Debian's docker-registry, registry 2.8) for trying `imgbuild push` by hand:
#
#   scripts/registry.sh start [PORT]   start on 127.0.0.1:PORT (default 5000), storage under $REGISTRY_DIR
#   scripts/registry.sh stop           stop the one this script started
#   scripts/registry.sh status
#
# The Docker engine trusts 127.0.0.0/8 over plain HTTP by default, so no TLS and no daemon.json change is needed:
#   imgbuild push cpu --registry 127.0.0.1:5000/team
# Installs the docker-registry package (apt) when it is missing and this runs as root.
set -Eeuo pipefail

REGISTRY_DIR="${REGISTRY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/imgbuild/registry}"
PID_FILE="${REGISTRY_DIR}/registry.pid"

die() {
    printf 'registry.sh: error: %s\n' "$*" >&2
    exit 1
}

binary() {
    local exe
    for exe in docker-registry registry; do
        if command -v "${exe}" >/dev/null 2>&1; then
            command -v "${exe}"
            return
        fi
    done
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-registry >&2
        command -v docker-registry
        return
    fi
    die "no registry binary: apt-get install docker-registry (as root)"
}

running() {
    [[ -f "${PID_FILE}" ]] && kill -0 "$(cat "${PID_FILE}")" 2>/dev/null
}

start() {
    local port="${1:-5000}" exe
    running && die "already running (pid $(cat "${PID_FILE}")); stop it first"
    exe="$(binary)"
    mkdir -p "${REGISTRY_DIR}/data"
    cat >"${REGISTRY_DIR}/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: ${REGISTRY_DIR}/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:${port}
EOF
    nohup "${exe}" serve "${REGISTRY_DIR}/config.yml" >"${REGISTRY_DIR}/registry.log" 2>&1 &
    echo $! >"${PID_FILE}"
    for _ in $(seq 1 50); do
        if curl -fsS "http://127.0.0.1:${port}/v2/" >/dev/null 2>&1; then
            echo "registry on 127.0.0.1:${port} (pid $(cat "${PID_FILE}"), data in ${REGISTRY_DIR}/data)"
            return
        fi
        running || die "the registry exited: $(tail -5 "${REGISTRY_DIR}/registry.log")"
        sleep 0.2
    done
    die "the registry did not answer on 127.0.0.1:${port} within 10s (log: ${REGISTRY_DIR}/registry.log)"
}

stop() {
    if running; then
        kill "$(cat "${PID_FILE}")"
        echo "stopped pid $(cat "${PID_FILE}")"
    else
        echo "not running"
    fi
    rm -f "${PID_FILE}"
}

case "${1:-}" in
start) start "${2:-5000}" ;;
stop) stop ;;
status) if running; then echo "running (pid $(cat "${PID_FILE}"))"; else echo "not running"; fi ;;
*) die "usage: $0 start [PORT] | stop | status" ;;
esac
