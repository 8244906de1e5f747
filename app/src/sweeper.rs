//! The sweeper: the background worker that makes sure no key stays unfinished and no key is kept
//! forever. It runs inside every `payonce serve` and on its own as `payonce sweep`; any number of
//! them may run against one database (each row is taken by one of them, see
//! [`crate::idempotency::recovery`]).
//!
//! Every pass, in order:
//!
//! 1. **Completer.** Takes over keys whose lease ran out before a final answer (the worker crashed,
//!    or gave the key back after a gateway failure) and drives each from its recovery point with
//!    the stored canonical request and the same downstream key, exactly as a client retry would.
//!    The client's next retry then gets the replay. A key that has failed `max_attempts` times is
//!    given up: `failed`, with a stored 502 problem, never left `processing` forever.
//! 2. **Reaper.** Deletes final keys past their expiry, in small batches. Payments stay.
//! 3. **Event purge.** Deletes key events past their retention.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use tracing::Instrument;

use crate::gateway::Gateway;
use crate::idempotency::{Backoff, Engine};
use crate::payments::process::{self, ProcessError};

/// How the sweeper paces itself.
#[derive(Debug, Clone, Copy)]
pub struct SweeperSettings {
    /// Time between two passes.
    pub interval: Duration,
    /// How many holders a key may have had before it is given up. The first holder counts, so a
    /// key gets `max_attempts` gateway attempts in all.
    pub max_attempts: i32,
    /// Waiting between attempts on the same key.
    pub backoff: Backoff,
    /// How long key events are kept.
    pub event_retention: Duration,
}

impl Default for SweeperSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            max_attempts: 12,
            backoff: Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(60) },
            event_retention: Duration::from_secs(7 * 24 * 60 * 60),
        }
    }
}

/// Keys taken over per statement; each is then driven concurrently.
const BATCH: i64 = 32;
/// Batches per pass at most, so one pass stays short and shutdown stays prompt.
const MAX_BATCHES: usize = 8;
/// Keys (or events) deleted per statement.
const DELETE_BATCH: i64 = 500;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Abandoned keys driven to a final answer.
    pub completed: usize,
    /// Abandoned keys whose gateway still gave no final answer (released for a later pass).
    pub retried: usize,
    /// Keys given up after too many attempts.
    pub failed: usize,
    /// Keys a client retry took over while the sweeper held them (the client finishes them).
    pub lost: usize,
    /// Keys that hit a database or data error.
    pub errors: usize,
    /// Expired keys deleted.
    pub reaped: u64,
    /// Old events deleted.
    pub purged_events: u64,
}

impl SweepReport {
    fn did_anything(&self) -> bool {
        *self != Self::default()
    }
}

/// The sweeper of one process.
pub struct Sweeper {
    engine: Engine,
    gateway: Gateway,
    settings: SweeperSettings,
    /// This sweeper's name as a lease owner (`sweeper:<host>:<pid>`).
    owner: String,
}

impl Sweeper {
    pub fn new(engine: Engine, gateway: Gateway, settings: SweeperSettings, owner: String) -> Self {
        Self { engine, gateway, settings, owner }
    }

    /// Sweeps every `interval` until `shutdown` resolves. A pass in progress is finished first.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tracing::info!(interval_secs = self.settings.interval.as_secs_f64(), owner = %self.owner, "sweeper started");
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            self.sweep().await;
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(self.settings.interval) => {}
            }
        }
        tracing::info!("sweeper stopped");
    }

    /// One pass: complete, reap, purge. Errors are logged and counted, never fatal: the next pass
    /// tries again.
    pub async fn sweep(&self) -> SweepReport {
        let span = tracing::info_span!("sweep", owner = %self.owner);
        let report = self.sweep_inner().instrument(span.clone()).await;
        metrics::counter!("payonce_sweeps_total").increment(1);
        span.in_scope(|| {
            if report.did_anything() {
                tracing::info!(?report, "sweep done");
            } else {
                tracing::debug!("sweep done; nothing to do");
            }
        });
        report
    }

    async fn sweep_inner(&self) -> SweepReport {
        let mut report = SweepReport::default();
        for _ in 0..MAX_BATCHES {
            let taken = self.complete_abandoned(&mut report).await;
            if taken < BATCH as usize {
                break;
            }
        }
        for _ in 0..MAX_BATCHES {
            match self.engine.reap_expired(DELETE_BATCH).await {
                Ok(reaped) => {
                    report.reaped += reaped;
                    if reaped < DELETE_BATCH as u64 {
                        break;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reaping expired keys failed");
                    report.errors += 1;
                    break;
                }
            }
        }
        match self.engine.purge_events(self.settings.event_retention, DELETE_BATCH * 10).await {
            Ok(purged) => report.purged_events = purged,
            Err(err) => {
                tracing::warn!(error = %err, "purging old events failed");
                report.errors += 1;
            }
        }
        report
    }

    /// Takes one batch of abandoned keys and drives them concurrently. Returns how many it took.
    async fn complete_abandoned(&self, report: &mut SweepReport) -> usize {
        let leases = match self.engine.reclaim_abandoned(&self.owner, BATCH, self.settings.backoff).await {
            Ok(leases) => leases,
            Err(err) => {
                tracing::warn!(error = %err, "looking for abandoned keys failed");
                report.errors += 1;
                return 0;
            }
        };
        let taken = leases.len();
        let mut work = JoinSet::new();
        for lease in leases {
            let gateway = self.gateway.clone();
            let max_attempts = self.settings.max_attempts;
            let span = tracing::info_span!("complete", key_id = %lease.key_id, attempts = lease.attempts);
            work.spawn(
                async move {
                    if lease.attempts > max_attempts {
                        process::give_up(&lease, "the gateway never gave a final answer").await.map(|_| Outcome::Failed)
                    } else {
                        tracing::info!(recovery_point = lease.recovery_point.as_str(), "resuming an abandoned key");
                        process::run(&gateway, lease).await.map(|_| Outcome::Completed)
                    }
                }
                .instrument(span),
            );
        }
        while let Some(joined) = work.join_next().await {
            match joined {
                Ok(Ok(Outcome::Completed)) => report.completed += 1,
                Ok(Ok(Outcome::Failed)) => report.failed += 1,
                Ok(Err(ProcessError::Gateway(_))) => report.retried += 1,
                Ok(Err(ProcessError::LeaseLost(_))) => report.lost += 1,
                Ok(Err(err)) => {
                    tracing::error!(error = %err, "could not complete an abandoned key");
                    report.errors += 1;
                }
                Err(err) => {
                    tracing::error!(error = %err, "a completion task panicked");
                    report.errors += 1;
                }
            }
        }
        taken
    }
}

enum Outcome {
    Completed,
    Failed,
}
