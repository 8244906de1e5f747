#!/usr/bin/env bash
# Exercise 1, the double click: a replay is byte for byte the first answer plus
# Idempotent-Replayed; another amount is a 422; the same JSON written differently is a replay.
# Amounts are in the currency's minor unit as Stripe defines it: 1000 yen; 12.345 KWD refused.
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

yen=$(pay yen-1 1000 pm_card_visa jpy)
expect "1000 in yen" "$(status_of "$yen")" 201
dash_login
expect_match "the payment's page writes whole yen" "$(dash "/admin/payments/$(member_of "$yen" id)")" '1,000 JPY'
dinars=$(pay kwd-1 12345 pm_card_visa kwd)
expect "a dinar amount not ending in 0" "$(status_of "$dinars")" 400
expect_match "...refused naming the amount" "$dinars" 'multiple of 10 for KWD'
expect "...before any key is used" "$(value "select count(*) from idempotency_keys where key = 'kwd-1'")" 0
in_source app/src/money.rs 'pub fn check'
