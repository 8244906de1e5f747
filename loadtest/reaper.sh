#!/usr/bin/env bash
# The reaper under load (docs/performance.md, "Retention and the reaper"): new payments
# at a fixed rate (an open loop, so that a slower server shows as latency, not as fewer
# requests), first quiet, then while the server's own sweeper reaps KEYS keys (default
# 1 000 000) expiring at once. Prints the payments' latency in both phases and their ratio
# (target: p99 during ≤ 2 × quiet), and the reaper's throughput (keys/s) while the payments ran
# and until the backlog was gone (or DRAIN_SECS passed), and the WAL each phase wrote.
#
# Both phases run with the keys in the table: they are inserted by SQL first, expiring
# SETTLE_SECS later; a VACUUM ANALYZE and then a checkpoint take the insert's own cost (its
# hint bits and visibility map set, every page written) out of the way; the quiet phase runs;
# then, once the keys expire, the reaping phase. So the two phases differ by the reaper alone.
# (Until 2026-12-03 the keys were inserted already expired between the phases, and the reaping
# phase also paid for the insert's checkpoint and autovacuum.)
#
#   loadtest/reaper.sh                      # release binaries from the target dir
#   KEYS=100000 DURATION=10s loadtest/reaper.sh   # shorter
#
# Settings (environment): KEYS (1000000), RATE (payments/s, 100), DURATION (per phase, 30s),
# SETTLE_SECS (from the insert to the keys' expiry, 120), KEY_IDS (v7, as the server makes them,
# or random: what the script used until 2026-12-03),
# CONCURRENCY (runner workers, 16), PAYONCE_BIN, PAYONCE_LOADTEST_BIN (default: the release
# binaries of CARGO_TARGET_DIR or target/), ADMIN_URL (postgres://postgres@127.0.0.1:5432/postgres).
# The server takes its own settings from this environment too: PAYONCE_REAP_RATE=2000, or 0 for
# the unpaced reaper, to see what its rate costs the payments.
set -euo pipefail
cd "$(dirname "$0")/.."

keys=${KEYS:-1000000}
rate=${RATE:-100}
duration=${DURATION:-30s}
settle=${SETTLE_SECS:-120}
concurrency=${CONCURRENCY:-16}
admin_url=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
target_dir=${CARGO_TARGET_DIR:-target}
payonce=${PAYONCE_BIN:-$target_dir/release/payonce}
loadtest=${PAYONCE_LOADTEST_BIN:-$target_dir/release/payonce-loadtest}
[ -x "$payonce" ] && [ -x "$loadtest" ] ||
    { echo "reaper.sh: build first: cargo build --release -p payonce -p payonce-loadtest" >&2; exit 2; }

work=$(mktemp -d -t payonce-reaper.XXXXXX)
. loadtest/stack.sh
trap 'stack_down; rm -rf "$work"' EXIT
RUST_LOG=warn stack_up 1
customer_id=$(psql "$DATABASE_URL" -Atc "select id from customers")

run() {
    "$loadtest" new-payments --target "$BASE_URLS" --api-key "$API_KEY" --sim-url "$SIM_URL" \
        --concurrency "$concurrency" --rate "$rate" --duration "$1" --json
}
expired() { psql "$DATABASE_URL" -Atc "select count(*) from idempotency_keys where expires_at <= now()"; }
now() { date +%s.%N; }
lsn() { psql "$DATABASE_URL" -Atc "select pg_current_wal_lsn()"; }
wal_since() { psql "$DATABASE_URL" -Atc "select pg_wal_lsn_diff(pg_current_wal_lsn(), '$1')::int8"; }

echo "warming up" >&2
run 5s >/dev/null

echo "inserting $keys keys that expire in $settle s" >&2
# Final keys (a stored 201), as a day's keys are a day later: one statement, one now(). Their ids
# are uuid v7, as the server makes them (the claim's time in the first 48 bits: one key per
# millisecond, a day ago), so they are reaped in id order, as a day's keys are: random ids would
# send each key's tombstone to a random page of the history's key index (a page written whole
# into the WAL after each checkpoint), which no real backlog does (KEY_IDS=random measures that).
case ${KEY_IDS:-v7} in
    v7) key_id="(lpad(to_hex((extract(epoch from now() - interval '1 day') * 1000)::int8 + i), 12, '0')
                 || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid" ;;
    random) key_id="gen_random_uuid()" ;;
    *) echo "reaper.sh: KEY_IDS is v7 or random, not ${KEY_IDS}" >&2; exit 2 ;;
esac
expire_at=$(psql "$DATABASE_URL" -qAt -c "
    insert into idempotency_keys
        (id, customer_id, key, method, route, fingerprint, request, state, recovery_point,
         response_status, response_headers, response_body, completed_at, created_at, expires_at)
    select $key_id, '$customer_id', 'expiring-' || i, 'POST', '/v1/payments',
           sha256(i::text::bytea), '{\"amount\": 1000, \"currency\": \"eur\"}', 'completed', 'finished',
           201, '{\"content-type\": \"application/json\"}', convert_to(repeat('x', 300), 'UTF8'),
           now() - interval '1 day', now() - interval '1 day', now() + make_interval(secs => $settle)
    from generate_series(1, $keys) as i;
    select extract(epoch from now() + make_interval(secs => $settle));")
# The vacuum first: it dirties every page the insert wrote (hint bits, the visibility map), and
# the checkpoint after it writes them, before the quiet phase rather than during it.
echo "settling: vacuum analyze, checkpoint" >&2
psql "$DATABASE_URL" -q -c "vacuum (analyze) idempotency_keys" -c "checkpoint"
echo "measuring: quiet ($duration at $rate/s, the keys in the table)" >&2
quiet_lsn=$(lsn)
run "$duration" >"$work/quiet.json"
quiet_wal=$(wal_since "$quiet_lsn")
wait_secs=$(python3 -c "import time; print(f'{$expire_at - time.time():.1f}')")
case $wait_secs in -*)
    echo "reaper.sh: the keys expired ${wait_secs#-} s before the quiet phase ended: raise SETTLE_SECS (now $settle)" >&2
    exit 1 ;;
esac
echo "waiting $wait_secs s for the keys to expire" >&2
sleep "$wait_secs"
before=$(expired)
reaping_lsn=$(lsn)
started=$(now)
echo "measuring: during the reaping ($duration at $rate/s; $before expired keys)" >&2
run "$duration" >"$work/during.json"
after=$(expired)
ended=$(now)
reaping_wal=$(wal_since "$reaping_lsn")

report() {
    python3 - "$work" "$keys" "$rate" "$duration" "$before" "$after" "$started" "$ended" "$quiet_wal" "$reaping_wal" "$@" <<'PY'
import json, pathlib, sys
work, keys, rate, duration, before, after, started, ended, quiet_wal, reaping_wal, *drain = sys.argv[1:]
work = pathlib.Path(work)
quiet, during = (json.loads((work / f"{name}.json").read_text())["stats"] for name in ("quiet", "during"))
before, after = int(before), int(after)
started, ended = float(started), float(ended)
def line(name, s):
    lat = s["latency"] or {}
    return (f"  {name:<22} {s['throughput']:6.0f}/s   p50 {lat.get('p50_ms', 0):7.2f} ms   "
            f"p95 {lat.get('p95_ms', 0):7.2f} ms   p99 {lat.get('p99_ms', 0):7.2f} ms   "
            f"max {lat.get('max_ms', 0):8.2f} ms   ({s['requests']} requests)")
if not drain:
    print(f"payonce reaper under load: {int(keys):,} expired keys, new payments at {rate}/s for {duration} per phase")
    print(line("payments, quiet", quiet))
    print(line("payments, reaping", during))
    ratio = (during["latency"] or {}).get("p99_ms", float("inf")) / (quiet["latency"] or {}).get("p99_ms", float("nan"))
    print(f"  p99 reaping / quiet    {ratio:.2f}x (target ≤ 2x: {'met' if ratio <= 2 else 'NOT met'})")
    print(f"  reaper while paying    {(before - after) / (ended - started):8.0f} keys/s ({before - after:,} keys in {ended - started:.1f} s)")
    # The whole server's WAL: the quiet phase's is the payments' own, the rest is the reaper's.
    quiet_wal, reaping_wal = int(quiet_wal), int(reaping_wal)
    reaper_wal = reaping_wal - quiet_wal
    per_key = f"{reaper_wal / (before - after):,.0f} bytes per reaped key" if before > after else "no key reaped"
    print(f"  WAL written            quiet {quiet_wal / 2**20:,.1f} MiB, reaping {reaping_wal / 2**20:,.1f} MiB"
          f" (the reaper's share: {per_key})")
else:
    left, at = int(drain[0]), float(drain[1])
    gone = before - left
    print(f"  reaper, backlog        {gone / (at - started):8.0f} keys/s ({gone:,} keys in {at - started:.1f} s; {left:,} left)")
PY
}
report
# The rest of the backlog, with nobody paying (at most DRAIN_SECS, default 600).
deadline=$(( $(date +%s) + ${DRAIN_SECS:-600} ))
while left=$(expired) && [ "$left" -gt 0 ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 1; done
report "$left" "$(now)"
