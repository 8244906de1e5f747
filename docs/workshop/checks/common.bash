# Sourced by every check (not a check itself: check.sh runs only *.sh). The attendee's shell on
# private ports and a scratch data folder, `up` already run, and assertions that say what broke.
#
# A new check (checks/<name>.sh, e.g. the lab's) starts with `. "$(dirname "$0")/common.bash"`,
# uses keys of its own (the class is shared under check.sh: WORKSHOP_SHARED), puts back any
# server setting or fault it changes (`stop; serve`, `faults '{}'`), and exits non-zero on
# failure (`expect`, `expect_match`, `fail`). Run alone (`bash checks/<name>.sh`) it brings up,
# and takes down, a class of its own.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
repo=$PWD

scratch=${WORKSHOP_SCRATCH:-$(mktemp -d "${TMPDIR:-/tmp}/payonce-workshop.XXXXXX")}
chmod 755 "$scratch"
# The exercises use the zero-config PostgreSQL; a test an exercise runs uses the caller's server.
export WORKSHOP_CALLER_DATABASE_URL=${WORKSHOP_CALLER_DATABASE_URL:-${DATABASE_URL:-}}
unset DATABASE_URL
if [ -n "${WORKSHOP_SHARED:-}" ]; then
    # check.sh brought the class up once (its ports and folder are in the environment), as a
    # workshop runs its exercises one after the other on one setup; each exercise uses keys of
    # its own. A check puts back what it changed (the server's settings, the faults).
    # shellcheck source=../setup.sh
    . docs/workshop/setup.sh 2>/dev/null
else
    free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
    export PAYONCE_DATA_DIR=$scratch/data
    export PAYONCE_ADDR=127.0.0.1:$(free_port)
    export PAYONCE_SIM_ADDR=127.0.0.1:$(free_port)
    export DASHBOARD_ADDR=127.0.0.1:$(free_port)
    # shellcheck source=../setup.sh
    . docs/workshop/setup.sh 2>/dev/null
    # Everything this check started goes when it ends, the database too.
    trap 'down; payonce db stop >/dev/null 2>&1 || true' EXIT
fi
cd "$scratch"
up > /dev/null
faults '{}' > /dev/null

fail() { echo "FAIL: $*" >&2; exit 1; }
# in_source FILE REGEX: the code an exercise sends people to read is still there.
in_source() { grep -Eq -- "$2" "$repo/$1" || fail "$1 no longer has '$2': the exercise points at nothing"; echo "ok: $1 has $2"; }
# expect WHAT ACTUAL EXPECTED
expect() { [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"; echo "ok: $1 = $3"; }
# expect_match WHAT TEXT REGEX
expect_match() { printf '%s' "$2" | grep -Eq -- "$3" || fail "$1: '$3' not in: $2"; echo "ok: $1 ~ $3"; }
# The status code of an answer `pay` printed.
status_of() { printf '%s\n' "$1" | sed -n '1s/^HTTP\/[0-9.]* \([0-9]*\).*/\1/p'; }
# A header of an answer `pay` printed (case-insensitive name).
header_of() { printf '%s\n' "$1" | tr -d '\r' | sed -n "s/^$2: *//Ip" | head -n 1; }
# The JSON body (the last line) of an answer `pay` printed, one member of it.
member_of() { printf '%s\n' "$1" | tr -d '\r' | grep '^{' | tail -n 1 | python3 -c 'import json, sys; print(json.load(sys.stdin).get(sys.argv[1], ""))' "$2"; }
# The operator's session on the dashboard, with a cookie jar: `dash_login`, then `dash PATH`.
dash_login() {
    local csrf
    csrf=$(curl -s -c "$scratch/jar" -b "$scratch/jar" "$DASHBOARD/admin/login" | sed -n 's/.*name="csrf" value="\([^"]*\)".*/\1/p' | head -n 1)
    curl -s -o /dev/null -c "$scratch/jar" -b "$scratch/jar" "$DASHBOARD/admin/login" \
        --data-urlencode "csrf=$csrf" --data-urlencode name=teacher --data-urlencode password=workshop-password
}
# value 'select …': one value (or rows of values, without a header) from payonce's database.
value() { psql "$(payonce db url)" -X -q -t -A -F ' | ' -c "$1"; }
dash() { curl -s -c "$scratch/jar" -b "$scratch/jar" "$DASHBOARD$1"; }
