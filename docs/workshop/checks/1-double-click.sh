#!/usr/bin/env bash
# Exercise 1, the double click: a replay is byte for byte the first answer plus
# Idempotent-Replayed; another amount is a 422; the same JSON written differently is a replay.
. "$(dirname "$0")/common.bash"

first=$(pay order-1)
second=$(pay order-1)
expect "first status" "$(status_of "$first")" 201
expect "replay status" "$(status_of "$second")" 201
expect "replay header" "$(header_of "$second" idempotent-replayed)" true
expect "the replayed body" "$(printf '%s' "$second" | tail -n 2)" "$(printf '%s' "$first" | tail -n 2)"
[ "$(header_of "$first" x-request-id)" != "$(header_of "$second" x-request-id)" ] || fail "X-Request-Id differs"
expect "charges for order-1" "$(charges order-1)" 1
ledger > /dev/null

other=$(pay order-1 2000)
expect "another amount" "$(status_of "$other")" 422

reordered=$(curl -si $API/v1/payments -H "Authorization: Bearer $KEY" -H 'Idempotency-Key: order-1' \
     -H 'Content-Type: application/json' \
     -d '{ "payment_method":"pm_card_visa",  "currency": "usd", "amount":1000 }')
expect "the same JSON written differently" "$(status_of "$reordered")" 201
expect "...is a replay" "$(header_of "$reordered" idempotent-replayed)" true
in_source app/src/idempotency/fingerprint.rs 'fn canonical_json'
expect "charges for order-1 at the end" "$(charges order-1)" 1
