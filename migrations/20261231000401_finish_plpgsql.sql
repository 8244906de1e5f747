-- The key's final write (20261230000005), made cheaper for every operation, the same rows written
-- (docs/performance.md, "A finish that read every payment", has the figures):
--
-- * Found by its whole primary key, (id, customer_id). By its id alone the planner cannot know
--   the key is one row, and until the table has statistics (a new database, or any table
--   autovacuum has not analysed yet) it guessed a few dozen and intersected the primary key with
--   idempotency_keys_processing, whose entries of every key finished since the last vacuum it then
--   walked: some 700 buffers per call instead of a dozen. A unique index matched in full is one
--   row whatever the statistics say.
-- * Planned once per connection. A `language sql` function that cannot be inlined into its caller
--   (this one writes) is parsed, analysed and planned again at every call, where PL/pgSQL keeps
--   the plan of its statement for the connection's life: 0.57 ms of PostgreSQL's time per call as
--   SQL, 0.34 ms as PL/pgSQL, 0.27 ms for the same statement written out in the caller (pgbench,
--   one client, a database of 10 000 keys).
-- * Planned for one row. It returns at most one (the key it finished), but a function that returns
--   rows is planned for a thousand unless it says otherwise. The payment's finish joins that row
--   to its payment (payments/process.rs): planned for a thousand keys, the join read the whole
--   payments table until it held some 60 000 rows, so a new payment cost the database more the
--   more payments there were.
--
-- The old signature goes: a server still running the previous release fails its finish (the
-- client gets an error, retries, and the key is resumed and finished by a current server).
drop function if exists idempotency_finish(uuid, bigint, boolean, int2, jsonb, bytea, jsonb);

create function idempotency_finish(
    p_key uuid, p_customer uuid, p_token bigint, p_failed boolean, p_status int2, p_headers jsonb, p_body bytea, p_detail jsonb
) returns table (key_id uuid, customer_id uuid)
    language plpgsql volatile rows 1
as $$
begin
    -- Every column it reads is qualified: key_id and customer_id are also its output variables.
    return query
    with finished as (
        update idempotency_keys k
           set state = case when p_failed then 'failed' else 'completed' end,
               recovery_point = case when p_failed then k.recovery_point else 'finished' end,
               response_status = p_status, response_headers = p_headers, response_body = p_body,
               locked_until = null, completed_at = now(), updated_at = now()
         where k.id = p_key and k.customer_id = p_customer and k.lease_token = p_token and k.state = 'processing'
        returning k.id, k.customer_id, k.lease_token, k.recovery_point
    ), event as (
        insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
        select f.id, f.customer_id, case when p_failed then 'failed' else 'completed' end, f.lease_token,
               p_detail || jsonb_build_object('status', p_status, 'recovery_point', f.recovery_point)
        from finished f
    )
    select f.id, f.customer_id from finished f;
end
$$;
