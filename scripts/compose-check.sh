#!/usr/bin/env bash
# Build the images of docker-compose.yml, bring the stack up under podman, and bring a tunnel
# up through it: the API container registers the two gateway containers and negotiates and
# sets up a tunnel between them, which both gateways' swanctl must show. Then take it all
# down (containers, network, volumes; the images stay for the next run).
#
# Debian 12, root. Installs what it needs: podman with runc, debootstrap, and podman-compose
# from the lock. No registry is needed: the base image is made with debootstrap from the
# machine's own apt mirror. Exits non-zero on any failure, after cleaning up.
#
#   bash scripts/compose-check.sh            QOSS_PORT=8000 by default (published on 127.0.0.1)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

export CONTAINERS_CONF=$root/deploy/podman/containers.conf
project=qoss-check
port=${QOSS_PORT:-8000}
base=localhost/qoss-base:bookworm
step() { printf '== %s\n' "$*" >&2; }
fail() { printf 'compose-check: %s\n' "$*" >&2; exit 1; }

step "packages"
need=()
for pkg in podman runc debootstrap slirp4netns uidmap containernetworking-plugins iptables; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
bash scripts/setup.sh   # the project's venv from the lock, podman-compose with it
compose=("$root/.venv/bin/podman-compose" -p "$project")

mirror() {  # the first Debian mirror apt uses here
  local m
  m=$(grep -h -o -E '^URIs: *\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n 1)
  [[ -n $m ]] || m=$(grep -h -o -E '^deb +\S+' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n 1)
  echo "${m:-http://deb.debian.org/debian}"
}

if ! podman image exists "$base"; then
  step "base image $base (debootstrap from $(mirror))"
  tmp=$(mktemp -d /var/tmp/qoss-base.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  debootstrap --variant=minbase --include=ca-certificates bookworm "$tmp/root" "$(mirror)" >/dev/null
  tar -C "$tmp/root" -c . | podman import - "$base" >/dev/null
  rm -rf "$tmp"
  trap - EXIT
fi

step "images"
ca=/etc/ssl/certs/ca-certificates.crt
podman build -q --build-arg BASE="$base" -t localhost/qoss-postgres:latest deploy/postgres >/dev/null
podman build -q --build-arg BASE="$base" -t localhost/qoss-gateway:latest deploy/strongswan >/dev/null
podman build -q --build-arg BASE="$base" --build-arg PIP_CERT=/run/qoss-ca.crt -v "$ca:/run/qoss-ca.crt:ro" \
  -t localhost/qoss-api:latest -f Dockerfile . >/dev/null

mkdir -p secrets
if [[ ! -s secrets/pg_password.txt ]]; then
  (umask 077 && python3 -c "import secrets; print(secrets.token_urlsafe(24))" > secrets/pg_password.txt)
fi

down() {
  "${compose[@]}" down -v >/dev/null 2>&1 || true
  # podman-compose 1.x leaves the named volumes of a project behind in some versions
  podman volume ls -q | grep "^${project}_" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
}
logs() {
  for c in api gw-left gw-right postgres; do
    echo "--- ${project}_${c}_1 (last 20 lines)" >&2
    podman logs --tail 20 "${project}_${c}_1" >&2 2>&1 || true
  done
}
trap 'rc=$?; if ((rc)); then logs; fi; down; exit $rc' EXIT
down

step "up"
QOSS_PORT=$port "${compose[@]}" up -d >/dev/null 2>&1 || fail "podman-compose up failed"
api=http://127.0.0.1:$port
for _ in $(seq 1 120); do
  curl -fsS -m 2 "$api/healthz" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS -m 2 "$api/healthz" >/dev/null || fail "the API did not answer /healthz within 120 s"
echo "checked: the API answers on $api, migrated on PostgreSQL" >&2

token=$(podman exec "${project}_api_1" qoss-container qoss token create --name compose-check --scopes admin --plain)
auth=(-H "Authorization: Bearer $token" -H "Content-Type: application/json")

step "gateways"
for side in left right; do
  case $side in left) addr=10.99.0.10 inside=10.1.0.1 ;; right) addr=10.99.0.11 inside=10.2.0.1 ;; esac
  for _ in $(seq 1 30); do
    podman exec "${project}_gw-${side}_1" test -S /var/run/qoss/charon.vici && break
    sleep 1
  done
  code=$(curl -sS -o /tmp/qoss-compose-gw.json -w '%{http_code}' "${auth[@]}" -X POST "$api/v1/gateways" \
    -d "{\"name\": \"$side\", \"vici_socket\": \"/var/run/qoss/$side/charon.vici\", \"ike_address\": \"$addr\",
         \"inside_networks\": [\"$inside/32\"]}")
  [[ $code == 201 ]] || fail "registering gateway $side: HTTP $code $(cat /tmp/qoss-compose-gw.json)"
done
echo "checked: both gateways registered through their VICI sockets (back end read from charon)" >&2

step "tunnel"
code=$(curl -sS -o /tmp/qoss-compose-tunnel.json -w '%{http_code}' "${auth[@]}" -X POST "$api/v1/tunnels" \
  -d '{"initiator": "left", "responder": "right", "min_levels": {"confidentiality": 8, "integrity": 8}}')
[[ $code == 201 ]] || fail "creating the tunnel: HTTP $code $(cat /tmp/qoss-compose-tunnel.json)"
read -r id state esp < <(python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
print(t["id"], t["state"], t["proposals"]["esp"])' /tmp/qoss-compose-tunnel.json)
[[ $state == up ]] || fail "tunnel $id is $state, not up"
echo "checked: tunnel $id is up with ESP proposal $esp" >&2
for side in left right; do
  sas=$(podman exec "${project}_gw-${side}_1" swanctl --list-sas --uri unix:///var/run/qoss/charon.vici)
  grep -q "INSTALLED" <<<"$sas" || fail "gw-$side shows no installed CHILD_SA: $sas"
  grep -q "ESTABLISHED" <<<"$sas" || fail "gw-$side shows no established IKE_SA: $sas"
  echo "checked: gw-$side swanctl --list-sas: $(grep -m1 -E 'INSTALLED' <<<"$sas" | sed 's/^ *//')" >&2
done
podman exec "${project}_gw-left_1" ping -c 2 -W 2 -I 10.1.0.1 10.2.0.1 >/dev/null \
  || fail "no ping through the tunnel from 10.1.0.1 to 10.2.0.1"
echo "checked: ping 10.1.0.1 -> 10.2.0.1 crossed the tunnel" >&2

code=$(curl -sS -o /dev/null -w '%{http_code}' "${auth[@]}" -X DELETE "$api/v1/tunnels/$id")
[[ $code == 204 ]] || fail "deleting tunnel $id: HTTP $code"
echo "compose-check: ok" >&2
