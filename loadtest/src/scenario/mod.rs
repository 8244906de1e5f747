//! What every scenario shares: the [`Run`] (API, budget, stats, what the clients believe) and the
//! workers that drive it. Each scenario is a module with one `worker` function: a loop that runs
//! operations (a fan-out of one key, a payment with its retries, one mixed request) while the
//! [`Budget`] allows, and records every answer with a [`Verdict`](crate::stats::Verdict).

mod bench;
mod capture_storm;
mod double_submit;
pub mod failover;
mod mixed;
mod refund_storm;
mod retry_storm;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::capture_audit::{Authorized, Storm};
use crate::cli::{ScenarioName, Settings};
use crate::client::{Answer, Api, Reply};
use crate::refund_audit::{Paid, RefundKey};
use crate::stats::{Stats, Verdict};

/// One load-test run, shared by its workers.
/// What a [`Run::burst`] sends.
#[derive(Debug, Clone, Copy)]
pub enum Request {
    Pay,
    Refund,
}

pub struct Run {
    pub scenario: ScenarioName,
    pub api: Api,
    pub settings: Settings,
    /// Prefix of every idempotency key of the run; the audit looks only at keys that start with it.
    pub run_id: String,
    pub budget: Budget,
    pub stats: Stats,
    /// Key → the PaymentIntent its first 201 named: the payments the clients believe succeeded.
    believed: Mutex<HashMap<String, Option<String>>>,
    /// refund-storm: the payments made before it, which its keys refund.
    refundable: OnceLock<Vec<Paid>>,
    /// refund-storm: every refund key, and how it ended.
    refund_keys: Mutex<Vec<RefundKey>>,
    /// capture-storm: the payments authorized before it, which its storms settle.
    authorized: OnceLock<Vec<Authorized>>,
    /// capture-storm: the next payment to storm, an index into `authorized`.
    next_storm: AtomicUsize,
    /// capture-storm: every storm, with each key's answers.
    storms: Mutex<Vec<Storm>>,
    /// failover: the body of the first 201 of each key, which every later 201 must repeat.
    acknowledged: Mutex<HashMap<String, Vec<u8>>>,
    /// failover with `--timeline`: every answer, as a JSON line.
    timeline: Mutex<Vec<String>>,
}

/// When to stop starting operations: a deadline, a number of requests, or Ctrl-C, whichever
/// comes first. Operations already started always finish, so that the audit sees whole ones.
pub struct Budget {
    deadline: Option<Instant>,
    max_requests: Option<u64>,
    sent: AtomicU64,
    stopped: AtomicBool,
}

impl Budget {
    fn new(duration: Option<Duration>, max_requests: Option<u64>) -> Self {
        Self {
            deadline: duration.map(|d| Instant::now() + d),
            max_requests,
            sent: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        }
    }

    /// Whether a worker may start another operation.
    pub fn allows_more(&self) -> bool {
        !self.stopped.load(Ordering::Relaxed)
            && self.deadline.is_none_or(|deadline| Instant::now() < deadline)
            && self.max_requests.is_none_or(|max| self.sent.load(Ordering::Relaxed) < max)
    }

    /// Stops the run early (Ctrl-C).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    fn count_request(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }
}

impl Run {
    pub fn new(scenario: ScenarioName, api: Api, settings: Settings) -> Self {
        Self {
            scenario,
            api,
            budget: Budget::new(settings.duration, settings.requests),
            settings,
            run_id: format!("lt-{}-{}", scenario.as_str(), Uuid::now_v7().simple()),
            stats: Stats::default(),
            believed: Mutex::new(HashMap::new()),
            refundable: OnceLock::new(),
            refund_keys: Mutex::new(Vec::new()),
            authorized: OnceLock::new(),
            next_storm: AtomicUsize::new(0),
            storms: Mutex::new(Vec::new()),
            acknowledged: Mutex::new(HashMap::new()),
            timeline: Mutex::new(Vec::new()),
        }
    }

    /// failover: notes a 201's body for `key`. False if an earlier 201 of the key said otherwise.
    pub fn acknowledge(&self, key: &str, body: &[u8]) -> bool {
        let mut acknowledged = self.acknowledged.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        acknowledged.entry(key.to_owned()).or_insert_with(|| body.to_vec()) == body
    }

    /// failover: each key's first 201 body.
    pub fn acknowledged(&self) -> Vec<(String, Vec<u8>)> {
        let acknowledged = self.acknowledged.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        acknowledged.iter().map(|(key, body)| (key.clone(), body.clone())).collect()
    }

    /// failover with `--timeline`: keeps the answer for the timeline.
    pub fn note(&self, key: &str, reply: &Reply) {
        if self.settings.timeline.is_some() {
            let line = failover::timeline_line(key, reply);
            self.timeline.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(line);
        }
    }

    /// failover: the timeline's lines, in the order the answers came.
    pub fn timeline(&self) -> Vec<String> {
        self.timeline.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The `n`-th key of `worker`: unique in the run, and recognisable by the audit.
    pub fn key(&self, worker: u32, n: u64) -> String {
        format!("{}-{worker}-{n}", self.run_id)
    }

    /// Sends one payment request with the run's client timeout and counts it against the budget.
    /// The caller judges the answer and records it with [`Run::record`].
    pub async fn pay(&self, target: &str, key: &str, body: &Value) -> Reply {
        self.budget.count_request();
        self.api.pay(target, key, body, self.settings.client_timeout).await
    }

    /// `POST /bench/payments` (no key), counted against the budget like [`Run::pay`].
    pub async fn pay_unprotected(&self, target: &str, body: &Value) -> Reply {
        self.budget.count_request();
        self.api.pay_unprotected(target, body, self.settings.client_timeout).await
    }

    /// Records an answer; a 201 with a payment also records the key as believed succeeded.
    pub fn record(&self, key: &str, reply: &Reply, verdict: Verdict) {
        self.stats.record(reply, verdict);
        if let Answer::Created(Some(payment)) | Answer::Replayed(Some(payment)) = &reply.answer {
            let mut believed = self.believed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // The first 201 of a key is what the client believes; later ones (replays) only
            // look, so a replay benchmark does not allocate a key per request.
            if !believed.contains_key(key) {
                believed.insert(key.to_owned(), payment.payment_intent.clone());
            }
        }
    }

    /// Records `key` as a payment the clients believe succeeded, charged by `intent`
    /// (capture-storm: an authorization whose capture was answered 200).
    pub fn believe(&self, key: &str, intent: Option<String>) {
        let mut believed = self.believed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        believed.entry(key.to_owned()).or_insert(intent);
    }

    /// The payments the clients believe succeeded.
    pub fn believed(&self) -> HashMap<String, Option<String>> {
        self.believed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Sends one refund request with the run's client timeout and counts it against the budget.
    pub async fn refund(&self, target: &str, key: &str, body: &Value) -> Reply {
        self.budget.count_request();
        self.api.refund(target, key, body, self.settings.client_timeout).await
    }

    /// Sends `body` under `key` `duplicates` times at once: as many tasks, released together by
    /// a barrier, spread round-robin over the targets (so with two servers the race is also
    /// between servers), each a payment or a refund as `request` says. The replies that came back.
    pub async fn burst(self: &Arc<Self>, request: Request, key: &str, body: Value, duplicates: usize) -> Vec<Reply> {
        let body = Arc::new(body);
        let barrier = Arc::new(Barrier::new(duplicates));
        let tasks: Vec<_> = (0..duplicates)
            .map(|_| {
                let (run, key, body, barrier) = (self.clone(), key.to_owned(), body.clone(), barrier.clone());
                let target = run.api.next_target().to_owned();
                tokio::spawn(async move {
                    barrier.wait().await;
                    match request {
                        Request::Pay => run.pay(&target, &key, &body).await,
                        Request::Refund => run.refund(&target, &key, &body).await,
                    }
                })
            })
            .collect();
        let mut replies = Vec::with_capacity(duplicates);
        for task in tasks {
            match task.await {
                Ok(reply) => replies.push(reply),
                Err(err) => eprintln!("payonce-loadtest: a request task failed: {err}"),
            }
        }
        replies
    }

    /// Sends one capture or cancel (`action`) of `payment` with the run's client timeout and
    /// counts it against the budget.
    pub async fn settle(&self, target: &str, payment: &str, action: &str, key: &str, body: &Value) -> Reply {
        self.budget.count_request();
        self.api.settle(target, payment, action, key, body, self.settings.client_timeout).await
    }

    /// capture-storm: the payments authorized for it (none before they are made).
    pub fn authorized(&self) -> &[Authorized] {
        self.authorized.get().map_or(&[], Vec::as_slice)
    }

    /// capture-storm: the next payment no storm has taken yet, if any.
    pub fn next_to_storm(&self) -> Option<&Authorized> {
        self.authorized().get(self.next_storm.fetch_add(1, Ordering::Relaxed))
    }

    /// capture-storm: keeps a storm's answers for the audit.
    pub fn stormed(&self, storm: Storm) {
        self.storms.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(storm);
    }

    /// capture-storm: every storm so far.
    pub fn storms(&self) -> Vec<Storm> {
        self.storms.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// refund-storm: the payments its keys refund (none before they are made).
    pub fn refundable(&self) -> &[Paid] {
        self.refundable.get().map_or(&[], Vec::as_slice)
    }

    /// refund-storm: records how a key ended.
    pub fn refund_key(&self, key: RefundKey) {
        self.refund_keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(key);
    }

    /// refund-storm: every key, and how it ended.
    pub fn refund_keys(&self) -> Vec<RefundKey> {
        self.refund_keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// A valid payment body.
pub fn payment(amount: i64) -> Value {
    json!({"amount": amount, "currency": "usd", "payment_method": "pm_card_visa"})
}

/// Whether a 201 carries a succeeded payment of `amount`, with the PaymentIntent that charged it.
pub fn pays(answer: &Answer, amount: i64) -> bool {
    answer.payment().is_some_and(|p| {
        p.status == "succeeded" && p.amount == amount && p.id.starts_with("pay_") && p.payment_intent.is_some()
    })
}

/// Runs `settings.concurrency` workers of the run's scenario until the budget is spent (after
/// making what the scenario needs first: refund-storm's payments, capture-storm's authorizations).
pub async fn run(run: Arc<Run>) -> Result<(), String> {
    if run.scenario == ScenarioName::RefundStorm {
        let paid = refund_storm::prepare(&run).await?;
        run.refundable.set(paid).map_err(|_| "the payments to refund were made twice".to_owned())?;
    }
    if run.scenario == ScenarioName::CaptureStorm {
        let authorized = capture_storm::prepare(&run).await?;
        run.authorized.set(authorized).map_err(|_| "the payments to capture were authorized twice".to_owned())?;
    }
    let workers: Vec<_> = (0..run.settings.concurrency)
        .map(|worker| {
            let run = run.clone();
            tokio::spawn(async move {
                match run.scenario {
                    ScenarioName::DoubleSubmit => double_submit::worker(run, worker).await,
                    ScenarioName::RetryStorm => retry_storm::worker(run, worker).await,
                    ScenarioName::Mixed => mixed::worker(run, worker).await,
                    ScenarioName::RefundStorm => refund_storm::worker(run, worker).await,
                    ScenarioName::CaptureStorm => capture_storm::worker(run, worker).await,
                    ScenarioName::Failover => failover::worker(run, worker).await,
                    ScenarioName::NewPayments => bench::new_payments(run, worker).await,
                    ScenarioName::Replays => bench::replays(run, worker).await,
                    ScenarioName::Unprotected => bench::unprotected(run, worker).await,
                }
            })
        })
        .collect();
    for worker in workers {
        if let Err(err) = worker.await {
            eprintln!("payonce-loadtest: a worker failed: {err}");
        }
    }
    if run.scenario == ScenarioName::Failover {
        failover::verify(&run).await;
        if let Some(path) = &run.settings.timeline {
            let lines = run.timeline().join("\n") + "\n";
            std::fs::write(path, lines)
                .map_err(|err| format!("cannot write the timeline {}: {err}", path.display()))?;
        }
    }
    Ok(())
}
