#!/bin/bash
# The parts of the official postgres image's docker-entrypoint.sh that testcontainers and
# these tests rely on:
# - arguments starting with `-` are the server's (`-c fsync=off` from the module);
# - POSTGRES_USER (default postgres), POSTGRES_PASSWORD, POSTGRES_DB (default the user),
#   POSTGRES_HOST_AUTH_METHOD (pg_hba method for remote hosts), POSTGRES_INITDB_ARGS;
# - /docker-entrypoint-initdb.d/*.sql, *.sql.gz and *.sh run once after initdb;
# - the log stream testcontainers waits on: during initialisation a temporary server,
#   reachable only on the Unix socket, logs through pg_ctl to **stdout**; the real server
#   then runs in the foreground and logs to **stderr**. The module waits for "database
#   system is ready to accept connections" on stderr and then on stdout, so the stderr
#   line appears only once the final server accepts connections.
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
  set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
  exec "$@"
fi

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_HOST_AUTH_METHOD:=}"
: "${POSTGRES_INITDB_ARGS:=}"
export PGPORT=${PGPORT:-5432}

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
    echo "Error: Database is uninitialized and superuser password is not specified." >&2
    echo "       Set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust." >&2
    exit 1
  fi
  initdb_args=(--username="$POSTGRES_USER")
  if [ -n "${POSTGRES_PASSWORD:-}" ]; then
    initdb_args+=(--pwfile=/dev/stdin)
  fi
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a word list, as upstream.
  initdb "${initdb_args[@]}" $POSTGRES_INITDB_ARGS <<<"${POSTGRES_PASSWORD:-}"

  # Local connections stay `trust` (initdb's default); other hosts use the chosen method
  # (scram-sha-256 when a password is set, as upstream).
  method=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
  printf '\nhost all all all %s\n' "$method" >>"$PGDATA/pg_hba.conf"

  # The temporary server: Unix socket only; its log goes to stdout (pg_ctl without -l).
  pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p $PGPORT" -w start
  psql=(psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc)
  if [ "$POSTGRES_DB" != postgres ]; then
    echo 'CREATE DATABASE :"db";' | "${psql[@]}" --dbname postgres --set db="$POSTGRES_DB"
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh) echo "entrypoint: running $f"; . "$f" ;;
      *.sql) echo "entrypoint: running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
      *.sql.gz) echo "entrypoint: running $f"; gunzip -c "$f" | "${psql[@]}" --dbname "$POSTGRES_DB" ;;
      *) [ -e "$f" ] && echo "entrypoint: ignoring $f" ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop
  echo 'PostgreSQL init process complete; ready for start up.'
fi

exec "$@"
