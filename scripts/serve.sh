#!/usr/bin/env bash
# Set everything up and run the service on its embedded default (SQLite in ./var),
# migrated and with the shipped rating tables and policies loaded, at 127.0.0.1:8000.
set -euo pipefail
cd "$(dirname "$0")/.."
QOSS_LOCK=${QOSS_LOCK:-requirements/runtime.txt} bash scripts/setup.sh
exec .venv/bin/qoss serve "$@"
