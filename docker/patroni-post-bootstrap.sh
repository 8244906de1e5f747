#!/bin/sh
# Patroni's post_bootstrap for the `ha` profile (docker/patroni-ha.yml): run once, on the node that
# initialised the cluster, with a connection string to it as $1. The application's role and
# database, with the same development password as the `db` service's.
set -e
psql "$1" -v ON_ERROR_STOP=1 -q <<'SQL'
create role payonce login password 'payonce';
create database payonce owner payonce;
SQL
