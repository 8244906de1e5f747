-- Refund events in the webhook inbox (refund.created, refund.updated, refund.failed,
-- charge.refund.updated, charge.refunded), beside the payments' ones.

alter table webhook_events
    -- the refund it concerned, when it named one payonce knows (its payment is in payment_id)
    add column refund_id   uuid,
    -- the key whose timeline the event went on, and its customer: a redelivery is noted there
    -- too, whatever the resource (no foreign key, like idempotency_events: keys are reaped)
    add column key_id      uuid,
    add column customer_id uuid;

-- The events recorded before: their payment's key.
update webhook_events w
   set key_id = p.key_id, customer_id = p.customer_id
  from payments p
 where p.id = w.payment_id and p.key_id is not null;
