-- Bounded retention (issue 24): the two history tables, the key events and the webhook inbox,
-- become partitioned by day, so that a day past its retention goes in O(1): one partition
-- detached and dropped by the sweeper (app/src/retention.rs), never a `delete` of millions of
-- rows (whose dead tuples and WAL cost as much as writing them did). docs/expiry.md states the
-- retention and its constraints.
--
-- Partitions are named `<table>_pYYYYMMDD` and hold one UTC day: [day 00:00 UTC, day+1 00:00 UTC).
-- There is deliberately no default partition: the sweeper detaches expired days CONCURRENTLY
-- (no lock a payment waits on), which PostgreSQL allows only without one. Days are therefore
-- made ahead, by this migration, whenever payonce opens the database and on every sweeper pass
-- (7 days ahead), so a row always finds its day; and the 3 days before today too, for the
-- webhook events Stripe still redelivers (dated by their `created`).
--
-- Existing rows are moved over (one copy, at this migration), those of the last 366 days up to
-- the days made ahead: anything older is past any retention payonce has had (7 days, then 30),
-- and a row dated further ahead is a clock's nonsense.

-- Makes the daily partitions of `parent` (partitioned by range on a timestamptz) for every day
-- from `first_day` to `last_day`, skipping those that exist; returns how many it made. A
-- partition is created on its own and then attached: ATTACH takes only a SHARE UPDATE EXCLUSIVE
-- lock on the parent (which inserts and reads do not wait for), where CREATE TABLE … PARTITION OF
-- would take an ACCESS EXCLUSIVE one.
create function payonce_add_daily_partitions(parent text, first_day date, last_day date) returns integer
    language plpgsql as $$
declare
    day date;
    child text;
    made integer := 0;
begin
    for day in select d::date from generate_series(first_day, last_day, interval '1 day') as d loop
        child := parent || '_p' || to_char(day, 'YYYYMMDD');
        continue when to_regclass(child) is not null;
        execute format('create table %I (like %I including defaults including constraints)', child, parent);
        execute format('alter table %I attach partition %I for values from (%L) to (%L)', parent, child,
                       day::timestamp at time zone 'UTC', (day + 1)::timestamp at time zone 'UTC');
        made := made + 1;
    end loop;
    return made;
end
$$;

-- The key events. The primary key gains the partition key (a unique constraint of a partitioned
-- table must hold it); id stays unique on its own (an identity), so no answer changes, and
-- customer_id stays in it (tests/api/schema.rs: the table could still be distributed by customer).
alter table idempotency_events rename to idempotency_events_unpartitioned;
alter table idempotency_events_unpartitioned rename constraint idempotency_events_pkey to idempotency_events_unpartitioned_pkey;
alter index idempotency_events_key rename to idempotency_events_unpartitioned_key;
alter index idempotency_events_created_at rename to idempotency_events_unpartitioned_created_at;
alter index idempotency_events_expired rename to idempotency_events_unpartitioned_expired;
alter index idempotency_events_refused rename to idempotency_events_unpartitioned_refused;

create table idempotency_events (
    id          bigint generated always as identity,
    key_id      uuid not null,
    customer_id uuid not null,
    kind        text not null,
    lease_token bigint,
    detail      jsonb not null default '{}',
    created_at  timestamptz not null default now(),
    primary key (id, customer_id, created_at)
) partition by range (created_at);

create index idempotency_events_key on idempotency_events (key_id, id);
create index idempotency_events_created_at on idempotency_events (created_at);
create index idempotency_events_expired on idempotency_events (created_at) where kind = 'expired';
create index idempotency_events_refused on idempotency_events (created_at) where kind = 'refused';

select payonce_add_daily_partitions(
    'idempotency_events',
    least((select min(created_at) at time zone 'UTC' from idempotency_events_unpartitioned
           where created_at >= ((now() at time zone 'UTC')::date - 366)::timestamp at time zone 'UTC')::date,
          (now() at time zone 'UTC')::date - 3),
    (now() at time zone 'UTC')::date + 7);

insert into idempotency_events (id, key_id, customer_id, kind, lease_token, detail, created_at)
overriding system value
select id, key_id, customer_id, kind, lease_token, detail, created_at from idempotency_events_unpartitioned
where created_at >= ((now() at time zone 'UTC')::date - 366)::timestamp at time zone 'UTC'
  and created_at < ((now() at time zone 'UTC')::date + 8)::timestamp at time zone 'UTC';

-- New ids continue after the moved ones.
select setval(pg_get_serial_sequence('idempotency_events', 'id'),
              coalesce((select max(id) from idempotency_events_unpartitioned), 0) + 1, false);

drop table idempotency_events_unpartitioned;
alter sequence idempotency_events_id_seq1 rename to idempotency_events_id_seq;

-- The webhook inbox, partitioned by the event's `created` (Stripe's, not when it arrived): every
-- delivery of one event carries the same `created`, so the primary key (id, customer_id,
-- created) still finds a redelivery, as (id, customer_id) did. Deduplication is exact for every
-- event younger than the retention; Stripe redelivers an event for 3 days at most, and the
-- retention is never shorter (docs/expiry.md). An event older than every kept day is not
-- recorded (app/src/inbox.rs says what becomes of it).
alter table webhook_events rename to webhook_events_unpartitioned;
alter table webhook_events_unpartitioned rename constraint webhook_events_pkey to webhook_events_unpartitioned_pkey;
alter table webhook_events_unpartitioned rename constraint webhook_events_effect_check to webhook_events_unpartitioned_effect_check;
alter index webhook_events_received_at rename to webhook_events_unpartitioned_received_at;

create table webhook_events (
    id          text not null,                -- Stripe's event id (evt_…)
    type        text not null,                -- e.g. payment_intent.succeeded
    created     timestamptz not null,         -- the event's `created`: the partition key
    -- the payment it concerned, when it named one payonce knows
    payment_id  uuid,
    -- applied: the payment moved; stale: older than what was known (a re-fetch was scheduled);
    -- ignored: a type payonce does not act on, or nothing to change; unmatched: no such payment
    effect      text not null check (effect in ('applied', 'stale', 'ignored', 'unmatched')),
    received_at timestamptz not null default now(),
    -- the refund it concerned, when it named one payonce knows (its payment is in payment_id)
    refund_id   uuid,
    -- the key whose timeline the event went on: a redelivery is noted there too
    key_id      uuid,
    -- the customer the event's object names (payonce_customer), or the nil uuid
    customer_id uuid not null default '00000000-0000-0000-0000-000000000000',
    primary key (id, customer_id, created)
) partition by range (created);

create index webhook_events_received_at on webhook_events (received_at);

select payonce_add_daily_partitions(
    'webhook_events',
    least((select min(created) at time zone 'UTC' from webhook_events_unpartitioned
           where created >= ((now() at time zone 'UTC')::date - 366)::timestamp at time zone 'UTC')::date,
          (now() at time zone 'UTC')::date - 3),
    (now() at time zone 'UTC')::date + 7);

insert into webhook_events (id, type, created, payment_id, effect, received_at, refund_id, key_id, customer_id)
select id, type, created, payment_id, effect, received_at, refund_id, key_id, customer_id
from webhook_events_unpartitioned
where created >= ((now() at time zone 'UTC')::date - 366)::timestamp at time zone 'UTC'
  and created < ((now() at time zone 'UTC')::date + 8)::timestamp at time zone 'UTC';

drop table webhook_events_unpartitioned;
