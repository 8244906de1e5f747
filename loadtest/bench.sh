#!/usr/bin/env bash
# The benchmark: payonce against the limit of its own database, side by side, in one run on one
# machine. docs/performance.md explains the figures and records the latest ones.
#
#   1. the limit: pgbench running the database work of one new payment (the engine's own
#      statements, generated from .sqlx/ by loadtest/pgbench/new_payment.py), at CONCURRENCY
#   2. new payments per second through payonce (simulator without latency), at CONCURRENCY
#   3. replays: the most per second (a closed loop of REPLAY_CONCURRENCY clients), and their
#      latency at REPLAY_RATE per second offered by as many clients (an open loop)
#   4. a storm: STORM simultaneous requests with one key: time to settle, and one charge
#   5. the same handler with the idempotency layer bypassed (POST /bench/payments), at CONCURRENCY
#
# It prints the figures and the ratios (payonce / pgbench, layer on / layer off) with the targets,
# then what each request cost (loadtest/cost.py, around phases 1, 2, 3 and 5, and pgbench again at
# the rate payonce reached in phase 2): PostgreSQL's CPU, payonce's CPU, rows written and WAL
# bytes per new payment and per replay, beside pgbench's at the same rate, with the ratios and
# the cost targets.
#
#   loadtest/bench.sh            release binaries (built if missing), 15 s per measurement
#   loadtest/bench.sh --quick    3 s per measurement (a smoke test of the benchmark itself)
#
# Knobs (environment): CONCURRENCY (16), REPLAY_CONCURRENCY (64), REPLAY_RATE (5000), STORM (1000), DURATION (15s),
# WARMUP (3s), PAYONCE_DB_POOL_SIZE (16), PAYONCE_WORKER_THREADS (the servers' threads; unset: one
# per core), PROFILE (release; `debug` for unoptimised binaries),
# PAYONCE_BIN, PAYONCE_LOADTEST_BIN, ADMIN_URL (postgres://postgres@127.0.0.1:5432/postgres).
#   loadtest/bench.sh --strategies   the claim strategies compared instead (loadtest/strategies.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--strategies" ]; then shift; exec loadtest/strategies.sh "$@"; fi

concurrency=${CONCURRENCY:-16}
replay_concurrency=${REPLAY_CONCURRENCY:-64}
replay_rate=${REPLAY_RATE:-5000}
storm=${STORM:-1000}
duration=${DURATION:-15s}
warmup=${WARMUP:-3s}
pool_size=${PAYONCE_DB_POOL_SIZE:-16}
profile=${PROFILE:-release}
admin_url=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
if [ "${1:-}" = "--quick" ]; then duration=3s; warmup=1s; fi

. loadtest/stack.sh
stack_binaries "$profile"
for tool in pgbench psql python3 curl; do
    command -v "$tool" >/dev/null || { echo "bench.sh: $tool is required" >&2; exit 2; }
done

work=$(mktemp -d -t payonce-bench.XXXXXX)
trap 'stack_down; rm -rf "$work"' EXIT
RUST_LOG=warn PAYONCE_DB_POOL_SIZE="$pool_size" stack_up 1 --bench-routes
app_url=$BASE_URLS
sim_url=$SIM_URL
api_key=$API_KEY
database_url=$DATABASE_URL
customer_id=$(psql "$database_url" -Atc "select id from customers")

# Runs a command and writes what it cost (CPU, rows, WAL) to $work/<name>.cost.json.
cost() {
    local name=$1
    shift
    python3 loadtest/cost.py measure --admin-url "$admin_url" --db "$stack_database" \
        --payonce "${stack_pids[1]}" --simulator "${stack_pids[0]}" --out "$work/$name.cost.json" -- "$@"
}

# One measured phase of the runner: warm up, reset the ledger, measure (and what it cost); the
# JSON report to $work/<name>.json. Extra arguments go to both runs (e.g. --rate).
measure() {
    local name=$1 scenario=$2 workers=$3
    shift 3
    "$loadtest" "$scenario" --target "$app_url" --api-key "$api_key" --sim-url "$sim_url" \
        --concurrency "$workers" --duration "$warmup" --json "$@" >/dev/null || true
    curl -fsS -X POST "$sim_url/_sim/reset" >/dev/null
    echo "measuring: $name" >&2
    cost "$name" "$loadtest" "$scenario" --target "$app_url" --api-key "$api_key" --sim-url "$sim_url" \
        --concurrency "$workers" --duration "$duration" --json "$@" >"$work/$name.json" ||
        echo "bench.sh: the $name run reported a failure" >&2
}

echo "measuring: pgbench" >&2
python3 loadtest/pgbench/new_payment.py .sqlx >"$work/new_payment.sql"
seconds=${duration%s}
pgbench -n -M prepared -c "$concurrency" -j "$(nproc)" -T "${warmup%s}" -D customer="$customer_id" \
    -f "$work/new_payment.sql" "$database_url" >/dev/null 2>&1
cost pgbench pgbench -n -M prepared -c "$concurrency" -j "$(nproc)" -T "$seconds" -D customer="$customer_id" \
    -f "$work/new_payment.sql" "$database_url" >"$work/pgbench.txt" 2>"$work/pgbench.err" ||
    { cat "$work/pgbench.err" >&2; exit 2; }

measure new-payments new-payments "$concurrency"
# The same statements at the rate payonce just reached: PostgreSQL's CPU per payment falls as
# the rate rises (commits share WAL flushes, backends sleep less), so the cost is compared at equal
# rates (the unthrottled run above is the limit).
new_rate=$(python3 -c 'import json, sys; print(max(1, round(json.load(open(sys.argv[1]))["stats"]["throughput"])))' \
    "$work/new-payments.json")
echo "measuring: pgbench at $new_rate/s" >&2
cost pgbench-at-rate pgbench -n -M prepared -c "$concurrency" -j "$(nproc)" -T "$seconds" -R "$new_rate" \
    -D customer="$customer_id" -f "$work/new_payment.sql" "$database_url" >"$work/pgbench-at-rate.txt" \
    2>"$work/pgbench.err" || { cat "$work/pgbench.err" >&2; exit 2; }
measure replays replays "$replay_concurrency"
measure replays-at-rate replays "$replay_concurrency" --rate "$replay_rate"
measure unprotected unprotected "$concurrency"
curl -fsS -X POST "$sim_url/_sim/reset" >/dev/null
echo "measuring: storm" >&2
"$loadtest" double-submit --target "$app_url" --api-key "$api_key" --sim-url "$sim_url" \
    --concurrency 1 --duplicates "$storm" --requests "$storm" --json >"$work/storm.json" ||
    echo "bench.sh: the storm run reported a failure" >&2

python3 - "$work" "$concurrency" "$replay_concurrency" "$storm" "$duration" "$pool_size" "$profile" "$replay_rate" <<'PY'
import json, os, pathlib, platform, re, subprocess, sys

work, concurrency, replay_concurrency, storm, duration, pool, profile, replay_rate = sys.argv[1:]
work = pathlib.Path(work)
load = lambda name: json.loads((work / f"{name}.json").read_text())
pgbench_text = (work / "pgbench.txt").read_text()
pg_tps = float(re.search(r"tps = ([0-9.]+)", pgbench_text).group(1))
pg_latency = float(re.search(r"latency average = ([0-9.]+) ms", pgbench_text).group(1))
new, replays, unprotected, storm_run = load("new-payments"), load("replays"), load("unprotected"), load("storm")
paced = load("replays-at-rate")

def line(label, run):
    s, lat = run["stats"], run["stats"]["latency"] or {}
    ok = "ok " if run["verdict"]["passed"] else "FAIL"
    return (f"  {label:<38} {s['throughput']:>9.0f}/s   p50 {lat.get('p50_ms', 0):>7.2f} ms   "
            f"p99 {lat.get('p99_ms', 0):>7.2f} ms   max {lat.get('max_ms', 0):>8.2f} ms   {ok} {s['requests']} requests")

def target(ok):
    return "meets the target" if ok else "BELOW the target"

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
pg_version = subprocess.run(["pgbench", "--version"], capture_output=True, text=True).stdout.strip()
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"\npayonce benchmark: {profile} build {rev}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores ({cpu}), {pg_version}")
print(f"  {duration} per measurement; new payments at {concurrency} clients, replays at {replay_concurrency}; "
      f"pool {pool} connections; worker threads: {os.environ.get('PAYONCE_WORKER_THREADS', 'one per core')} "
      f"(PAYONCE_WORKER_THREADS); simulator without latency; RUST_LOG=warn\n")
print(f"  {'1 pgbench: one payment’s statements':<38} {pg_tps:>9.0f}/s   average {pg_latency:.2f} ms")
print(line("2 new payments through payonce", new))
print(line(f"3 replays, {replay_concurrency} clients flat out", replays))
print(line(f"  replays offered at {replay_rate}/s", paced))
print(line("5 new payments, idempotency layer off", unprotected))
storm_stats, storm_audit = storm_run["stats"], storm_run["audit"]
answers = storm_stats["answers"]
print(f"  {'4 storm: ' + storm + ' requests, one key':<38} settled in {storm_stats['elapsed_secs'] * 1000:.0f} ms: "
      f"{answers['created']} created, {answers['replayed']} replayed, {answers['in_flight']} in flight; "
      f"{storm_audit['charges']} charge(s)")

ratio = new["stats"]["throughput"] / pg_tps
layer = new["stats"]["throughput"] / unprotected["stats"]["throughput"]
replay_p99 = (paced["stats"]["latency"] or {}).get("p99_ms", float("inf"))
print("\n  ratios and targets")
print(f"    payonce / pgbench          {ratio:6.0%}   (target ≥ 50%: {target(ratio >= 0.5)})")
print(f"    layer on / layer off       {layer:6.0%}   (target ≥ 80%: {target(layer >= 0.8)}; the layer costs {1 - layer:.0%})")
print(f"    replays                    {replays['stats']['throughput']:6.0f}/s at most; p99 {replay_p99:.2f} ms at "
      f"{paced['stats']['throughput']:.0f}/s (target ≥ 5000/s, p99 ≤ 5 ms at 5000/s: "
      f"{target(replays['stats']['throughput'] >= 5000 and replay_p99 <= 5)})")
print(f"    storm                      {storm_stats['elapsed_secs'] * 1000:6.0f} ms, {storm_audit['charges']} charge "
      f"(target < 1 s and exactly 1: {target(storm_stats['elapsed_secs'] < 1 and storm_audit['charges'] == 1)})")
sys.path.insert(0, "loadtest")
import cost
processed = lambda text: int(re.search(r"number of transactions actually processed: ([0-9]+)", text).group(1))
at_rate_text = (work / "pgbench-at-rate.txt").read_text()
at_rate_tps = float(re.search(r"tps = ([0-9.]+)", at_rate_text).group(1))
cost.report(work, [
    ("1 pgbench: one payment’s statements", "pgbench", processed(pgbench_text), "limit"),
    (f"  the same at payonce's rate ({at_rate_tps:.0f}/s)", "pgbench-at-rate", processed(at_rate_text), "pgbench"),
    ("2 new payments through payonce", "new-payments", new["stats"]["requests"], "new"),
    (f"3 replays, {replay_concurrency} clients flat out", "replays", replays["stats"]["requests"], "replay"),
    (f"  replays offered at {replay_rate}/s", "replays-at-rate", paced["stats"]["requests"], "replay"),
    ("5 new payments, idempotency layer off", "unprotected", unprotected["stats"]["requests"], "bare"),
])
failed = [name for name, run in [("new payments", new), ("replays", replays), ("paced replays", paced),
                                  ("unprotected", unprotected), ("storm", storm_run)]
          if not run["verdict"]["passed"]]
if failed:
    print(f"\n  FAILED runs (unexpected answers or a bad audit): {', '.join(failed)}")
    sys.exit(1)
PY
