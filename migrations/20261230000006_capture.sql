-- Authorize now, capture later (docs/lifecycle.md, "Captures and cancels").
--
-- A payment created with "capture": "manual" is authorized, not charged: its PaymentIntent waits
-- in `requires_capture` with `amount_capturable`. POST /v1/payments/{id}/capture moves money (all
-- of it, or part), POST /v1/payments/{id}/cancel releases the hold; the gateway cancels an
-- authorization nobody captured in time. Statuses, in the only order they may be reached:
--   pending < requires_action < processing < requires_capture < succeeded = failed = canceled
alter table payments drop constraint payments_status_check;
alter table payments add constraint payments_status_check
    check (status in ('pending', 'requires_action', 'processing', 'requires_capture', 'succeeded', 'failed', 'canceled'));
create or replace function payment_status_rank(status text) returns integer
    language sql immutable parallel safe
    return case status
        when 'pending' then 0
        when 'requires_action' then 1
        when 'processing' then 2
        when 'requires_capture' then 3
        when 'succeeded' then 4
        when 'failed' then 4
        when 'canceled' then 4
    end;

alter table payments
    add column capture_method    text not null default 'automatic' check (capture_method in ('automatic', 'manual')),
    -- what the authorization may still capture (requires_capture), 0 otherwise
    add column amount_capturable bigint not null default 0 check (amount_capturable >= 0),
    -- the money that moved: the whole amount once an automatic payment succeeded, what a capture
    -- took for a manual one; refunds never take more than this
    add column amount_captured   bigint not null default 0 check (amount_captured >= 0 and amount_captured <= amount),
    -- The one capture or cancel of an authorization, decided here: the first write of a capture
    -- or cancel key claims the payment (`settlement`, and the key in `settled_by`) with a
    -- conditional update under the payment's row lock, so however many keys capture or cancel one
    -- payment at once, at most one capture or one cancel is ever sent.
    add column settlement        text check (settlement in ('capture', 'cancel')),
    add column settled_by        uuid,
    add constraint payments_one_settlement check ((settlement is null) = (settled_by is null));
update payments set amount_captured = amount where status = 'succeeded';

-- An automatic payment that succeeded took its whole amount: said here once, for every statement
-- that moves a payment to `succeeded` (the key's finish, a webhook, a look-up, the lab's). A manual
-- one's capture says how much it took itself, in the statement that records the capture.
create function payments_automatic_capture() returns trigger
    language plpgsql as $$
begin
    if new.status = 'succeeded' and new.capture_method = 'automatic' then
        new.amount_captured := new.amount;
    end if;
    return new;
end
$$;
create trigger payments_automatic_capture before insert or update of status on payments
    for each row execute function payments_automatic_capture();
-- Refunds give back money that moved, never more.
alter table payments add constraint payments_refunds_captured check (amount_refunded <= amount_captured);
