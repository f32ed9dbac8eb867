#!/bin/bash
# The parts of the official mariadb image's docker-entrypoint.sh that testcontainers and
# these tests rely on:
# - arguments starting with `-` are the server's;
# - MARIADB_ALLOW_EMPTY_ROOT_PASSWORD / MARIADB_ROOT_PASSWORD (one is required),
#   MARIADB_ROOT_HOST (default %), MARIADB_DATABASE, MARIADB_USER / MARIADB_PASSWORD,
#   MARIADB_INITDB_SKIP_TZINFO, and the MYSQL_* spellings of each;
# - /docker-entrypoint-initdb.d/*.sql, *.sql.gz and *.sh run once after initialisation;
# - the log stream testcontainers waits on: the module waits on stderr for
#   "mariadbd: ready for connections." and then "port: 3306". The temporary server used
#   for initialisation has networking off (its ready line says port: 0) and logs to
#   stdout here, so both lines on stderr come from the final server.
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
  set -- mariadbd "$@"
fi
if [ "$1" != mariadbd ] && [ "$1" != mysqld ]; then
  exec "$@"
fi

env_or() { # MARIADB_X name: its value, else MYSQL_X's, else empty
  local m=MARIADB_$1 y=MYSQL_$1
  printf '%s' "${!m:-${!y:-}}"
}
root_password=$(env_or ROOT_PASSWORD)
allow_empty=$(env_or ALLOW_EMPTY_ROOT_PASSWORD)
root_host=$(env_or ROOT_HOST); root_host=${root_host:-%}
database=$(env_or DATABASE)
user=$(env_or USER)
password=$(env_or PASSWORD)
skip_tzinfo=$(env_or INITDB_SKIP_TZINFO)

DATADIR=/var/lib/mysql
SOCKET=/run/mysqld/mysqld.sock

sql_string() { # a quoted SQL string literal
  local s=${1//\\/\\\\}
  printf "'%s'" "${s//\'/\\\'}"
}

if [ ! -d "$DATADIR/mysql" ]; then
  if [ -z "$root_password" ] && [ -z "$allow_empty" ]; then
    echo "Error: Database is uninitialized and password option is not specified" >&2
    echo "       Set MARIADB_ROOT_PASSWORD or MARIADB_ALLOW_EMPTY_ROOT_PASSWORD." >&2
    exit 1
  fi
  echo "entrypoint: initialising $DATADIR"
  mariadb-install-db --datadir="$DATADIR" --rpm --skip-test-db \
    --auth-root-authentication-method=normal \
    --skip-log-bin --expire-logs-days=0 --default-time-zone=SYSTEM

  # The temporary server: socket only, logging to stdout.
  "$@" --skip-networking --socket="$SOCKET" --skip-log-bin --default-time-zone=SYSTEM \
    --loose-innodb-buffer-pool-load-at-startup=0 2>&1 &
  temp_pid=$!
  client=(mariadb --protocol=socket --socket="$SOCKET" -uroot --database=mysql)
  for _ in $(seq 1 60); do
    "${client[@]}" -e 'SELECT 1' >/dev/null 2>&1 && break
    kill -0 "$temp_pid" 2>/dev/null || { echo "entrypoint: temporary server died" >&2; exit 1; }
    sleep 0.5
  done
  "${client[@]}" -e 'SELECT 1' >/dev/null

  if [ -z "$skip_tzinfo" ]; then
    # Time zone tables, as upstream (tzinfo output uses its own session settings).
    mariadb-tzinfo-to-sql /usr/share/zoneinfo 2>/dev/null | "${client[@]}"
  fi

  {
    echo "SET @@SESSION.SQL_LOG_BIN = 0;"
    echo "SET @@SESSION.SQL_MODE = REPLACE(@@SESSION.SQL_MODE, 'NO_BACKSLASH_ESCAPES', '');"
    # Only the root accounts set up below, and no anonymous ones.
    echo "DROP USER IF EXISTS root@'127.0.0.1', root@'::1', ''@'localhost';"
    echo "EXECUTE IMMEDIATE CONCAT('DROP USER IF EXISTS root@\\'', @@hostname, '\\'');"
    echo "EXECUTE IMMEDIATE CONCAT('DROP USER IF EXISTS \\'\\'@\\'', @@hostname, '\\'');"
    pw=$(sql_string "$root_password")
    echo "ALTER USER root@localhost IDENTIFIED BY $pw;"
    if [ "$root_host" != localhost ]; then
      h=$(sql_string "$root_host")
      echo "CREATE USER root@$h IDENTIFIED BY $pw;"
      echo "GRANT ALL ON *.* TO root@$h WITH GRANT OPTION;"
      echo "GRANT PROXY ON ''@'%' TO root@$h WITH GRANT OPTION;"
    fi
    if [ -n "$database" ]; then
      echo "CREATE DATABASE IF NOT EXISTS \`${database//\`/\`\`}\`;"
    fi
    if [ -n "$user" ]; then
      u=$(sql_string "$user")
      echo "CREATE USER $u@'%' IDENTIFIED BY $(sql_string "$password");"
      [ -n "$database" ] && echo "GRANT ALL ON \`${database//\`/\`\`}\`.* TO $u@'%';"
    fi
    echo "FLUSH PRIVILEGES;"
  } | "${client[@]}"

  if [ -n "$root_password" ]; then
    client+=(--password="$root_password")
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sh) echo "entrypoint: running $f"; . "$f" ;;
      *.sql) echo "entrypoint: running $f"; "${client[@]}" --database="${database:-mysql}" <"$f" ;;
      *.sql.gz) echo "entrypoint: running $f"; gunzip -c "$f" | "${client[@]}" --database="${database:-mysql}" ;;
      *) [ -e "$f" ] && echo "entrypoint: ignoring $f" ;;
    esac
  done

  kill "$temp_pid"
  wait "$temp_pid" || true
  echo "entrypoint: MariaDB init process done. Ready for start up."
fi

exec "$@"
