#!/bin/sh
# The payonce-patroni image's entry point (docker/standins/build): `patroni …` runs as the postgres
# user (PostgreSQL refuses root) once the data volume and the socket folder are postgres's; it stays
# PID 1, which Patroni handles (it reaps orphans and forwards SIGTERM to its own process). Anything
# else runs as given (`docker compose exec pg1 patronictl -c /etc/patroni/patroni.yml list`).
set -e
if [ "$1" = patroni ] && [ "$(id -u)" = 0 ]; then
    mkdir -p /var/lib/postgresql/data /var/run/postgresql
    chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
exec "$@"
