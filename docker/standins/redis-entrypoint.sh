#!/bin/sh
# The stand-in redis image's entry point (docker/standins/build), as the real image's: run as the
# redis user, and without a config file turn protected mode off (the container's network is the
# boundary, and other containers must reach it).
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi
if [ "$1" = redis-server ] && [ "${2%.conf}" = "${2:-}" ]; then
    shift
    set -- redis-server --protected-mode no "$@"
fi
exec "$@"
