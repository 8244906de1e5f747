#!/bin/bash
# The stand-in postgres image's entry point (docker/standins/build): what the real image's
# docker-entrypoint.sh does for the variables payonce and testcontainers use.
#   POSTGRES_USER (postgres), POSTGRES_PASSWORD, POSTGRES_DB (= user), POSTGRES_HOST_AUTH_METHOD
#   (scram-sha-256, or trust without a password), PGDATA, /docker-entrypoint-initdb.d/*.sql|*.sh
# A first start initialises PGDATA with a temporary server whose log goes to stdout; the real
# server then logs to stderr, so "ready to accept connections" shows on both, as with the real image.
set -euo pipefail

if [ "${1:0:1}" = '-' ]; then
    set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
    exec "$@"
fi

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chmod 0700 "$PGDATA"
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

echo "stand-in postgres image: $(postgres --version) (Debian bookworm's; built where no registry answers)"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "${POSTGRES_HOST_AUTH_METHOD:-}" != trust ]; then
        echo "error: POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)" >&2
        exit 1
    fi
    method=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host="$method" \
        --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA"
    rm -f "$pwfile"
    printf 'host all all all %s\n' "$method" >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"

    # The temporary server: local socket only, its log on stdout.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start
    export PGUSER=$user PGHOST=/var/run/postgresql
    if [ "$db" != postgres ]; then
        psql -v ON_ERROR_STOP=1 --dbname=postgres -qc "create database \"$db\""
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sql) psql -v ON_ERROR_STOP=1 --dbname="$db" -f "$f" ;;
            *.sh) . "$f" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
    unset PGUSER PGHOST
fi

exec "$@"
