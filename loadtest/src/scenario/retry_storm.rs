//! Retry storm: clients with a short timeout retry with the same key until they get a 201,
//! against a gateway made slow and flaky through the simulator's faults (see `--faults`).
//!
//! Each operation is one payment: up to `--max-attempts` requests with the same key and payload,
//! each abandoned after `--client-timeout`. Between attempts the client waits at least
//! `Retry-After` when the server sent one (409 in flight, 503 gateway unavailable), plus an
//! exponential backoff with full jitter, so that clients that failed together do not come back
//! together. Allowed answers: 201 (fresh or replayed, with the payment), 409 and 503 with
//! `Retry-After`, and client timeouts; with `--retry-transport-errors` (a run that kills servers
//! on purpose) also a refused or reset connection, retried like a 503.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Run, payment, pays};
use crate::client::Answer;
use crate::stats::{Verdict, is_success};

/// The first backoff step; doubles with each attempt.
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// The largest backoff step.
const BACKOFF_CAP: Duration = Duration::from_secs(2);

pub async fn worker(run: Arc<Run>, worker: u32) {
    let mut n = 0;
    while run.budget.allows_more() {
        let key = run.key(worker, n);
        n += 1;
        let amount = 100 + fastrand::i64(0..9900);
        let body = payment(amount);
        let started = Instant::now();
        let mut attempt = 0;
        let succeeded = loop {
            attempt += 1;
            let reply = run.pay(run.api.next_target(), &key, &body).await;
            let verdict = match &reply.answer {
                answer if is_success(answer) && pays(answer, amount) => Verdict::Expected,
                answer if is_success(answer) => Verdict::Unexpected("not a succeeded payment of the amount sent"),
                Answer::InFlight { retry_after: Some(s) } | Answer::Unavailable { retry_after: Some(s) } if *s >= 1 => {
                    Verdict::Expected
                }
                Answer::InFlight { .. } | Answer::Unavailable { .. } => {
                    Verdict::Unexpected("without a Retry-After of at least 1 s")
                }
                Answer::Timeout => Verdict::Expected,
                Answer::Transport(_) if run.settings.retry_transport_errors => Verdict::Expected,
                _ => Verdict::Unexpected("not a 201, 409, 503 or client timeout"),
            };
            run.record(&key, &reply, verdict);
            if is_success(&reply.answer) {
                break true;
            }
            let retryable =
                matches!(reply.answer, Answer::InFlight { .. } | Answer::Unavailable { .. } | Answer::Timeout)
                    || (run.settings.retry_transport_errors && matches!(reply.answer, Answer::Transport(_)));
            if !retryable || attempt >= run.settings.max_attempts {
                break false;
            }
            tokio::time::sleep(wait_before_retry(reply.answer.retry_after(), attempt)).await;
        };
        if succeeded {
            run.stats.payment_completed(attempt, started.elapsed());
        } else {
            run.stats.payment_given_up(attempt);
        }
    }
}

/// How long to wait after the `attempt`-th attempt: at least `Retry-After` when given, plus a
/// backoff drawn uniformly from `0..min(cap, base · 2^(attempt-1))` ("full jitter").
pub(super) fn wait_before_retry(retry_after: Option<u64>, attempt: u32) -> Duration {
    let ceiling = BACKOFF_BASE.saturating_mul(1 << (attempt - 1).min(16)).min(BACKOFF_CAP);
    let backoff = ceiling.mul_f64(fastrand::f64());
    Duration::from_secs(retry_after.unwrap_or(0)) + backoff
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retry-After is a floor; the jitter stays under the doubling ceiling and the cap.
    #[test]
    fn waits() {
        for attempt in 1..=20 {
            let ceiling = BACKOFF_BASE.saturating_mul(1 << (attempt - 1).min(16)).min(BACKOFF_CAP);
            let wait = wait_before_retry(None, attempt);
            assert!(wait <= ceiling && ceiling <= BACKOFF_CAP, "attempt {attempt}: {wait:?}");
            let wait = wait_before_retry(Some(5), attempt);
            assert!(wait >= Duration::from_secs(5) && wait <= Duration::from_secs(5) + BACKOFF_CAP);
        }
    }
}
