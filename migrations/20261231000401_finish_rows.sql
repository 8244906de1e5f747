-- idempotency_finish returns at most one row (the key it finished, by primary key and fencing
-- token), but a function that returns rows is planned for a thousand of them unless it says
-- otherwise. The payment's finish joins that row to its payment (payments/process.rs), and
-- planned for a thousand keys the join read the whole payments table until it held some 60 000
-- rows: every new payment's last statement, so a new payment cost the database more the more
-- payments there were (about 4 ms of CPU per payment, where it is 1 ms by the index; see
-- docs/performance.md, "A finish that read every payment"). Said here, it is one row, and the
-- payment is found by its key at any size (scale::the_payments_finish_finds_its_payment_by_key_at_any_size).
alter function idempotency_finish(uuid, bigint, boolean, int2, jsonb, bytea, jsonb) rows 1;
