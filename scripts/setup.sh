#!/usr/bin/env bash
# Set up everything qoss needs on a fresh Debian 12 machine (run as root):
# Debian packages (strongSwan charon with kernel-libipsec and the standard plugins — openssl for the ECP
# groups, gcm for AES-GCM —, iperf3, iproute2, iptables, PostgreSQL, HAProxy for the test of
# several replicas behind a load balancer, chromium for the console's browser tests, charon-cmd:
# strongSwan's stock command-line client, the phone or laptop of the device tests)
# and a Python virtualenv in .venv with qoss and, from requirements/dev.txt, its dev tools
# (QOSS_LOCK=requirements/runtime.txt: qoss alone, unless .venv already holds the dev lock,
# which has every runtime pin: then it is left as it is). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  strongswan-charon strongswan-swanctl libstrongswan-standard-plugins libcharon-extra-plugins libstrongswan-extra-plugins
  iperf3 iproute2 iptables iputils-ping postgresql python3-venv haproxy
  chromium  # the console's browser tests (tests/ui/browser), driven by Playwright: no browser download
  charon-cmd  # a stock VPN client joining from a device profile (tests/integration/agent/test_device_join.py)
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The Debian packages start services we do not want: qoss starts its own charons
  # and its own PostgreSQL for tests.
  systemctl disable --now strongswan-starter postgresql haproxy >/dev/null 2>&1 || true
fi

# Python packages come only from the lock (requirements/, see scripts/lock.sh), hash-checked;
# qoss itself is installed editable on top, built by the locked setuptools.
lock=${QOSS_LOCK:-requirements/dev.txt}
dev=requirements/dev.txt
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
stamp=.venv/.qoss-installed  # the lock and pyproject.toml .venv was last synced to (a hash)
synced_to() { cat "$1" pyproject.toml | sha256sum | cut -d' ' -f1; }
covers() {  # BIG SMALL: every "name==version" pin of lock file SMALL is in lock file BIG
  "$PY" - "$1" "$2" <<'PY'
import re
import sys

def pins(path):
    return {pin.lower() for pin in re.findall(r"^[A-Za-z0-9][\w.-]*==[^\s;\\]+", open(path).read(), re.MULTILINE)}

sys.exit(0 if pins(sys.argv[2]) <= pins(sys.argv[1]) else 1)
PY
}
want=$(synced_to "$lock")
have=$(cat "$stamp" 2>/dev/null || true)
if [[ $have == "$want" ]]; then
  :  # synced to this lock already
elif [[ $have == "$(synced_to "$dev")" ]] && covers "$dev" "$lock"; then
  # Synced to the current dev lock, which holds every pin of this one at the same version
  # (scripts/lock.sh compiles runtime.txt against dev.txt): it serves as it is. Syncing would
  # remove the dev tools, which the test command would install again.
  :
else
  bash scripts/uv.sh pip sync --quiet --python .venv/bin/python --require-hashes "$lock"
  bash scripts/uv.sh pip install --quiet --python .venv/bin/python --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
# Bytecode compiled once, here, is read by every Python process that follows (a server, a
# client, each test worker), also where PYTHONDONTWRITEBYTECODE keeps them from writing their
# own: without it each process compiles qoss and its libraries again (about 2 s of CPU).
# Files already compiled and unchanged are skipped.
.venv/bin/python -m compileall -q -j 0 .venv/lib/python3*/site-packages app benchmarks migrations >/dev/null
