#!/bin/bash
# PgBouncer in the foreground, configured from the environment:
#   PGBOUNCER_UPSTREAM_HOST   the PostgreSQL server (required; a container's address)
#   PGBOUNCER_UPSTREAM_PORT   its port (default 5432)
#   PGBOUNCER_UPSTREAM_USER   the role PgBouncer logs in as (default postgres; the server
#                             must trust it: the test images do with
#                             POSTGRES_HOST_AUTH_METHOD=trust)
#   PGBOUNCER_POOL_MODE       transaction (default) or session
#   PGBOUNCER_MAX_PREPARED_STATEMENTS
#                             protocol-level prepared statements tracked per client
#                             (default 200; 0 turns the tracking off, as before 1.21)
#   PGBOUNCER_DEFAULT_POOL_SIZE  server connections per database/user (default 80: in
#                             session mode every client holds one; the server allows 100)
#   PGBOUNCER_MAX_CLIENT_CONN    client connections (default 1000)
#   PGBOUNCER_LISTEN_PORT     the port it listens on (default 6432; with --network host,
#                             several PgBouncers side by side need ports of their own)
# Clients connect to port 6432 with any user name and no password (auth_type = any: every
# connection logs in upstream as PGBOUNCER_UPSTREAM_USER); any database name is passed
# through. The admin console is the `pgbouncer` database (SHOW POOLS, SHOW CONFIG).
# Ready when stderr shows "process up: PgBouncer" (after "listening on 0.0.0.0:6432").
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
  set -- pgbouncer "$@"
fi
if [ "$1" != pgbouncer ]; then
  exec "$@"
fi

: "${PGBOUNCER_UPSTREAM_HOST:?set PGBOUNCER_UPSTREAM_HOST to the PostgreSQL server}"
: "${PGBOUNCER_UPSTREAM_PORT:=5432}"
: "${PGBOUNCER_UPSTREAM_USER:=postgres}"
: "${PGBOUNCER_POOL_MODE:=transaction}"
: "${PGBOUNCER_MAX_PREPARED_STATEMENTS:=200}"
: "${PGBOUNCER_DEFAULT_POOL_SIZE:=80}"
: "${PGBOUNCER_MAX_CLIENT_CONN:=1000}"
: "${PGBOUNCER_LISTEN_PORT:=6432}"
case "$PGBOUNCER_POOL_MODE" in
  transaction | session) ;;
  *) echo "Error: PGBOUNCER_POOL_MODE must be transaction or session" >&2; exit 1 ;;
esac

config=/var/lib/pgbouncer/pgbouncer.ini
cat >"$config" <<INI
[databases]
* = host=$PGBOUNCER_UPSTREAM_HOST port=$PGBOUNCER_UPSTREAM_PORT user=$PGBOUNCER_UPSTREAM_USER

[pgbouncer]
listen_addr = 0.0.0.0
listen_port = $PGBOUNCER_LISTEN_PORT
unix_socket_dir =
auth_type = any
admin_users = $PGBOUNCER_UPSTREAM_USER
stats_users = $PGBOUNCER_UPSTREAM_USER
pool_mode = $PGBOUNCER_POOL_MODE
max_prepared_statements = $PGBOUNCER_MAX_PREPARED_STATEMENTS
default_pool_size = $PGBOUNCER_DEFAULT_POOL_SIZE
max_client_conn = $PGBOUNCER_MAX_CLIENT_CONN
; sqlx sends extra_float_digits as a startup parameter, which PgBouncer does not forward.
ignore_startup_parameters = extra_float_digits
INI
echo "entrypoint: pool_mode = $PGBOUNCER_POOL_MODE, max_prepared_statements = $PGBOUNCER_MAX_PREPARED_STATEMENTS, upstream $PGBOUNCER_UPSTREAM_HOST:$PGBOUNCER_UPSTREAM_PORT"
exec "$@" "$config"
