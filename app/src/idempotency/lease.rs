//! Where the lease is held, extended and given up.
//!
//! A lease is two columns of the key's row: `locked_until` (until when the holder is presumed
//! alive) and `lease_token` (a fencing token that grows every time the key changes hands). The
//! holder proves it still holds the lease by writing `where lease_token = $token`: if another
//! worker reclaimed the key meanwhile, the write matches no row and the old holder stops. That is
//! what makes it safe to presume a slow worker dead: even if it wakes up, it can no longer write.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::PgConnection;
use tokio::time::{Instant, MissedTickBehavior};
use uuid::Uuid;

use super::{Engine, Event, EventKind, Fingerprint, StoredResponse, identity, secs};

/// How far the work of a key got: the `recovery_point` column. The engine knows two points,
/// [`STARTED`](Self::STARTED) (claimed, nothing else written) and [`FINISHED`](Self::FINISHED)
/// (the response is stored); every operation names the points between them
/// ([`super::Idempotent::phases`]: `payment_created`, `refund_created`), each committed in one
/// short statement or transaction, the gateway called between them with no transaction open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPoint(Cow<'static, str>);

impl RecoveryPoint {
    /// The key is claimed; nothing else is written yet. A key claimed together with its
    /// operation's first write (the usual case) never rests here.
    pub const STARTED: Self = Self(Cow::Borrowed("started"));
    /// The response is stored; the key is final.
    pub const FINISHED: Self = Self(Cow::Borrowed("finished"));

    /// A point an operation declares.
    pub const fn named(name: &'static str) -> Self {
        Self(Cow::Borrowed(name))
    }

    /// Reads the `recovery_point` column. No constraint lists its values (the engine's own two
    /// and each registered operation's phases); `tests/api/operations.rs` checks that every
    /// value written is declared.
    pub fn parse(s: &str) -> Option<Self> {
        (!s.is_empty()).then(|| Self(Cow::Owned(s.to_owned())))
    }

    /// The `recovery_point` column's value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The right to advance one key, held by one worker.
#[derive(Debug)]
pub struct Lease {
    engine: Engine,
    /// The key's row id.
    pub key_id: Uuid,
    pub customer_id: Uuid,
    /// The route template the key was claimed for: which operation drives it.
    pub route: String,
    /// The client's `Idempotency-Key`: part of the request's identity, and audit metadata.
    pub client_key: String,
    /// The request's fingerprint: part of its identity ([`Self::identity`]).
    pub fingerprint: Fingerprint,
    /// Which time this request is made anew after its key was forgotten on purpose: the
    /// engine's, moved on past resources that exist ([`super::Begun::Taken`]).
    pub generation: u32,
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
    /// What the operation's first write made (its resource, as it was inserted), handed from
    /// [`super::Idempotent::begin`] to [`super::Idempotent::resume`] so a fresh key need not
    /// read it back.
    carried: Carried,
}

/// The value a lease carries from the first write to the rest of the work.
#[derive(Default)]
struct Carried(Option<Box<dyn std::any::Any + Send + Sync>>);

impl std::fmt::Debug for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Carried(Some(..))" } else { "Carried(None)" })
    }
}

/// Why a fenced write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The lease was taken over: another worker now owns the key, and this one must stop writing.
#[derive(Debug, thiserror::Error)]
#[error("lease on idempotency key {key_id} superseded (token {token} is stale)")]
pub struct LeaseLost {
    pub key_id: Uuid,
    pub token: i64,
}

impl Engine {
    /// [`Lease::release`] by the lease's key and fencing token: what is left of a lease after it
    /// was handed to an operation ([`Engine::drive`]).
    pub(crate) async fn release_key(
        &self,
        key_id: Uuid,
        customer_id: Uuid,
        token: i64,
        reason: &str,
        refused: Option<Value>,
    ) -> sqlx::Result<Option<Duration>> {
        let budget = self.sql_budget();
        let released = sqlx::query_scalar!(
            r#"
            with released as (
                update idempotency_keys
                   set locked_until = now(), lease_owner = null, updated_at = now()
                 where id = $1 and customer_id = $9 and lease_token = $2 and state = 'processing'
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
            key_id,
            token,
            reason,
            refused.clone(),
            budget.max_attempts,
            budget.horizon,
            budget.base,
            budget.cap,
            customer_id,
        )
        .fetch_optional(self.pool())
        .await?;
        if released.is_some() {
            EventKind::Released.count(1);
            if refused.is_some() {
                EventKind::Refused.count(1);
            }
        }
        Ok(released.map(|secs| Duration::try_from_secs_f64(secs).unwrap_or_default()))
    }
}

impl Lease {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        engine: Engine,
        key_id: Uuid,
        customer_id: Uuid,
        route: String,
        client_key: String,
        fingerprint: Fingerprint,
        token: i64,
        recovery_point: RecoveryPoint,
        request: Value,
        attempts: i32,
        age: Duration,
    ) -> Self {
        Self {
            engine,
            key_id,
            customer_id,
            route,
            client_key,
            fingerprint,
            generation: 0,
            token,
            recovery_point,
            request,
            attempts,
            age,
            carried: Carried::default(),
        }
    }

    /// Hands `value` to whoever drives the rest of this lease's work ([`Self::take`]).
    pub fn carry<T: std::any::Any + Send + Sync>(&mut self, value: T) {
        self.carried.0 = Some(Box::new(value));
    }

    /// What the first write carried, if it ran under this lease and made a `T`.
    pub fn take<T: std::any::Any>(&mut self) -> Option<T> {
        self.carried.0.take()?.downcast::<T>().ok().map(|value| *value)
    }

    /// The request's identity at this generation: the id its operation gives the resource it
    /// makes, from which the downstream key and every parameter the gateway compares follow, so
    /// that a database that forgot the key still makes the gateway replay ([`identity`]).
    pub fn identity(&self) -> Uuid {
        identity::identity(self.customer_id, &self.client_key, &self.fingerprint, self.generation)
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
             where id = $1 and customer_id = $4 and lease_token = $2 and state = 'processing'
            "#,
            self.key_id,
            self.token,
            secs(self.engine.settings().lease),
            self.customer_id,
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
        self.engine.release_key(self.key_id, self.customer_id, self.token, reason, refused).await
    }

    /// Moves the key from recovery point `from` to `to`, fenced, inside the operation's own
    /// transaction `conn` (the phase's business write goes in the same one). With `detail`,
    /// records the phase's event (its kind is the point's name); without, the operation writes
    /// it with its business row. [`LeaseLost`] if the key is no longer
    /// this lease's, or no longer at `from`: the caller must then roll back.
    pub async fn advance_in(
        &mut self,
        conn: &mut PgConnection,
        from: &RecoveryPoint,
        to: &RecoveryPoint,
        detail: Option<Value>,
    ) -> Result<(), FenceError> {
        let advanced = sqlx::query_scalar!(
            r#"
            with advanced as (
                update idempotency_keys
                   set recovery_point = $4, updated_at = now()
                 where id = $1 and customer_id = $6 and lease_token = $2 and state = 'processing'
                   and recovery_point = $3
                returning id, customer_id, lease_token
            ), event as (
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, $4, lease_token, $5 from advanced where $5::jsonb is not null
            )
            select count(*) as "advanced!" from advanced
            "#,
            self.key_id,
            self.token,
            from.as_str(),
            to.as_str(),
            detail,
            self.customer_id,
        )
        .fetch_one(&mut *conn)
        .await?;
        if advanced != 1 {
            return Err(self.lost().into());
        }
        self.recovery_point = to.clone();
        Ok(())
    }

    /// Makes the key final with `response`, fenced, inside the operation's own transaction
    /// `conn`: the operation's last business write and the stored response commit together, so a
    /// replay can never disagree with the resource. `failed` stores it as a key given up
    /// (`state = 'failed'`) rather than answered. Records a `completed` (or `failed`) event with
    /// `detail`. The write is the database's `idempotency_finish`, which an operation may also
    /// call from its own last statement to save a round trip (the payment's finish does); either
    /// way counted with [`Self::finished`].
    pub async fn finish_in(
        &self,
        conn: &mut PgConnection,
        response: &StoredResponse,
        failed: bool,
        detail: Value,
    ) -> Result<(), FenceError> {
        let finished = sqlx::query_scalar!(
            r#"
            select count(*) as "finished!"
            from idempotency_finish($1, $2, $3, $4, $5, $6, $7, $8)
            "#,
            self.key_id,
            self.customer_id,
            self.token,
            failed,
            response.status.as_u16() as i16,
            response.headers_json(),
            response.body.as_ref(),
            detail,
        )
        .fetch_one(&mut *conn)
        .await?;
        self.finished(finished == 1, failed)
    }

    /// After `idempotency_finish` ran (here or in an operation's own statement): whether it
    /// finished the key (`false`: the lease was lost, and that is recorded and returned), counted.
    pub fn finished(&self, finished: bool, failed: bool) -> Result<(), FenceError> {
        if !finished {
            return Err(self.lost().into());
        }
        if failed { EventKind::Failed } else { EventKind::Completed }.count(1);
        Ok(())
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
