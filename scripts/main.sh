#!/usr/bin/env bash
# The main job from nothing: set up this machine, build the cpu image and verify it (one container, then a
# two-node MPI run across containers).
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh --main
source scripts/ca-env.sh
recipe="${1:-cpu}"
imgbuild build "${recipe}"
imgbuild verify "${recipe}"
imgbuild verify "${recipe}" --nodes 2
