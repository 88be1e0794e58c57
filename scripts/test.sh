#!/usr/bin/env bash
# The test command (README, .ci/run): set up this machine (Docker engine, debootstrap, base image, the
# package), then lint, type-check and run every test, Docker-marked ones included. In CI (CI=true) a test that
# needs the engine fails, never skips, when none answers.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
source scripts/ca-env.sh
PYTHON="${PYTHON:-python3}"

echo "==> ruff"
"${PYTHON}" -m ruff check src tests benchmarks
"${PYTHON}" -m ruff format --check src tests benchmarks
echo "==> mypy"
"${PYTHON}" -m mypy
echo "==> pytest"
"${PYTHON}" -m pytest -p no:cacheprovider --durations=15 "$@"
