//! The claim-strategy lab: four ways to claim an idempotency key, switchable, so that the ones
//! that fail can be watched failing (docs/strategies.md).
//!
//! | strategy            | who decides that one request does the work                              | module |
//! |---------------------|-------------------------------------------------------------------------|--------|
//! | `on-conflict`       | the unique index, in one `INSERT … ON CONFLICT DO NOTHING` (the engine)  | [`crate::idempotency::claim`] |
//! | `for-update`        | `SELECT … FOR UPDATE`, insert if absent, one transaction held across the gateway call; in fact the unique index again | [`for_update`] |
//! | `redis`             | a lease in Redis (`SET NX PX`), fenced by an `INCR` token in PostgreSQL  | [`redis`] |
//! | `check-then-insert` | nobody: a `SELECT`, a gap, an `INSERT` with no unique index behind it    | [`check_then_insert`] |
//!
//! `PAYONCE_CLAIM_STRATEGY` picks the one `POST /v1/payments` (and the shop) uses; `on-conflict`
//! is the default and the only one that serves outside the lab: the others lack what the engine
//! guarantees besides the claim (reconciliation, webhooks, the sweeper: [`Strategy::lacks`]), and
//! `check-then-insert` double charges by design. They run only in lab mode (`--lab`,
//! `PAYONCE_LAB=1`), which also mounts `POST /lab/{strategy}/v1/payments` so that one server runs
//! all four side by side.
//!
//! The engine is reached at one seam only: `http::payments::execute_with` sends `on-conflict` to
//! the engine and everything else here. The three strategies below keep their keys in
//! `lab_keys`, never in `idempotency_keys`, so the engine, the sweeper and the reaper never see
//! them; their payments are ordinary `payments` rows.

pub mod check_then_insert;
pub mod for_update;
pub mod redis;
mod store;

use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::gateway::Gateway;
use crate::idempotency::{Operation, StoredResponse};
use crate::payments::process::ProcessError;

/// Who decides that exactly one request does an operation's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claims {
    /// The engine (`idempotency/`): the unique index, the lease, the fencing token, and every
    /// guarantee after the claim.
    Engine,
    /// One of the lab's strategies: lab servers only.
    Lab(Strategy),
}

impl Claims {
    /// `strategy` as the claims it makes: the engine's own is the engine.
    pub fn of(strategy: Strategy) -> Self {
        if strategy == Strategy::OnConflict { Self::Engine } else { Self::Lab(strategy) }
    }
}

/// One way to claim a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The engine: the unique index decides, a lease and a fencing token carry the work.
    OnConflict,
    /// The textbook transaction, its row lock held across the gateway call.
    ForUpdate,
    /// A lease in Redis, fenced in PostgreSQL.
    Redis,
    /// The naive check, then insert. Double charges under a storm; lab mode only.
    CheckThenInsert,
}

impl Strategy {
    /// All four, in the order the docs and the dashboard show them.
    pub const ALL: [Self; 4] = [Self::OnConflict, Self::ForUpdate, Self::Redis, Self::CheckThenInsert];

    /// Reads a strategy's name (`on-conflict`, `for-update`, `redis`, `check-then-insert`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The name, as `PAYONCE_CLAIM_STRATEGY` and `/lab/{strategy}/…` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnConflict => "on-conflict",
            Self::ForUpdate => "for-update",
            Self::Redis => "redis",
            Self::CheckThenInsert => "check-then-insert",
        }
    }

    /// Whether the strategy charges at most once per key under any concurrency. Only
    /// check-then-insert is not.
    pub fn is_safe(self) -> bool {
        self != Self::CheckThenInsert
    }

    /// What this strategy does *not* guarantee that the engine does: why only the engine serves
    /// outside the lab. Empty for `on-conflict`. (`/healthz`, the dashboard's banner and
    /// docs/strategies.md show it.)
    pub fn lacks(self) -> &'static [&'static str] {
        const OUTSIDE_THE_ENGINE: [&str; 3] = [
            "a pending payment (202 processing, requires_action) is never looked up: with a lost webhook it stays \
             pending for good",
            "a webhook that arrives before its transaction commits finds no payment (unmatched), and its redeliveries \
             count as duplicates",
            "after an unknown outcome (a timeout, a lost answer) no key row is left for the sweeper to reconcile",
        ];
        const NOBODY_DECIDES: [&str; 4] = [
            "charging once: concurrent retries with one key are each charged",
            OUTSIDE_THE_ENGINE[0],
            OUTSIDE_THE_ENGINE[1],
            OUTSIDE_THE_ENGINE[2],
        ];
        match self {
            Self::OnConflict => &[],
            Self::ForUpdate | Self::Redis => &OUTSIDE_THE_ENGINE,
            Self::CheckThenInsert => &NOBODY_DECIDES,
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::parse(name).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|s| s.as_str()).collect();
            format!("{name:?} is not a claim strategy (one of: {})", names.join(", "))
        })
    }
}

/// The lab's configuration (`payonce serve --claim-strategy … --lab`).
#[derive(Debug, Clone)]
pub struct LabSettings {
    /// `PAYONCE_CLAIM_STRATEGY`: the strategy of `POST /v1/payments` and the shop.
    pub strategy: Strategy,
    /// `PAYONCE_LAB`: allow check-then-insert, mount `/lab/{strategy}/v1/payments` and the
    /// dashboard's Lab page.
    pub lab: bool,
    /// `REDIS_URL`, for the redis strategy.
    pub redis_url: String,
    /// The redis strategy's lease (`PX`): how long a key stays claimed if its holder dies.
    pub redis_lease: Duration,
    /// check-then-insert's pause between its check and its insert (`PAYONCE_LAB_GAP_MS`). The
    /// race exists without it; the gap makes it happen every time a storm hits, which is what a
    /// lab needs. Zero turns it off.
    pub gap: Duration,
}

impl Default for LabSettings {
    fn default() -> Self {
        Self {
            strategy: Strategy::OnConflict,
            lab: false,
            redis_url: "redis://127.0.0.1:6379".to_owned(),
            redis_lease: Duration::from_secs(60),
            gap: Duration::from_millis(50),
        }
    }
}

impl LabSettings {
    /// Refuses a configuration that would double charge outside the lab.
    /// Only the engine's own strategy keeps every guarantee (reconciliation of unknown and
    /// pending outcomes, webhooks, the sweeper); the others exist to be compared, in the lab.
    pub fn check(&self) -> Result<(), String> {
        if self.strategy == Strategy::OnConflict || self.lab {
            return Ok(());
        }
        let why = if self.strategy.is_safe() {
            "charges once, but lacks what the engine guarantees besides"
        } else {
            "charges the same payment more than once under concurrent retries: it exists only to be watched failing, \
             and lacks every other guarantee too"
        };
        Err(format!(
            "PAYONCE_CLAIM_STRATEGY={} {why}: {}. Refusing to serve it outside the lab; to run it anyway, add --lab (or \
             PAYONCE_LAB=1) and never point real clients or a real Stripe account at this server (docs/strategies.md)",
            self.strategy,
            self.strategy.lacks().join("; "),
        ))
    }
}

/// The lab at run time: its settings and the Redis connection, opened on first use.
pub struct Lab {
    settings: LabSettings,
    redis: OnceCell<::redis::aio::ConnectionManager>,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Lab {
    pub fn new(settings: LabSettings) -> Self {
        Self { settings, redis: OnceCell::new() }
    }

    pub fn settings(&self) -> &LabSettings {
        &self.settings
    }

    /// The strategy of `POST /v1/payments`.
    pub fn strategy(&self) -> Strategy {
        self.settings.strategy
    }

    /// Whether this server runs in lab mode.
    pub fn is_lab(&self) -> bool {
        self.settings.lab
    }
}

/// The answer to a payment request under a lab strategy.
#[derive(Debug)]
pub struct LabAnswer {
    pub stored: StoredResponse,
    pub replayed: bool,
}

/// Why a lab strategy gave no final answer.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Another request holds the key (409, as the engine's in-flight answer).
    #[error("another request holds this key ({reason})")]
    Busy { retry_after: Duration, reason: &'static str },
    /// The key was first used with another payload (422).
    #[error("this Idempotency-Key was first used with a different request body")]
    PayloadMismatch,
    /// The gateway gave no final answer (503), as in the engine.
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// Redis could not be reached or refused a command (503).
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// Asked to run the engine's own strategy here, or a row this code could not have written.
    #[error("{0}")]
    Corrupt(String),
}

/// Runs `op` under `strategy` (anything but `on-conflict`, which is the engine's: see
/// `http::payments::execute_with`).
pub async fn submit(
    lab: &Lab,
    pool: &sqlx::PgPool,
    gateway: &Gateway,
    strategy: Strategy,
    op: &Operation,
) -> Result<LabAnswer, LabError> {
    match strategy {
        Strategy::ForUpdate => for_update::submit(pool, gateway, op).await,
        Strategy::Redis => redis::submit(lab, pool, gateway, op).await,
        Strategy::CheckThenInsert => check_then_insert::submit(lab, pool, gateway, op).await,
        Strategy::OnConflict => Err(LabError::Corrupt("on-conflict is the engine's own claim, not the lab's".into())),
    }
}

/// A stable name for a customer's key under a strategy: the seed of the payment id and of the
/// downstream idempotency key of for-update and redis. It must not come from a row id: for-update's
/// row vanishes with its transaction when the process dies, and the retry must send the gateway
/// the same downstream key (and the same payment) to be replayed rather than charged again.
fn stable_id(strategy: Strategy, op: &Operation) -> Uuid {
    let mut hash = Sha256::new();
    for part in [strategy.as_str().as_bytes(), op.customer_id.as_bytes(), op.key.as_str().as_bytes()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// The downstream idempotency key of a lab payment.
fn downstream_key(strategy: Strategy, seed: Uuid) -> String {
    format!("payonce-lab-{}-{}", strategy.as_str(), seed.simple())
}
