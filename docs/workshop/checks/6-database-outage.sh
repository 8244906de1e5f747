#!/usr/bin/env bash
# Exercise 6, the database goes away: during a retrying loop the database is killed and started
# again on the same port; the clients see 503s meanwhile, every key ends completed with exactly
# one charge, and the payment caught mid-flight was taken over (reclaimed) afterwards.
. "$(dirname "$0")/common.bash"

port_before=$(payonce db url)
stop; serve PAYONCE_LEASE_SECS=5
faults '{"latency_ms": 2000}' > /dev/null
for i in $(seq 10); do pay_until_done "loop-$i"; done > loop.log &
sleep 3; payonce db stop --immediate    # a crash: no checkpoint, crash recovery at the next start
sleep 5; payonce db start > /dev/null   # on the same port: every pool reconnects by itself
wait; faults '{}' > /dev/null
cat loop.log

expect "the database's URL after the restart" "$(payonce db url)" "$port_before"
expect_match "clients were told 503 meanwhile" "$(cat loop.log)" '503'
expect "loop keys, by state" "$(value "select state, count(*) from idempotency_keys where key like 'loop-%' group by 1")" "completed | 10"
doubles=$(curl -s "$SIM/_sim/charges" | python3 -c 'import collections, json, sys
keys = collections.Counter(c["metadata"].get("payonce_idempotency_key") for c in json.load(sys.stdin)["charges"])
print(sum(1 for k, n in keys.items() if k and k.startswith("loop-") and n != 1), sum(1 for k in keys if k and k.startswith("loop-")))')
expect "loop keys charged other than once, loop keys charged" "$doubles" "0 10"
reclaimed=$(value "select k.key || ' ' || (e.detail->>'owner') from idempotency_events e
                   join idempotency_keys k on k.id = e.key_id where e.kind = 'reclaimed' and k.key like 'loop-%'")
echo "taken over: $reclaimed"
[ -n "$reclaimed" ] || fail "no loop key was taken over: the outage missed every payment in flight"
in_source app/src/db/mod.rs 'ACQUIRE_TIMEOUT: Duration = Duration::from_secs\(2\)'
stop; serve
