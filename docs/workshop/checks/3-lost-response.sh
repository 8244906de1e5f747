#!/usr/bin/env bash
# Exercise 3, the response that never came back: the client gets a 503 but the card is charged;
# the retry answers 201 with that very PaymentIntent (Stripe's replay), and there is one charge.
. "$(dirname "$0")/common.bash"

faults '{"drop_after_charge_rate": 1.0, "next_calls": 1}' > /dev/null
lost=$(pay order-3)
expect "the client's answer" "$(status_of "$lost")" 503
expect "charged anyway" "$(charges order-3)" 1
again=$(pay order-3)
if [ "$(status_of "$again")" = 409 ]; then
    wait=$(header_of "$again" retry-after)
    expect "a quick retry waits out the backoff" "$wait" 1
    sleep "$wait"
    again=$(pay order-3)
fi
expect "the retry" "$(status_of "$again")" 201
charged=$(curl -s "$SIM/_sim/charges" | python3 -c 'import json, sys
print([c["payment_intent"] for c in json.load(sys.stdin)["charges"] if c["metadata"].get("payonce_idempotency_key") == "order-3"][0])')
expect "the retry's PaymentIntent is the one charged" "$(member_of "$again" payment_intent)" "$charged"
expect "charges for order-3" "$(charges order-3)" 1
in_source app/src/gateway/mod.rs 'fn downstream_key'
faults '{}' > /dev/null
