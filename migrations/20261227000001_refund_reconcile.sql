-- Pending refunds are reconciled, like pending payments (docs/lifecycle.md, "Pending refunds"):
-- a refund the gateway answered `pending` moves on by its webhook or, when none comes, by the
-- sweeper asking the gateway (`GET /v1/refunds/{id}`) when its look-up is due.

alter table refunds
    -- When the sweeper next asks the gateway about a pending refund that has its gateway id;
    -- null when there is nothing to ask (final, or no gateway id yet: the key's own work, or its
    -- reconciliation, is still to tell). Pushed forward with payonce_backoff.
    add column reconcile_at       timestamptz,
    add column reconcile_attempts integer not null default 0;

create index refunds_reconcile on refunds (reconcile_at) where reconcile_at is not null;
