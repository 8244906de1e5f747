#!/usr/bin/env bash
# Exercise 4, the zombie: a server that charged and froze is killed; the dashboard (its own
# process) still shows the key, in flight and then stuck with why; a normal server finishes it
# through the sweeper with the same PaymentIntent: one charge, and the retry is a replay.
. "$(dirname "$0")/common.bash"

stop
serve PAYONCE_FAILPOINT=after_charge PAYONCE_LEASE_SECS=10
pay order-4 > /dev/null 2>&1 &
sleep 2; crash
wait || true

expect "charged before the crash" "$(charges order-4)" 1
row=$(key_row order-4 | tail -n 1)
expect_match "the key's row" "$row" '^processing \| payment_created \| 1 \| http:'
dash_login
id=$(value "select id from idempotency_keys where key = 'order-4'")
expect_match "the dashboard, still up, shows the key" "$(dash "/admin/keys/$id")" 'In flight'
for _ in $(seq 150); do
    [ "$(value "select locked_until <= now() from idempotency_keys where key = 'order-4'")" = t ] && break
    sleep 0.1
done
page=$(dash "/admin/keys/$id")
expect_match "then stuck" "$page" '<span class="badge stuck">Stuck</span>'
expect_match "saying why" "$page" 'Stuck because its holder stopped without a word'
expect_match "with its budget" "$page" 'attempts 1/12'

serve
for _ in $(seq 200); do
    [ "$(value "select state from idempotency_keys where key = 'order-4'")" = completed ] && break
    sleep 0.1
done
expect "finished by" "$(value "select detail->>'owner' from idempotency_events e join idempotency_keys k on k.id = e.key_id
                          where k.key = 'order-4' and e.kind = 'reclaimed'" | cut -d: -f1)" sweeper
replay=$(pay order-4)
expect "the retry" "$(status_of "$replay")" 201
expect "is a replay" "$(header_of "$replay" idempotent-replayed)" true
expect "charges for order-4" "$(charges order-4)" 1
grep -q 'sweep' "$WORKSHOP_DIR/serve.log" || fail "no sweep span in the log"
grep -q '### Sizing the lease' "$repo/docs/lifecycle.md" || fail "lifecycle.md lost 'Sizing the lease'"
