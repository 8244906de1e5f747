//! Capture storm: authorize now, capture later, under fire. However many keys capture or cancel
//! one authorization at once, at most one capture or one cancel may reach the gateway.
//!
//! First `--payments` payments are authorized (`"capture": "manual"`, 10.00–99.99, `--concurrency`
//! at a time). Then each worker takes the next payment and storms it: `--keys` distinct keys,
//! alternately capturing it (all of it, or a random part) and cancelling it, each sent
//! `--duplicates` times (a double submit), every request of the storm released together by one
//! barrier, round-robin over the targets. A key with no final answer is retried by its client
//! after `Retry-After` (plus jittered backoff), up to `--max-attempts`. Once every key has its
//! answer, each is sent once more with the same request (a key answered 200 must be replayed, a
//! key refused must be refused again), and each key answered 200 once with another body (422).
//!
//! Allowed answers: 200 with the payment (fresh or replayed), 409 `payment-not-capturable` (another
//! key settled it first; this key was not used), 409 in flight and 503 with a `Retry-After` of at
//! least 1 s (the client retries), and 422 to the reuse. Anything else, a 500 or a 502 among them,
//! is unexpected. Whether the answers agree with one another, with payonce's payments and with the
//! ledger is the capture audit's ([`crate::capture_audit`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tokio::sync::Barrier;

use super::retry_storm::wait_before_retry;
use super::{Run, payment};
use crate::capture_audit::{Action, Authorized, Final, SettleKey, Storm};
use crate::client::{Answer, Reply};
use crate::stats::Verdict;

/// Authorizes `--payments` payments, `--concurrency` at a time, before any storm starts. Those
/// not authorized (an unexpected answer, counted as such) are left out of the storms.
pub async fn prepare(run: &Arc<Run>) -> Result<Vec<Authorized>, String> {
    let count = run.settings.payments as usize;
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..(run.settings.concurrency as usize).min(count))
        .map(|_| {
            let (run, next) = (run.clone(), next.clone());
            tokio::spawn(async move {
                let mut made = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= count {
                        break made;
                    }
                    made.extend(authorize(&run, n).await.map(|authorized| (n, authorized)));
                }
            })
        })
        .collect();
    let mut made = Vec::with_capacity(count);
    for task in tasks {
        made.extend(task.await.map_err(|err| format!("an authorization task failed: {err}"))?);
    }
    if made.is_empty() {
        return Err("no payment could be authorized (see the unexpected answers)".into());
    }
    made.sort_by_key(|(n, _)| *n);
    Ok(made.into_iter().map(|(_, authorized)| authorized).collect())
}

/// One authorization, retried with its key after a 409 or 503 as a client would.
async fn authorize(run: &Run, n: usize) -> Option<Authorized> {
    let key = format!("{}-auth-{n}", run.run_id);
    let amount = 1_000 + fastrand::i64(0..9_000);
    let mut body = payment(amount);
    body["capture"] = "manual".into();
    for attempt in 1..=run.settings.max_attempts {
        let reply = run.pay(run.api.next_target(), &key, &body).await;
        let authorized = match &reply.answer {
            Answer::Created(Some(p)) | Answer::Replayed(Some(p))
                if p.status == "requires_capture"
                    && p.amount == amount
                    && p.amount_capturable == amount
                    && p.amount_captured == 0
                    && p.id.starts_with("pay_") =>
            {
                p.payment_intent.clone().map(|payment_intent| Authorized {
                    key: key.clone(),
                    id: p.id.clone(),
                    amount,
                    payment_intent,
                })
            }
            _ => None,
        };
        let retry = matches!(reply.answer,
            Answer::InFlight { retry_after: Some(s) } | Answer::Unavailable { retry_after: Some(s) } if s >= 1);
        let verdict = match () {
            _ if authorized.is_some() => Verdict::Expected,
            _ if retry && attempt < run.settings.max_attempts => Verdict::Expected,
            _ if retry => Verdict::Unexpected("an authorization still without an answer after --max-attempts"),
            _ => Verdict::Unexpected("not an authorization (201 requires_capture) of the amount sent"),
        };
        run.stats.record(&reply, verdict);
        if authorized.is_some() || !retry {
            return authorized;
        }
        tokio::time::sleep(wait_before_retry(reply.answer.retry_after(), attempt)).await;
    }
    None
}

pub async fn worker(run: Arc<Run>, worker: u32) {
    let mut n = 0;
    while run.budget.allows_more() {
        let Some(paid) = run.next_to_storm() else { break };
        let storm = storm(&run, worker, n, paid).await;
        n += 1;
        run.stormed(storm);
    }
}

/// One payment's storm, its retries and the resend after it.
async fn storm(run: &Arc<Run>, worker: u32, n: u64, paid: &Authorized) -> Storm {
    let mut keys: Vec<SettleKey> = (0..run.settings.keys)
        .map(|i| {
            let action = if i % 2 == 0 {
                // Half the captures take all that is capturable, half a part of it.
                Action::Capture { amount: fastrand::bool().then(|| fastrand::i64(100..=paid.amount)) }
            } else {
                Action::Cancel
            };
            SettleKey::new(format!("{}-{i}-{}", run.key(worker, n), action.name()), action)
        })
        .collect();

    // Every request of every key at once, in a shuffled order (no key is always first in line).
    let duplicates = run.settings.duplicates as usize;
    let mut order: Vec<usize> = (0..keys.len()).flat_map(|i| std::iter::repeat_n(i, duplicates)).collect();
    fastrand::shuffle(&mut order);
    let barrier = Arc::new(Barrier::new(order.len()));
    let mut tasks = Vec::with_capacity(order.len());
    for i in order {
        let (run, barrier, body) = (run.clone(), barrier.clone(), body_of(keys[i].action));
        let (payment, name, action) = (paid.id.clone(), keys[i].key.clone(), keys[i].action.name());
        let target = run.api.next_target().to_owned();
        tasks.push((
            i,
            tokio::spawn(async move {
                barrier.wait().await;
                run.settle(&target, &payment, action, &name, &body).await
            }),
        ));
    }
    let mut retry_after = vec![None; keys.len()];
    for (i, task) in tasks {
        match task.await {
            Ok(reply) => {
                run.stats.record(&reply, judge(&reply.answer));
                match final_of(&reply) {
                    Some(answer) => keys[i].answers.push(answer),
                    None => retry_after[i] = retry_after[i].max(reply.answer.retry_after()),
                }
            }
            Err(err) => eprintln!("payonce-loadtest: a request task failed: {err}"),
        }
    }

    // A key none of whose requests got a final answer: its client comes back.
    let retries: Vec<_> = keys
        .iter()
        .enumerate()
        .filter(|(_, key)| key.answers.is_empty())
        .map(|(i, key)| {
            let (run, payment, key, wait) = (run.clone(), paid.id.clone(), key.clone(), retry_after[i]);
            (i, tokio::spawn(async move { until_final(&run, &payment, key, wait).await }))
        })
        .collect();
    for (i, task) in retries {
        match task.await {
            Ok(key) => keys[i] = key,
            Err(err) => eprintln!("payonce-loadtest: a retrying client failed: {err}"),
        }
    }

    resend(run, &paid.id, &mut keys).await;
    // A capture answered 200: the runner's charge audit holds the ledger to it as to any payment
    // believed paid (one charge under the authorization's key, naming its PaymentIntent).
    if keys.iter().any(|k| matches!(k.action, Action::Capture { .. }) && k.answers.iter().any(is_settled)) {
        run.believe(&paid.key, Some(paid.payment_intent.clone()));
    }
    Storm { payment: paid.id.clone(), keys }
}

/// A key's client retrying until a final answer, waiting `Retry-After` (plus jitter) each time.
async fn until_final(run: &Run, payment: &str, mut key: SettleKey, mut retry_after: Option<u64>) -> SettleKey {
    let body = body_of(key.action);
    for attempt in 1..=run.settings.max_attempts {
        tokio::time::sleep(wait_before_retry(retry_after, attempt)).await;
        let reply = run.settle(run.api.next_target(), payment, key.action.name(), &key.key, &body).await;
        run.stats.record(&reply, judge(&reply.answer));
        if let Some(answer) = final_of(&reply) {
            key.answers.push(answer);
            break;
        }
        if !matches!(reply.answer, Answer::InFlight { .. } | Answer::Unavailable { .. } | Answer::Timeout) {
            break;
        }
        retry_after = reply.answer.retry_after();
    }
    key
}

/// After the storm: every key with a final answer sent once more (a 200 must come back replayed,
/// a refusal refused again), and every key answered 200 sent with another body (422).
async fn resend(run: &Arc<Run>, payment: &str, keys: &mut [SettleKey]) {
    let tasks: Vec<_> = keys
        .iter()
        .enumerate()
        .filter(|(_, key)| !key.answers.is_empty())
        .map(|(i, key)| {
            let (run, payment, name, action) = (run.clone(), payment.to_owned(), key.key.clone(), key.action);
            let settled = key.answers.iter().any(is_settled);
            tokio::spawn(async move {
                let reply = run.settle(run.api.next_target(), &payment, action.name(), &name, &body_of(action)).await;
                let verdict = match (&reply.answer, settled) {
                    (Answer::Settled { replayed: true, .. }, true) | (Answer::NotCapturable, false) => {
                        Verdict::Expected
                    }
                    (_, true) => Verdict::Unexpected("after the storm, a key answered 200 is not replayed"),
                    (_, false) => Verdict::Unexpected("after the storm, a refused key is not refused again"),
                };
                run.stats.record(&reply, verdict);
                let resent = final_of(&reply).unwrap_or_else(|| Final::Other(reply.answer.label()));
                let reuse_refused = if settled {
                    let (route, other) = reused(action);
                    let reply = run.settle(run.api.next_target(), &payment, route, &name, &other).await;
                    let refused = reply.answer == Answer::KeyReused;
                    let verdict = match refused {
                        true => Verdict::Expected,
                        false => Verdict::Unexpected("a key reused with another body is not refused 422"),
                    };
                    run.stats.record(&reply, verdict);
                    Some(refused)
                } else {
                    None
                };
                (i, resent, reuse_refused)
            })
        })
        .collect();
    for task in tasks {
        match task.await {
            Ok((i, resent, reuse_refused)) => {
                keys[i].resent = Some(resent);
                keys[i].reuse_refused = reuse_refused;
            }
            Err(err) => eprintln!("payonce-loadtest: a resend failed: {err}"),
        }
    }
}

/// The body of a settle request.
fn body_of(action: Action) -> Value {
    match action {
        Action::Capture { amount: Some(amount) } => json!({"amount_to_capture": amount}),
        Action::Capture { amount: None } | Action::Cancel => json!({}),
    }
}

/// The same key with another request: a capture of another amount on the capture route; for a
/// cancel (whose body is always `{}`), a capture.
fn reused(action: Action) -> (&'static str, Value) {
    match action {
        Action::Capture { amount: Some(amount) } => ("capture", json!({"amount_to_capture": amount + 1})),
        Action::Capture { amount: None } => ("capture", json!({"amount_to_capture": 1})),
        Action::Cancel => ("capture", json!({})),
    }
}

/// Whether an answer is one a settle request may get (what it says is the audit's business).
fn judge(answer: &Answer) -> Verdict {
    match answer {
        Answer::Settled { payment: Some(_), .. } | Answer::NotCapturable => Verdict::Expected,
        Answer::Settled { payment: None, .. } => Verdict::Unexpected("a 200 that is not a payment"),
        Answer::InFlight { retry_after: Some(s) } | Answer::Unavailable { retry_after: Some(s) } if *s >= 1 => {
            Verdict::Expected
        }
        Answer::InFlight { .. } | Answer::Unavailable { .. } => {
            Verdict::Unexpected("without a Retry-After of at least 1 s")
        }
        _ => Verdict::Unexpected("not a 200, a 409 or a 503 with Retry-After"),
    }
}

/// A reply's final answer (a 200 or 409 `payment-not-capturable`), if it is one.
fn final_of(reply: &Reply) -> Option<Final> {
    match &reply.answer {
        Answer::Settled { replayed, .. } => Some(Final::Settled { replayed: *replayed, body: reply.body.clone() }),
        Answer::NotCapturable => Some(Final::Refused),
        _ => None,
    }
}

fn is_settled(answer: &Final) -> bool {
    matches!(answer, Final::Settled { .. })
}
