#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests, on 127.0.0.1 only (Debian 12, root).
#   scripts/pg.sh start DIR [PORT]   initdb DIR if needed, start, print the SQLAlchemy URL (last line)
#   scripts/pg.sh stop DIR           stop the server of DIR (idempotent)
set -euo pipefail

cmd=${1:-}
dir=${2:-}
port=${3:-54329}
if [[ -z $cmd || -z $dir ]]; then
  echo "usage: $0 start DIR [PORT] | stop DIR" >&2
  exit 2
fi

bindir() {
  local b
  b=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [[ -z $b || ! -x $b/initdb ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
    b=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  echo "$b"
}

as_postgres() {
  if [[ $(id -u) -eq 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case $cmd in
  start)
    bin=$(bindir)
    mkdir -p "$dir"
    [[ $(id -u) -eq 0 ]] && chown postgres:postgres "$dir" && chmod 700 "$dir"
    if [[ ! -f $dir/PG_VERSION ]]; then
      as_postgres "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >/dev/null
    fi
    if ! as_postgres "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
      as_postgres "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >/dev/null
    fi
    for _ in $(seq 1 100); do
      if as_postgres "$bin/pg_isready" -h 127.0.0.1 -p "$port" -q; then
        echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
        exit 0
      fi
      sleep 0.2
    done
    echo "pg.sh: PostgreSQL did not become ready; see $dir/server.log" >&2
    exit 1
    ;;
  stop)
    [[ -f $dir/PG_VERSION ]] || exit 0
    bin=$(bindir)
    as_postgres "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null 2>&1 || true
    ;;
  *)
    echo "usage: $0 start DIR [PORT] | stop DIR" >&2
    exit 2
    ;;
esac
