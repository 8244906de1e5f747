#!/bin/sh
# The stand-in haproxy image's entry point (docker/standins/build), as the real image's: flags
# alone mean haproxy, and haproxy runs in master-worker mode in the foreground (-W -db).
set -e
if [ "${1#-}" != "$1" ]; then
    set -- haproxy "$@"
fi
if [ "$1" = haproxy ]; then
    shift
    set -- haproxy -W -db "$@"
fi
exec "$@"
