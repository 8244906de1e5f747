-- The idempotency engine's state: one row per (customer, Idempotency-Key).
-- See docs/lifecycle.md for the state machine drawn out.
create table idempotency_keys (
    -- uuid v7. Also the seed of the downstream (Stripe) idempotency key, so a retry after a crash
    -- sends the gateway the very same key and can never create a second charge.
    id               uuid primary key,
    customer_id      uuid not null references customers (id) on delete cascade,
    -- the client's Idempotency-Key, decoded from its Structured Field form
    key              text not null check (length(key) between 1 and 255),
    -- the operation the key was first used for; reuse on another route is refused (422)
    method           text not null,
    route            text not null,
    -- SHA-256 of method, route and the canonical JSON of the request body
    fingerprint      bytea not null check (length(fingerprint) = 32),
    -- the canonical request itself, so abandoned work can be finished without the client
    request          jsonb not null,

    -- processing: somebody holds (or held) the lease and the outcome is not known yet
    -- completed:  a final response is stored and is replayed to every retry
    -- failed:     recovery gave up; a final problem response is stored and replayed
    state            text not null default 'processing'
                     check (state in ('processing', 'completed', 'failed')),
    -- How far the work got. Each step is one short transaction; the gateway is called between
    -- payment_created and finished, with no transaction open (docs/lifecycle.md, "Recovery points").
    recovery_point   text not null default 'started'
                     check (recovery_point in ('started', 'payment_created', 'finished')),

    -- The lease. Whoever holds the current lease_token may advance the row; every write after the
    -- claim says `where lease_token = $token`, so a worker that lost its lease (it was slow, or
    -- presumed dead and reclaimed) cannot overwrite its successor. The token only ever grows.
    lease_token      bigint not null default 1,
    lease_owner      text,
    locked_until     timestamptz,
    -- how many times a worker has taken the lease (the claim counts as the first)
    attempts         integer not null default 1,

    -- the final response, replayed byte for byte
    response_status  smallint check (response_status between 100 and 599),
    response_headers jsonb,
    response_body    bytea,

    created_at       timestamptz not null default now(),
    updated_at       timestamptz not null default now(),
    completed_at     timestamptz,
    -- after this instant a final key may be deleted; a retry after that is a new request
    expires_at       timestamptz not null,

    unique (customer_id, key),
    -- a final row has its response; a processing row has none and a lease deadline
    constraint final_rows_have_a_response check (
        (state = 'processing') = (response_status is null)
        and (state = 'processing') = (locked_until is not null)
        and (state = 'processing') = (completed_at is null)
    )
);

-- the sweeper looks for processing keys whose lease ran out
create index idempotency_keys_processing on idempotency_keys (locked_until) where state = 'processing';
-- the reaper deletes final keys past their expiry
create index idempotency_keys_expiry on idempotency_keys (expires_at) where state <> 'processing';

-- Append-only history of every key: what happened, when, under which lease token.
-- Deliberately no foreign key to idempotency_keys: the events of a reaped key remain, and the
-- dashboard counts expired keys from them.
create table idempotency_events (
    id          bigint generated always as identity primary key,
    key_id      uuid not null,
    customer_id uuid not null,
    kind        text not null check (kind in (
                    'claimed',          -- a new key was inserted (the atomic claim)
                    'replayed',         -- a retry got the stored response
                    'conflict',         -- a retry found the key in flight (409)
                    'mismatch',         -- the key was reused with another payload or route (422)
                    'reclaimed',        -- an expired lease was taken over (new token)
                    'payment_created',  -- recovery point reached: the local payment row exists
                    'completed',        -- the gateway answered; payment and response stored together
                    'released',         -- the lease was given up so a retry can resume
                    'lease_lost',       -- a worker found its token superseded and stopped
                    'failed',           -- recovery gave up; final problem stored
                    'expired'           -- the key was deleted after its retention
                )),
    lease_token bigint,
    detail      jsonb not null default '{}',
    created_at  timestamptz not null default now()
);

create index idempotency_events_key on idempotency_events (key_id, id);
create index idempotency_events_created_at on idempotency_events (created_at);
