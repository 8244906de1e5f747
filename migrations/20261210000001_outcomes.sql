-- Unknown outcomes are resolved, never guessed (docs/lifecycle.md, "Outcomes" and "The budget").

-- The one backoff formula, used by every statement that decides when a key (or a pending
-- payment) may be tried again: `base`, `base`, `2·base`, `4·base`, … up to `cap`. The exponent is
-- bounded, so the arithmetic cannot overflow whatever the count (2^1024 overflows float8).
create function payonce_backoff(attempts integer, base_secs float8, cap_secs float8) returns interval
    language sql immutable parallel safe
    return least(cap_secs, base_secs * 2.0::float8 ^ least(greatest(attempts - 2, 0), 30)) * interval '1 second';

-- Payment statuses, in the only order they may be reached:
--   pending (no answer yet) < requires_action < processing < succeeded = failed (both terminal).
-- `requires_action` and `processing` are a PaymentIntent that exists and may still move money
-- (3-D Secure to complete, a bank debit settling); they move on by webhook or reconciliation.
alter table payments drop constraint payments_status_check;
alter table payments add constraint payments_status_check
    check (status in ('pending', 'requires_action', 'processing', 'succeeded', 'failed'));

create function payment_status_rank(status text) returns integer
    language sql immutable parallel safe
    return case status
        when 'pending' then 0
        when 'requires_action' then 1
        when 'processing' then 2
        when 'succeeded' then 3
        when 'failed' then 3
    end;

-- Never backwards. Every statement that writes a status guards itself with
-- `payment_status_rank(new) > payment_status_rank(status)`; this trigger is the last line of
-- defence against one that forgets: a status may stay, or rise, never fall or swap terminals.
create function payments_forward_only() returns trigger
    language plpgsql as $$
begin
    if new.status <> old.status and payment_status_rank(new.status) <= payment_status_rank(old.status) then
        raise exception 'payment % may not move from % to %', old.id, old.status, new.status
            using errcode = 'check_violation', hint = 'payment statuses only move forward (docs/lifecycle.md)';
    end if;
    return new;
end
$$;
create trigger payments_forward_only before update of status on payments
    for each row execute function payments_forward_only();

alter table payments
    -- A copy of idempotency_key_id without the foreign key: it survives the key's reaping, so a
    -- pending payment can still be reconciled, and its timeline (events by key id) found.
    add column key_id             uuid,
    -- Stripe's `next_action` while the payment is `requires_action` (null otherwise).
    add column next_action        jsonb,
    -- When the sweeper next asks the gateway about a pending (requires_action, processing)
    -- payment; null when there is nothing to ask. Pushed forward with payonce_backoff.
    add column reconcile_at       timestamptz,
    add column reconcile_attempts integer not null default 0,
    -- The `created` of the last webhook event applied: an older one is stale.
    add column gateway_event_at   timestamptz;
update payments set key_id = idempotency_key_id;
create unique index payments_key_id on payments (key_id);
create index payments_reconcile on payments (reconcile_at) where reconcile_at is not null;
-- webhook events name the PaymentIntent
create index payments_payment_intent on payments (gateway_payment_intent_id) where gateway_payment_intent_id is not null;

-- New events on a key's timeline.
alter table idempotency_events drop constraint idempotency_events_kind_check;
alter table idempotency_events add constraint idempotency_events_kind_check check (kind in (
    'claimed', 'replayed', 'conflict', 'mismatch', 'reclaimed', 'payment_created', 'completed',
    'released', 'lease_lost', 'failed', 'expired',
    'refused',      -- the gateway refused payonce's own request (configuration): nothing stored
    'reconciled',   -- payonce asked the gateway for the truth (retrieve, replay, search) and what it said
    'webhook'       -- a webhook event about the key's payment arrived, and what it did
));
-- the dashboard's banner: refusals in the last minutes, on every server alike
create index idempotency_events_refused on idempotency_events (created_at) where kind = 'refused';

-- The webhook inbox: one row per Stripe event ever applied, inserted in the same transaction as
-- the event's effect. A redelivery finds its row and changes nothing.
create table webhook_events (
    id          text primary key,           -- Stripe's event id (evt_…)
    type        text not null,              -- e.g. payment_intent.succeeded
    created     timestamptz not null,       -- the event's `created`
    -- the payment it concerned, when it named one payonce knows
    payment_id  uuid,
    -- applied: the payment moved; stale: older than what was known (a re-fetch was scheduled);
    -- ignored: a type payonce does not act on, or nothing to change; unmatched: no such payment
    effect      text not null check (effect in ('applied', 'stale', 'ignored', 'unmatched')),
    received_at timestamptz not null default now()
);
-- purged with the key events (PAYONCE_EVENT_RETENTION_SECS)
create index webhook_events_received_at on webhook_events (received_at);

-- Whether a key's budget is spent: it has had `max_attempts` holders, or it is older than the
-- downstream key's horizon (PAYONCE_DOWNSTREAM_KEY_TTL_SECS, under Stripe's 24 h), after which
-- no create call may be sent for it. A spent key is never reclaimed by a client; only the
-- sweeper takes it, every `cap`, to reconcile it with the gateway.
create function idempotency_exhausted(
    attempts integer, created_at timestamptz, max_attempts integer, horizon_secs float8
) returns boolean
    language sql stable parallel safe
    return attempts >= max_attempts or created_at + horizon_secs * interval '1 second' <= now();

-- When a processing key whose lease ended at `locked_until` may be taken again: after its
-- backoff, or `cap` once its budget is spent. Every statement that reclaims, and every answer
-- that tells a client when to come back, uses this.
create function idempotency_retry_at(
    locked_until timestamptz, attempts integer, created_at timestamptz,
    max_attempts integer, horizon_secs float8, base_secs float8, cap_secs float8
) returns timestamptz
    language sql stable parallel safe
    return locked_until + case
        when idempotency_exhausted(attempts, created_at, max_attempts, horizon_secs) then cap_secs * interval '1 second'
        else payonce_backoff(attempts, base_secs, cap_secs)
    end;
