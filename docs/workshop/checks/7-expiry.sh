#!/usr/bin/env bash
# Exercise 7, forgetting on purpose: with a 20 s TTL the key is reaped, the same key is then a
# new payment (a second charge, on purpose), the dashboard lists its tombstone under Expired, and
# the audit calls it "paid again after the key expired", not a double charge.
. "$(dirname "$0")/common.bash"

stop; serve PAYONCE_KEY_TTL_SECS=20
first=$(pay order-7)
expect "the first payment" "$(status_of "$first")" 201
while key_row order-7 | grep -q completed; do sleep 1; done    # about 25 s: the reaper's pass
stop; serve                     # the default TTL again: the next key lives 24 h, not 20 s
second=$(pay order-7)
expect "after expiry" "$(status_of "$second")" 201
[ -z "$(header_of "$second" idempotent-replayed)" ] || fail "after expiry the key is a new payment, not a replay"
[ "$(member_of "$first" payment_intent)" != "$(member_of "$second" payment_intent)" ] || fail "a new PaymentIntent"
expect "charges for order-7" "$(charges order-7)" 2

dash_login
expired=$(dash "/admin/keys?state=expired")
expect_match "the Expired filter lists the tombstone" "$expired" 'order-7'
expect_match "…and only expired keys" "$expired" '1 key match'
# Claimed under the default TTL, the second key outlives the exercise: no second tombstone later.
expect "the second key's lifetime" "$(sql "select expires_at > now() + interval '23 hours' from idempotency_keys where key = 'order-7'" | tail -n 1)" t
gateway=$(dash /admin/gateway)
printf '%s' "$gateway" | grep -q 'charged more than once' && fail "the audit raised the double-charge alarm"
expect_match "the audit" "$gateway" 'Paid again after the key expired \(1\)'
grep -q 'Expiry policy' "$repo/docs/expiry.md" || fail "docs/expiry.md lost its policy"
