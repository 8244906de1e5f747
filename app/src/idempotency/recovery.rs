//! Where abandoned keys are found and taken over, and where expired keys are deleted: the
//! engine's half of the sweeper ([`crate::sweeper`]).
//!
//! Both statements pick their rows with `FOR UPDATE SKIP LOCKED`, so any number of sweepers (and
//! servers) can run them against one database at once: a row is taken by exactly one of them, the
//! others skip it. The row lock lasts only for that one statement; the lease that follows is a
//! value in the row, fenced by its token like every other lease.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::lease::{Lease, RecoveryPoint};
use super::{Engine, EventKind, Fingerprint, secs};

struct Abandoned {
    id: Uuid,
    customer_id: Uuid,
    route: String,
    key: String,
    fingerprint: Vec<u8>,
    lease_token: i64,
    recovery_point: String,
    request: Value,
    attempts: i32,
    age_secs: f64,
}

impl Engine {
    /// Takes over up to `limit` keys whose lease ran out without a final answer, with a new
    /// token each, for `owner`: those whose backoff has passed, and those whose budget is spent
    /// once every `cap` (`idempotency_retry_at`). The caller must drive each to completion (or,
    /// for a spent key, reconcile it: [`Lease::exhausted`]) or give it back.
    pub async fn reclaim_abandoned(&self, owner: &str, limit: i64) -> sqlx::Result<Vec<Lease>> {
        let budget = self.sql_budget();
        let rows = sqlx::query_as!(
            Abandoned,
            r#"
            with abandoned as (
                select id, customer_id
                from idempotency_keys
                where state = 'processing'
                  and locked_until <= now()
                  and idempotency_retry_at(locked_until, attempts, created_at, $3, $4, $5, $6) <= now()
                order by locked_until
                limit $2
                for update skip locked
            ), reclaimed as (
                update idempotency_keys k
                   set lease_token = k.lease_token + 1,
                       lease_owner = $1,
                       locked_until = now() + $7 * interval '1 second',
                       attempts = k.attempts + 1,
                       updated_at = now()
                  from abandoned
                 where k.id = abandoned.id and k.customer_id = abandoned.customer_id
                returning k.id, k.customer_id, k.route, k.key, k.fingerprint, k.lease_token, k.recovery_point,
                          k.request, k.attempts, k.created_at
            ), event as (
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, 'reclaimed', lease_token,
                       jsonb_build_object('owner', $1::text, 'recovery_point', recovery_point, 'attempts', attempts)
                from reclaimed
            )
            select id, customer_id, route, key, fingerprint, lease_token, recovery_point, request, attempts,
                   extract(epoch from now() - created_at)::float8 as "age_secs!"
            from reclaimed
            "#,
            owner,
            limit,
            budget.max_attempts,
            budget.horizon,
            budget.base,
            budget.cap,
            secs(self.settings().lease),
        )
        .fetch_all(self.pool())
        .await?;
        let mut leases = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(recovery_point) = RecoveryPoint::parse(&row.recovery_point) else {
                tracing::error!(key_id = %row.id, recovery_point = row.recovery_point, "unknown recovery point; leaving the key alone");
                continue;
            };
            let Some(fingerprint) = Fingerprint::from_bytes(&row.fingerprint) else {
                tracing::error!(key_id = %row.id, "a stored fingerprint of the wrong length; leaving the key alone");
                continue;
            };
            EventKind::Reclaimed.count(1);
            leases.push(Lease::new(
                self.clone(),
                row.id,
                row.customer_id,
                row.route,
                row.key,
                fingerprint,
                row.lease_token,
                recovery_point,
                row.request,
                row.attempts,
                Duration::try_from_secs_f64(row.age_secs).unwrap_or_default(),
            ));
        }
        Ok(leases)
    }

    /// Deletes up to `limit` final keys past their expiry, oldest first, recording an `expired`
    /// event for each. Their payments stay (their link is set to null). Returns how many went.
    ///
    /// The batch commits without waiting for its WAL to reach the disk (or a synchronous
    /// standby): its flush would otherwise hold up the payments committing meanwhile. Nothing is
    /// at stake: a reap lost in a crash leaves the keys expired, to be reaped again, and anything
    /// later that depends on it (a new claim of the same key) commits durably, which flushes the
    /// reap's WAL first, since WAL is written in order.
    pub async fn reap_expired(&self, limit: i64) -> sqlx::Result<u64> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("set local synchronous_commit = off").execute(&mut *tx).await?;
        let reaped = sqlx::query_scalar!(
            r#"
            with doomed as (
                select id
                from idempotency_keys
                where state <> 'processing' and expires_at <= now()
                order by expires_at
                limit $1
                for update skip locked
            ), reaped as (
                -- By the ids' array, not a join with doomed: after a statement's fifth execution
                -- PostgreSQL may plan it once for any limit, guessing it keeps 10 % of the expired
                -- keys, and then joined them by reading the whole table (0.8 s a batch at a
                -- million keys). An array of ids is looked up by the primary key whatever its size.
                delete from idempotency_keys k
                 where k.id = any(array(select id from doomed))
                returning k.id, k.customer_id, k.key, k.lease_token, k.state, k.attempts, k.response_status,
                          k.created_at, k.route
            ), event as (
                -- The key's tombstone: enough to find it and tell what became of it.
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, 'expired', lease_token,
                       jsonb_build_object('state', state, 'age_secs', extract(epoch from now() - created_at)::int8,
                                          'key', key, 'attempts', attempts, 'response_status', response_status,
                                          'route', route)
                from reaped
            )
            select count(*) as "reaped!" from reaped
            "#,
            limit,
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        let reaped = u64::try_from(reaped).unwrap_or(0);
        EventKind::Expired.count(reaped);
        Ok(reaped)
    }
}
