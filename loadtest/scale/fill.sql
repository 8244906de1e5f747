-- Grows a migrated payonce database by `payonce.fill_keys` keys' worth of history, in SQL
-- (generate_series): what loadtest/scale.sh measures against and what the EXPLAIN test
-- (app/tests/api/scale.rs) plans against. Run it with the setting in the session:
--
--   PGOPTIONS='-c payonce.fill_keys=1000000' psql "$DATABASE_URL" -f loadtest/scale/fill.sql
--
-- Rows it adds, per key i (uuid v7 ids in time order, spread over the last 7 days):
--   72 % completed payments (201, payment succeeded)     5 % completed declines (402, failed)
--    2 % failed keys (502, the gateway said no charge)   21 % of those older than a day
--                                                         expired (completed if younger): no key row left, their
--        tombstone (`expired` event) and payment kept    every 20th completed payment refunded,
--        under a refund key of its own                   3 events per key (claimed,
--        payment_created, completed) + the tombstone     one webhook inbox row per 2 payments
-- and a few keys held now: 10 in flight (live lease) and 20 stuck (lease lapsed).
-- Repeatable: each run adds a new batch (its keys are named after the run).
\set ON_ERROR_STOP on
begin;
set local synchronous_commit = off;
-- The history tables hold one partition per UTC day (migrations/20261231000101_retention.sql), made
-- 3 days back and 7 ahead: the days this history is spread over (8 back, for the tombstones a day
-- after their key) are made here, inside the retention, so the sweeper keeps them.
select payonce_add_daily_partitions(t, (now() at time zone 'UTC')::date - 8, (now() at time zone 'UTC')::date)
from unnest(array['idempotency_events', 'webhook_events']) as t;

create temporary table fill_customers on commit drop as
select gen_random_uuid() as id, n from generate_series(0, 3) as n;
insert into customers (id, name, api_key_lookup, api_key_sha256)
select id, 'scale-' || left(id::text, 8), 'scale_' || id::text, sha256(id::text::bytea) from fill_customers;

create temporary table fill_plan on commit drop as
with this_run as materialized (
    -- one id for the whole run: its keys share a prefix, as one client's keys do
    select gen_random_uuid() as run
), series as (
    select i, current_setting('payonce.fill_keys')::int as total, now() as t0, run
    from generate_series(1, current_setting('payonce.fill_keys')::int) as i, this_run
), shaped as (
    select i, total, run,
           t0 - interval '7 days' * (1 - i::float8 / total) as created_at,
           case when i % 100 < 72 then 'completed'
                when i % 100 < 77 then 'declined'
                when i % 100 < 79 then 'failed'
                -- a key lives 24 h: only an older one can have expired (its tombstone is dated
                -- at its expiry, never in the future)
                when i::float8 / total < 6.0 / 7 then 'expired'
                else 'completed' end as fate,
           md5(run::text || i) as h
    from series
)
select i, created_at, fate,
       (lpad(to_hex((extract(epoch from created_at) * 1000)::int8), 12, '0') || '7' || substr(h, 1, 3)
        || '8' || substr(h, 4, 15))::uuid as key_id,
       (substr(h, 1, 12) || '8' || substr(h, 14, 3) || '9' || substr(h, 18, 15))::uuid as payment_id,
       (select id from fill_customers where n = i % 4) as customer_id,
       'scale-' || left(run::text, 8) || '-' || lpad(i::text, 9, '0') as key,
       (lpad(to_hex((extract(epoch from created_at) * 1000)::int8 + 1000), 12, '0') || '7' || substr(h, 17, 3)
        || '8' || substr(h, 20, 13) || substr(h, 1, 2))::uuid as refund_key_id,
       (substr(h, 5, 12) || '8' || substr(h, 17, 3) || '9' || substr(h, 20, 13) || substr(h, 1, 2))::uuid as refund_id,
       'pi_' || substr(h, 1, 24) as payment_intent,
       i % 20 = 0 and i % 100 < 72 as refunded
from shaped;

insert into idempotency_keys (id, customer_id, key, method, route, fingerprint, request, state, recovery_point,
                              lease_token, locked_until, attempts, response_status, response_headers,
                              response_body, created_at, updated_at, completed_at, expires_at)
select key_id, customer_id, key, 'POST', '/v1/payments', sha256(key::bytea),
       jsonb_build_object('amount', 1000 + i % 5000, 'currency', 'usd', 'payment_method', 'pm_card_visa'),
       case fate when 'failed' then 'failed' else 'completed' end, 'finished', 1, null, 1,
       case fate when 'completed' then 201 when 'declined' then 402 else 502 end,
       '{"content-type": "application/json"}',
       convert_to(jsonb_build_object('id', 'pay_' || replace(payment_id::text, '-', ''), 'amount', 1000 + i % 5000,
                                     'currency', 'usd', 'status', case fate when 'completed' then 'succeeded' else 'failed' end,
                                     'payment_intent', payment_intent)::text, 'utf8'),
       created_at, created_at, created_at + interval '300 milliseconds', created_at + interval '7 days'
from fill_plan where fate <> 'expired';

insert into payments (id, customer_id, key_id, amount, currency, payment_method, status, gateway_payment_intent_id,
                      created_at, updated_at, amount_captured)
select payment_id, customer_id, key_id, 1000 + i % 5000, 'usd', 'pm_card_visa',
       case when fate in ('completed', 'expired') then 'succeeded' else 'failed' end,
       case when fate <> 'failed' then payment_intent end, created_at, created_at,
       case when fate in ('completed', 'expired') then 1000 + i % 5000 else 0 end
from fill_plan;

insert into idempotency_events (key_id, customer_id, kind, lease_token, detail, created_at)
select key_id, customer_id, kind, 1, detail, created_at + step * interval '100 milliseconds'
from fill_plan,
     lateral (values (0, 'claimed', '{}'::jsonb),
                     (1, 'payment_created', '{}'::jsonb),
                     (2, 'completed', jsonb_build_object('response_status', case fate when 'declined' then 402 else 201 end)))
         as e(step, kind, detail)
where fate <> 'failed'
union all
select key_id, customer_id, 'released', 1, '{"reason": "gateway declined, no charge"}', created_at
from fill_plan where fate = 'failed'
union all
-- The tombstones: what the reaper writes when it deletes a key at its expiry.
select key_id, customer_id, 'expired', 1,
       jsonb_build_object('key', key, 'state', 'completed', 'response_status', 201, 'attempts', 1,
                          'route', '/v1/payments', 'age_secs', 86400, 'recovery_point', 'finished'),
       created_at + interval '1 day'
from fill_plan where fate = 'expired';

-- Refunds, each under a key of its own (ids just after its payment's key).
insert into idempotency_keys (id, customer_id, key, method, route, fingerprint, request, state, recovery_point,
                              lease_token, attempts, response_status, response_headers, response_body,
                              created_at, updated_at, completed_at, expires_at)
select refund_key_id, customer_id, key || '-refund', 'POST', '/v1/refunds',
       sha256((key || '-refund')::bytea), jsonb_build_object('payment', 'pay_' || replace(payment_id::text, '-', '')),
       'completed', 'finished', 1, 1, 200, '{"content-type": "application/json"}', convert_to('{}', 'utf8'),
       created_at + interval '1 second', created_at + interval '1 second', created_at + interval '1 second',
       created_at + interval '7 days'
from fill_plan where refunded;
insert into refunds (id, customer_id, payment_id, key_id, amount, currency, status, gateway_refund_id, created_at,
                     updated_at)
select refund_id, customer_id, payment_id, refund_key_id, 500, 'usd', 'succeeded',
       're_' || substr(md5(payment_id::text), 1, 24), created_at + interval '1 second', created_at + interval '1 second'
from fill_plan where refunded;
update payments p set amount_refunded = 500 from fill_plan f where f.refunded and p.id = f.payment_id;

insert into webhook_events (id, type, created, payment_id, effect, received_at, key_id, customer_id)
select 'evt_' || substr(md5(payment_id::text || 'evt'), 1, 24), 'payment_intent.succeeded', created_at, payment_id,
       'stale', created_at + interval '2 seconds', key_id, customer_id
from fill_plan where i % 2 = 0;

-- Keys held now: in flight (a live lease) and stuck (lapsed, not yet resumed).
insert into idempotency_keys (id, customer_id, key, method, route, fingerprint, request, state, recovery_point,
                              lease_token, lease_owner, locked_until, attempts, created_at, updated_at, expires_at)
select (lpad(to_hex((extract(epoch from now()) * 1000)::int8 - 60000 + n), 12, '0') || '7' || substr(h, 1, 3) || '8'
        || substr(h, 4, 15))::uuid,
       (select id from fill_customers where fill_customers.n = s.n % 4), 'scale-held-' || h, 'POST', '/v1/payments',
       sha256(h::bytea), '{"amount": 1000, "currency": "usd"}', 'processing', 'payment_created', 1, 'scale:fill',
       now() + case when n <= 10 then interval '1 hour' else - interval '1 minute' end, 1,
       now() - interval '2 minutes', now() - interval '2 minutes', now() + interval '7 days'
from (select n, md5(gen_random_uuid()::text) as h from generate_series(1, 30) as n) s;
commit;

analyze customers, idempotency_keys, idempotency_events, payments, refunds, webhook_events;
