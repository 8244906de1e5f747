//! What an operator may do to a key from the dashboard ([`crate::admin`]), and why it is safe.
//!
//! Both actions are *fenced* like every other write of the engine: the operator acts on the key
//! as they saw it, identified by its `lease_token`, and the statement matches only
//! `where id = $1 and lease_token = $2 and <the state the action needs>`. If anything happened to
//! the key in between (a client retry or the sweeper reclaimed it, it completed, another operator
//! acted), the token or the state no longer matches and the action does nothing; [`Refusal`]
//! then says what the key looks like now. Each action that does happen writes its audit event in
//! the same statement, naming the operator.

use uuid::Uuid;

use super::{Engine, EventKind};

/// Why an operator's action did nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The key no longer exists (it expired, or another operator expired it).
    Gone,
    /// The key changed hands since the operator looked: its token is now `now`.
    Superseded { now: i64 },
    /// The key is not in a state this action applies to; `state` describes it
    /// (`in flight`, `stuck`, `completed`, `failed`).
    WrongState { state: &'static str },
}

/// What an operator's action did.
pub type ActionResult = Result<(), Refusal>;

impl Engine {
    /// Releases a *stuck* key (still `processing`, lease expired, not yet recovered) on an
    /// operator's behalf: its last holder is fenced off for good, and the next client retry (or
    /// sweeper pass, after the key's usual backoff) resumes it.
    ///
    /// The key stays `processing` at its recovery point; its token grows by one, which fences
    /// off the last holder even if it wakes up; the owner is cleared. `locked_until` is left as
    /// it is: it has already passed (that is what "stuck" means), and moving it would restart
    /// the sweeper's backoff, which counts from it. A `released` event records `detail.by = "operator:<name>"`. Nothing is
    /// charged or undone: whoever resumes the key calls the gateway with the same downstream
    /// idempotency key, so a charge the old holder made is found, not repeated.
    pub async fn operator_release(&self, key_id: Uuid, seen_token: i64, operator: &str) -> sqlx::Result<ActionResult> {
        let by = format!("operator:{operator}");
        let released = sqlx::query_scalar!(
            r#"
            with released as (
                update idempotency_keys
                   set lease_token = lease_token + 1, lease_owner = null, updated_at = now()
                 where id = $1 and lease_token = $2 and state = 'processing' and locked_until <= now()
                returning id, customer_id, lease_token, recovery_point
            ), event as (
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, 'released', lease_token,
                       jsonb_build_object('by', $3::text, 'recovery_point', recovery_point, 'fenced_token', $2::int8)
                from released
            )
            select count(*) as "released!" from released
            "#,
            key_id,
            seen_token,
            by,
        )
        .fetch_one(self.pool())
        .await?;
        self.settle(released, EventKind::Released, key_id, seen_token, &by).await
    }

    /// Expires a *final* key (completed or failed) now, on an operator's behalf, as the reaper
    /// would at its expiry: the key is deleted, so the next request with the same client key is
    /// a new request. The payment stays (its link to the key becomes null). An `expired` event
    /// records `detail.by = "operator:<name>"`. A `processing` key is refused: deleting it would
    /// forget work in progress.
    pub async fn operator_expire(&self, key_id: Uuid, seen_token: i64, operator: &str) -> sqlx::Result<ActionResult> {
        let by = format!("operator:{operator}");
        let expired = sqlx::query_scalar!(
            r#"
            with expired as (
                delete from idempotency_keys
                 where id = $1 and lease_token = $2 and state <> 'processing'
                returning id, customer_id, key, lease_token, state, attempts, response_status, created_at, route
            ), event as (
                -- The key's tombstone: enough to find it and tell what became of it.
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, 'expired', lease_token,
                       jsonb_build_object('by', $3::text, 'state', state,
                                          'age_secs', extract(epoch from now() - created_at)::int8,
                                          'key', key, 'attempts', attempts, 'response_status', response_status,
                                          'route', route)
                from expired
            )
            select count(*) as "expired!" from expired
            "#,
            key_id,
            seen_token,
            by,
        )
        .fetch_one(self.pool())
        .await?;
        // This process may have the answer in memory; other servers forget it within seconds.
        self.replays().forget(key_id);
        self.settle(expired, EventKind::Expired, key_id, seen_token, &by).await
    }

    /// The workshop's reset (`PAYONCE_WORKSHOP` only, from the gateway panel): deletes every key,
    /// payment, event and webhook record, and whatever else refers to payments, so a class starts
    /// again from an empty dashboard. Customers and operators stay. Not fenced, not for
    /// production: work in flight on any server loses its rows (its later writes match nothing).
    pub async fn workshop_reset(&self, operator: &str) -> sqlx::Result<()> {
        sqlx::query!("truncate idempotency_events, webhook_events, payments, idempotency_keys cascade")
            .execute(self.pool())
            .await?;
        self.replays().clear();
        tracing::warn!(by = %format!("operator:{operator}"), "workshop reset: every key and payment deleted");
        Ok(())
    }

    /// Counts and logs an action that matched its row; explains one that matched none.
    async fn settle(
        &self,
        matched: i64,
        kind: EventKind,
        key_id: Uuid,
        seen_token: i64,
        by: &str,
    ) -> sqlx::Result<ActionResult> {
        if matched == 1 {
            kind.count(1);
            tracing::info!(%key_id, seen_token, by, action = kind.as_str(), "operator action applied");
            return Ok(Ok(()));
        }
        self.refusal(key_id, seen_token).await
    }

    /// Why a fenced action matched no row, from a look at the key as it is now.
    async fn refusal(&self, key_id: Uuid, seen_token: i64) -> sqlx::Result<ActionResult> {
        let row = sqlx::query!(
            r#"
            select lease_token, state, coalesce(locked_until > now(), false) as "live!"
            from idempotency_keys where id = $1
            "#,
            key_id,
        )
        .fetch_optional(self.pool())
        .await?;
        Ok(Err(match row {
            None => Refusal::Gone,
            Some(row) if row.lease_token != seen_token => Refusal::Superseded { now: row.lease_token },
            Some(row) => Refusal::WrongState {
                state: match (row.state.as_str(), row.live) {
                    ("processing", true) => "in flight",
                    ("processing", false) => "stuck",
                    ("completed", _) => "completed",
                    _ => "failed",
                },
            },
        }))
    }
}
