#!/usr/bin/env bash
# Run uv, the installer and lock tool qoss uses, at the version requirements/uv.txt pins
# (hash-checked). It is installed once into a virtualenv of its own, .venv/.uv, so that
# `uv pip sync` of the project's environment never removes it.
#
#   bash scripts/uv.sh ARGS...     e.g. bash scripts/uv.sh pip list --python .venv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tools=.venv/.uv
want=$(sha256sum requirements/uv.txt | cut -d' ' -f1)
if [[ ! -x $tools/bin/uv || $(cat "$tools/.pinned" 2>/dev/null) != "$want" ]]; then
  rm -rf "$tools"
  "$PY" -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
    -r requirements/uv.txt
  echo "$want" > "$tools/.pinned"
fi
exec "$tools/bin/uv" "$@"
