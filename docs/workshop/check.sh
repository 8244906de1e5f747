#!/usr/bin/env bash
# Runs the workshop (docs/workshop.md) as written and checks that every exercise still teaches
# what it says: one script per exercise in docs/workshop/checks/, each standalone (non-zero on
# failure). With names (`check.sh 4 6`, `check.sh lab`), only those.
#
# Every check sources docs/workshop/setup.sh, like an attendee, on private ports and a private data
# folder, so it neither needs nor disturbs a payonce that is already running. It builds nothing:
# it runs ${PAYONCE_BIN:-${CARGO_TARGET_DIR:-target}/debug/payonce} (`cargo build -p payonce`
# first), plus what an exercise itself runs (exercise 5 runs one `cargo test`).
#
#   docs/workshop/check.sh            # every exercise: about 3 minutes once the tests are built;
#                                     # exercise 5 runs one `cargo test`, which on a fresh checkout
#                                     # is the tests' first build (README.md, "Build times")
#   docs/workshop/check.sh 2 7        # some
#   KEEP=1 docs/workshop/check.sh 4   # keep the scratch folder (logs, database) to look at
set -uo pipefail
cd "$(dirname "$0")/../.."

checks=docs/workshop/checks
export PAYONCE_BIN=${PAYONCE_BIN:-${CARGO_TARGET_DIR:-target}/debug/payonce}
if [ ! -x "$PAYONCE_BIN" ]; then
    echo "check.sh: no payonce binary at $PAYONCE_BIN: run \`cargo build -p payonce\` (or set PAYONCE_BIN)" >&2
    exit 2
fi

if [ $# -eq 0 ]; then
    names=()
    for script in "$checks"/*.sh; do names+=("$(basename "$script" .sh)"); done
else
    names=("$@")
fi

# One class for every check, as a workshop runs: the processes come up once, on private ports
# and a private folder; each exercise uses keys of its own.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
class=$(mktemp -d "${TMPDIR:-/tmp}/payonce-workshop-class.XXXXXX")
# Run as root, the zero-config PostgreSQL runs as `postgres`, which must reach its folder.
chmod 755 "$class"
export WORKSHOP_SHARED=1 WORKSHOP_CALLER_DATABASE_URL=${DATABASE_URL:-}
export PAYONCE_DATA_DIR=$class/data PAYONCE_ADDR=127.0.0.1:$(free_port) PAYONCE_SIM_ADDR=127.0.0.1:$(free_port)
export DASHBOARD_ADDR=127.0.0.1:$(free_port)
unset DATABASE_URL
started=$SECONDS
(
    # shellcheck source=setup.sh
    . docs/workshop/setup.sh 2>/dev/null
    up > /dev/null
) || { echo "check.sh: the workshop's setup failed (logs in $class/data/workshop)" >&2; exit 1; }
finish() {
    (
        . docs/workshop/setup.sh 2>/dev/null
        down
        payonce db stop > /dev/null 2>&1 || true
    )
    if [ ${#failed[@]} -eq 0 ] && [ -z "${KEEP:-}" ]; then rm -rf "$class"; else echo "the class's logs and database: $class/data"; fi
}
trap finish EXIT
printf '%-16s %s\n' setup "up in $((SECONDS - started)) s"
failed=()
for name in "${names[@]}"; do
    script=$checks/$name.sh
    # An exercise's number names its check: `4` is checks/4-zombie.sh.
    if [ ! -f "$script" ]; then
        for candidate in "$checks/$name"-*.sh; do [ -f "$candidate" ] && script=$candidate; done
    fi
    name=$(basename "$script" .sh)
    if [ ! -f "$script" ]; then
        printf '%-16s %s\n' "$name" "no such check ($script)"
        failed+=("$name")
        continue
    fi
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/payonce-workshop-$name.XXXXXX")
    # Run as root, the zero-config PostgreSQL runs as `postgres`, which must reach its folder.
    chmod 755 "$scratch"
    begin=$SECONDS
    WORKSHOP_SCRATCH=$scratch bash "$script" > "$scratch/check.log" 2>&1
    status=$?
    took=$((SECONDS - begin))
    if [ $status -eq 0 ]; then
        printf '%-16s pass  %3d s\n' "$name" "$took"
    else
        printf '%-16s FAIL  %3d s   (exit %d; the end of its log follows, all of it in %s)\n' \
            "$name" "$took" "$status" "$scratch"
        tail -n 25 "$scratch/check.log" | sed 's/^/    /'
        failed+=("$name")
    fi
    if [ $status -eq 0 ] && [ -z "${KEEP:-}" ]; then rm -rf "$scratch"; fi
done

printf '%d checks in %d s: ' "${#names[@]}" "$((SECONDS - started))"
if [ ${#failed[@]} -eq 0 ]; then
    echo "all pass"
else
    echo "failed: ${failed[*]}"
    exit 1
fi
