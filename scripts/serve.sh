#!/usr/bin/env bash
# Set everything up and run the service on its embedded default (SQLite in ./var),
# migrated and with the shipped rating tables and policies loaded, at 127.0.0.1:8000.
# Arguments go to `qoss serve`: --port N (or QOSS_PORT) and --host ADDRESS to listen
# elsewhere, --database-url URL; `.venv/bin/qoss serve --help` lists them all.
# The runtime lock's packages are installed, unless .venv already holds the dev lock's
# (scripts/test.sh), which has them all: then it serves from that environment as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
QOSS_LOCK=${QOSS_LOCK:-requirements/runtime.txt} bash scripts/setup.sh
exec .venv/bin/qoss serve "$@"
