-- The dashboard at ten million keys (docs/performance.md, "Scale"): every page reads a bounded
-- number of rows through an index. What each index serves:
--
-- * The Failed filter and count. Failed keys are few, and a walk down the primary key looking for
--   them reads every key when there are none. Completed keys are most keys: the primary key,
--   read newest first, finds a page of them in a page's worth of rows, so they need no index.
--   In flight and stuck keys are served by idempotency_keys_processing.
create index if not exists idempotency_keys_failed on idempotency_keys (id) where state = 'failed';

-- * The search by the beginning of a client key (`?q=order-12`), across customers. The database's
--   collation is not "C", so a plain btree cannot serve `like 'order-12%'`: text_pattern_ops can.
--   The one index here that every new key writes to.
create index if not exists idempotency_keys_key_prefix on idempotency_keys (key text_pattern_ops);

-- * The tombstones (`expired` events) in key order, for the keys table's Expired rows and a reaped
--   key's page, and their client keys for the search. Written once per expired key.
create index if not exists idempotency_events_tombstones on idempotency_events (key_id) where kind = 'expired';
create index if not exists idempotency_events_tombstone_key on idempotency_events ((detail->>'key') text_pattern_ops)
    where kind = 'expired';
-- ANALYZE keeps no statistics of a partial index's expression: without these the planner guesses
-- that a key prefix matches 0.5 % of the tombstones, and walks all of them in key order to find a
-- page of matches (80 ms at a million keys) instead of asking the index above (0.1 ms).
create statistics if not exists idempotency_events_tombstone_key_stats on (detail->>'key') from idempotency_events;

-- A payment id (`pay_…`) is found by the primary key and a PaymentIntent id (`pi_…`) by
-- payments_payment_intent; the gateway audit lists succeeded payments by payments_key_id.
--
-- On a database that already holds millions of rows, build these by hand first with
-- `create index concurrently` under the same names (`if not exists` then skips them): a plain
-- `create index` blocks writes to the table while it builds.

-- * The Operation filter, in the keys table's order (id: uuid v7, time order), so that a page of
--   refund keys is read from the cursor on rather than found among every key. It replaces the
--   index by (route, created_at) that served the same filter when the table was ordered by time.
drop index if exists idempotency_keys_route;
create index if not exists idempotency_keys_route_id on idempotency_keys (route, id);

-- * The Operation filter on tombstones. A tombstone names its key's route since the route was
--   added to it; an older one was told apart at every read by looking for a refund under its key,
--   which no index serves (the refund filter walked every tombstone: 400 ms at a million keys).
--   The older ones are written once here, the same way (refunds keep their key's id), so that
--   every tombstone can be found by its route.
update idempotency_events e
   set detail = e.detail || jsonb_build_object('route',
           case when exists (select from refunds r where r.key_id = e.key_id) then '/v1/refunds' else '/v1/payments' end)
 where e.kind = 'expired' and not (e.detail ? 'route');
create index if not exists idempotency_events_tombstone_route on idempotency_events ((detail->>'route'), key_id)
    where kind = 'expired';
