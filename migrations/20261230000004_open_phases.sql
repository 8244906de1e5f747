-- An operation's recovery points and the events it writes are its own (app/src/operations.rs, the
-- registry of every operation payonce serves): a new operation must not have to edit the
-- engine's constraints to add its phases. The two lists below were copies of what the code
-- declares, kept in step by hand; the code's registry is now the one list, and a test
-- (tests/api/operations.rs) checks that every recovery point and event kind the operations write
-- is one it declares. A state machine's own values stay checked here: `state`, the lease, the
-- response.
alter table idempotency_keys drop constraint idempotency_keys_recovery_point_check;
alter table idempotency_events drop constraint idempotency_events_kind_check;
