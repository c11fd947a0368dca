#!/usr/bin/env bash
# Build the images of docker-compose.yml, bring the stack up under podman, and bring a tunnel
# up through it: the API container (its server running as the image's unprivileged user, the
# database password readable by that user alone) registers the two gateway containers and
# negotiates and sets up a tunnel between them, which both gateways' swanctl must show with
# the suite the API chose. Then take it all down (containers, network, volumes, and the
# password secret if the check made it; the images stay cached).
#
# Debian 12, root. Installs what it needs: podman with runc, mmdebstrap, and podman-compose
# from the lock (the project's .venv, scripts/setup.sh). No image registry is needed: the
# base image is made with mmdebstrap from this machine's own apt mirror
# (deploy/base/build-base.sh) when it is missing. Every wait is bounded. Exits non-zero on any
# failure, after printing the containers' logs and cleaning up; safe to run again.
#
#   bash scripts/compose-check.sh
#
#   QOSS_PORT=8000    publish the API on 127.0.0.1:8000 (default: a free port)
#   QOSS_BASE_IMAGE   the base image (default localhost/qoss-base:bookworm, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
started=$SECONDS

export CONTAINERS_CONF=$root/deploy/podman/containers.conf
project=qoss-check
base=${QOSS_BASE_IMAGE:-localhost/qoss-base:bookworm}
work=$(mktemp -d /tmp/qoss-compose-check.XXXXXX)
stack_up=0
secret=qoss_pg_password             # the database password: docker-compose.yml's external secret
secret_label=io.qoss.compose-check  # on the secret when this check made it

step() { printf '== %s (at %d s)\n' "$*" "$((SECONDS - started))" >&2; }
checked() { printf 'checked: %s\n' "$*" >&2; }
fail() { printf 'compose-check: FAILED: %s\n' "$*" >&2; exit 1; }

down() {
  "${compose[@]}" down -v >"$work/down.log" 2>&1 || true
  # Anything of this project an interrupted run may have left: containers, volumes, network,
  # and the database password if this check made it (its label says so; a stack's own stays).
  podman ps -aq --filter "label=io.podman.compose.project=$project" | xargs -r podman rm -f >/dev/null 2>&1 || true
  podman volume ls -q | grep "^${project}_" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
  podman network ls -q | grep "^${project}_" | xargs -r podman network rm -f >/dev/null 2>&1 || true
  if [[ $(podman secret inspect -f "{{index .Spec.Labels \"$secret_label\"}}" "$secret" 2>/dev/null) == "$project" ]]; then
    podman secret rm "$secret" >/dev/null 2>&1 || true
  fi
}
logs() {
  for c in postgres api gw-left gw-right; do
    echo "--- ${project}_${c}_1 (last 30 lines)" >&2
    timeout 20 podman logs --tail 30 "${project}_${c}_1" >&2 2>&1 || true
  done
}
finish() {
  local rc=$?
  if ((stack_up)); then
    ((rc == 0)) || logs
    step "down"
    down
  fi
  rm -rf "$work"
  if ((rc == 0)); then
    echo "compose-check: ok, in $((SECONDS - started)) s" >&2
  else
    echo "compose-check: failed (exit $rc), after $((SECONDS - started)) s" >&2
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One run at a time on a machine: the project name, the network and its addresses are fixed.
exec 9>/run/lock/qoss-compose-check.lock
flock -w 900 9 || fail "another compose-check held /run/lock/qoss-compose-check.lock for 15 min"

step "packages"
need=()
for pkg in podman runc mmdebstrap slirp4netns uidmap containernetworking-plugins iptables curl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -qq
  timeout 1200 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
timeout 1200 bash scripts/setup.sh   # the project's .venv from requirements/dev.txt: podman-compose is its compose extra
compose=("$root/.venv/bin/podman-compose" -p "$project")
"${compose[0]}" version >/dev/null 2>&1 || fail "podman-compose is not in .venv (requirements/dev.txt)"

if ! podman image exists "$base"; then
  step "base image $base"
  bash deploy/base/build-base.sh "$base"
fi

step "images"
build() {  # TAG CONTEXT [PODMAN BUILD ARGS...]: rebuild (layer cache), drop the image it replaces
  local tag=$1 context=$2 old new from=$SECONDS
  shift 2
  old=$(podman image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)
  timeout 1800 podman build --build-arg BASE="$base" -t "$tag" "$@" "$context" >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; fail "building $tag"; }
  new=$(podman image inspect -f '{{.Id}}' "$tag")
  if [[ -n $old && $old != "$new" ]]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
  checked "image $tag (${new:0:12}, $((SECONDS - from)) s)"
}
build localhost/qoss-postgres:latest deploy/postgres
build localhost/qoss-gateway:latest deploy/strongswan
# pip in the API build reaches PyPI with this machine's CA bundle (it may sit behind an
# intercepting proxy); mounted for the build only, never copied into the image.
build localhost/qoss-api:latest . -f Dockerfile \
  --build-arg PIP_CERT=/run/qoss-ca.crt -v /etc/ssl/certs/ca-certificates.crt:/run/qoss-ca.crt:ro

# Where the gateways are, as docker-compose.yml pins them.
read -r gw_left gw_right in_left in_right < <(.venv/bin/python - <<'PY'
import yaml
s = yaml.safe_load(open("docker-compose.yml"))["services"]
addr = {n: s[n]["networks"]["ike"]["ipv4_address"] for n in ("gw-left", "gw-right")}
inside = {n: s[n]["environment"]["INSIDE_ADDRESS"] for n in ("gw-left", "gw-right")}
print(addr["gw-left"], addr["gw-right"], inside["gw-left"], inside["gw-right"])
PY
)
port=${QOSS_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
api=http://127.0.0.1:$port

step "up (project $project, API on $api)"
stack_up=1
down
# The stack's password where a stack on this machine has one (only its containers read it);
# else one for this run, removed with the stack.
if ! podman secret inspect "$secret" >/dev/null 2>&1; then
  python3 -c "import secrets; print(secrets.token_urlsafe(24))" \
    | podman secret create --label "$secret_label=$project" "$secret" - >/dev/null
fi
QOSS_PORT=$port timeout 300 "${compose[@]}" up -d >"$work/up.log" 2>&1 \
  || { tail -n 40 "$work/up.log" >&2; fail "podman-compose up"; }
for _ in $(seq 1 120); do
  curl -fsS -m 2 "$api/healthz" >/dev/null 2>&1 && break
  [[ $(timeout 20 podman container inspect -f '{{.State.Running}}' "${project}_api_1") == true ]] \
    || fail "the API container stopped before it answered /healthz"
  sleep 1
done
curl -fsS -m 2 "$api/healthz" >/dev/null || fail "the API did not answer /healthz within 120 s"
checked "the API container answers /healthz on $api"

# The API runs as its image's unprivileged user, and the password is that user's alone.
qoss_uid=$(timeout 30 podman exec "${project}_api_1" id -u) || fail "id -u in the API container"
qoss_gid=$(timeout 30 podman exec "${project}_api_1" id -g) || fail "id -g in the API container"
server_uid=$(timeout 30 podman exec "${project}_api_1" awk '/^Uid:/ {print $2}' /proc/1/status) \
  || fail "reading the API server's uid"
((qoss_uid != 0)) || fail "the API container runs as root"
[[ $server_uid == "$qoss_uid" ]] || fail "the API server runs as uid $server_uid, not $qoss_uid"
for c in api postgres; do
  case $c in api) want="$qoss_uid:$qoss_gid:400" ;; postgres) want="0:0:400" ;; esac
  got=$(timeout 30 podman exec "${project}_${c}_1" stat -c %u:%g:%a /run/secrets/pg_password) \
    || fail "stat of the password in the $c container"
  [[ $got == "$want" ]] || fail "the password in the $c container is $got (uid:gid:mode), not $want"
done
checked "the API server runs as uid $qoss_uid (not root); the password is mode 0400, the API user's in its container, root's in PostgreSQL's"

psql() {  # SQL: run in the PostgreSQL container as the qoss role, over TCP with its password
  timeout 30 podman exec "${project}_postgres_1" sh -c \
    'PGPASSWORD=$(cat /run/secrets/pg_password) /usr/lib/postgresql/15/bin/psql -h 127.0.0.1 -U qoss -d qoss -tAc "$1"' \
    psql "$1"
}
revision=$(psql "SELECT version_num FROM alembic_version") || fail "reading the schema revision from PostgreSQL"
[[ -n $revision ]] || fail "PostgreSQL has no schema revision: the API did not migrate it"
checked "PostgreSQL migrated by the API container (revision $revision)"

token=$(timeout 60 podman exec "${project}_api_1" qoss-container qoss token create \
          --name compose-check --scopes admin --plain) || fail "qoss token create in the API container"
auth=(-H "Authorization: Bearer $token" -H "Content-Type: application/json")
call() {  # METHOD PATH [BODY]: the HTTP status on stdout, the body in $work/answer.json
  curl -sS -m 60 -o "$work/answer.json" -w '%{http_code}' "${auth[@]}" -X "$1" "$api$2" ${3:+-d "$3"}
}

step "gateways"
for side in left right; do
  container=${project}_gw-${side}_1
  for _ in $(seq 1 30); do
    timeout 10 podman exec "$container" test -S /var/run/qoss/charon.vici && break
    sleep 1
  done
  case $side in left) addr=$gw_left inside=$in_left ;; right) addr=$gw_right inside=$in_right ;; esac
  code=$(call POST /v1/gateways "{\"name\": \"$side\", \"vici_socket\": \"/var/run/qoss/$side/charon.vici\",
    \"ike_address\": \"$addr\", \"inside_networks\": [\"$inside/32\"]}")
  [[ $code == 201 ]] || fail "registering gateway $side: HTTP $code $(cat "$work/answer.json")"
  backend=$(python3 -c 'import json, sys; g = json.load(open(sys.argv[1])); print(g["backend"], "/", g["version"])' \
              "$work/answer.json")
  checked "gw-$side registered through the API at $addr over its shared VICI socket ($backend)"
done
[[ $(psql "SELECT count(*) FROM gateways") == 2 ]] || fail "PostgreSQL does not hold the two gateways"

step "tunnel"
code=$(call POST /v1/tunnels \
  '{"initiator": "left", "responder": "right", "min_levels": {"confidentiality": 8, "integrity": 8}}')
[[ $code == 201 ]] || fail "requesting the tunnel: HTTP $code $(cat "$work/answer.json")"
cp "$work/answer.json" "$work/tunnel.json"
read -r id state esp ike < <(python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
print(t["id"], t["state"], t["proposals"]["esp"], t["proposals"]["ike"])' "$work/tunnel.json")
[[ $state == up ]] || fail "tunnel $id is $state, not up: $(cat "$work/tunnel.json")"
checked "the API answered: tunnel $id is up, ESP $esp, IKE $ike"
[[ $(psql "SELECT state FROM tunnels WHERE id = '$id'") == up ]] || fail "PostgreSQL does not hold tunnel $id as up"

# What each charon says, read with swanctl inside its own container, against the API's choice.
for side in left right; do
  timeout 30 podman exec "${project}_gw-${side}_1" swanctl --list-sas --raw --uri unix:///var/run/qoss/charon.vici \
    >"$work/sas-$side.txt" || fail "swanctl --list-sas in gw-$side"
  python3 - "$work/sas-$side.txt" "$work/tunnel.json" "gw-$side" <<'PY' || fail "gw-$side's SAs do not match the API's tunnel"
import json, re, sys

raw, tunnel, who = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), sys.argv[3]
conn = tunnel["conn"]

ENCR = [(r"aes(\d+)gcm(8|12|16)", lambda m: ("AES_GCM_" + m[2], m[1])),
        (r"aes(\d+)ccm(8|12|16)", lambda m: ("AES_CCM_" + m[2], m[1])),
        (r"aes(\d+)ctr", lambda m: ("AES_CTR", m[1])),
        (r"aes(\d+)", lambda m: ("AES_CBC", m[1])),
        (r"camellia(\d+)", lambda m: ("CAMELLIA_CBC", m[1])),
        (r"blowfish(\d+)", lambda m: ("BLOWFISH_CBC", m[1])),
        (r"chacha20poly1305", lambda m: ("CHACHA20_POLY1305", None)),
        (r"3des", lambda m: ("3DES_CBC", None)),
        (r"null", lambda m: ("NULL", None))]
INTEG = {"md5": "HMAC_MD5_96", "sha1": "HMAC_SHA1_96", "sha256": "HMAC_SHA2_256_128",
         "sha384": "HMAC_SHA2_384_192", "sha512": "HMAC_SHA2_512_256", "aesxcbc": "AES_XCBC_96",
         "aescmac": "AES_CMAC_96"}
PRF = {"prfmd5": "PRF_HMAC_MD5", "prfsha1": "PRF_HMAC_SHA1", "prfsha256": "PRF_HMAC_SHA2_256",
       "prfsha384": "PRF_HMAC_SHA2_384", "prfsha512": "PRF_HMAC_SHA2_512", "prfaesxcbc": "PRF_AES128_XCBC",
       "prfaescmac": "PRF_AES128_CMAC"}


def dh(keyword):
    fixed = {"x25519": "CURVE_25519", "curve25519": "CURVE_25519", "x448": "CURVE_448", "curve448": "CURVE_448"}
    if keyword in fixed:
        return fixed[keyword]
    m = re.fullmatch(r"(modp|ecp)(\d+)", keyword)
    if m:
        return f"{m[1].upper()}_{m[2]}"
    sys.exit(f"{who}: no swanctl name known for key exchange {keyword!r}")


def encr(keyword):
    for pattern, name in ENCR:
        m = re.fullmatch(pattern, keyword)
        if m:
            return name(m)
    sys.exit(f"{who}: no swanctl name known for encryption {keyword!r}")


def fields(text):
    return dict(re.findall(r"([a-z-]+)=(\[[^]]*\]|[^\s}]+)", text))


events = [line for line in raw.splitlines() if line.startswith(f"list-sa event {{{conn} {{")]
if len(events) != 1:
    sys.exit(f"{who}: {len(events)} IKE_SAs named {conn}, not one, in:\n{raw}")
ike_text, _, child_text = events[0].partition("child-sas {")
ike, child = fields(ike_text), fields(child_text)
problems = []


def expect(where, got, key, want):
    if want is not None and got.get(key) != want:
        problems.append(f"{where} {key}={got.get(key)} (the API chose {want})")


expect("IKE_SA", ike, "state", "ESTABLISHED")
expect("CHILD_SA", child, "state", "INSTALLED")
expect("CHILD_SA", child, "mode", "TUNNEL")
expect("CHILD_SA", child, "protocol", tunnel["suite"]["protocol"].upper())
suite = tunnel["suite"]
name, size = encr(suite["encryption"])
expect("CHILD_SA", child, "encr-alg", name)
expect("CHILD_SA", child, "encr-keysize", size)
if suite["integrity"]:
    expect("CHILD_SA", child, "integ-alg", INTEG.get(suite["integrity"], suite["integrity"]))
name, size = encr(tunnel["ike"]["encryption"])
expect("IKE_SA", ike, "encr-alg", name)
expect("IKE_SA", ike, "encr-keysize", size)
if tunnel["ike"]["integrity"]:
    expect("IKE_SA", ike, "integ-alg", INTEG.get(tunnel["ike"]["integrity"], tunnel["ike"]["integrity"]))
expect("IKE_SA", ike, "prf-alg", PRF.get(tunnel["ike"]["prf"], tunnel["ike"]["prf"]))
expect("IKE_SA", ike, "dh-group", dh(tunnel["ike"]["key_exchange"]))
for key, want in (("local-ts", tunnel["local_ts"]), ("remote-ts", tunnel["remote_ts"])):
    if who == "gw-right":
        key = {"local-ts": "remote-ts", "remote-ts": "local-ts"}[key]
    expect("CHILD_SA", child, key, "[" + " ".join(want) + "]")
if problems:
    sys.exit(f"{who}: " + "; ".join(problems) + f"\n{raw}")
c = child
print(f"{who}: IKE_SA {conn} ESTABLISHED {ike['encr-alg']}-{ike['encr-keysize']}/{ike['prf-alg']}/{ike['dh-group']}; "
      f"CHILD_SA INSTALLED {c['mode']} {c['protocol']} {c['encr-alg']}"
      + (f"-{c['encr-keysize']}" if "encr-keysize" in c else "")
      + (f"/{c['integ-alg']}" if "integ-alg" in c else "")
      + f" {c['local-ts']} <-> {c['remote-ts']}")
PY
done > "$work/sas.txt"
while read -r line; do checked "swanctl --list-sas in $line"; done < "$work/sas.txt"

timeout 30 podman exec "${project}_gw-left_1" ping -c 3 -W 2 -I "$in_left" "$in_right" >"$work/ping.txt" || true
grep -q ' 3 received' "$work/ping.txt" \
  || fail "ping through the tunnel from $in_left to $in_right: $(cat "$work/ping.txt")"
for side in left right; do
  timeout 30 podman exec "${project}_gw-${side}_1" swanctl --list-sas --raw --uri unix:///var/run/qoss/charon.vici \
    >"$work/sas-$side.txt"
  packets=$(grep -o 'packets-in=[0-9]*' "$work/sas-$side.txt" | head -n 1 | cut -d= -f2)
  ((${packets:-0} >= 3)) || fail "gw-$side's CHILD_SA counted ${packets:-0} packets in, not the 3 pings"
done
checked "ping $in_left -> $in_right crossed the tunnel (3 of 3 answered; both CHILD_SAs counted the packets)"

code=$(call DELETE "/v1/tunnels/$id")
[[ $code == 204 ]] || fail "deleting tunnel $id: HTTP $code $(cat "$work/answer.json")"
for side in left right; do
  timeout 30 podman exec "${project}_gw-${side}_1" swanctl --list-conns --uri unix:///var/run/qoss/charon.vici \
    >"$work/conns-$side.txt"
  ! grep -q "qoss-$id" "$work/conns-$side.txt" || fail "gw-$side still has qoss-$id after DELETE"
done
checked "tunnel $id deleted through the API: neither charon has its conn any more"
