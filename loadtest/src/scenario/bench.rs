//! The benchmark's closed loops (`loadtest/bench.sh`): each worker sends one request at a time,
//! as fast as the answers come back, so throughput and latency measure the server, not a rate
//! the client chose.
//!
//! | scenario        | every request                                   | allowed answer           |
//! |-----------------|-------------------------------------------------|--------------------------|
//! | `new-payments`  | a fresh key                                     | 201, a succeeded payment |
//! | `replays`       | the worker's one key, created by its first call | 201 replayed, that payment |
//! | `unprotected`   | `POST /bench/payments`: no key, no layer        | 201, a succeeded payment |
//!
//! `unprotected` needs `payonce serve --bench-routes`. Its charges carry no idempotency key, so
//! the audit cannot group them; it only counts the answers.
//!
//! With `--rate`, the workers send on a schedule instead (an open loop): each worker one request
//! every `concurrency / rate` seconds, and a request's latency counts from when it was *due*, not
//! from when the worker got round to it, so a server that falls behind is not flattered by the
//! client waiting for it (coordinated omission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Run, payment, pays};
use crate::client::Answer;
use crate::stats::Verdict;

const AMOUNT: i64 = 1000;

/// `new-payments`: one fresh key per request.
pub async fn new_payments(run: Arc<Run>, worker: u32) {
    let body = payment(AMOUNT);
    let mut pacer = Pacer::new(&run, worker);
    let mut n = 0;
    while run.budget.allows_more() {
        let key = run.key(worker, n);
        n += 1;
        let late = pacer.wait().await;
        let mut reply = run.pay(run.api.next_target(), &key, &body).await;
        reply.latency += late;
        let verdict = match &reply.answer {
            answer @ Answer::Created(_) if pays(answer, AMOUNT) => Verdict::Expected,
            _ => Verdict::Unexpected("a new key must be created, as a succeeded payment"),
        };
        run.record(&key, &reply, verdict);
    }
}

/// `replays`: the worker creates one payment, then replays it until the budget is spent.
pub async fn replays(run: Arc<Run>, worker: u32) {
    let body = payment(AMOUNT);
    let key = run.key(worker, 0);
    let first = run.pay(run.api.next_target(), &key, &body).await;
    let Some(original) = first.answer.payment().map(|p| p.id.clone()) else {
        run.record(&key, &first, Verdict::Unexpected("the payment to replay could not be created"));
        return;
    };
    run.record(&key, &first, Verdict::Expected);
    let mut pacer = Pacer::new(&run, worker);
    while run.budget.allows_more() {
        let late = pacer.wait().await;
        let mut reply = run.pay(run.api.next_target(), &key, &body).await;
        reply.latency += late;
        let verdict = match &reply.answer {
            Answer::Replayed(Some(p)) if p.id == original => Verdict::Expected,
            _ => Verdict::Unexpected("a retry of a finished payment must be replayed"),
        };
        run.record(&key, &reply, verdict);
    }
}

/// `unprotected`: the same payment through the route without the idempotency layer.
pub async fn unprotected(run: Arc<Run>, worker: u32) {
    let body = payment(AMOUNT);
    let mut pacer = Pacer::new(&run, worker);
    while run.budget.allows_more() {
        let late = pacer.wait().await;
        let mut reply = run.pay_unprotected(run.api.next_target(), &body).await;
        reply.latency += late;
        let verdict = match &reply.answer {
            answer @ Answer::Created(_) if pays(answer, AMOUNT) => Verdict::Expected,
            _ => Verdict::Unexpected("the bench route must answer 201 (is the server run with --bench-routes?)"),
        };
        // Not `Run::record`: without a key there is nothing for the audit to match.
        run.stats.record(&reply, verdict);
    }
}

/// A worker's schedule under `--rate`; without it, every request is due at once.
struct Pacer {
    /// Time between two requests of this worker.
    period: Option<Duration>,
    /// When the next request is due.
    next: Instant,
}

impl Pacer {
    fn new(run: &Run, worker: u32) -> Self {
        let period = run.settings.rate.map(|rate| Duration::from_secs_f64(f64::from(run.settings.concurrency) / rate));
        // Spread the workers' first requests over one period, so they do not all fire together.
        let offset =
            period.map_or(Duration::ZERO, |p| p.mul_f64(f64::from(worker) / f64::from(run.settings.concurrency)));
        Self { period, next: Instant::now() + offset }
    }

    /// Waits until the next request is due; returns how late it is being sent.
    async fn wait(&mut self) -> Duration {
        let Some(period) = self.period else { return Duration::ZERO };
        tokio::time::sleep_until(self.next.into()).await;
        let late = Instant::now().saturating_duration_since(self.next);
        self.next += period;
        late
    }
}
