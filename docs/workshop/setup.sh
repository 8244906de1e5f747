# The workshop's shell: source it from the repository's top folder, in every terminal you use.
#
#     cargo build -p payonce          # once: the exercises run the binary it makes
#     . docs/workshop/setup.sh
#
# It defines the commands the exercises use (docs/workshop.md). Three processes, each with its own
# log under $WORKSHOP_DIR (`logs` follows them):
#
#   the Stripe simulator   `payonce stripe-sim` on $SIM: the ledger outlives a killed server
#   the API server         `payonce serve` on $API, charging through that simulator
#   the dashboard          `payonce serve --admin-only --workshop` on $DASHBOARD: stays up while
#                          the API server is killed, never signs the projector out
#
# and the zero-config PostgreSQL under $PAYONCE_DATA_DIR (exercise 6 stops it; DATABASE_URL is
# unset for that reason). Everything can be moved with the variables below, set before sourcing:
# docs/workshop/check.sh runs every exercise on other ports this way.
#
# Written for bash (the check runs it with bash); zsh works too.

export PAYONCE_BIN=${PAYONCE_BIN:-${CARGO_TARGET_DIR:-target}/debug/payonce}
# The workshop's own zero-config PostgreSQL (a cluster of its own, started clean on the first `up`),
# not the README session's `.payonce`: the class never sees another session's keys, and exercise
# 6's `db stop` stops nobody else's database.
export PAYONCE_DATA_DIR=${PAYONCE_DATA_DIR:-.payonce/workshop}
# Absolute, so that the commands work from any folder.
case $PAYONCE_BIN in /*) ;; *) PAYONCE_BIN=$PWD/$PAYONCE_BIN ;; esac
case $PAYONCE_DATA_DIR in /*) ;; *) PAYONCE_DATA_DIR=$PWD/$PAYONCE_DATA_DIR ;; esac
export WORKSHOP_DIR=${WORKSHOP_DIR:-$PAYONCE_DATA_DIR/workshop}
export PAYONCE_ADDR=${PAYONCE_ADDR:-127.0.0.1:3000}
export PAYONCE_SIM_ADDR=${PAYONCE_SIM_ADDR:-127.0.0.1:12111}
export DASHBOARD_ADDR=${DASHBOARD_ADDR:-127.0.0.1:3001}
API=http://$PAYONCE_ADDR
SIM=http://$PAYONCE_SIM_ADDR
DASHBOARD=http://$DASHBOARD_ADDR
# Every server charges through the one simulator, so its ledger is the truth for the whole class.
export STRIPE_SECRET_KEY=sk_test_workshop STRIPE_API_BASE=$SIM/
if [ -n "${DATABASE_URL:-}" ]; then
    echo "workshop: DATABASE_URL unset: the exercises use the zero-config PostgreSQL in $PAYONCE_DATA_DIR" >&2
    unset DATABASE_URL
fi
mkdir -p "$WORKSHOP_DIR"

# `payonce …`: the binary cargo built.
payonce() { "$PAYONCE_BIN" "$@"; }

# `up`: the simulator, the API server and the dashboard, a customer ($KEY) and an operator
# (teacher / workshop-password). Safe to run again: what runs is left running.
up() {
    # Started on its own, the database belongs to no server: stopping one leaves it running.
    payonce db start > /dev/null 2>> "$WORKSHOP_DIR/cli.log" || { tail -n 5 "$WORKSHOP_DIR/cli.log" >&2; return 1; }
    # The binary itself, not the `payonce` function: the pid file must name the simulator, so
    # that `down` stops it (a function would leave a bash subshell's pid there).
    running sim || start_process sim "$SIM/_sim/faults" "$PAYONCE_BIN" stripe-sim
    running serve || serve
    running dashboard || start_process dashboard "$DASHBOARD/readyz" \
        env PAYONCE_ADDR="$DASHBOARD_ADDR" PAYONCE_WORKSHOP=true "$PAYONCE_BIN" serve --admin-only
    if [ ! -s "$WORKSHOP_DIR/api-key" ]; then
        payonce customers create workshop > "$WORKSHOP_DIR/api-key" 2>> "$WORKSHOP_DIR/cli.log"
        PAYONCE_ADMIN_PASSWORD=workshop-password payonce admins create teacher 2>> "$WORKSHOP_DIR/cli.log"
    fi
    KEY=$(cat "$WORKSHOP_DIR/api-key")
    echo "API $API · dashboard $DASHBOARD/admin (teacher / workshop-password) · simulator $SIM · \$KEY is set"
}

# `serve [NAME=VALUE …]`: starts the API server in the background with extra settings, e.g.
# `serve PAYONCE_LEASE_SECS=10`; returns once it is ready. Its log: $WORKSHOP_DIR/serve.log.
serve() {
    start_process serve "$API/readyz" env "$@" "$PAYONCE_BIN" serve
}

# `stop`: stops the API server the polite way (SIGTERM: it finishes what it is doing).
stop() { stop_process serve TERM; }

# `crash`: kill -9 the API server (and only it): no shutdown, exactly like a crash.
crash() { stop_process serve KILL; }

# `down`: stops all three (the database stays up: `payonce db stop`).
down() { stop_process dashboard TERM; stop_process serve TERM; stop_process sim TERM; }

# `logs`: follows every log.
logs() { tail -n 20 -F "$WORKSHOP_DIR"/*.log; }

# `pay KEY [AMOUNT] [PAYMENT_METHOD] [CURRENCY]`: one payment, the whole answer (status line,
# headers, body). AMOUNT is in the currency's minor unit as Stripe defines it (cents; whole yen).
pay() {
    curl -si "$API/v1/payments" -H "Authorization: Bearer $KEY" \
        -H "Idempotency-Key: $1" -H 'Content-Type: application/json' \
        -d "{\"amount\": ${2:-1000}, \"currency\": \"${4:-usd}\", \"payment_method\": \"${3:-pm_card_visa}\"}"
    echo
}

# `pay_until_done KEY`: pays until the answer is final (201 or 402), retrying 409 and 503 after
# the Retry-After they carry (1 s without one), as a well-behaved client does. Prints each status.
pay_until_done() {
    local answer status wait
    while true; do
        answer=$(pay "$1" 2>/dev/null) || true
        status=$(printf '%s\n' "$answer" | sed -n '1s/^HTTP\/[0-9.]* \([0-9]*\).*/\1/p')
        printf '%s ' "${status:-000}"
        case $status in
            201 | 402) echo; return 0 ;;
            409 | 503 | 000 | "") ;;
            *) echo; return 1 ;;
        esac
        wait=$(printf '%s\n' "$answer" | tr -d '\r' | sed -n 's/^[Rr]etry-[Aa]fter: *//p')
        sleep "${wait:-1}"
    done
}

# `faults JSON`: what the simulator's next calls suffer (`faults '{}'` clears them).
faults() { curl -s -X PUT "$SIM/_sim/faults" -H 'content-type: application/json' -d "$1"; echo; }

# `ledger`: every charge the simulator made.
ledger() { curl -s "$SIM/_sim/charges" | python3 -m json.tool; }

# `charges KEY`: how many charges the simulator made for one Idempotency-Key.
charges() {
    curl -s "$SIM/_sim/charges" | python3 -c 'import json, sys
print(sum(c["metadata"].get("payonce_idempotency_key") == sys.argv[1] for c in json.load(sys.stdin)["charges"]))' "$1"
}

# `sql 'select …'`: a query on payonce's database.
sql() { psql "$(payonce db url 2>/dev/null)" -X -q -A -F ' | ' -P footer=off -c "$1"; }

# `key_row KEY`: the row of one key, as the engine sees it.
key_row() {
    sql "select state, recovery_point, lease_token, lease_owner, attempts, locked_until > now() as live
         from idempotency_keys where key = '$1'"
}

# `events KEY`: the timeline of one key (also after it expired).
events() {
    sql "select e.kind, e.lease_token as token, e.detail from idempotency_events e
         where e.key_id in (select key_id from idempotency_events where detail->>'key' = '$1'
                            union select id from idempotency_keys where key = '$1')
         order by e.id"
}

# --- plumbing -----------------------------------------------------------------------------------

running() {
    local pid
    pid=$(cat "$WORKSHOP_DIR/$1.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null
}

# start_process NAME READY_URL COMMAND…: runs COMMAND in the background (its log in NAME.log, its
# pid in NAME.pid) and waits up to 60 s until READY_URL answers.
start_process() {
    local name=$1 ready=$2 pid
    shift 2
    "$@" >> "$WORKSHOP_DIR/$name.log" 2>&1 &
    pid=$!
    # Not a job of this shell: a `wait` for the exercise's own background work must not wait for
    # the servers too.
    disown 2>/dev/null || true
    echo "$pid" > "$WORKSHOP_DIR/$name.pid"
    for _ in $(seq 600); do
        if curl -sf -o /dev/null "$ready"; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "workshop: $name exited; the end of $WORKSHOP_DIR/$name.log:" >&2
            tail -n 20 "$WORKSHOP_DIR/$name.log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "workshop: $name is not ready after 60 s (see $WORKSHOP_DIR/$name.log)" >&2
    return 1
}

# stop_process NAME SIGNAL: signals the process started as NAME and waits until it is gone
# (kill -9 after 30 s, saying so).
stop_process() {
    local pid
    pid=$(cat "$WORKSHOP_DIR/$1.pid" 2>/dev/null) || return 0
    kill "-$2" "$pid" 2>/dev/null || true
    for _ in $(seq 300); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$WORKSHOP_DIR/$1.pid"; return 0; }
        sleep 0.1
    done
    echo "workshop: $1 did not stop within 30 s of SIG$2: killed" >&2
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$WORKSHOP_DIR/$1.pid"
}
