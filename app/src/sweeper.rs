//! The sweeper: the background worker that makes sure no key stays unfinished and no key is kept
//! forever. It runs inside every `payonce serve` and on its own as `payonce sweep`; any number of
//! them may run against one database (each row is taken by one of them, see
//! [`crate::idempotency::recovery`]).
//!
//! Every pass, in order:
//!
//! 1. **Completer.** Takes over keys whose lease ran out before an answer (the worker crashed, or
//!    gave the key back after a gateway failure) once their backoff has passed, and drives each
//!    from its recovery point with the stored canonical request and the same downstream key,
//!    exactly as a client retry would. The client's next retry then gets the replay. A key whose
//!    budget is spent (`PAYONCE_MAX_ATTEMPTS`, or the downstream key's horizon) is taken every
//!    `PAYONCE_BACKOFF_CAP_SECS` and *reconciled*: the gateway is asked what became of it
//!    ([`crate::payments::reconcile`]). It is given up only when the gateway confirms there is no
//!    charge; never left `processing` by guessing.
//! 2. **Pending look-ups.** Asks every operation, through one seam
//!    ([`crate::idempotency::Idempotent::look_up_due`]), to look up what it left pending at the
//!    gateway and is due: payments whose key answered 202 (`requires_action`, `processing`),
//!    moved forward with what Stripe says; refunds the gateway answered `pending`, which settle
//!    (a failed one giving its reservation back) or are asked again later. The safety net under
//!    webhooks.
//! 3. **Reaper.** Deletes final keys past their expiry, in small batches of one short statement
//!    each, skipping rows another transaction holds, at a bounded rate (`PAYONCE_REAP_RATE`)
//!    for up to four fifths of the interval. Payments stay.
//! 4. **Retention.** Makes the coming days' partitions of the key events and the webhook inbox,
//!    and detaches and drops the days past their retention ([`crate::retention`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tracing::Instrument;

use crate::gateway::Gateway;
use crate::idempotency::{Engine, LookedUp, Operations, ProcessError};

/// How the sweeper paces itself. The budget and the backoff it applies are the engine's
/// ([`crate::idempotency::Budget`]): the same for clients and sweepers.
#[derive(Debug, Clone, Copy)]
pub struct SweeperSettings {
    /// Time between two passes.
    pub interval: Duration,
    /// How many days key events and webhook inbox entries are kept (whole UTC days: a day goes
    /// when its end is this far in the past). At least [`crate::retention::MIN_DAYS`].
    pub event_retention_days: u32,
    /// How many expired keys the reaper deletes per second at most, in ten evenly spaced
    /// batches; `None`: batches of [`UNPACED_BATCH`] back to back. A backlog drains slower, and
    /// the payments meanwhile keep their latency (docs/performance.md, "Retention and the
    /// reaper").
    pub reap_rate: Option<NonZeroU32>,
}

impl SweeperSettings {
    /// The reaper's batch size, and the time from one batch's start to the next one's.
    fn reap_pace(&self) -> (i64, Duration) {
        match self.reap_rate {
            None => (UNPACED_BATCH, Duration::ZERO),
            Some(rate) => {
                let batch = (rate.get() / 10).clamp(1, UNPACED_BATCH as u32);
                (i64::from(batch), Duration::from_secs_f64(f64::from(batch) / f64::from(rate.get())))
            }
        }
    }
}

impl Default for SweeperSettings {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            event_retention_days: crate::retention::DEFAULT_DAYS,
            reap_rate: NonZeroU32::new(DEFAULT_REAP_RATE),
        }
    }
}

/// Keys taken over per statement; each is then driven concurrently.
const BATCH: i64 = 32;
/// Batches per pass at most, so one pass stays short and shutdown stays prompt.
const MAX_BATCHES: usize = 8;
/// Keys deleted per statement at most (each one short transaction, its rows taken with
/// `SKIP LOCKED`); an unpaced reaper's batch.
pub const UNPACED_BATCH: i64 = 500;
/// The reaper's default rate, keys per second (`PAYONCE_REAP_RATE`).
pub const DEFAULT_REAP_RATE: u32 = 1000;
/// The reaper's share of a pass, as a fraction of the interval: it goes on while its batches
/// come back full, until then. The next pass starts an interval after this one started, so a
/// backlog is reaped all along, while the completer still runs every interval.
const REAP_SHARE: f64 = 0.8;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Abandoned keys driven to an answer (201, 202, 402).
    pub completed: usize,
    /// Abandoned keys whose gateway still gave no answer that tells (released for a later pass).
    pub retried: usize,
    /// Keys given up because the gateway confirmed there is no charge.
    pub failed: usize,
    /// What each operation (by route) had pending and looked up, and how much of it moved
    /// forward (a payment settled, a refund succeeded or failed).
    pub looked_up: BTreeMap<&'static str, LookedUp>,
    /// Keys a client retry took over while the sweeper held them (the client finishes them).
    pub lost: usize,
    /// Keys that hit a database or data error.
    pub errors: usize,
    /// Expired keys deleted.
    pub reaped: u64,
    /// Expired history partitions (a day of key events or webhook inbox entries) dropped.
    pub dropped_partitions: usize,
}

impl SweepReport {
    fn did_anything(&self) -> bool {
        *self != Self::default()
    }

    /// How many of what the operation on `route` left pending were looked up, and how many of
    /// those moved forward.
    pub fn looked_up_on(&self, route: &str) -> (usize, usize) {
        self.looked_up.get(route).map_or((0, 0), |looked| (looked.looked_up, looked.moved))
    }
}

/// The sweeper of one process.
pub struct Sweeper {
    engine: Engine,
    /// Every idempotent operation, by route: an abandoned key is driven by the operation it was
    /// claimed for, which the completer never needs to know.
    operations: Operations,
    settings: SweeperSettings,
    /// This sweeper's name as a lease owner (`sweeper:<host>:<pid>`).
    owner: String,
    /// Set when shutdown comes during a pass: its reaping stops at the next batch.
    stopping: AtomicBool,
}

impl Sweeper {
    pub fn new(engine: Engine, gateway: Gateway, settings: SweeperSettings, owner: String) -> Self {
        let operations = crate::operations::registry(&gateway);
        Self { engine, operations, settings, owner, stopping: AtomicBool::new(false) }
    }

    /// Starts a pass every `interval` (or as soon as the last one ends, if it took longer) until
    /// `shutdown` resolves, the first one an interval after it starts: an abandoned key waits
    /// for its lease to run out anyway, and a server just started has requests to serve first.
    /// A pass in progress is finished first, its paced reaping cut short.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tracing::info!(interval_secs = self.settings.interval.as_secs_f64(), owner = %self.owner, "sweeper started");
        // The series exists (at 0) from the start, not from the first pass an interval later:
        // an alert on its growth has something to read at once.
        metrics::counter!("payonce_sweeps_total").increment(0);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut wait = self.settings.interval;
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(wait) => {}
            }
            let started = Instant::now();
            let mut pass = std::pin::pin!(self.sweep());
            tokio::select! {
                _ = &mut pass => {}
                () = &mut shutdown => {
                    // The pass finishes what it holds; a paced reaping stops at its next batch.
                    self.stopping.store(true, Ordering::Relaxed);
                    pass.await;
                    break;
                }
            }
            wait = self.settings.interval.saturating_sub(started.elapsed());
        }
        tracing::info!("sweeper stopped");
    }

    /// One pass: complete, look up, reap, keep the history bounded. Errors are logged and
    /// counted, never fatal: the next pass tries again.
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
        for operation in self.operations.all() {
            let route = operation.route;
            for _ in 0..MAX_BATCHES {
                match operation.driver.look_up_due(&self.engine, BATCH).await {
                    Ok(looked) => {
                        report.errors += looked.errors;
                        let total = report.looked_up.entry(route).or_default();
                        (total.looked_up, total.moved) =
                            (total.looked_up + looked.looked_up, total.moved + looked.moved);
                        if looked.taken < BATCH as usize {
                            break;
                        }
                    }
                    Err(err) => {
                        failed(&mut report, &format!("looking for what {route} left pending"), &err);
                        break;
                    }
                }
            }
        }
        let (batch, pace) = self.settings.reap_pace();
        let reaping = Instant::now();
        let window = self.settings.interval.mul_f64(REAP_SHARE);
        loop {
            let started = Instant::now();
            match self.engine.reap_expired(batch).await {
                Ok(reaped) => {
                    report.reaped += reaped;
                    let stopping = self.stopping.load(Ordering::Relaxed);
                    if reaped < batch as u64 || reaping.elapsed() + pace >= window || stopping {
                        break;
                    }
                    tokio::time::sleep(pace.saturating_sub(started.elapsed())).await;
                }
                Err(err) => {
                    failed(&mut report, "reaping expired keys", &err);
                    break;
                }
            }
        }
        match crate::retention::maintain(self.engine.pool(), self.settings.event_retention_days).await {
            Ok(maintained) => report.dropped_partitions = maintained.dropped.len(),
            Err(err) => failed(&mut report, "maintaining the history partitions", &err),
        }
        report
    }

    /// Takes one batch of abandoned keys and drives (or reconciles) them concurrently. Returns
    /// how many it took.
    async fn complete_abandoned(&self, report: &mut SweepReport) -> usize {
        let leases = match self.engine.reclaim_abandoned(&self.owner, BATCH).await {
            Ok(leases) => leases,
            Err(err) => {
                failed(report, "looking for abandoned keys", &err);
                return 0;
            }
        };
        let taken = leases.len();
        let mut work = JoinSet::new();
        for lease in leases {
            let operations = self.operations.clone();
            let span =
                tracing::info_span!("complete", key_id = %lease.key_id, route = lease.route, attempts = lease.attempts);
            work.spawn(
                async move {
                    let doing = if lease.exhausted() {
                        "reconciling a key whose budget is spent"
                    } else {
                        "resuming an abandoned key"
                    };
                    tracing::info!(recovery_point = lease.recovery_point.as_str(), "{doing}");
                    operations.resume(lease).await
                }
                .instrument(span),
            );
        }
        while let Some(joined) = work.join_next().await {
            match joined {
                Ok(Ok(response)) if response.status.is_server_error() => report.failed += 1,
                Ok(Ok(_)) => report.completed += 1,
                Ok(Err(
                    ProcessError::Gateway { .. } | ProcessError::Refused { .. } | ProcessError::Unconfirmed { .. },
                )) => report.retried += 1,
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

/// Notes a step of the pass that failed on the database: logged with what the failure means (the
/// one classification, [`crate::db::Failure`], which also lets the pool retire connections to a
/// primary a failover demoted), and counted in the report.
fn failed(report: &mut SweepReport, what: &str, err: &sqlx::Error) {
    let failure = crate::db::Failure::of(err);
    tracing::warn!(error = %err, ?failure, "{what} failed");
    report.errors += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(rate: u32) -> (i64, Duration) {
        SweeperSettings { reap_rate: NonZeroU32::new(rate), ..SweeperSettings::default() }.reap_pace()
    }

    #[test]
    fn the_reapers_rate_is_ten_batches_a_second_within_the_batch_limit() {
        assert_eq!(pace(1000), (100, Duration::from_millis(100)));
        assert_eq!(pace(5), (1, Duration::from_millis(200)), "a batch of one key at least");
        assert_eq!(pace(20_000), (500, Duration::from_millis(25)), "never more than a batch's limit");
        assert_eq!(pace(0), (UNPACED_BATCH, Duration::ZERO), "0: unpaced");
    }
}
