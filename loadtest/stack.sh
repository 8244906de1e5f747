# A deployment in miniature for the load tests: a scratch database, one `payonce stripe-sim` and
# N `payonce serve` on free ports, and a customer. Sourced by .ci/loadtest-smoke and
# loadtest/bench.sh, so both start, wait for and clean up the same stack the same way.
#
# The sourcing script sets: payonce (the binary), admin_url (a PostgreSQL URL), work (a temporary
# folder for the logs). It then calls `stack_up N [serve flags…]` (extra server settings through
# the environment, e.g. PAYONCE_LEASE_SECS=5) and gets, exported: DATABASE_URL, SIM_URL,
# BASE_URLS (comma-separated), API_KEY, and the arrays stack_pids and stack_targets. `stack_down`
# stops everything and drops the database; call it from the script's EXIT trap.

stack_pids=()
stack_targets=()
stack_database=payonce_stack_$$

stack_fail() { printf 'stack: %s\n' "$*" >&2; exit 2; }

# Sets payonce and loadtest, the two binaries of profile $1 (debug | release), or PAYONCE_BIN /
# PAYONCE_LOADTEST_BIN; builds them first when they are missing.
stack_binaries() {
    local profile=$1 target_dir=${CARGO_TARGET_DIR:-target}
    payonce=${PAYONCE_BIN:-$target_dir/$profile/payonce}
    loadtest=${PAYONCE_LOADTEST_BIN:-$target_dir/$profile/payonce-loadtest}
    if [ ! -x "$payonce" ] || [ ! -x "$loadtest" ]; then
        local flag
        flag=$([ "$profile" = release ] && echo --release || true)
        echo "building the $profile binaries…" >&2
        cargo build $flag -p payonce --bin payonce >&2
        cargo build $flag -p payonce-loadtest >&2
    fi
}

# A port nobody listens on now (the kernel's pick; the server binds it a moment later).
stack_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until $1 answers 200, or fails with the log of process $2 (named $3).
stack_wait_ready() {
    local url=$1 pid=$2 name=$3
    for _ in $(seq 300); do
        curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || { tail -n 30 "$work/$name.log" >&2; stack_fail "$name exited before it was ready"; }
        sleep 0.1
    done
    tail -n 30 "$work/$name.log" >&2
    stack_fail "$name was not ready at $url after 30 s"
}

stack_up() {
    local servers=$1
    shift
    command -v psql >/dev/null || stack_fail "psql is not installed"
    command -v python3 >/dev/null || stack_fail "python3 is not installed (it finds free ports)"
    psql "$admin_url" -qc "create database $stack_database" >/dev/null ||
        stack_fail "cannot create a scratch database on $admin_url"
    # The scratch database on the same server, with admin_url's parameters (e.g. `?sslmode=disable`;
    # the Unix socket is a host: postgres://postgres@%2Fvar%2Frun%2Fpostgresql/postgres).
    local base=${admin_url%%\?*} params=
    [ "$base" = "$admin_url" ] || params="?${admin_url#*\?}"
    export DATABASE_URL="${base%/*}/$stack_database$params"

    local port n
    port=$(stack_free_port)
    "$payonce" stripe-sim --addr "127.0.0.1:$port" >"$work/sim.log" 2>&1 &
    stack_pids+=($!)
    stack_wait_ready "http://127.0.0.1:$port/_sim/faults" "$!" sim
    export SIM_URL="http://127.0.0.1:$port"

    for n in $(seq "$servers"); do
        port=$(stack_free_port)
        # The first server migrates the database; the next ones start once it is ready.
        STRIPE_SECRET_KEY=sk_test_stack STRIPE_API_BASE="$SIM_URL/" \
            "$payonce" serve --addr "127.0.0.1:$port" "$@" >"$work/server$n.log" 2>&1 &
        stack_pids+=($!)
        stack_wait_ready "http://127.0.0.1:$port/readyz" "$!" "server$n"
        stack_targets+=("http://127.0.0.1:$port")
    done
    BASE_URLS=$(IFS=,; echo "${stack_targets[*]}")
    export BASE_URLS
    API_KEY=$("$payonce" customers create loadtest 2>"$work/customer.log") ||
        { cat "$work/customer.log" >&2; stack_fail "cannot create a customer"; }
    export API_KEY
}

# Stops the processes (TERM, then KILL after 5 s) and drops the scratch database.
stack_down() {
    local pid
    # Every command may fail (the process is already gone): `|| true` keeps a caller's `set -e`
    # from cutting the cleanup short.
    for pid in "${stack_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${stack_pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    psql "$admin_url" -qc "drop database if exists $stack_database with (force)" >/dev/null 2>&1 || true
}
