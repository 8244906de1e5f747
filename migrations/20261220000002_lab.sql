-- The claim-strategy lab (docs/strategies.md): the keys of the three strategies that are not the
-- engine's own, and the runs of the dashboard's Lab page. Nothing here is read by the engine, the
-- sweeper or the reaper: the lab's keys live beside `idempotency_keys`, never in it.

-- One row per claimed key of `for-update`, `redis` and `check-then-insert`. The payment itself
-- is an ordinary row of `payments` (without `key_id`), so `GET /v1/payments/{id}` shows it.
create table lab_keys (
    id               uuid primary key,   -- uuid v7; check-then-insert's downstream key is made of it
    strategy         text not null check (strategy in ('for-update', 'redis', 'check-then-insert')),
    customer_id      uuid not null references customers (id) on delete cascade,
    key              text not null,
    fingerprint      bytea not null,
    state            text not null default 'processing' check (state in ('processing', 'completed')),
    -- redis: the fencing token (Redis `INCR`) of the holder allowed to write this row
    fence            bigint not null default 0,
    payment_id       uuid,
    response_status  smallint,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz not null default now(),
    completed_at     timestamptz
);

-- The database decides, for the two strategies that rely on it. check-then-insert is left out ON
-- PURPOSE: with nothing unique to stop it, two requests that both checked "absent" both insert,
-- and both charge. Creating the missing index is the fix of the workshop's lab exercise:
--   create unique index lab_keys_naive_unique on lab_keys (customer_id, key)
--       where strategy = 'check-then-insert';
create unique index lab_keys_unique on lab_keys (strategy, customer_id, key)
    where strategy <> 'check-then-insert';
-- check-then-insert's check (not unique).
create index lab_keys_lookup on lab_keys (strategy, customer_id, key, created_at);

-- The dashboard's Lab page: each run's parameters and, once it ended, its result (per strategy:
-- answers by status, charges per key, the double-charged keys, p99, one raced key's timeline).
create table lab_runs (
    id          uuid primary key,        -- uuid v7: newest first by id
    started_by  text not null,           -- the operator's name
    params      jsonb not null,
    state       text not null default 'running' check (state in ('running', 'finished', 'failed')),
    result      jsonb,
    error       text,
    started_at  timestamptz not null default now(),
    finished_at timestamptz
);
