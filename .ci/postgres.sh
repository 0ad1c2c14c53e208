#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for waymark's PostgreSQL tests, on 127.0.0.1 only.
#
#   eval "$(bash .ci/postgres.sh start)"   start one; prints `export WAYMARK_TEST_PG=postgres://...`
#   bash .ci/postgres.sh stop              stop it and delete its files
#
# The cluster lives in a temporary directory named in $WAYMARK_PG_DIR (default
# ${TMPDIR:-/tmp}/waymark-pg), listens on a free port of 127.0.0.1 (no Unix socket, no other
# address), asks for passwords (scram-sha-256), and has a database `waymark` and a role `waymark` with the
# password `waymark`. PostgreSQL refuses to run as root: as root, the cluster is initialised and run
# as `nobody` (its directory is handed to that user). The binaries are looked up on the PATH, then in
# /usr/local/bin and /usr/lib/postgresql/*/bin; PG_BIN overrides.
set -euo pipefail

dir=${WAYMARK_PG_DIR:-${TMPDIR:-/tmp}/waymark-pg}

find_bin() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  for d in /usr/local/bin /usr/lib/postgresql/*/bin; do
    if [ -x "$d/initdb" ]; then echo "$d"; return; fi
  done
  echo "postgres.sh: no PostgreSQL binaries (initdb, pg_ctl, postgres) found; set PG_BIN" >&2
  exit 1
}

# Run a command as the cluster's user: ourselves, or `nobody` when we are root.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
  local bin port
  bin=$(find_bin)
  if [ -f "$dir/port" ] && as_owner "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    port=$(cat "$dir/port")
  else
    rm -rf "$dir"
    mkdir -p "$dir"
    chmod 700 "$dir"
    [ "$(id -u)" = 0 ] && chown nobody:nogroup "$dir"
    port=$(free_port)
    echo "$port" > "$dir/port.tmp" && mv "$dir/port.tmp" "$dir/port"
    echo postgres > "$dir/pw"
    [ "$(id -u)" = 0 ] && chown nobody:nogroup "$dir/pw"
    # Passwords over TCP (so that a wrong one is refused, as in production), trust in single-user mode.
    as_owner "$bin/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pw" --auth-host=scram-sha-256 \
      --auth-local=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories= -c fsync=off -c max_connections=200" \
      start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
    create_db "$bin" "$port"
  fi
  echo "export WAYMARK_TEST_PG=postgres://waymark:waymark@127.0.0.1:$port/waymark"
}

# Create the role `waymark` and the database `waymark`: with psql if there is one, else through
# PostgreSQL's single-user mode (the server stopped meanwhile).
create_db() {
  local bin=$1 port=$2
  if [ -x "$bin/psql" ]; then
    PGPASSWORD=postgres "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -q -v ON_ERROR_STOP=1 \
      -c "CREATE ROLE waymark LOGIN SUPERUSER PASSWORD 'waymark'" -c "CREATE DATABASE waymark OWNER waymark" >/dev/null
  else
    # No psql: single-user mode cannot run while the server runs, so stop, create, start again.
    as_owner "$bin/pg_ctl" -D "$dir/data" -w stop >/dev/null
    printf "CREATE ROLE waymark LOGIN SUPERUSER PASSWORD 'waymark';\nCREATE DATABASE waymark OWNER waymark;\n" \
      | as_owner "$bin/postgres" --single -D "$dir/data" postgres >"$dir/single.log" 2>&1 \
      || { cat "$dir/single.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories= -c fsync=off -c max_connections=200" \
      start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
  fi
}

stop() {
  local bin
  bin=$(find_bin)
  if [ -d "$dir/data" ]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -w -t 60 -m fast stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: bash .ci/postgres.sh start|stop" >&2; exit 2 ;;
esac
