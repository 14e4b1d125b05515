#!/usr/bin/env bash
# Runs the whole suite: makes sure the setup is complete (idempotent, seconds when it is), then
# tox: ruff, mypy --strict, and pytest (unit, integration, end to end with real CRIU and NATS).
# Extra arguments go to pytest, e.g. ./test.sh -k restore
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"
./setup.sh --no-demo
if [ $# -gt 0 ]; then exec .venv/bin/tox -q -- "$@"; fi
exec .venv/bin/tox -q
