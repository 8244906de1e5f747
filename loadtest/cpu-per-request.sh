#!/usr/bin/env bash
# Where a request's CPU goes: payonce, the simulator, the load generator and the rest (PostgreSQL,
# and the kernel's share of the loopback traffic), per request, for each scenario run in turn on
# one stack. It is how docs/performance.md ("No extra commit (issue 11)") splits the layer's cost.
#
#   loadtest/cpu-per-request.sh                    new-payments, then unprotected (the layer off)
#   SCENARIOS=replays loadtest/cpu-per-request.sh  any payonce-loadtest scenarios, in turn
#
# Knobs (environment): SCENARIOS ("new-payments unprotected"), CONCURRENCY (16), DURATION (10, in
# seconds), WARMUP (3), PAYONCE_DB_POOL_SIZE (16), PAYONCE_BIN, PAYONCE_LOADTEST_BIN (release
# binaries, built if missing), ADMIN_URL (postgres://postgres@127.0.0.1:5432/postgres), and SQL:
# statements run on the scratch database once it is migrated, before the first measurement (to
# try a schema change, e.g. SQL='drop index idempotency_keys_route').
#
# The machine must be otherwise quiet: "rest" is every busy tick of the machine that is not one of
# the three processes. "idle" near zero means the run was CPU-bound, so the per-request figures
# add up to what limits the throughput.
set -euo pipefail
cd "$(dirname "$0")/.."

scenarios=${SCENARIOS:-new-payments unprotected}
concurrency=${CONCURRENCY:-16}
duration=${DURATION:-10}
warmup=${WARMUP:-3}
admin_url=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
target_dir=${CARGO_TARGET_DIR:-target}
payonce=${PAYONCE_BIN:-$target_dir/release/payonce}
loadtest=${PAYONCE_LOADTEST_BIN:-$target_dir/release/payonce-loadtest}
if [ ! -x "$payonce" ] || [ ! -x "$loadtest" ]; then
    echo "building the release binaries…" >&2
    cargo build --release -p payonce --bin payonce >&2
    cargo build --release -p payonce-loadtest >&2
fi
hz=$(getconf CLK_TCK)

work=$(mktemp -d -t payonce-cpu.XXXXXX)
. loadtest/stack.sh
trap 'stack_down; rm -rf "$work"' EXIT
RUST_LOG=warn PAYONCE_DB_POOL_SIZE=${PAYONCE_DB_POOL_SIZE:-16} stack_up 1 --bench-routes
if [ -n "${SQL:-}" ]; then psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -qc "$SQL"; fi
simulator=${stack_pids[0]}
server=${stack_pids[1]}

# utime + stime of a process, in clock ticks
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# busy and idle (incl. iowait) ticks of the whole machine
machine() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }

printf '%-14s %9s   %s\n' scenario "req/s" "CPU per request, ms: payonce  simulator  load generator  rest (PostgreSQL, kernel)  = busy;  idle"
for scenario in $scenarios; do
    args=("$scenario" --target "$BASE_URLS" --api-key "$API_KEY" --sim-url "$SIM_URL" --concurrency "$concurrency" --json)
    "$loadtest" "${args[@]}" --duration "${warmup}s" >/dev/null || true
    s0=$(ticks "$server"); m0=$(ticks "$simulator"); read -r b0 i0 < <(machine)
    "$loadtest" "${args[@]}" --duration "${duration}s" >"$work/$scenario.json" &
    runner=$!
    # The runner's own ticks, read while it runs (it is gone once it has finished).
    l0=$(ticks "$runner"); l1=$l0
    while kill -0 "$runner" 2>/dev/null; do l1=$(ticks "$runner" 2>/dev/null || echo "$l1"); sleep 0.2; done
    wait "$runner" || echo "cpu-per-request: the $scenario run reported a failure" >&2
    s1=$(ticks "$server"); m1=$(ticks "$simulator"); read -r b1 i1 < <(machine)
    python3 - "$scenario" "$work/$scenario.json" "$hz" $((s1 - s0)) $((m1 - m0)) $((l1 - l0)) $((b1 - b0)) $((i1 - i0)) <<'PY'
import json, sys
scenario, report, hz, server, sim, runner, busy, idle = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
stats = json.load(open(report))["stats"]
per = lambda t: t * 1000 / hz / stats["requests"]
rest = per(busy) - per(server) - per(sim) - per(runner)
print(f"{scenario:<14} {stats['throughput']:>7.0f}/s   {per(server):>26.3f} {per(sim):>10.3f} {per(runner):>15.3f} "
      f"{rest:>26.3f}  = {per(busy):.3f}; {per(idle):.3f}")
PY
done
