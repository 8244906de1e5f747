-- Payments: the business records the idempotency engine protects.
create table payments (
    id                        uuid primary key,   -- uuid v7 (time-ordered), shown as `pay_<hex>`
    customer_id               uuid not null references customers (id) on delete cascade,
    -- the key that created the payment; payments outlive their keys (the reaper deletes keys)
    idempotency_key_id        uuid unique references idempotency_keys (id) on delete set null,
    amount                    bigint not null check (amount > 0),
    currency                  text not null check (currency ~ '^[a-z]{3}$'),
    payment_method            text not null,
    description               text,
    metadata                  jsonb not null default '{}',
    -- pending until the gateway answered; failed = declined or refused by the gateway
    status                    text not null default 'pending'
                              check (status in ('pending', 'succeeded', 'failed')),
    gateway_payment_intent_id text,
    failure_code              text,
    decline_code              text,
    failure_message           text,
    created_at                timestamptz not null default now(),
    updated_at                timestamptz not null default now()
);

-- `GET /v1/payments` lists a customer's payments newest first; uuid v7 ids sort by creation time
create index payments_customer on payments (customer_id, id desc);
