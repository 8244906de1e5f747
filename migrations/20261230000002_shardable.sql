-- Shardable by customer (docs/ha.md, "Past one primary"): every table that grows with the
-- customers' traffic has customer_id in each of its primary and unique keys, so that it could be
-- distributed by customer_id (Citus: colocated shards, every key's statements on one shard) with
-- its uniqueness still enforced by the database. The tables that do not are small ones that would
-- be reference tables (customers, admins, admin_login_failures, lab_runs) and the sessions.
-- tests/api/schema.rs fails on a key that breaks this.
--
-- The ids stay unique on their own (uuid: v7, or the request's identity, which hashes the
-- customer), so adding customer_id changes no answer; it goes second, so that a look-up by id
-- alone still uses the key's index.

-- payments.idempotency_key_id (the key while it exists, set null by a foreign key when it is
-- reaped) goes: key_id links a payment to its key for good, and "while it exists" is a look-up.
alter table payments drop column idempotency_key_id;

alter table refunds drop constraint refunds_payment_id_fkey;
alter table payments drop constraint payments_pkey, add primary key (id, customer_id);
drop index payments_key_id;
create unique index payments_key_id on payments (key_id, customer_id);

alter table refunds drop constraint refunds_pkey, add primary key (id, customer_id);
alter table refunds drop constraint refunds_key_id_key, add constraint refunds_key_id_key unique (key_id, customer_id);
-- A refund is its payment's customer's (the first write checks it): the key says so.
alter table refunds add constraint refunds_payment_id_fkey
    foreign key (payment_id, customer_id) references payments (id, customer_id) on delete cascade;

alter table idempotency_keys drop constraint idempotency_keys_pkey, add primary key (id, customer_id);
alter table idempotency_events drop constraint idempotency_events_pkey, add primary key (id, customer_id);
alter table lab_keys drop constraint lab_keys_pkey, add primary key (id, customer_id);

-- The webhook inbox records each event under the customer its object's metadata names
-- (payonce_customer), or the nil uuid for an event that names none: one event, one customer,
-- so the event and its effect stay on one shard. (Before, customer_id was filled in after the
-- effect, from the key it concerned: the same customer.)
update webhook_events set customer_id = '00000000-0000-0000-0000-000000000000' where customer_id is null;
alter table webhook_events
    alter column customer_id set default '00000000-0000-0000-0000-000000000000',
    alter column customer_id set not null;
alter table webhook_events drop constraint webhook_events_pkey, add primary key (id, customer_id);
