-- The engine's final write of a key, once: every operation's last statement calls it (so an
-- operation can fuse its own last business write with it in one statement, and none re-writes
-- it), and so does Lease::finish_in. The key becomes final with its response, fenced by the lease
-- token (a worker that lost its lease finishes nothing: no row comes back), and a `completed`
-- (or, for a key given up, `failed`) event records it with the operation's `detail`.
create function idempotency_finish(
    p_key uuid, p_token bigint, p_failed boolean, p_status int2, p_headers jsonb, p_body bytea, p_detail jsonb
) returns table (key_id uuid, customer_id uuid)
    language sql volatile
as $$
    with finished as (
        update idempotency_keys k
           set state = case when p_failed then 'failed' else 'completed' end,
               recovery_point = case when p_failed then k.recovery_point else 'finished' end,
               response_status = p_status, response_headers = p_headers, response_body = p_body,
               locked_until = null, completed_at = now(), updated_at = now()
         where k.id = p_key and k.lease_token = p_token and k.state = 'processing'
        returning k.id, k.customer_id, k.lease_token, k.recovery_point
    ), event as (
        insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
        select f.id, f.customer_id, case when p_failed then 'failed' else 'completed' end, f.lease_token,
               p_detail || jsonb_build_object('status', p_status, 'recovery_point', f.recovery_point)
        from finished f
    )
    select f.id, f.customer_id from finished f
$$;
