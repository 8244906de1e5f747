#!/usr/bin/env bash
# Checks the workshop's lab exercises (docs/workshop.md, "Lab exercises") as written: it takes
# every shell block marked `<!-- lab-check: NAME -->` from the document and runs it, then asserts
# what the exercise says the attendee will see. Standalone: non-zero on any failure.
#
# The blocks run unchanged except for what must differ on a shared machine: the ports (3100 and
# 12200 become free ones), the database (payonce_lab becomes a scratch one, dropped afterwards)
# and the binary (target/debug/payonce becomes $PAYONCE_BIN). It needs psql and createdb on a
# PostgreSQL server (ADMIN_URL), curl, python3, and Redis on 127.0.0.1:6379 with redis-server on
# the PATH: exercise L3 restarts it exactly as written (without persistence).
#
#   docs/workshop/checks/lab.sh
#   PAYONCE_BIN    default: ${CARGO_TARGET_DIR:-target}/debug/payonce (cargo build -p payonce)
#   ADMIN_URL      default: postgres://postgres@127.0.0.1:5432/postgres
set -uo pipefail
cd "$(dirname "$0")/../../.."

payonce=${PAYONCE_BIN:-${CARGO_TARGET_DIR:-target}/debug/payonce}
case $payonce in /*) ;; *) payonce=$PWD/$payonce ;; esac
admin_url=${ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
doc=docs/workshop.md

fail() { printf 'lab.sh: FAILED: %s\n' "$*" >&2; exit 1; }
[ -x "$payonce" ] || { echo "lab.sh: no payonce binary at $payonce (cargo build -p payonce)" >&2; exit 2; }
for tool in psql createdb curl python3 redis-cli redis-server; do
    command -v "$tool" >/dev/null || { echo "lab.sh: $tool is required" >&2; exit 2; }
done
redis-cli ping >/dev/null || { echo "lab.sh: Redis does not answer on 127.0.0.1:6379" >&2; exit 2; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
work=$(mktemp -d "${TMPDIR:-/tmp}/payonce-lab-check.XXXXXX")
api_port=$(free_port)
sim_port=$(free_port)
database=payonce_lab_check_$$
host=${admin_url#*://}
host=${host#*@}
host=${host%%/*}
server_pid=

# The server block is a shell running createdb and then payonce: killing that shell alone left
# payonce running (a `payonce serve --lab` outlived every check, on a dropped database). So the
# block runs in a session of its own, and the whole group is stopped: SIGTERM, then SIGKILL.
cleanup() {
    local leaked=
    if [ -n "$server_pid" ]; then
        kill -TERM -- "-$server_pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 -- "-$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$server_pid" "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
        # What the stop is for: nothing of the check's still serves its port.
        if curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$api_port/readyz" 2>/dev/null; then
            echo "lab.sh: FAILED: the lab server still answers on 127.0.0.1:$api_port after the check stopped it" >&2
            leaked=1
        fi
    fi
    psql "$admin_url" -qc "drop database if exists $database with (force)" >/dev/null 2>&1
    rm -rf "$work"
    [ -z "$leaked" ] || exit 1
}
trap cleanup EXIT

# The block NAME of the document, with the machine's substitutions, in $work/NAME.sh.
block() {
    python3 - "$doc" "$1" "$work/$1.sh" <<'EOF' || fail "no block '$1' in $doc"
import re, sys
doc, name, out = sys.argv[1:]
text = open(doc).read()
match = re.search(r"<!-- lab-check: %s -->\n```sh\n(.*?)```" % re.escape(name), text, re.S)
if not match:
    sys.exit(1)
open(out, "w").write(match.group(1))
EOF
    sed -i -e "s/127\.0\.0\.1:3100/127.0.0.1:$api_port/g" -e "s/127\.0\.0\.1:12200/127.0.0.1:$sim_port/g" \
        -e "s#postgres://postgres@127\.0\.0\.1:5432/payonce_lab#${admin_url%/*}/$database#g" \
        -e "s/createdb -h 127\.0\.0\.1 -U postgres payonce_lab/createdb -h ${host%%:*} -U postgres $database/" \
        -e "s#target/debug/payonce#$payonce#g" "$work/$1.sh"
}

# Runs block NAME in the attendee's shell (the setup's variables and functions), its output to
# $work/NAME.out and on stdout.
run() {
    block "$1"
    printf '\n--- %s\n' "$1"
    (
        # shellcheck disable=SC1090
        . "$work/setup.env"
        . "$work/$1.sh"
    ) 2>&1 | tee "$work/$1.out"
}

# How many lines of block NAME's output match a pattern.
count() { grep -cE "$2" "$work/$1.out" || true; }

# The server: terminal 3, in the background, until it is ready.
block server
(cd "$work" && exec setsid bash "$work/server.sh") >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do
    curl -fsS -o /dev/null "http://127.0.0.1:$api_port/readyz" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { tail -n 30 "$work/server.log"; fail "the lab server did not start"; }
    sleep 0.1
done
curl -fsS -o /dev/null "http://127.0.0.1:$api_port/readyz" || { tail -n 30 "$work/server.log"; fail "the lab server is not ready"; }

# The setup: terminal 4. Its variables and functions are kept for every exercise.
block setup
(
    . "$work/setup.sh" >"$work/setup.out" 2>&1
    declare -p LAB_DB LAB LABSIM LABKEY
    declare -f lab labfaults charges
) >"$work/setup.env" || fail "the setup block failed: $(cat "$work/setup.out")"
cat "$work/setup.out"
grep -q '"claim_strategy":"on-conflict"' "$work/setup.out" && grep -q '"lab":true' "$work/setup.out" ||
    fail "/healthz does not name the strategy and lab mode"

# L1: check-then-insert double charges; on-conflict does not; the unique index fixes it.
run L1-race
naive=$(grep -m1 'charge(s) for l1' "$work/L1-race.out" | cut -d' ' -f1)
both=$(grep 'charge(s) for l1' "$work/L1-race.out" | tail -n1 | cut -d' ' -f1)
[ "${naive:-0}" -gt 1 ] || fail "L1: check-then-insert charged l1 ${naive:-0} time(s), not more than once"
[ "$(count L1-race '^201 check-then-insert l1$')" -eq "$naive" ] || fail "L1: not one 201 per check-then-insert charge"
[ "$((both - naive))" -eq 1 ] || fail "L1: on-conflict charged l1 $((both - naive)) time(s), not once"
[ "$(count L1-race '^201 on-conflict l1$')" -eq 1 ] && [ "$(count L1-race '^409 on-conflict l1$')" -eq 4 ] ||
    fail "L1: on-conflict did not answer one 201 and four 409s"
run L1-fix
grep -q 'could not create unique index' "$work/L1-fix.out" || fail "L1: the index was built over the race's duplicates"
grep -q '^1 charge(s) for l1-fixed$' "$work/L1-fix.out" || fail "L1: with the unique index, not exactly one charge"
[ "$(count L1-fix '^409 check-then-insert l1-fixed$')" -eq 4 ] || fail "L1: with the unique index, not four 409s"

# L2: for-update drains the pool (503s, /readyz refused); on-conflict does not.
run L2-drain
drained=$(count L2-drain '^503 for-update ')
[ "$drained" -ge 1 ] || fail "L2: for-update with a 4 s gateway and 4 connections answered no 503"
[ "$((drained + $(count L2-drain '^201 for-update ')))" -eq 8 ] || fail "L2: for-update answered other than 201/503"
[ "$(grep -m1 '^readyz' "$work/L2-drain.out" | cut -d' ' -f2)" = 503 ] || fail "L2: /readyz answered while the pool was drained"
[ "$(count L2-drain '^201 on-conflict ')" -eq 8 ] || fail "L2: on-conflict did not answer eight 201s"
[ "$(grep '^readyz' "$work/L2-drain.out" | tail -n1 | cut -d' ' -f2)" = 200 ] || fail "L2: /readyz refused under on-conflict"

# L3: a Redis restart mid-storm: the lease and the counter are gone, the fence holds, one charge.
run L3-restart
redis-cli ping >/dev/null || fail "L3: Redis is not running after the exercise"
[ "$(count L3-restart '^201 redis l3$')" -eq 2 ] || fail "L3: not one 201 for the holder and one for the last request"
[ "$(count L3-restart '^409 redis l3$')" -eq 5 ] || fail "L3: not five 409s (two behind the lease, three fenced)"
grep -q '^1 charge(s) for l3$' "$work/L3-restart.out" || fail "L3: not exactly one charge for l3"

printf '\nlab.sh: every lab exercise teaches what it says\n'
