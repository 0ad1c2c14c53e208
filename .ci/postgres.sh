#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for waymark's PostgreSQL tests, on 127.0.0.1 only.
#
#   eval "$(bash .ci/postgres.sh start)"   start one; prints `export WAYMARK_TEST_PG=postgres://...`
#   bash .ci/postgres.sh stop              stop it and delete its files
#
# The cluster lives in a temporary directory named in $WAYMARK_PG_DIR (default
# ${TMPDIR:-/tmp}/waymark-pg), listens on a free port of 127.0.0.1 (no Unix socket, no other
# address), asks for passwords (scram-sha-256), and has a database `waymark` and a role `waymark` with the
# password `waymark`. With `openssl` on the PATH the server also speaks TLS: a certificate
# authority and a server certificate for 127.0.0.1 and localhost are made in $dir/tls, `start`
# also prints `export WAYMARK_TEST_PG_CA=FILE` (the authority's certificate), and a role and
# database `waymark_tls` (password `waymark_tls`) take TLS connections only. PostgreSQL refuses to
# run as root: as root, the cluster is initialised and run as `nobody` (its directory is handed to that user). The binaries are looked up on the PATH, then in
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
    tls_setup
    server_start "$bin" "$port"
    create_db "$bin" "$port"
  fi
  echo "export WAYMARK_TEST_PG=postgres://waymark:waymark@127.0.0.1:$port/waymark"
  if [ -f "$dir/tls/ca.crt" ]; then echo "export WAYMARK_TEST_PG_CA=$dir/tls/ca.crt"; fi
}

server_start() {
  local bin=$1 port=$2 ssl=""
  if [ -f "$dir/tls/server.key" ]; then
    ssl="-c ssl=on -c ssl_cert_file=$dir/tls/server.crt -c ssl_key_file=$dir/tls/server.key"
  fi
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories= -c fsync=off -c max_connections=200 $ssl" \
    start >/dev/null || { cat "$dir/server.log" >&2; exit 1; }
}

# With openssl: a CA and a server certificate it signs (for 127.0.0.1 and localhost), the key
# private to the cluster's user, and pg_hba.conf lines that let `waymark_tls` in over TLS only
# (ahead of initdb's `host` lines, which take both).
tls_setup() {
  command -v openssl >/dev/null 2>&1 || return 0
  local t=$dir/tls
  mkdir -p "$t"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=waymark test CA" \
    -keyout "$t/ca.key" -out "$t/ca.crt" >"$t/openssl.log" 2>&1 || { cat "$t/openssl.log" >&2; exit 1; }
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$t/server.key" -out "$t/server.csr" \
    >>"$t/openssl.log" 2>&1 || { cat "$t/openssl.log" >&2; exit 1; }
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n' >"$t/server.ext"
  openssl x509 -req -in "$t/server.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial -days 2 \
    -extfile "$t/server.ext" -out "$t/server.crt" >>"$t/openssl.log" 2>&1 || { cat "$t/openssl.log" >&2; exit 1; }
  chmod 755 "$t"
  chmod 644 "$t/ca.crt" "$t/server.crt"
  chmod 600 "$t/server.key" "$t/ca.key"
  [ "$(id -u)" = 0 ] && chown -R nobody:nogroup "$t"
  local hba=$dir/data/pg_hba.conf
  { printf 'hostnossl waymark_tls all 127.0.0.1/32 reject\nhostssl waymark_tls waymark_tls 127.0.0.1/32 scram-sha-256\n'
    cat "$hba"; } >"$hba.new"
  cat "$hba.new" >"$hba"
  rm -f "$hba.new"
}

# Create the roles and databases `waymark` and `waymark_tls`: with psql if there is one, else through
# PostgreSQL's single-user mode (the server stopped meanwhile).
create_db() {
  local bin=$1 port=$2
  if [ -x "$bin/psql" ]; then
    PGPASSWORD=postgres "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -q -v ON_ERROR_STOP=1 \
      -c "CREATE ROLE waymark LOGIN SUPERUSER PASSWORD 'waymark'" -c "CREATE DATABASE waymark OWNER waymark" \
      -c "CREATE ROLE waymark_tls LOGIN PASSWORD 'waymark_tls'" -c "CREATE DATABASE waymark_tls OWNER waymark_tls" \
      >/dev/null
  else
    # No psql: single-user mode cannot run while the server runs, so stop, create, start again.
    as_owner "$bin/pg_ctl" -D "$dir/data" -w stop >/dev/null
    printf "%s\n" "CREATE ROLE waymark LOGIN SUPERUSER PASSWORD 'waymark';" "CREATE DATABASE waymark OWNER waymark;" \
      "CREATE ROLE waymark_tls LOGIN PASSWORD 'waymark_tls';" "CREATE DATABASE waymark_tls OWNER waymark_tls;" \
      | as_owner "$bin/postgres" --single -D "$dir/data" postgres >"$dir/single.log" 2>&1 \
      || { cat "$dir/single.log" >&2; exit 1; }
    server_start "$bin" "$port"
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
