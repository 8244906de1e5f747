#!/usr/bin/env bash
# Exercise 8, what the database forgets, Stripe remembers: an asynchronous HA cluster
# (loadtest/ha.sh up --async) fails over onto a standby that was cut off, and forgets two
# acknowledged payments; their retries rebuild the same payments (the same id and PaymentIntent,
# not a replay) and the simulator charges nothing new. Needs what loadtest/ha.sh needs (root, or
# Patroni, etcd and HAProxy installed).
. "$(dirname "$0")/common.bash"

# The cluster lives in the check's own folder (the exercise uses ha.sh's default), and whatever
# happens, the API server goes back to the workshop's database and the cluster is stopped.
export HA_DIR=$scratch/ha
previous_exit=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
finish() {
    local status=$?
    set +e
    stop; serve > /dev/null
    "$repo/loadtest/ha.sh" down > /dev/null 2>&1
    eval "$previous_exit"
    exit "$status"
}
trap finish EXIT
cd "$repo" || exit 1    # the exercise runs from the repository's top folder, like setup.sh

eval "$(loadtest/ha.sh up --async)"     # node1 leads; writes go through HAProxy at $HA_URL
psql "$HA_URL" -c 'create database workshop'
HA_DB=${HA_URL%/*}/workshop
stop; serve DATABASE_URL=$HA_DB         # the API server on the cluster (it migrates the database)
KEY=$(DATABASE_URL=$HA_DB payonce customers create workshop-ha)
loadtest/ha.sh lag --pause node2        # node2 stops receiving the leader's WAL
first_a=$(pay order-8a); first_b=$(pay order-8b)
expect "order-8a before the failover" "$(status_of "$first_a")" 201
expect "order-8b before the failover" "$(status_of "$first_b")" 201
node2=$(printf '%s' "$HA_NODE_URLS" | cut -d, -f2)
expect "payments on node2 before the failover" "$(psql "${node2%/*}/workshop" -XAtc "select count(*) from payments")" 0
loadtest/ha.sh failover node2           # node2 leads now, without them
loadtest/ha.sh lag --resume node2
rows=$(psql "$HA_DB" -c "select key, state from idempotency_keys where key like 'order-8%'")
echo "$rows"
expect_match "the keys after the failover" "$rows" '\(0 rows\)'
expect "payments left after the failover" "$(psql "$HA_DB" -XAtc "select count(*) from payments")" 0
# node1 had them and was rewound to follow node2 (once it has rejoined).
for _ in $(seq 60); do grep -q 'pg_rewind: servers diverged' "$HA_DIR/logs/node1.log" && break; sleep 1; done
expect_match "node1's log" "$(grep -h 'servers diverged' "$HA_DIR/logs/node1.log" | head -n 1)" 'pg_rewind: servers diverged'

again_a=$(pay order-8a)
expect "order-8a retried" "$(status_of "$again_a")" 201
[ -z "$(header_of "$again_a" idempotent-replayed)" ] || fail "the key was gone: the retry rebuilds the payment, it is not a replay"
expect "order-8a's payment id" "$(member_of "$again_a" id)" "$(member_of "$first_a" id)"
expect "order-8a's PaymentIntent" "$(member_of "$again_a" payment_intent)" "$(member_of "$first_a" payment_intent)"
expect "charges order-8a" "$(charges order-8a)" 1
[ "$(member_of "$again_a" created)" != "$(member_of "$first_a" created)" ] ||
    fail "the rebuilt payment has a new 'created' (the exercise asks why)"
again_b=$(pay order-8b)
expect "order-8b retried" "$(status_of "$again_b")" 201
expect "order-8b's payment id" "$(member_of "$again_b" id)" "$(member_of "$first_b" id)"
expect "order-8b's PaymentIntent" "$(member_of "$again_b" payment_intent)" "$(member_of "$first_b" payment_intent)"
expect "charges order-8b" "$(charges order-8b)" 1
in_source app/src/idempotency/identity.rs 'pub fn identity\(customer_id'
in_source docs/expiry.md '## When the database forgets'
in_source docs/ha.md '## synchronous_mode or synchronous_mode_strict'

stop; serve; KEY=$(cat "$WORKSHOP_DIR/api-key")
loadtest/ha.sh down
expect "the workshop's customer again" "$(status_of "$(pay order-8-local)")" 201
