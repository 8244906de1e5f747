-- Refunds: the second idempotent operation (docs/architecture.md, "Making your own endpoint
-- idempotent").

-- How much of the payment is refunded or being refunded: the sum of the amounts of its refunds
-- that are pending or succeeded. It is the *reservation* that keeps different keys from
-- refunding more than was paid: a refund's first write raises it with one conditional update
-- (`amount_refunded + $amount <= amount`), committed with the key's claim, before the gateway is
-- called; a refund that fails gives its amount back in the statement that marks it failed. Two
-- refunds of one payment serialise on the payment's row only for that short statement, never
-- across the gateway call. The check is the last line of defence.
alter table payments
    add column amount_refunded bigint not null default 0,
    add constraint payments_refunds_within_amount check (amount_refunded between 0 and amount);

create table refunds (
    id                uuid primary key,             -- uuid v7, shown as `re_<hex>`
    customer_id       uuid not null references customers (id) on delete cascade,
    payment_id        uuid not null references payments (id) on delete cascade,
    -- the key that created the refund (kept after the key is reaped: the timeline, the downstream key)
    key_id            uuid not null unique,
    -- resolved at the first write: the amount asked for, or all that remained then
    amount            bigint not null check (amount > 0),
    currency          text not null,
    reason            text check (reason in ('duplicate', 'fraudulent', 'requested_by_customer')),
    metadata          jsonb not null default '{}',
    -- pending: reserved on the payment, the gateway has not confirmed it yet
    -- succeeded: the gateway refunded it; failed: it did not (the reservation was given back)
    status            text not null default 'pending' check (status in ('pending', 'succeeded', 'failed')),
    gateway_refund_id text,
    failure_code      text,
    failure_message   text,
    created_at        timestamptz not null default now(),
    updated_at        timestamptz not null default now()
);

-- `GET /v1/refunds?payment=` and the payment's page list a payment's refunds, newest first
create index refunds_payment on refunds (payment_id, id desc);
create index refunds_customer on refunds (customer_id, id desc);
create index refunds_gateway on refunds (gateway_refund_id) where gateway_refund_id is not null;

-- A refund's recovery point, and the event its first write records.
alter table idempotency_keys drop constraint idempotency_keys_recovery_point_check;
alter table idempotency_keys add constraint idempotency_keys_recovery_point_check
    check (recovery_point in ('started', 'payment_created', 'refund_created', 'finished'));

alter table idempotency_events drop constraint idempotency_events_kind_check;
alter table idempotency_events add constraint idempotency_events_kind_check check (kind in (
    'claimed', 'replayed', 'conflict', 'mismatch', 'reclaimed', 'payment_created', 'completed',
    'released', 'lease_lost', 'failed', 'expired', 'refused', 'reconciled', 'webhook',
    'refund_created'   -- recovery point reached: the refund row exists and its amount is reserved
));

-- The dashboard filters keys by operation (their route).
create index idempotency_keys_route on idempotency_keys (route, created_at desc);
