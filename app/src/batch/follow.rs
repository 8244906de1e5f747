//! Following the rows answered 202 until their payments are final.
//!
//! A 202 is the key's final answer (replayed as 202 for as long as the key lives, as Stripe
//! replays its first answer), but not the payment's: a bank debit `processing` may still fail.
//! So once every row is sent, the run asks `GET /v1/payments/{id}` about each pending row, again
//! and again with a growing pause, until it is `succeeded` (the row is then `charged`, or
//! `replayed` if its 202 was a replay) or `failed` (`failed`, exit 1), or until `--wait-timeout`
//! ends the wait (the row stays `pending`, exit 4). A re-run follows its 202 replays the same
//! way, so it tells the same truth. `--no-wait` skips all of this.
//!
//! Only reads: nothing here can charge anyone. A look-up that fails (a network error, a 503) is
//! tried again at the next round; the row stays pending until one succeeds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinSet;

use super::answer::{Outcome, RowResult};
use super::runner::{Runner, Stop};

/// The pause after the first round of look-ups; it doubles each round up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between two rounds.
const LONGEST_PAUSE: Duration = Duration::from_secs(15);

/// How long to pause after round `round` (0, 1, …): 0.5 s doubling to 15 s, with "equal jitter"
/// (between half of it and all of it) so that two runs do not ask in step.
pub fn pause(round: u32) -> Duration {
    let step = (FIRST_PAUSE * 2u32.pow(round.min(8))).min(LONGEST_PAUSE);
    step / 2 + (step / 2).mul_f64(fastrand::f64())
}

/// The row's result once its payment is final, as `payment` (the JSON of `GET /v1/payments/{id}`)
/// shows it; `None` while it is still pending.
pub fn settled(pending: &RowResult, payment: &Value) -> Option<RowResult> {
    let status = payment["status"].as_str()?;
    let first = pending.payment_status.as_deref().unwrap_or("pending");
    let (outcome, detail) = match status {
        "succeeded" => (
            if pending.replayed { Outcome::Replayed } else { Outcome::Charged },
            format!("202 {first}, then succeeded"),
        ),
        "failed" => {
            let failure = &payment["failure"];
            let code = failure["code"].as_str();
            // Stripe repeats the code as the decline code for some failures (`account_closed`).
            let decline_code = failure["decline_code"].as_str().filter(|d| Some(*d) != code);
            let why = [code, decline_code].into_iter().flatten().collect::<Vec<_>>().join("/");
            let message = failure["message"].as_str().filter(|m| !m.is_empty());
            let why = match (why.is_empty(), message) {
                (true, None) => "no reason given".to_owned(),
                (true, Some(message)) => message.to_owned(),
                (false, None) => why,
                (false, Some(message)) => format!("{why} ({message})"),
            };
            (Outcome::Failed, format!("{why}: 202 {first}, then failed at the gateway; not charged"))
        }
        _ => return None,
    };
    Some(RowResult { outcome, payment_status: Some(status.to_owned()), detail, ..pending.clone() })
}

/// The followed rows that ended, so far: what the progress lines say.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    succeeded: usize,
    failed: usize,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} succeeded, {} failed", self.succeeded, self.failed)
    }
}

/// Follows every pending row of `results` (those with a payment id) until its payment is final,
/// `wait` has passed, or the run is stopped; replaces the rows that settle. `concurrency`
/// look-ups at once.
pub async fn follow(runner: &Arc<Runner>, results: &mut [RowResult], wait: Duration, concurrency: usize, stop: &Stop) {
    let mut pending: Vec<usize> = (0..results.len())
        .filter(|&i| results[i].outcome == Outcome::Pending && results[i].payment_id.is_some())
        .collect();
    let total = pending.len();
    if total == 0 {
        return;
    }
    eprintln!(
        "payonce batch: following {total} pending payment(s) until they are final (GET /v1/payments/{{id}}; \
         at most {} s: --wait-timeout, --no-wait skips this)",
        wait.as_secs()
    );
    let started = Instant::now();
    let deadline = started + wait;
    let mut last_error = vec![None::<String>; results.len()];
    let mut tally = Tally::default();
    for round in 0.. {
        let mut looks = JoinSet::new();
        for &i in &pending {
            if looks.len() >= concurrency.max(1)
                && let Some(Ok((i, look))) = looks.join_next().await
            {
                apply(results, &mut last_error, &mut tally, i, look);
            }
            let (runner, id) = (runner.clone(), results[i].payment_id.clone().unwrap_or_default());
            looks.spawn(async move { (i, runner.look_up(&id).await) });
        }
        while let Some(joined) = looks.join_next().await {
            if let Ok((i, look)) = joined {
                apply(results, &mut last_error, &mut tally, i, look);
            }
        }
        pending.retain(|&i| results[i].outcome == Outcome::Pending);
        let now = Instant::now();
        if pending.is_empty() || now >= deadline {
            break;
        }
        let next = pause(round).min(deadline - now);
        eprintln!(
            "payonce batch: [{:7.1}s] {} of {total} payment(s) still pending ({}); next look in {:.1} s, \
             giving up in {:.0} s",
            started.elapsed().as_secs_f64(),
            pending.len(),
            tally,
            next.as_secs_f64(),
            (deadline - now).as_secs_f64().ceil(),
        );
        if !stop.sleep(next).await {
            break;
        }
    }
    for &i in &pending {
        let status = results[i].payment_status.clone().unwrap_or_else(|| "pending".into());
        let why = match &last_error[i] {
            Some(err) => format!(" (last look-up: {err})"),
            None => String::new(),
        };
        results[i].detail = format!(
            "still {status} after {} s of following{why}: not final yet; run the batch again later to follow it",
            started.elapsed().as_secs()
        );
    }
    if pending.is_empty() {
        eprintln!("payonce batch: every followed payment is final ({tally})");
    } else {
        eprintln!(
            "payonce batch: {} of {total} payment(s) still pending after {} s ({tally}): reported as pending",
            pending.len(),
            started.elapsed().as_secs()
        );
    }
}

/// Takes one look-up's answer into row `i`.
fn apply(
    results: &mut [RowResult],
    last_error: &mut [Option<String>],
    tally: &mut Tally,
    i: usize,
    look: Result<Value, String>,
) {
    match look {
        Ok(payment) => {
            last_error[i] = None;
            match settled(&results[i], &payment) {
                Some(done) => {
                    if done.outcome == Outcome::Failed {
                        tally.failed += 1;
                    } else {
                        tally.succeeded += 1;
                    }
                    results[i] = done;
                }
                None => results[i].payment_status = payment["status"].as_str().map(str::to_owned),
            }
        }
        Err(err) => last_error[i] = Some(err),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pending(replayed: bool) -> RowResult {
        RowResult {
            outcome: Outcome::Pending,
            status: Some(202),
            payment_id: Some("pay_1".into()),
            payment_status: Some("processing".into()),
            replayed,
            detail: "pending at the gateway".into(),
        }
    }

    /// A succeeded payment is the row charged (replayed, if its 202 was a replay); a failed one is
    /// `failed` with the gateway's reason; anything else is still pending.
    #[test]
    fn what_a_look_up_says() {
        let charged = settled(&pending(false), &json!({"status": "succeeded"})).unwrap();
        assert_eq!((charged.outcome, charged.payment_status.as_deref()), (Outcome::Charged, Some("succeeded")));
        assert_eq!((charged.status, charged.detail.as_str()), (Some(202), "202 processing, then succeeded"));
        let replayed = settled(&pending(true), &json!({"status": "succeeded"})).unwrap();
        assert_eq!((replayed.outcome, replayed.replayed), (Outcome::Replayed, true));
        let failed = settled(
            &pending(false),
            &json!({"status": "failed", "failure": {"code": "account_closed", "decline_code": "account_closed", "message": "The account is closed."}}),
        )
        .unwrap();
        assert_eq!((failed.outcome, failed.payment_status.as_deref()), (Outcome::Failed, Some("failed")));
        assert!(
            failed.detail.starts_with("account_closed (The account is closed.): 202 processing"),
            "{}",
            failed.detail
        );
        for status in ["processing", "requires_action", "pending"] {
            assert_eq!(settled(&pending(false), &json!({ "status": status })), None, "{status}");
        }
        assert_eq!(settled(&pending(false), &json!({})), None);
    }

    /// The pause doubles from 0.5 s to 15 s, never below half of its step.
    #[test]
    fn pauses_grow_to_a_cap() {
        for _ in 0..100 {
            let first = pause(0);
            assert!(first >= Duration::from_millis(250) && first <= Duration::from_millis(500), "{first:?}");
            let late = pause(u32::MAX);
            assert!(late >= Duration::from_millis(7500) && late <= LONGEST_PAUSE, "{late:?}");
        }
    }
}
