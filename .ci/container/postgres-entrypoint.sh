#!/bin/bash
# The CI stand-in's entrypoint (see postgres.Containerfile): initialise PGDATA on the first
# start as the official image does, then exec the command (postgres).
set -euo pipefail
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start >/dev/null
  if [ "$db" != postgres ]; then
    createdb -h /var/run/postgresql -U "$user" "$db"
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "postgres: initialised $PGDATA (user $user, database $db)"
fi
if [ "${1:-}" = postgres ]; then
  shift
  exec postgres -c unix_socket_directories=/var/run/postgresql "$@"
fi
exec "$@"
