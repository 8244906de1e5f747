//! Failover: every key is kept until it has a final answer while the database behind the servers
//! fails over under them (`loadtest/failover.sh` kills its primary, or a whole node, or switches
//! it over, mid-run), and no acknowledged payment may be lost or changed by it.
//!
//! Each operation sends a fresh key `--duplicates` times at once, round-robin over the targets;
//! each of those clients retries a 409, a 503, a client timeout or a refused connection after its
//! `Retry-After` (plus jitter), as a well-behaved client does, until it gets a 201, for at most
//! `--max-attempts` attempts. Allowed on the way: 201 (fresh or replayed, naming one payment per
//! key), 409 and 503 with a `Retry-After` of at least 1 s, timeouts and transport errors; anything
//! else (a 500) is unexpected. When the run ends, every key is sent once more ([`verify`]): the
//! answer must be a replayed 201 with the very bytes of the first 201 a client got for it. The
//! charge audit (one charge per key) is the runner's, as for every scenario.
//!
//! `--timeline FILE` writes every answer as a JSON line (when, how long, what), from which the
//! script measures the unavailability window and the latency before and after the failover.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::retry_storm::wait_before_retry;
use super::{Run, payment, pays};
use crate::client::{Answer, Reply};
use crate::stats::Verdict;

pub async fn worker(run: Arc<Run>, worker: u32) {
    let duplicates = run.settings.duplicates;
    let mut n = 0;
    while run.budget.allows_more() {
        let key = Arc::new(run.key(worker, n));
        let amount = 1000 + (n % 1000) as i64;
        n += 1;
        let clients: Vec<_> = (0..duplicates)
            .map(|_| {
                let (run, key) = (run.clone(), key.clone());
                tokio::spawn(async move { until_final(&run, &key, amount).await })
            })
            .collect();
        for client in clients {
            if let Err(err) = client.await {
                eprintln!("payonce-loadtest: a client task failed: {err}");
            }
        }
    }
}

/// One client of one key: retries until a 201, within the attempt budget.
async fn until_final(run: &Run, key: &str, amount: i64) {
    let body = payment(amount);
    for attempt in 1..=run.settings.max_attempts {
        let reply = run.pay(run.api.next_target(), key, &body).await;
        let verdict = match &reply.answer {
            answer if answer.payment().is_some() && !pays(answer, amount) => {
                Verdict::Unexpected("not a succeeded payment of the amount sent")
            }
            Answer::Created(_) | Answer::Replayed(_) => match run.acknowledge(key, &reply.body) {
                true => Verdict::Expected,
                false => Verdict::Unexpected("two 201s for one key with different bodies"),
            },
            Answer::InFlight { retry_after: Some(s) } | Answer::Unavailable { retry_after: Some(s) } if *s >= 1 => {
                Verdict::Expected
            }
            Answer::InFlight { .. } | Answer::Unavailable { .. } => {
                Verdict::Unexpected("without a Retry-After of at least 1 s")
            }
            Answer::Timeout | Answer::Transport(_) => Verdict::Expected,
            _ => Verdict::Unexpected("not a 201, 409, 503, timeout or refused connection"),
        };
        run.record(key, &reply, verdict);
        run.note(key, &reply);
        if reply.answer.payment().is_some() {
            return;
        }
        tokio::time::sleep(wait_before_retry(reply.answer.retry_after(), attempt)).await;
    }
    run.stats.payment_given_up(run.settings.max_attempts);
}

/// After the run: each key acknowledged with a 201 is sent once more, and must be answered with
/// that 201 again, byte for byte (replayed). A key whose answer is gone or changed is an
/// acknowledged payment the failover lost.
pub async fn verify(run: &Run) {
    for (key, first) in run.acknowledged() {
        let amount = serde_json::from_slice::<serde_json::Value>(&first)
            .ok()
            .and_then(|payment| payment["amount"].as_i64())
            .unwrap_or_default();
        let reply = run.pay(run.api.next_target(), &key, &payment(amount)).await;
        let verdict = match &reply.answer {
            Answer::Replayed(_) if reply.body == first => Verdict::Expected,
            Answer::Replayed(_) => Verdict::Unexpected("after the failover, a replay differs from the first 201"),
            _ => Verdict::Unexpected("after the failover, an acknowledged payment is not replayed"),
        };
        run.record(&key, &reply, verdict);
    }
}

/// One line of the timeline: when the answer came (Unix ms), how long it took, what it was.
pub fn timeline_line(key: &str, reply: &Reply) -> String {
    let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    json!({
        "at_ms": at.as_millis() as u64,
        "latency_ms": reply.latency.as_secs_f64() * 1e3,
        "answer": reply.answer.label(),
        "key": key,
    })
    .to_string()
}
