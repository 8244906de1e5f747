#!/usr/bin/env bash
# Exercise 5, presumed dead but alive: the test runs as written; the fence is where the exercise
# says (the SQL function every operation's last write calls, in a migration); and the edit it asks
# for makes a function PostgreSQL accepts (created, in a transaction rolled back, on the workshop's
# migrated database). The rebuild with the fence removed is left out: it recompiles the crate
# (minutes); WORKSHOP_FULL=1 does it too, on a copy of the repository.
. "$(dirname "$0")/common.bash"

migration=migrations/20261231000401_finish_plpgsql.sql
fence="where k.id = p_key and k.customer_id = p_customer and k.lease_token = p_token and k.state = 'processing'"
unfenced="where k.id = p_key and k.customer_id = p_customer and k.state = 'processing'"
in_source "$migration" 'create function idempotency_finish'
in_source "$migration" "$fence"
in_source app/src/payments/process.rs 'idempotency_finish\('

# The exercise's edit, on the migration's text, and PostgreSQL's verdict on the function it makes.
edited=$(python3 - "$repo/$migration" "$fence" "$unfenced" <<'PY'
import sys
path, fence, unfenced = sys.argv[1:]
print(open(path).read().replace(fence, unfenced, 1))
PY
)
expect_match "the exercise's edit" "$edited" "$unfenced"
created=$(printf 'begin;\ndrop function idempotency_finish;\n%s\nrollback;\n' "$edited" |
    psql "$(payonce db url)" -X -q -v ON_ERROR_STOP=1 2>&1 && echo created)
expect_match "the edited function is valid SQL" "$created" created

cd "$repo"
# The test harness makes its own databases: on the caller's DATABASE_URL if it had one.
if [ -n "$WORKSHOP_CALLER_DATABASE_URL" ]; then export DATABASE_URL=$WORKSHOP_CALLER_DATABASE_URL; fi
out=$(cargo test -p payonce --test api a_worker_presumed_dead_cannot_double_charge 2>&1) || fail "the test fails as written: $out"
expect_match "the test runs and passes" "$out" 'test recovery::a_worker_presumed_dead_cannot_double_charge \.\.\. ok'

if [ -n "${WORKSHOP_FULL:-}" ]; then
    copy=$scratch/repo
    git worktree add --detach "$copy" HEAD > /dev/null
    trap 'git worktree remove --force "$copy"; down; payonce db stop >/dev/null 2>&1 || true' EXIT
    printf '%s\n' "$edited" > "$copy/$migration"
    unfenced_run=$(cd "$copy" && cargo test -p payonce --test api a_worker_presumed_dead_cannot_double_charge 2>&1) &&
        fail "without the fence the test still passes"
    expect_match "without the fence it fails" "$unfenced_run" 'after losing its lease|lease_lost'
fi
