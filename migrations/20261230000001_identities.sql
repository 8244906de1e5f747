-- Payments and refunds are named by their request's identity (app/src/idempotency/identity.rs):
-- a hash of what the client sent, so that a database that forgot a key (a restore, a failover
-- that lost commits) rebuilds the very same resource from the gateway's replay. Those ids are
-- uuid version 8: they no longer sort by time, as the uuid v7 ids before them did, so "newest
-- first" is ordered by the creation time, with the id to break ties (and as the page cursor).
create index payments_customer_created on payments (customer_id, created_at desc, id desc);
drop index payments_customer;
create index refunds_payment_created on refunds (payment_id, created_at desc, id desc);
drop index refunds_payment;
create index refunds_customer_created on refunds (customer_id, created_at desc, id desc);
drop index refunds_customer;
