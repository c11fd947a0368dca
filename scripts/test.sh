#!/usr/bin/env bash
# Set everything up and run the whole suite: ruff, mypy (strict on app/), pytest
# (unit, API, SQLite and a real PostgreSQL started here, real charon in network
# namespaces). Fails if pytest collects no tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== lock" >&2
bash scripts/lock.sh --check

echo "== ruff" >&2
.venv/bin/ruff check .
echo "== mypy" >&2
.venv/bin/mypy

pgdir=$(mktemp -d /tmp/qoss-pg.XXXXXX)
cleanup() {
  bash scripts/pg.sh stop "$pgdir" >/dev/null 2>&1 || true
  rm -rf "$pgdir"
}
trap cleanup EXIT
port=${QOSS_TEST_PG_PORT:-54329}
QOSS_TEST_PG_URL=$(bash scripts/pg.sh start "$pgdir" "$port" | tail -n 1)
export QOSS_TEST_PG_URL

echo "== pytest" >&2
set +e
.venv/bin/pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "test: pytest collected no tests" >&2
  exit 1
fi
exit $rc
