#!/usr/bin/env bash
# Exercise 5, presumed dead but alive: the test runs as written; the fence is where the exercise
# says; and the edit it asks for works where the two traps are. sqlx type-checks a query by
# asking PostgreSQL to prepare it, so preparing the edited `finish` statement against the
# workshop's migrated database (what `SQLX_OFFLINE=false DATABASE_URL=$(payonce db url)` makes the
# build do) proves it compiles, and preparing the naive edit proves it does not ("could not
# determine data type of parameter $2"). The rebuild with the fence removed is left out: it
# recompiles the crate (minutes); WORKSHOP_FULL=1 does it too, on a copy of the repository.
. "$(dirname "$0")/common.bash"

in_source app/src/payments/process.rs 'async fn finish'
finish=$(python3 - "$repo/app/src/payments/process.rs" <<'PY'
import re, sys
source = open(sys.argv[1]).read()
body = source[source.index("async fn finish"):]
print(body[body.index('r#"') + 3:body.index('"#')])
PY
)
expect_match "the fence in finish" "$finish" "where id = \\\$1 and lease_token = \\\$2 and state = 'processing' and recovery_point = 'payment_created'"

# Preparing a statement needs its parameters' types only; none of them is bound.
prepare() { printf 'prepare finish_check as %s;\n' "$1" | psql "$(payonce db url)" -X -q -v ON_ERROR_STOP=1 2>&1; }
expect_match "the statement as it is prepares" "$(prepare "$finish" && echo prepared)" prepared
naive=${finish/lease_token = \$2 and /}
expect_match "without the condition, \$2 is untyped" "$(prepare "$naive" || true)" 'could not determine data type of parameter \$2'
edited=${finish/lease_token = \$2 and/\$2::int8 is not null and}
expect_match "the exercise's replacement" "$edited" "where id = \\\$1 and \\\$2::int8 is not null and state = 'processing' and recovery_point = 'payment_created'"
expect_match "the replacement prepares" "$(prepare "$edited" && echo prepared)" prepared

cd "$repo"
# The test harness makes its own databases: on the caller's DATABASE_URL if it had one.
if [ -n "$WORKSHOP_CALLER_DATABASE_URL" ]; then export DATABASE_URL=$WORKSHOP_CALLER_DATABASE_URL; fi
out=$(cargo test -p payonce --test api a_worker_presumed_dead_cannot_double_charge 2>&1) || fail "the test fails as written: $out"
expect_match "the test runs and passes" "$out" 'test recovery::a_worker_presumed_dead_cannot_double_charge \.\.\. ok'

if [ -n "${WORKSHOP_FULL:-}" ]; then
    copy=$scratch/repo
    git worktree add --detach "$copy" HEAD > /dev/null
    trap 'git worktree remove --force "$copy"; down; payonce db stop >/dev/null 2>&1 || true' EXIT
    python3 - "$copy/app/src/payments/process.rs" <<'PY'
import sys
path = sys.argv[1]
source = open(path).read()
fence = "where id = $1 and lease_token = $2 and state = 'processing' and recovery_point = 'payment_created'"
source = source.replace(fence, fence.replace("lease_token = $2 and", "$2::int8 is not null and"), 1)
open(path, "w").write(source)
PY
    unfenced=$(cd "$copy" && SQLX_OFFLINE=false DATABASE_URL=$(payonce db url) cargo test -p payonce --test api \
        a_worker_presumed_dead_cannot_double_charge 2>&1) && fail "without the fence the test still passes"
    expect_match "without the fence it fails" "$unfenced" 'lease_lost|token >= 3'
fi
