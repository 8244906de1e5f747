#!/usr/bin/env bash
# The batch client's throughput against the server's own rate for new payments, in one run on
# one machine (docs/performance.md, "Batches"):
#
#   1. new payments through payonce: the native runner's `new-payments` at CONCURRENCY
#   2. `payonce batch charge` of ROWS new rows at the same concurrency
#   3. the same file again: every row a replay
#
# and the ratios. One stack (loadtest/stack.sh: simulator without latency, one server).
#
#   loadtest/batch-bench.sh      ROWS=100000 CONCURRENCY=8 DURATION=30s, release binaries
#
# Knobs (environment): ROWS, CONCURRENCY (8, the batch's default), DURATION (of step 1), PROFILE
# (release; `debug` for unoptimised binaries), PAYONCE_BIN, PAYONCE_LOADTEST_BIN, ADMIN_URL.
set -euo pipefail
cd "$(dirname "$0")/.."

rows=${ROWS:-100000}
concurrency=${CONCURRENCY:-8}
duration=${DURATION:-30s}
profile=${PROFILE:-release}
admin_url=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
target_dir=${CARGO_TARGET_DIR:-target}
payonce=${PAYONCE_BIN:-$target_dir/$profile/payonce}
loadtest=${PAYONCE_LOADTEST_BIN:-$target_dir/$profile/payonce-loadtest}
for binary in "$payonce" "$loadtest"; do
    [ -x "$binary" ] || { echo "batch-bench.sh: $binary is not built" >&2; exit 2; }
done

work=$(mktemp -d -t payonce-batch-bench.XXXXXX)
. loadtest/stack.sh
trap 'stack_down; rm -rf "$work"' EXIT
RUST_LOG=warn stack_up 1

echo "measuring: new payments, native runner, $concurrency workers, $duration" >&2
"$loadtest" new-payments --target "$BASE_URLS" --api-key "$API_KEY" --sim-url "$SIM_URL" \
    --concurrency "$concurrency" --duration 3s --json >/dev/null
curl -fsS -X POST "$SIM_URL/_sim/reset" >/dev/null
"$loadtest" new-payments --target "$BASE_URLS" --api-key "$API_KEY" --sim-url "$SIM_URL" \
    --concurrency "$concurrency" --duration "$duration" --json >"$work/runner.json"
curl -fsS -X POST "$SIM_URL/_sim/reset" >/dev/null

python3 - "$rows" >"$work/batch.csv" <<'EOF'
import sys
print("row_id,amount,currency,payment_method,description")
for i in range(int(sys.argv[1])):
    print(f"inv-{i:07d},{100 + i % 900},usd,pm_card_visa,invoice {i}")
EOF
export PAYONCE_API_URL=$BASE_URLS PAYONCE_API_KEY=$API_KEY
echo "measuring: batch charge, $rows new rows" >&2
"$payonce" batch charge "$work/batch.csv" --concurrency "$concurrency" >"$work/first.txt" 2>"$work/first.err"
echo "measuring: the same batch again (all replays)" >&2
"$payonce" batch charge "$work/batch.csv" --concurrency "$concurrency" >"$work/second.txt" 2>"$work/second.err"

python3 - "$work" "$rows" "$concurrency" <<'EOF'
import json, re, sys
work, rows, concurrency = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runner = json.load(open(f"{work}/runner.json"))
def rate(report):
    return float(report["stats"]["throughput"])
def batch(name):
    text = open(f"{work}/{name}.txt").read()
    head = re.search(r"(\d+) rows in ([\d.]+) s, ([\d.]+) rows/s", text)
    counts = {m[0]: int(m[1]) for m in re.findall(r"^  (\w+)\s+(\d+)", text, re.M)}
    return float(head[2]), float(head[3]), counts
new = rate(runner)
if not runner["verdict"]["passed"]:
    sys.exit("FAIL: the runner's own audit failed")
t1, r1, c1 = batch("first")
t2, r2, c2 = batch("second")
print(f"  new payments, native runner ({concurrency} workers)   {new:8.0f}/s")
print(f"  batch charge, {rows} new rows               {r1:8.0f} rows/s  in {t1:.1f} s  ({c1.get('charged', 0)} charged)")
print(f"  the same batch again (all replays)          {r2:8.0f} rows/s  in {t2:.1f} s  ({c2.get('replayed', 0)} replayed)")
print(f"  batch / runner                              {100 * r1 / new:7.0f}%")
if c1.get("charged") != rows or c2.get("replayed") != rows:
    sys.exit("FAIL: the first run must charge every row and the second replay every row")
EOF
