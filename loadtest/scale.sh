#!/usr/bin/env bash
# The scale benchmark: payonce on an empty database and on one grown to N keys, measured the same
# way in one run. docs/performance.md ("Scale") explains the figures and records the latest ones.
#
#   1. a stack (loadtest/stack.sh: scratch database, simulator, one server) and an operator
#   2. on the empty database: new payments/s (closed loop, CONCURRENCY clients), replay p99 at
#      REPLAY_RATE/s (open loop), every dashboard page signed in (SAMPLES GETs each: p50, p95),
#      one sweeper pass (`payonce sweep --once`), table and index sizes
#   3. the database grown to N keys' history by SQL (loadtest/scale/fill.sql: completed, declined,
#      failed, expired tombstones, a few in flight and stuck, refunds, events, webhook inbox rows),
#      then VACUUM ANALYZE (what autovacuum does in the background)
#   4. the same measurements again, and the two side by side with the targets
#
#   loadtest/scale.sh                 10,000,000 keys (about an hour to fill on 2 cores)
#   loadtest/scale.sh --keys 1000000  a million
#   loadtest/scale.sh --smoke         CI: 20,000 keys, 2 s per load measurement, 5 GETs per page
#
# Knobs (environment): CONCURRENCY (16), REPLAY_RATE (1000), DURATION (10s), SAMPLES (30),
# PROFILE (release; `debug` for unoptimised binaries), PAYONCE_BIN, PAYONCE_LOADTEST_BIN,
# ADMIN_URL (postgres://postgres@127.0.0.1:5432/postgres).
set -euo pipefail
cd "$(dirname "$0")/.."

keys=10000000
concurrency=${CONCURRENCY:-16}
replay_rate=${REPLAY_RATE:-1000}
duration=${DURATION:-10s}
samples=${SAMPLES:-30}
profile=${PROFILE:-release}
admin_url=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
while [ $# -gt 0 ]; do
    case $1 in
        --keys) keys=$2; shift 2 ;;
        --smoke) keys=20000; duration=2s; samples=5; shift ;;
        *) echo "usage: loadtest/scale.sh [--keys N] [--smoke]" >&2; exit 2 ;;
    esac
done

. loadtest/stack.sh
stack_binaries "$profile"
for tool in psql python3 curl; do
    command -v "$tool" >/dev/null || { echo "scale.sh: $tool is required" >&2; exit 2; }
done

work=$(mktemp -d -t payonce-scale.XXXXXX)
trap 'stack_down; rm -rf "$work"' EXIT
RUST_LOG=warn stack_up 1
app_url=$BASE_URLS
database_url=$DATABASE_URL
PAYONCE_ADMIN_PASSWORD=scale-benchmark-password "$payonce" admins create scale >/dev/null 2>"$work/admin.log" ||
    { cat "$work/admin.log" >&2; exit 2; }

# Signs in as the operator; the session cookie stays in $work/cookies.
jar=$work/cookies
csrf=$(curl -fsS -c "$jar" -b "$jar" "$app_url/admin/login" | sed -n 's/.*name="csrf" value="\([^"]*\)".*/\1/p' | head -1)
curl -fsS -o /dev/null -c "$jar" -b "$jar" --data-urlencode "csrf=$csrf" --data-urlencode name=scale \
    --data-urlencode password=scale-benchmark-password --data-urlencode next= "$app_url/admin/login"

# One phase's measurements, to $work/<phase>.*.
measure() {
    local phase=$1
    echo "[$phase] new payments, $concurrency clients, $duration" >&2
    "$loadtest" new-payments --target "$app_url" --api-key "$API_KEY" --sim-url "$SIM_URL" \
        --concurrency "$concurrency" --duration "$duration" --json >"$work/$phase.new.json" ||
        echo "scale.sh: the $phase new-payments run reported a failure" >&2
    echo "[$phase] replays at $replay_rate/s, $duration" >&2
    "$loadtest" replays --target "$app_url" --api-key "$API_KEY" --sim-url "$SIM_URL" \
        --concurrency 64 --rate "$replay_rate" --duration "$duration" --json >"$work/$phase.replays.json" ||
        echo "scale.sh: the $phase replays run reported a failure" >&2

    # The pages: a key, a tombstone, a payment and a PaymentIntent taken from the middle of the
    # history (not the newest rows, which the caches hold anyway), a customer, a key's prefix.
    local key tomb payment pi customer prefix
    key=$(psql "$database_url" -Atc "select id from idempotency_keys where state = 'completed' and route = '/v1/payments'
        order by id desc offset (select least(count(*) / 2, 100000) from (select from idempotency_keys limit 200000) s) limit 1")
    tomb=$(psql "$database_url" -Atc "select key_id from idempotency_events where kind = 'expired' order by key_id desc offset 1000 limit 1")
    payment=$(psql "$database_url" -Atc "select 'pay_' || replace(id::text, '-', '') from payments where key_id = '$key'")
    pi=$(psql "$database_url" -Atc "select gateway_payment_intent_id from payments where key_id = '$key'")
    customer=$(psql "$database_url" -Atc "select 'cus_' || replace(customer_id::text, '-', '') from idempotency_keys where id = '$key'")
    prefix=$(psql "$database_url" -Atc "select left(key, length(key) - 2) from idempotency_keys where id = '$key'" |
        python3 -c "import sys, urllib.parse; print(urllib.parse.quote(sys.stdin.read().strip(), safe=''))")
    [ -n "$tomb" ] || tomb=$key  # the empty database has no tombstone yet
    : >"$work/$phase.pages"
    local name path
    while read -r name path; do
        [ -n "$name" ] || continue
        for _ in $(seq "$samples"); do
            curl -sS -o /dev/null -b "$jar" -w '%{http_code} %{time_total}\n' "$app_url$path" |
                sed "s|^|$name |" >>"$work/$phase.pages"
        done
    done <<EOF
overview /admin
keys /admin/keys
keys?state=in_flight /admin/keys?state=in_flight
keys?state=stuck /admin/keys?state=stuck
keys?state=completed /admin/keys?state=completed
keys?state=failed /admin/keys?state=failed
keys?state=expired /admin/keys?state=expired
keys?operation=refund /admin/keys?operation=refund
keys?customer= /admin/keys?customer=$customer
keys?q=<key-prefix> /admin/keys?q=$prefix
keys?q=pay_… /admin/keys?q=$payment
keys?q=pi_… /admin/keys?q=$pi
keys?before=<key> /admin/keys?before=$key
key-page /admin/keys/$key
tombstone-page /admin/keys/$tomb
payment-page /admin/payments/$payment
gateway-audit /admin/gateway
EOF

    echo "[$phase] one sweeper pass" >&2
    local started=$EPOCHREALTIME
    STRIPE_SECRET_KEY=sk_test_stack STRIPE_API_BASE="$SIM_URL/" RUST_LOG=warn \
        timeout 900 "$payonce" sweep --once >"$work/$phase.sweep.log" 2>&1 || echo "scale.sh: the sweeper pass failed" >&2
    python3 -c "import sys; print(f'{(float(sys.argv[2]) - float(sys.argv[1])) * 1000:.0f}')" "$started" "$EPOCHREALTIME" \
        >"$work/$phase.sweep.ms"
    psql "$database_url" -AtF ' ' -c "
        -- a partitioned table (the history, by day) is the sum of its partitions
        with tables as (
            select c.relname, case when c.relkind = 'p' then array(select relid from pg_partition_tree(c.oid)) else array[c.oid] end as parts
            from pg_class c join pg_namespace n on n.oid = c.relnamespace
            where n.nspname = 'public' and c.relkind in ('r', 'p')
              and c.relname in ('idempotency_keys', 'idempotency_events', 'payments', 'refunds', 'webhook_events')
        )
        select relname,
               (select sum(pg_table_size(p))::int8 from unnest(parts) p),
               (select sum(pg_indexes_size(p))::int8 from unnest(parts) p),
               coalesce((select sum(greatest(r.reltuples, 0))::int8 from unnest(parts) p join pg_class r on r.oid = p
                 where r.relkind = 'r'), 0)
        from tables
        order by 1" >"$work/$phase.sizes"
}

measure empty
echo "[fill] growing the database to $keys keys' history" >&2
fill_started=$SECONDS
PGOPTIONS="-c payonce.fill_keys=$keys" psql "$database_url" -q -f loadtest/scale/fill.sql >&2
psql "$database_url" -qc "vacuum analyze" >&2
fill_secs=$((SECONDS - fill_started))
measure full

python3 - "$work" "$keys" "$fill_secs" "$concurrency" "$replay_rate" "$duration" "$samples" "$profile" "$payonce" <<'PY'
import json, pathlib, platform, statistics, subprocess, sys

work, keys, fill_secs, concurrency, replay_rate, duration, samples, profile, binary = sys.argv[1:]
work = pathlib.Path(work)

def pages(phase):
    out = {}
    for line in (work / f"{phase}.pages").read_text().splitlines():
        name, code, secs = line.rsplit(" ", 2)
        out.setdefault(name, []).append((code, float(secs) * 1000))
    return out

def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]

def load(phase, name):
    try:
        return json.loads((work / f"{phase}.{name}.json").read_text())
    except (OSError, ValueError):
        return None

def sizes(phase):
    out = {}
    for line in (work / f"{phase}.sizes").read_text().splitlines():
        name, table, index, rows = line.split()
        out[name] = (int(table), int(index), int(rows))
    return out

mb = lambda n: f"{n / 1048576:,.0f} MB" if n >= 1048576 else f"{n / 1024:,.0f} kB"
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
pg = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout.strip()
print(f"\npayonce scale benchmark: {binary} at {rev}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores ({cpu}), {pg}")
print(f"  empty database vs {int(keys):,} keys' history (filled in {fill_secs} s); {duration} per load measurement, "
      f"{samples} GETs per page\n")

ok = True
broken = []  # what makes the run fail: a page that did not answer 200, a load run that failed its audit
new = {phase: load(phase, "new") for phase in ("empty", "full")}
rep = {phase: load(phase, "replays") for phase in ("empty", "full")}
tp = {p: (r or {}).get("stats", {}).get("throughput", 0.0) for p, r in new.items()}
p99 = {p: ((r or {}).get("stats", {}).get("latency") or {}).get("p99_ms", float("nan")) for p, r in rep.items()}
ratio = tp["full"] / tp["empty"] if tp["empty"] else 0.0
print(f"  {'':<26} {'empty':>12} {'full':>12}")
print(f"  {'new payments/s':<26} {tp['empty']:>12.0f} {tp['full']:>12.0f}   full/empty {ratio:.2f} (target >= 0.9: "
      f"{'met' if ratio >= 0.9 else 'NOT MET'})")
print(f"  {'replay p99 at ' + replay_rate + '/s':<26} {p99['empty']:>9.2f} ms {p99['full']:>9.2f} ms")
sweep = {p: (work / f"{p}.sweep.ms").read_text().strip() for p in ("empty", "full")}
print(f"  {'one sweeper pass':<26} {sweep['empty']:>9} ms {sweep['full']:>9} ms   (process start and connect included)")

print(f"\n  dashboard pages, ms (target p50 <= 100, p95 <= 250 at full)")
print(f"  {'page':<26} {'empty p50':>10} {'p95':>7} {'full p50':>10} {'p95':>7}")
empty_pages, full_pages = pages("empty"), pages("full")
for name, full in full_pages.items():
    empty = empty_pages.get(name, [])
    codes = {code for code, _ in full}
    f50, f95 = pct([t for _, t in full], 50), pct([t for _, t in full], 95)
    e50 = pct([t for _, t in empty], 50) if empty else float("nan")
    e95 = pct([t for _, t in empty], 95) if empty else float("nan")
    met = f50 <= 100 and f95 <= 250 and codes == {"200"}
    ok &= met
    note = "" if codes == {"200"} else f"  HTTP {','.join(sorted(codes))}"
    if codes != {"200"}:
        broken.append(f"{name} answered HTTP {','.join(sorted(codes))}")
    print(f"  {name:<26} {e50:>10.1f} {e95:>7.1f} {f50:>10.1f} {f95:>7.1f}   {'ok' if met else 'OVER'}{note}")

print(f"\n  {'table':<20} {'rows (est.)':>12} {'table':>10} {'indexes':>10}   (empty -> full)")
empty_sizes, full_sizes = sizes("empty"), sizes("full")
for name, (table, index, rows) in full_sizes.items():
    et, ei, er = empty_sizes.get(name, (0, 0, 0))
    print(f"  {name:<20} {rows:>12,} {mb(table):>10} {mb(index):>10}   (from {mb(et)} + {mb(ei)})")
print(f"\n  every page within the targets: {'yes' if ok else 'NO'}")
for phase in ("empty", "full"):
    for name, run in (("new payments", new[phase]), ("replays", rep[phase])):
        if not run or not run.get("verdict", {}).get("passed"):
            broken.append(f"{phase}: the {name} run failed or reported a failure")
for problem in broken:
    print(f"  scale.sh: {problem}", file=sys.stderr)
sys.exit(1 if broken else 0)
PY
