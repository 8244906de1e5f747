//! The idempotency engine: everything that makes a request happen once, independent of what the
//! request does.
//!
//! A request with an `Idempotency-Key` goes through [`Engine::claim`]:
//!
//! 1. **Claim** ([`claim`]): one `INSERT … ON CONFLICT DO NOTHING RETURNING`. If a row came back,
//!    this request created the key and holds its *lease*. There is no check-then-insert anywhere:
//!    the unique index decides, atomically, under any concurrency.
//! 2. On conflict the existing row is loaded and checked in a fixed order: **scope** (the same
//!    method and route), then **fingerprint** (the same payload), then **state**: a final row is
//!    replayed, a live lease means "in flight" (409), an expired lease is *reclaimed* with a new
//!    fencing token and the work resumes where it stopped, once its backoff has passed and within
//!    its budget ([`budget`]); otherwise the client is told when to come back (409).
//!    For a new key the claim shares one short transaction with the operation's first write
//!    ([`Idempotent::begin`]), so claiming costs no commit of its own.
//! 3. The holder drives the work through its recovery points ([`Idempotent::resume`]: a payment,
//!    a refund; [`operation`] is the seam every operation implements).
//!    Every write it makes is fenced by the lease token ([`lease`]); the lease is extended by a
//!    heartbeat while the gateway call runs; the final response is stored in the same statement
//!    that completes the work.
//!
//! No database transaction or row lock is ever held while waiting on anything outside the
//! database: the lease is a row *value* (`locked_until`, `lease_token`), not a lock.

pub mod budget;
pub mod claim;
pub mod downstream;
pub mod events;
pub mod fingerprint;
pub mod identity;
pub mod key;
pub mod lease;
pub mod operation;
pub mod operator;
pub mod recovery;
pub mod replays;
pub mod response;
pub mod submit;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

pub use budget::{Backoff, Budget, Horizon};
pub use claim::{Busy, Claim, ClaimError, Operation};
pub use downstream::{GatewayError, Refusal, RefusalReason};
pub use events::{Event, EventKind, EventLog};
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyError};
pub use lease::{FenceError, Lease, LeaseLost, RecoveryPoint};
pub use operation::{Begun, BoxFuture, Idempotent, LookedUp, Operations, ProcessError, Registered};
pub use response::StoredResponse;
pub use submit::{Answer, SubmitError};

/// Timing policy of the engine.
#[derive(Debug, Clone, Copy)]
pub struct EngineSettings {
    /// How long a lease lasts without a heartbeat. A worker that stops heartbeating (crashed,
    /// partitioned, paused) loses its key this long after its last sign of life.
    pub lease: Duration,
    /// How long a final key is kept (and replayed) after it was created.
    pub key_ttl: Duration,
    /// How often a key may be tried, by anyone ([`budget`]).
    pub budget: Budget,
    /// How long the gateway remembers a downstream key.
    pub horizon: Horizon,
    /// The deadline of one gateway call. A live holder answers, or gives its key back, within it:
    /// a retry that finds the key in flight is told to come back after at most this long (and
    /// the `conflict` event records that same `Retry-After`).
    pub gateway_timeout: Duration,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(60),
            key_ttl: Duration::from_secs(24 * 60 * 60),
            budget: Budget::default(),
            horizon: Horizon::default(),
            gateway_timeout: Duration::from_secs(30),
        }
    }
}

/// The engine: a pool, the timing policy and the event log. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

struct Inner {
    pool: PgPool,
    settings: EngineSettings,
    events: EventLog,
    /// Final answers recently replayed by this process.
    replays: replays::ReplayCache,
}

impl Engine {
    pub fn new(pool: PgPool, settings: EngineSettings, events: EventLog) -> Self {
        Self { inner: Arc::new(Inner { pool, settings, events, replays: Default::default() }) }
    }

    /// The pool the engine writes through.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The timing policy.
    pub fn settings(&self) -> EngineSettings {
        self.inner.settings
    }

    /// The budget, as the SQL functions take it.
    pub(crate) fn sql_budget(&self) -> budget::SqlBudget {
        budget::SqlBudget::new(&self.inner.settings.budget, &self.inner.settings.horizon)
    }

    /// The observation event log.
    pub fn events(&self) -> &EventLog {
        &self.inner.events
    }

    /// Final answers recently replayed by this process.
    pub fn replays(&self) -> &replays::ReplayCache {
        &self.inner.replays
    }
}

/// A duration as fractional seconds, the unit the SQL below multiplies `interval '1 second'` by.
fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}
