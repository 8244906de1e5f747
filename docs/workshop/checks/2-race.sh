#!/usr/bin/env bash
# Exercise 2, the race: ten at once while the gateway takes 3 s: one 201, nine 409s whose
# Retry-After is the gateway timeout (30 s, sooner than the lease's 60), the same number the
# conflict events record; one charge; the code the exercise sends people to exists.
. "$(dirname "$0")/common.bash"

faults '{"latency_ms": 3000}' > /dev/null
out=$(for i in $(seq 10); do pay order-2 | grep -E '^HTTP|^retry-after' & done; wait)
echo "$out"
expect "201s" "$(printf '%s\n' "$out" | grep -c '^HTTP/1.1 201')" 1
expect "409s" "$(printf '%s\n' "$out" | grep -c '^HTTP/1.1 409')" 9
expect "distinct Retry-After values" "$(printf '%s\n' "$out" | tr -d '\r' | sed -n 's/^retry-after: //p' | sort -u)" 30
expect "charges for order-2" "$(charges order-2)" 1
sleep 0.3 # observations are written in batches
recorded=$(events order-2 | grep '^conflict' | sed -n 's/.*"retry_after": \([0-9]*\).*/\1/p' | sort -u)
expect "the Retry-After the conflict events record" "$recorded" 30
in_source app/src/idempotency/claim.rs 'fn claim_or_load'
in_source app/src/idempotency/claim.rs 'on conflict'
in_source app/src/idempotency/claim.rs 'pub fn retry_after'
in_source app/tests/api/concurrency.rs 'fn fifty_simultaneous'
faults '{}' > /dev/null
