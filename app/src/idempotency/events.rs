//! The append-only `idempotency_events` log: the history of every key, read by the dashboard.
//!
//! Two kinds of events, written two ways:
//!
//! * **Transitions** (claimed, reclaimed, payment_created, completed, released, …) change a key's
//!   state. They are inserted by the very statement that makes the transition, so the log can never
//!   disagree with the table. What the gateway said (refused, reconciled, webhook) is written the
//!   same way, with the statement or transaction that acts on it.
//! * **Observations** (replayed, conflict, mismatch) change nothing. They are the hot path of a
//!   retry storm, so they go through [`EventLog`], which batches them into one insert every few
//!   milliseconds instead of one commit per request. An observation can be lost if the process
//!   dies in that window; a transition never is.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// What happened to a key, in the engine's words. An operation's phases are events too, named by
/// their recovery point (`payment_created`, `refund_created`): the operation writes them with
/// its first write, the engine counts them ([`count_phase`]), and no list here (nor a database
/// constraint) needs to know them: a new operation adds its phases without editing the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Claimed,
    Replayed,
    Conflict,
    Mismatch,
    Reclaimed,
    Completed,
    Released,
    LeaseLost,
    Failed,
    Expired,
    /// The gateway refused payonce's own request (its configuration); nothing was stored.
    Refused,
    /// payonce asked the gateway what became of a payment (retrieve, replay, search).
    Reconciled,
    /// A webhook event about the key's payment arrived.
    Webhook,
}

impl EventKind {
    /// Every one of them.
    pub const ALL: [Self; 13] = [
        Self::Claimed,
        Self::Replayed,
        Self::Conflict,
        Self::Mismatch,
        Self::Reclaimed,
        Self::Completed,
        Self::Released,
        Self::LeaseLost,
        Self::Failed,
        Self::Expired,
        Self::Refused,
        Self::Reconciled,
        Self::Webhook,
    ];

    /// The value stored in `idempotency_events.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::Reclaimed => "reclaimed",
            Self::Completed => "completed",
            Self::Released => "released",
            Self::LeaseLost => "lease_lost",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Refused => "refused",
            Self::Reconciled => "reconciled",
            Self::Webhook => "webhook",
        }
    }

    /// Counts `n` events of this kind in the `payonce_idempotency_events_total` metric. Every event
    /// is counted where it is recorded, so the metric and the log never tell different stories.
    pub fn count(self, n: u64) {
        metrics::counter!("payonce_idempotency_events_total", "kind" => self.as_str()).increment(n);
    }
}

/// Counts `n` events of an operation's phase (its recovery point's name, so that this file needs
/// nothing of the lease's) in the same metric as the engine's own kinds.
pub fn count_phase(phase: &str, n: u64) {
    metrics::counter!("payonce_idempotency_events_total", "kind" => phase.to_owned()).increment(n);
}

/// One event on its way to the table.
#[derive(Debug, Clone)]
pub struct Event {
    pub key_id: Uuid,
    pub customer_id: Uuid,
    pub kind: EventKind,
    pub lease_token: Option<i64>,
    pub detail: Value,
}

/// Buffered writer for observation events. Cheap to clone.
#[derive(Clone)]
pub struct EventLog {
    tx: mpsc::Sender<Event>,
    /// Events dropped since the writer last said so.
    dropped: Arc<AtomicU64>,
}

/// How many events may wait for the writer before new ones are dropped (with a warning).
const QUEUE: usize = 16_384;
/// The most events written by one statement: more than a replay storm at the fastest rate
/// measured (54,000 replays/s, docs/performance.md) records in one [`LINGER`], so the writer keeps
/// up with it.
const BATCH: usize = 4_096;
/// How long the writer lets a batch fill before writing it.
const LINGER: Duration = Duration::from_millis(20);

impl EventLog {
    /// Starts the writer. It stops, after writing what it holds, once every `EventLog` clone is
    /// dropped; await the handle to be sure the last events reached the database.
    pub fn spawn(pool: PgPool) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        (Self { tx, dropped: dropped.clone() }, tokio::spawn(write_batches(pool, rx, dropped)))
    }

    /// Queues an event. Never waits: under overload the event is dropped rather than slowing a
    /// request down. The writer says how many were, once per batch (a warning per dropped event
    /// was a log line per request just when the process was busiest).
    pub fn record(&self, event: Event) {
        event.kind.count(1);
        if self.tx.try_send(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Writes one event now and waits for it: for what must not be lost (what the gateway said about
/// a payment), outside a statement that could carry it. On a pool, or inside a transaction with
/// the effect it describes.
pub async fn write<'e>(executor: impl sqlx::PgExecutor<'e>, event: Event) -> sqlx::Result<()> {
    sqlx::query!(
        r#"
        insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
        values ($1, $2, $3, $4, $5)
        "#,
        event.key_id,
        event.customer_id,
        event.kind.as_str(),
        event.lease_token,
        event.detail,
    )
    .execute(executor)
    .await?;
    event.kind.count(1);
    Ok(())
}

async fn write_batches(pool: PgPool, mut rx: mpsc::Receiver<Event>, dropped: Arc<AtomicU64>) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            return; // every sender is gone and the queue is empty
        }
        // Let a burst accumulate: one insert of many rows costs about what one row costs.
        tokio::time::sleep(LINGER).await;
        // Take whatever arrived meanwhile, without waiting.
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        if let Err(err) = insert(&pool, &batch).await {
            tracing::warn!(error = %err, events = batch.len(), "could not write events; dropped");
        }
        batch.clear();
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            metrics::counter!("payonce_idempotency_events_dropped_total").increment(lost);
            tracing::warn!(events = lost, "event queue full; events dropped");
        }
    }
}

/// Writes a batch. Its commit does not wait for the disk (`synchronous_commit = off` for this
/// transaction only): observations may be lost in a crash anyway, and not flushing them keeps
/// the disk's flushes for the commits that matter, the payments'.
async fn insert(pool: &PgPool, events: &[Event]) -> sqlx::Result<()> {
    let key_ids: Vec<Uuid> = events.iter().map(|e| e.key_id).collect();
    let customer_ids: Vec<Uuid> = events.iter().map(|e| e.customer_id).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let tokens: Vec<Option<i64>> = events.iter().map(|e| e.lease_token).collect();
    let details: Vec<Value> = events.iter().map(|e| e.detail.clone()).collect();
    let mut tx = pool.begin().await?;
    sqlx::query!("set local synchronous_commit = off").execute(&mut *tx).await?;
    sqlx::query!(
        r#"
        insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
        select * from unnest($1::uuid[], $2::uuid[], $3::text[], $4::int8[], $5::jsonb[])
        "#,
        &key_ids,
        &customer_ids,
        &kinds as &[&str],
        &tokens as &[Option<i64>],
        &details,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the queue's capacity, `record` drops the event without waiting and counts it: the
    /// count is what the writer reports (one warning and the metric) after its next batch.
    #[test]
    fn a_full_queue_drops_and_counts() {
        let (tx, mut rx) = mpsc::channel(2);
        let log = EventLog { tx, dropped: Arc::new(AtomicU64::new(0)) };
        let event = || Event {
            key_id: Uuid::nil(),
            customer_id: Uuid::nil(),
            kind: EventKind::Replayed,
            lease_token: None,
            detail: Value::Null,
        };
        for _ in 0..5 {
            log.record(event());
        }
        assert_eq!(log.dropped.load(Ordering::Relaxed), 3, "two queued, three dropped");
        for queued in 0..2 {
            assert!(rx.try_recv().is_ok(), "event {queued} was queued");
        }
        assert!(rx.try_recv().is_err(), "nothing past the capacity was queued");
        log.record(event());
        assert_eq!(log.dropped.load(Ordering::Relaxed), 3, "room again: queued, not dropped");
    }
}
