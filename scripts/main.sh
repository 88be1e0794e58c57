#!/usr/bin/env bash
# The main job from nothing: set up this machine, build the cpu image and verify it (one container, then a
# two-node MPI run across containers).
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
if [[ -z "${IMGBUILD_CA_BUNDLE:-}" && -n "${SSL_CERT_FILE:-}" && -f "${SSL_CERT_FILE}" ]]; then
    export IMGBUILD_CA_BUNDLE="${SSL_CERT_FILE}"
fi
recipe="${1:-cpu}"
imgbuild build "${recipe}"
imgbuild verify "${recipe}"
imgbuild verify "${recipe}" --nodes 2
