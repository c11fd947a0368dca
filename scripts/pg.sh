#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests, on 127.0.0.1 only (Debian 12; as root or
# as a user who may run initdb). Installs the `postgresql` package only when no initdb
# is found under /usr/lib/postgresql/*/bin.
#
#   scripts/pg.sh start DIR [PORT]   initdb DIR if needed, start it (default port 54329),
#                                    wait until it accepts connections, print the
#                                    SQLAlchemy URL as the last line of stdout
#   scripts/pg.sh stop DIR           stop the server of DIR (does nothing if not running)
#
# The cluster trusts every local and 127.0.0.1 connection, keeps its Unix socket in DIR
# and runs with fsync off: it is for tests, never for data anyone wants to keep.
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [PORT] | stop DIR" >&2
  exit 2
}

cmd=${1:-}
dir=${2:-}
port=${3:-54329}
[[ -n $cmd && -n $dir ]] || usage
[[ $port =~ ^[0-9]+$ ]] || { echo "pg.sh: PORT must be a number, not '$port'" >&2; exit 2; }
dir=$(realpath -m -- "$dir")   # the server runs as another user, from another directory

is_root() { [[ $(id -u) -eq 0 ]]; }

# The newest /usr/lib/postgresql/<version>/bin that has initdb, or nothing.
find_bindir() {
  local b found=""
  for b in /usr/lib/postgresql/*/bin; do
    [[ -x $b/initdb ]] && found="$b"$'\n'"$found"
  done
  [[ -n $found ]] && printf '%s' "$found" | sort -V | tail -n 1
  return 0
}

bindir() {
  local b
  b=$(find_bindir)
  if [[ -z $b ]]; then
    if ! is_root; then
      echo "pg.sh: PostgreSQL is not installed; run as root to install it (apt-get install postgresql)" >&2
      exit 1
    fi
    echo "pg.sh: installing postgresql (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    b=$(find_bindir)
    [[ -n $b ]] || { echo "pg.sh: no initdb after installing postgresql" >&2; exit 1; }
  fi
  printf '%s\n' "$b"
}

as_postgres() {
  if is_root; then
    (cd / && runuser -u postgres -- "$@")   # from /: the caller's directory may be closed to postgres
  else
    "$@"
  fi
}

start() {
  local bin
  bin=$(bindir)
  if is_root; then
    id postgres >/dev/null 2>&1 || { echo "pg.sh: there is no 'postgres' user to run the server" >&2; exit 1; }
    mkdir -p -- "$dir"
    chown postgres:postgres -- "$dir"
  else
    mkdir -p -- "$dir"
  fi
  chmod 700 -- "$dir"
  if [[ ! -f $dir/PG_VERSION ]]; then
    as_postgres "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
  fi
  if ! as_postgres "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    if ! as_postgres "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" \
        start >/dev/null; then
      echo "pg.sh: PostgreSQL did not start; the end of $dir/server.log:" >&2
      tail -n 20 "$dir/server.log" >&2 || true
      exit 1
    fi
  fi
  # The port of the server that runs (it may have been started earlier with another one).
  port=$(sed -n 4p "$dir/postmaster.pid")
  for _ in $(seq 1 150); do
    if as_postgres "$bin/pg_isready" -h 127.0.0.1 -p "$port" -q; then
      echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
      return 0
    fi
    sleep 0.2
  done
  echo "pg.sh: PostgreSQL did not become ready; see $dir/server.log" >&2
  exit 1
}

stop() {
  [[ -f $dir/PG_VERSION ]] || return 0
  local bin
  bin=$(bindir)
  if as_postgres "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    as_postgres "$bin/pg_ctl" -D "$dir" -m fast -w -t 60 stop >/dev/null
  fi
}

case $cmd in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
