#!/usr/bin/env bash
# Set everything up and run the whole suite: ruff, mypy (strict on app/), pytest
# (unit, API, SQLite and a real PostgreSQL started here, real charon in network
# namespaces), then the container stack (scripts/compose-check.sh: the images built, the
# stack up under podman, a tunnel through it). Fails if pytest collects no tests or
# either part fails. With arguments: pytest ARGS alone (one process), no container stack.
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

stack=0
set +e
if [[ $# -gt 0 ]]; then  # the tests asked for, one at a time
  echo "== pytest" >&2
  .venv/bin/pytest "$@"
  rc=$?
else
  # Most tests wait on charon, servers and databases: QOSS_TEST_WORKERS (3, on 2 cores) run side by side,
  # each module on one worker (its labs and servers are made once, and a module's closing checks
  # see all of its tests). Those marked "alone" hold only with the machine to themselves: they
  # run after, one at a time.
  echo "== pytest (${QOSS_TEST_WORKERS:-3} workers)" >&2
  .venv/bin/pytest -n "${QOSS_TEST_WORKERS:-3}" --dist loadscope --durations=25 -m "not alone"
  rc=$?
  echo "== pytest (alone)" >&2
  .venv/bin/pytest -m alone
  alone=$?
  if [[ $rc -eq 0 || $alone -eq 5 ]]; then rc=$alone; fi
  # After pytest, never beside it: the image builds take both cores, and pytest's "alone"
  # tests need the machine to themselves. About 3 minutes from nothing (docs/containers.md).
  echo "== compose-check" >&2
  bash scripts/compose-check.sh
  stack=$?
fi
set -e
if [[ $rc -eq 5 ]]; then
  echo "test: pytest collected no tests" >&2
  exit 1
fi
if [[ $stack -ne 0 ]]; then
  echo "test: the container stack check failed (scripts/compose-check.sh, exit $stack)" >&2
  exit 1
fi
exit $rc
