#!/usr/bin/env bash
# The lock files: every Python package qoss installs, pinned with its hashes.
#
#   bash scripts/lock.sh             refresh after editing pyproject.toml: pins that still
#                                    fit are kept, new requirements get the newest release
#   bash scripts/lock.sh --upgrade   move every pin to the newest release (then run the suite)
#   bash scripts/lock.sh --upgrade-package NAME   move one
#   bash scripts/lock.sh --check     fail if the lock files do not match pyproject.toml
#
# requirements/dev.txt    qoss with every extra, its tests and tools (scripts/test.sh)
# requirements/runtime.txt  qoss alone, the same versions (scripts/serve.sh, the image)
# requirements/uv.txt     uv itself (scripts/uv.sh)
# Plain `pip install --require-hashes -r requirements/runtime.txt` reads them too.
set -euo pipefail
cd "$(dirname "$0")/.."

compile() {  # OUT_DIR ARGS...
  local out=$1
  shift
  local common=(pip compile --quiet --universal --python-version 3.11 --generate-hashes
                --custom-compile-command "bash scripts/lock.sh")
  bash scripts/uv.sh "${common[@]}" "$@" requirements/uv.in -o "$out/uv.txt"
  bash scripts/uv.sh "${common[@]}" "$@" --all-extras pyproject.toml requirements/build.in -o "$out/dev.txt"
  bash scripts/uv.sh "${common[@]}" "$@" -c "$out/dev.txt" pyproject.toml requirements/build.in \
    -o "$out/runtime.txt"
}

if [[ ${1:-} == --check ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir "$tmp/out"
  cp requirements/uv.txt requirements/dev.txt requirements/runtime.txt "$tmp/out/"
  compile "$tmp/out"
  sed -i "s#-c $tmp/out/dev.txt#-c requirements/dev.txt#" "$tmp/out/runtime.txt"
  if ! diff -u requirements/ "$tmp/out/" --exclude="*.in" >"$tmp/diff"; then
    echo "lock: requirements/*.txt do not match pyproject.toml; run 'bash scripts/lock.sh' and commit:" >&2
    grep -E '^[-+][a-z0-9]' "$tmp/diff" | head -40 >&2 || true
    exit 1
  fi
  echo "lock: requirements/*.txt match pyproject.toml" >&2
  exit 0
fi
compile requirements "$@"
