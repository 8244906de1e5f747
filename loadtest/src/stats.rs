//! What the run saw: answers by kind, the unexpected ones and why, latency percentiles, and, for
//! payments that take several attempts (retry-storm), how they ended.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::client::{Answer, Reply};

/// Whether an answer is one the scenario allows at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Expected,
    /// Not allowed; the reason names what was wrong with it ("a replay with another payment").
    Unexpected(&'static str),
}

/// The run's tallies, shared by the workers.
#[derive(Default)]
pub struct Stats {
    inner: Mutex<Tallies>,
}

#[derive(Default)]
struct Tallies {
    requests: u64,
    /// Answer label → count.
    answers: BTreeMap<String, u64>,
    /// "label: reason" → count.
    unexpected: BTreeMap<String, u64>,
    /// Answer label → latencies in microseconds.
    latencies: BTreeMap<String, Vec<u64>>,
    payments: Payments,
}

/// How multi-attempt payments ended.
#[derive(Default)]
struct Payments {
    completed: u64,
    given_up: u64,
    retries: u64,
    attempts: Vec<u64>,
    /// Microseconds from the first attempt to the 201.
    time_to_success: Vec<u64>,
}

/// The counts the progress line shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub requests: u64,
    pub created: u64,
    pub replayed: u64,
    pub in_flight: u64,
    pub key_reused: u64,
    pub other: u64,
    pub unexpected: u64,
}

/// Percentiles of a set of durations, in milliseconds (nearest rank).
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The four answers every scenario counts, and everything else by label.
#[derive(Debug, Clone, Serialize)]
pub struct Answers {
    pub created: u64,
    pub replayed: u64,
    pub in_flight: u64,
    pub key_reused: u64,
    /// Every other answer, by label ("503 unavailable", "500", "timeout", …).
    pub other: BTreeMap<String, u64>,
}

/// How the multi-attempt payments of a retry storm ended.
#[derive(Debug, Clone, Serialize)]
pub struct PaymentOutcomes {
    pub completed: u64,
    pub given_up: u64,
    pub retries: u64,
    pub attempts_avg: f64,
    pub attempts_max: u64,
    pub time_to_success: Option<Latency>,
}

/// Everything the stats say at the end of the run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub elapsed_secs: f64,
    /// Requests per second over the whole run (including the tail where operations finish).
    pub throughput: f64,
    pub answers: Answers,
    pub unexpected: u64,
    /// "answer: reason" → count.
    pub unexpected_by_reason: BTreeMap<String, u64>,
    /// Every request that got an HTTP answer (timeouts and transport errors excluded).
    pub latency: Option<Latency>,
    /// By answer label.
    pub latency_by_answer: BTreeMap<String, Latency>,
    /// Only for scenarios whose payments take several attempts.
    pub payments: Option<PaymentOutcomes>,
}

const CREATED: &str = "201 created";
const REPLAYED: &str = "201 replayed";
const IN_FLIGHT: &str = "409 in flight";
const KEY_REUSED: &str = "422 key reused";

impl Stats {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tallies> {
        // A worker that panicked mid-update leaves counts that are still counts.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts one request.
    pub fn record(&self, reply: &Reply, verdict: Verdict) {
        let label = reply.answer.label();
        let mut t = self.lock();
        t.requests += 1;
        *t.answers.entry(label.clone()).or_default() += 1;
        if let Verdict::Unexpected(reason) = verdict {
            *t.unexpected.entry(format!("{label}: {reason}")).or_default() += 1;
        }
        t.latencies.entry(label).or_default().push(reply.latency.as_micros() as u64);
    }

    /// A payment got its 201 after `attempts` attempts, `elapsed` after the first.
    pub fn payment_completed(&self, attempts: u32, elapsed: Duration) {
        let mut t = self.lock();
        t.payments.completed += 1;
        t.payments.retries += u64::from(attempts - 1);
        t.payments.attempts.push(u64::from(attempts));
        t.payments.time_to_success.push(elapsed.as_micros() as u64);
    }

    /// A payment ended without a 201 after `attempts` attempts.
    pub fn payment_given_up(&self, attempts: u32) {
        let mut t = self.lock();
        t.payments.given_up += 1;
        t.payments.retries += u64::from(attempts.saturating_sub(1));
        t.payments.attempts.push(u64::from(attempts));
    }

    pub fn snapshot(&self) -> Snapshot {
        let t = self.lock();
        let count = |label: &str| t.answers.get(label).copied().unwrap_or(0);
        let (created, replayed, in_flight, key_reused) =
            (count(CREATED), count(REPLAYED), count(IN_FLIGHT), count(KEY_REUSED));
        Snapshot {
            requests: t.requests,
            created,
            replayed,
            in_flight,
            key_reused,
            other: t.requests - created - replayed - in_flight - key_reused,
            unexpected: t.unexpected.values().sum(),
        }
    }

    pub fn summary(&self, elapsed: Duration) -> Summary {
        let t = self.lock();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let count = |label: &str| t.answers.get(label).copied().unwrap_or(0);
        let other = t
            .answers
            .iter()
            .filter(|(label, _)| ![CREATED, REPLAYED, IN_FLIGHT, KEY_REUSED].contains(&label.as_str()))
            .map(|(label, n)| (label.clone(), *n))
            .collect();
        let answered: Vec<u64> = t
            .latencies
            .iter()
            .filter(|(label, _)| label.as_str() != "timeout" && label.as_str() != "transport error")
            .flat_map(|(_, values)| values.iter().copied())
            .collect();
        let p = &t.payments;
        Summary {
            requests: t.requests,
            elapsed_secs: secs,
            throughput: t.requests as f64 / secs,
            answers: Answers {
                created: count(CREATED),
                replayed: count(REPLAYED),
                in_flight: count(IN_FLIGHT),
                key_reused: count(KEY_REUSED),
                other,
            },
            unexpected: t.unexpected.values().sum(),
            unexpected_by_reason: t.unexpected.clone(),
            latency: Latency::of(answered),
            latency_by_answer: t
                .latencies
                .iter()
                .filter_map(|(label, values)| Some((label.clone(), Latency::of(values.clone())?)))
                .collect(),
            payments: (!p.attempts.is_empty()).then(|| PaymentOutcomes {
                completed: p.completed,
                given_up: p.given_up,
                retries: p.retries,
                attempts_avg: p.attempts.iter().sum::<u64>() as f64 / p.attempts.len() as f64,
                attempts_max: p.attempts.iter().copied().max().unwrap_or(0),
                time_to_success: Latency::of(p.time_to_success.clone()),
            }),
        }
    }
}

impl Latency {
    /// Percentiles of `micros`; `None` for an empty set.
    pub fn of(mut micros: Vec<u64>) -> Option<Self> {
        if micros.is_empty() {
            return None;
        }
        micros.sort_unstable();
        let ms = |micros: u64| micros as f64 / 1000.0;
        // Nearest rank: the smallest value with at least p % of the values at or below it.
        let rank = |p: f64| micros[((p / 100.0 * micros.len() as f64).ceil() as usize).clamp(1, micros.len()) - 1];
        Some(Self {
            count: micros.len(),
            p50_ms: ms(rank(50.0)),
            p95_ms: ms(rank(95.0)),
            p99_ms: ms(rank(99.0)),
            max_ms: ms(micros[micros.len() - 1]),
        })
    }
}

/// Whether an answer is one of the two 201s.
pub fn is_success(answer: &Answer) -> bool {
    matches!(answer, Answer::Created(_) | Answer::Replayed(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nearest-rank percentiles on a known set.
    #[test]
    fn percentiles() {
        let latency = Latency::of((1..=100).map(|ms| ms * 1000).collect()).unwrap();
        assert_eq!((latency.p50_ms, latency.p95_ms, latency.p99_ms, latency.max_ms), (50.0, 95.0, 99.0, 100.0));
        let one = Latency::of(vec![1500]).unwrap();
        assert_eq!((one.p50_ms, one.p99_ms), (1.5, 1.5));
        assert!(Latency::of(Vec::new()).is_none());
    }

    /// Answers are counted by kind; unexpected ones by kind and reason.
    #[test]
    fn tallies() {
        let stats = Stats::default();
        let reply = |answer| Reply { answer, latency: Duration::from_millis(2), body: Vec::new() };
        stats.record(&reply(Answer::Created(None)), Verdict::Expected);
        stats.record(&reply(Answer::InFlight { retry_after: Some(5) }), Verdict::Expected);
        stats.record(&reply(Answer::Status(500)), Verdict::Unexpected("server error"));
        stats.record(&reply(Answer::Timeout), Verdict::Expected);
        let summary = stats.summary(Duration::from_secs(2));
        assert_eq!((summary.requests, summary.answers.created, summary.answers.in_flight), (4, 1, 1));
        assert_eq!(summary.answers.other, BTreeMap::from([("500".into(), 1), ("timeout".into(), 1)]));
        assert_eq!(summary.unexpected_by_reason, BTreeMap::from([("500: server error".into(), 1)]));
        assert_eq!(summary.latency.unwrap().count, 3, "timeouts are not answers");
        assert_eq!(summary.throughput, 2.0);
        assert_eq!(stats.snapshot().other, 2);
    }
}
