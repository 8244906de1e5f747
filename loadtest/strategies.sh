#!/usr/bin/env bash
# The four claim strategies compared, in one run, on the same storms over TWO payonce servers in
# lab mode (one database, one simulator): docs/strategies.md explains and records the figures.
#
#   1. the storm: double-submit (DUPLICATES requests per key released together, CONCURRENCY keys
#      at a time, gateway latency LATENCY_MS), every strategy through /lab/{strategy}/v1/payments,
#      requests alternating between the two servers: double-charged keys, throughput, p99, the
#      peak of pooled connections in use on either server (/healthz, sampled every 50 ms)
#   2. a slow gateway (SLOW_MS per charge), the same storm: what holding a transaction across the
#      gateway call does to the pool (503s, peak pool use)
#   3. kill -9 mid-charge: a retry storm (clients retry with the same key until answered, over
#      both servers) with a slow gateway; server 1 is killed with SIGKILL while its charges are at
#      the gateway, then restarted: double-charged keys, and payments never answered
#   4. (redis) Redis restarted without persistence mid-storm: `redis-cli shutdown nosave`, then
#      REDIS_START (the CI's redis-server command line)
#
#   loadtest/strategies.sh            release binaries (built if missing)
#   loadtest/strategies.sh --quick    shorter runs (a smoke test of the script itself)
#   loadtest/bench.sh --strategies    the same
#
# Knobs (environment): CONCURRENCY (8), DUPLICATES (8), LATENCY_MS (100), SLOW_MS (1500),
# DURATION (8s), PAYONCE_DB_POOL_SIZE (16), PROFILE (release), PAYONCE_BIN, PAYONCE_LOADTEST_BIN,
# ADMIN_URL, REDIS_URL (redis://127.0.0.1:6379), REDIS_START, SKIP_REDIS_RESTART (1: skip 4).
set -euo pipefail
cd "$(dirname "$0")/.."

concurrency=${CONCURRENCY:-8}
duplicates=${DUPLICATES:-8}
latency_ms=${LATENCY_MS:-100}
slow_ms=${SLOW_MS:-1500}
duration=${DURATION:-8s}
pool_size=${PAYONCE_DB_POOL_SIZE:-16}
profile=${PROFILE:-release}
admin_url=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
redis_start=${REDIS_START:-redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log}
if [ "${1:-}" = "--quick" ]; then duration=3s; fi
strategies=(on-conflict for-update redis check-then-insert)

. loadtest/stack.sh
stack_binaries "$profile"
for tool in psql python3 curl jq redis-cli; do
    command -v "$tool" >/dev/null || { echo "strategies.sh: $tool is required" >&2; exit 2; }
done
redis-cli ping >/dev/null || { echo "strategies.sh: Redis does not answer (start it: $redis_start)" >&2; exit 2; }

work=$(mktemp -d -t payonce-strategies.XXXXXX)
trap 'stack_down; rm -rf "$work"' EXIT
# Short leases, so that the keys a killed server held are taken over within seconds.
export RUST_LOG=warn PAYONCE_DB_POOL_SIZE=$pool_size PAYONCE_LEASE_SECS=3 PAYONCE_REDIS_LEASE_MS=3000 \
    PAYONCE_GATEWAY_TIMEOUT_SECS=10
stack_up 2 --lab
servers=$BASE_URLS
echo "simulator $SIM_URL, lab servers $servers (pool $pool_size each)" >&2

# Samples both servers' /healthz every 50 ms; prints the peak of pooled connections in use.
pool_sampler() {
    exec python3 - "$@" <<'EOF'
import json, sys, time, urllib.request, signal
peak = 0
def done(*_):
    print(peak)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
while True:
    for url in sys.argv[1:]:
        try:
            pool = json.load(urllib.request.urlopen(url + "/healthz", timeout=1))["pool"]
            peak = max(peak, pool["size"] - pool["idle"])
        except Exception:
            pass
    time.sleep(0.05)
EOF
}

# One run of the native runner against both servers: the JSON report to $work/NAME.json and the
# pool's peak to $work/NAME.pool. Extra arguments go to the runner.
measure() {
    local name=$1 strategy=$2 scenario=$3
    shift 3
    curl -fsS -X POST "$SIM_URL/_sim/reset" >/dev/null
    pool_sampler ${servers//,/ } >"$work/$name.pool" &
    local sampler=$!
    echo "measuring: $name" >&2
    "$loadtest" "$scenario" --target "$servers" --api-key "$API_KEY" --sim-url "$SIM_URL" --strategy "$strategy" \
        --json "$@" >"$work/$name.json" || true
    kill -TERM "$sampler" && wait "$sampler" || true
}

# A row of the table from a report.
row() {
    local name=$1 label=$2
    jq -r --arg name "$label" --arg pool "$(cat "$work/$name.pool" 2>/dev/null || echo '?')" --arg max "$pool_size" '
        [ $name,
          "\(.audit.double_charged | length) / \(.audit.keys_charged)",
          (.stats.throughput | floor | tostring),
          (if .stats.latency then (.stats.latency.p99_ms | . * 10 | round / 10 | tostring) else "-" end),
          "\($pool) / \($max)",
          "201:\(.stats.answers.created) replay:\(.stats.answers.replayed) 409:\(.stats.answers.in_flight) \(.stats.answers.other | to_entries | map("\(.key | split(" ")[0]):\(.value)") | join(" "))",
          (if .stats.payments then "\(.stats.payments.given_up)" else "-" end)
        ] | @tsv' "$work/$name.json"
}

table() {
    local title=$1
    shift
    printf '\n%s\n' "$title"
    {
        printf 'strategy\tdouble-charged keys\treq/s\tp99 ms\tpeak pool use\tanswers\tgiven up\n'
        for entry in "$@"; do row "${entry%%=*}" "${entry#*=}"; done
    } | column -t -s $'\t'
}

storm_rows=() slow_rows=() kill_rows=() redis_rows=()
for strategy in "${strategies[@]}"; do
    measure "storm-$strategy" "$strategy" double-submit --duration "$duration" --concurrency "$concurrency" \
        --duplicates "$duplicates" --faults "{\"latency_ms\": $latency_ms}"
    storm_rows+=("storm-$strategy=$strategy")
done
for strategy in "${strategies[@]}"; do
    measure "slow-$strategy" "$strategy" double-submit --duration "$duration" --concurrency $((pool_size * 2)) \
        --duplicates 2 --faults "{\"latency_ms\": $slow_ms}"
    slow_rows+=("slow-$strategy=$strategy")
done

# kill -9 of server 1 (stack_pids[1]; [0] is the simulator) two seconds into a retry storm, while
# its charges wait on a 1 s gateway; restarted one second later on the same port.
restart_server_1() {
    local port=${servers%%,*}
    port=${port##*:}
    sleep 2
    kill -KILL "${stack_pids[1]}"
    echo "  kill -9 server 1 (pid ${stack_pids[1]})" >&2
    sleep 1
    STRIPE_SECRET_KEY=sk_test_stack STRIPE_API_BASE="$SIM_URL/" \
        "$payonce" serve --addr "127.0.0.1:$port" --lab >>"$work/server1.log" 2>&1 &
    stack_pids[1]=$!
    echo "  server 1 restarted (pid $!)" >&2
}
for strategy in "${strategies[@]}"; do
    restart_server_1 &
    killer=$!
    measure "kill-$strategy" "$strategy" retry-storm --duration 4s --concurrency 16 --client-timeout 5s \
        --max-attempts 40 --retry-transport-errors --faults '{"latency_ms": 1000}'
    wait "$killer"
    # The restarted server's pid lives in the subshell: find it by its port.
    port=${servers%%,*}
    stack_pids[1]=$(pgrep -f "serve --addr 127.0.0.1:${port##*:}" | head -n1)
    stack_wait_ready "${servers%%,*}/readyz" "${stack_pids[1]}" server1
    kill_rows+=("kill-$strategy=$strategy")
done

if [ "${SKIP_REDIS_RESTART:-0}" != 1 ]; then
    restart_redis() {
        sleep 2
        redis-cli shutdown nosave >/dev/null 2>&1 || true
        echo "  redis stopped (no persistence: every lease and the fencing counter are gone)" >&2
        sleep 1
        eval "$redis_start"
        echo "  redis started again" >&2
    }
    restart_redis &
    restarter=$!
    measure "redis-restart" redis retry-storm --duration 6s --concurrency 16 --client-timeout 5s \
        --max-attempts 40 --faults '{"latency_ms": 1000}'
    wait "$restarter"
    redis-cli ping >/dev/null
    redis_rows+=("redis-restart=redis")
fi

# KEEP_REPORTS=DIR keeps every run's JSON report (and pool peak) for a closer look.
if [ -n "${KEEP_REPORTS:-}" ]; then mkdir -p "$KEEP_REPORTS" && cp "$work"/*.json "$work"/*.pool "$KEEP_REPORTS"/; fi
table "1. the storm: $duplicates requests per key at once, $concurrency keys at a time, gateway ${latency_ms} ms, two servers" "${storm_rows[@]}"
table "2. a slow gateway: ${slow_ms} ms per charge, $((pool_size * 2)) keys at a time, 2 requests each, pool $pool_size per server" "${slow_rows[@]}"
table "3. kill -9 of one server mid-charge (retry storm, gateway 1 s, 16 clients, server 1 restarted after 1 s)" "${kill_rows[@]}"
if [ ${#redis_rows[@]} -gt 0 ]; then
    table "4. Redis restarted without persistence mid-storm (retry storm, gateway 1 s)" "${redis_rows[@]}"
fi

