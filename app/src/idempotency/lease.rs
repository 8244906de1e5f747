//! Where the lease is held, extended and given up.
//!
//! A lease is two columns of the key's row: `locked_until` (until when the holder is presumed
//! alive) and `lease_token` (a fencing token that grows every time the key changes hands). The
//! holder proves it still holds the lease by writing `where lease_token = $token`: if another
//! worker reclaimed the key meanwhile, the write matches no row and the old holder stops. That is
//! what makes it safe to presume a slow worker dead: even if it wakes up, it can no longer write.

use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::{Instant, MissedTickBehavior};
use uuid::Uuid;

use super::{Engine, Event, EventKind, secs};

/// How far the work of a key got. Each step is committed in one short transaction; the gateway is
/// called between `PaymentCreated` and `Finished` with no transaction open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryPoint {
    /// The key is claimed; nothing else is written yet.
    Started,
    /// The local payment row exists; the gateway may or may not have been called.
    PaymentCreated,
    /// The payment's outcome and the response are stored; the key is final.
    Finished,
}

impl RecoveryPoint {
    /// Reads the `recovery_point` column.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "started" => Some(Self::Started),
            "payment_created" => Some(Self::PaymentCreated),
            "finished" => Some(Self::Finished),
            _ => None,
        }
    }

    /// The `recovery_point` column's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::PaymentCreated => "payment_created",
            Self::Finished => "finished",
        }
    }
}

/// The right to advance one key, held by one worker.
#[derive(Debug)]
pub struct Lease {
    engine: Engine,
    /// The key's row id; also the seed of the downstream idempotency key.
    pub key_id: Uuid,
    pub customer_id: Uuid,
    /// The client's `Idempotency-Key`, for audit metadata.
    pub client_key: String,
    /// The fencing token every write of this holder must present.
    pub token: i64,
    /// Where the work resumes.
    pub recovery_point: RecoveryPoint,
    /// The canonical request stored at claim time.
    pub request: Value,
    /// How many workers have held this key, this one included.
    pub attempts: i32,
    /// How old the key was when this lease was taken, by the database's clock.
    pub age: Duration,
}

/// The lease was taken over: another worker now owns the key, and this one must stop writing.
#[derive(Debug, thiserror::Error)]
#[error("lease on idempotency key {key_id} superseded (token {token} is stale)")]
pub struct LeaseLost {
    pub key_id: Uuid,
    pub token: i64,
}

impl Lease {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        engine: Engine,
        key_id: Uuid,
        customer_id: Uuid,
        client_key: String,
        token: i64,
        recovery_point: RecoveryPoint,
        request: Value,
        attempts: i32,
        age: Duration,
    ) -> Self {
        Self { engine, key_id, customer_id, client_key, token, recovery_point, request, attempts, age }
    }

    /// The engine this lease belongs to.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Whether the downstream key may still be sent to the gateway: the key is younger than the
    /// horizon. After it, the work may only look its result up.
    pub fn within_horizon(&self) -> bool {
        self.age < self.engine.settings().horizon.downstream_key_ttl
    }

    /// Whether the key's budget is spent: more holders than `max_attempts`, or past the horizon.
    /// Only the sweeper holds such a key, to reconcile it with the gateway.
    pub fn exhausted(&self) -> bool {
        self.attempts > self.engine.settings().budget.max_attempts || !self.within_horizon()
    }

    /// Whether a search that finds nothing can be believed: the last create call could have been
    /// sent no later than the horizon, and the gateway's search index has had the settle delay
    /// since then to catch up.
    pub fn search_settled(&self) -> bool {
        let horizon = self.engine.settings().horizon;
        self.age >= horizon.downstream_key_ttl + horizon.search_settle
    }

    /// Runs `work` (the gateway call) while a heartbeat extends the lease every third of its
    /// length, so a slow but alive worker keeps its key however long the call takes.
    ///
    /// If a heartbeat finds the token superseded, `work` is abandoned and [`LeaseLost`] returned:
    /// the new holder will redo the call with the same downstream idempotency key, so abandoning
    /// it cannot lose or duplicate a charge. A heartbeat that fails for another reason (the
    /// database is briefly unreachable) is logged and the work goes on: at worst the lease runs
    /// out and the fence stops this worker's later write.
    pub async fn hold<F: Future>(&self, work: F) -> Result<F::Output, LeaseLost> {
        let every = self.engine.settings().lease / 3;
        let mut work = std::pin::pin!(work);
        let mut heartbeat = tokio::time::interval_at(Instant::now() + every, every);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                output = &mut work => return Ok(output),
                _ = heartbeat.tick() => match tokio::time::timeout(every, self.extend()).await {
                    Ok(Ok(true)) => tracing::debug!(key_id = %self.key_id, "lease extended"),
                    Ok(Ok(false)) => return Err(self.lost()),
                    Ok(Err(err)) => tracing::warn!(key_id = %self.key_id, error = %err, "heartbeat failed"),
                    Err(_) => tracing::warn!(key_id = %self.key_id, "heartbeat timed out"),
                },
            }
        }
    }

    /// One heartbeat. `false` if the token is no longer ours.
    async fn extend(&self) -> sqlx::Result<bool> {
        let extended = sqlx::query!(
            r#"
            update idempotency_keys
               set locked_until = now() + $3 * interval '1 second', updated_at = now()
             where id = $1 and lease_token = $2 and state = 'processing'
            "#,
            self.key_id,
            self.token,
            secs(self.engine.settings().lease),
        )
        .execute(self.engine.pool())
        .await?;
        Ok(extended.rows_affected() == 1)
    }

    /// Gives the lease up without finishing, so that the next retry (or the sweeper) can resume
    /// as soon as the key's backoff allows instead of waiting for the lease to run out. With
    /// `refused`, a `refused` event records the gateway's refusal (payonce's own configuration)
    /// in the same statement. Returns how long until the key may be tried again, or `None` if it
    /// was no longer ours.
    pub async fn release(&self, reason: &str, refused: Option<Value>) -> sqlx::Result<Option<Duration>> {
        let budget = self.engine.sql_budget();
        let released = sqlx::query_scalar!(
            r#"
            with released as (
                update idempotency_keys
                   set locked_until = now(), lease_owner = null, updated_at = now()
                 where id = $1 and lease_token = $2 and state = 'processing'
                returning id, customer_id, lease_token, recovery_point, attempts, created_at, locked_until
            ), event as (
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, 'released', lease_token,
                       jsonb_build_object('reason', $3::text, 'recovery_point', recovery_point)
                from released
                union all
                select id, customer_id, 'refused', lease_token, $4::jsonb
                from released where $4::jsonb is not null
            )
            select extract(epoch from idempotency_retry_at(locked_until, attempts, created_at, $5, $6, $7, $8) - now())::float8
                   as "retry_in!"
            from released
            "#,
            self.key_id,
            self.token,
            reason,
            refused.clone(),
            budget.max_attempts,
            budget.horizon,
            budget.base,
            budget.cap,
        )
        .fetch_optional(self.engine.pool())
        .await?;
        if released.is_some() {
            EventKind::Released.count(1);
            if refused.is_some() {
                EventKind::Refused.count(1);
            }
        }
        Ok(released.map(|secs| Duration::try_from_secs_f64(secs).unwrap_or_default()))
    }

    /// Records that this worker found its lease superseded, and returns the error to stop with.
    pub fn lost(&self) -> LeaseLost {
        tracing::warn!(key_id = %self.key_id, token = self.token, "lease superseded; stopping");
        self.engine.events().record(Event {
            key_id: self.key_id,
            customer_id: self.customer_id,
            kind: EventKind::LeaseLost,
            lease_token: Some(self.token),
            detail: json!({"recovery_point": self.recovery_point.as_str()}),
        });
        LeaseLost { key_id: self.key_id, token: self.token }
    }
}
