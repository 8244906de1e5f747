//! Refund storm: many keys, each sent by many clients at once, refunding random parts of the
//! same few payments, so that their sums overlap and exceed what was paid.
//!
//! First `--payments` payments of [`PAYMENT_AMOUNT`] are made (one key each, like any payment).
//! Then each operation takes a fresh key, one of those payments at random and a random part of
//! it (2–30 %), and sends `--duplicates` identical `POST /v1/refunds` with it, from as many tasks
//! released together by a barrier, round-robin over the targets. Keys race keys for what remains
//! of a payment (only the database's reservation keeps their sum under the amount), and
//! duplicates race each other for their key.
//!
//! Allowed answers: a 201 with the refund of the amount asked (exactly one request per key may
//! *create* it; every 201 of a key names the same refund), a 409 `refund-exceeds-payment` (the
//! payment has not that much left; then every final answer of the key is that one), a 409 in
//! flight with `Retry-After`, and a 503 with `Retry-After` (only under `--faults`). The refund
//! audit ([`crate::refund_audit`]) then holds the ledger to what the clients were told.

use std::sync::Arc;

use serde_json::json;

use super::{Request, Run, payment, pays};
use crate::client::Answer;
use crate::refund_audit::{Paid, RefundKey, Settled};
use crate::stats::Verdict;

/// What each payment of the storm charges.
pub const PAYMENT_AMOUNT: i64 = 10_000;

/// Makes the payments the storm refunds, one after the other, before any worker starts.
pub async fn prepare(run: &Run) -> Result<Vec<Paid>, String> {
    let mut paid = Vec::with_capacity(run.settings.payments as usize);
    for n in 0..run.settings.payments {
        let key = format!("{}-payment-{n}", run.run_id);
        let target = run.api.next_target().to_owned();
        let reply = run.api.pay(&target, &key, &payment(PAYMENT_AMOUNT), run.settings.client_timeout).await;
        let made = pays(&reply.answer, PAYMENT_AMOUNT);
        run.record(
            &key,
            &reply,
            if made { Verdict::Expected } else { Verdict::Unexpected("a payment to refund failed") },
        );
        match reply.answer.payment() {
            Some(p) if made => paid.push(Paid {
                id: p.id.clone(),
                amount: p.amount,
                payment_intent: p.payment_intent.clone().unwrap_or_default(),
            }),
            _ => {
                return Err(format!(
                    "could not make the payments to refund: {key} was answered {}",
                    reply.answer.label()
                ));
            }
        }
    }
    Ok(paid)
}

pub async fn worker(run: Arc<Run>, worker: u32) {
    let payments = run.refundable();
    if payments.is_empty() {
        return;
    }
    let duplicates = run.settings.duplicates as usize;
    let mut n = 0;
    while run.budget.allows_more() {
        let key = run.key(worker, n);
        n += 1;
        let paid = &payments[fastrand::usize(..payments.len())];
        let amount = (paid.amount * fastrand::i64(2..=30) / 100).max(1);
        let replies = run.burst(Request::Refund, &key, json!({"payment": paid.id, "amount": amount}), duplicates).await;

        // The refund every 201 must name: the creator's, else the first replay's.
        let first_refund = replies
            .iter()
            .find(|r| matches!(r.answer, Answer::Refunded { replayed: false, .. }))
            .or_else(|| replies.iter().find(|r| matches!(r.answer, Answer::Refunded { .. })))
            .and_then(|r| r.answer.refund())
            .cloned();
        let exceeded = replies.iter().any(|r| r.answer == Answer::ExceedsPayment);
        let mut created = 0;
        for reply in &replies {
            let verdict = match &reply.answer {
                Answer::Refunded { refund, .. }
                    if !refund.as_ref().is_some_and(|r| {
                        r.amount == amount
                            && r.payment == paid.id
                            && r.id.starts_with("re_")
                            && (r.status == "succeeded" || r.status == "pending")
                    }) =>
                {
                    Verdict::Unexpected("not a refund of the amount sent, of that payment")
                }
                Answer::Refunded { .. } if exceeded => {
                    Verdict::Unexpected("one key answered both 201 and 409 refund-exceeds-payment")
                }
                Answer::Refunded { replayed: false, .. } if created > 0 => {
                    Verdict::Unexpected("a second request created the same key")
                }
                Answer::Refunded { refund, .. }
                    if refund.as_ref().map(|r| &r.id) != first_refund.as_ref().map(|r| &r.id) =>
                {
                    Verdict::Unexpected("answers for one key name different refunds")
                }
                Answer::Refunded { .. } | Answer::ExceedsPayment => Verdict::Expected,
                Answer::InFlight { retry_after: Some(secs) } if *secs >= 1 => Verdict::Expected,
                Answer::InFlight { .. } => Verdict::Unexpected("409 without a Retry-After of at least 1 s"),
                Answer::Unavailable { retry_after: Some(secs) } if *secs >= 1 && run.settings.faulty => {
                    Verdict::Expected
                }
                _ => Verdict::Unexpected("not a 201, a 409 or (under faults) a 503"),
            };
            if matches!(reply.answer, Answer::Refunded { replayed: false, .. }) {
                created += 1;
            }
            run.stats.record(reply, verdict);
        }
        let settled = match (first_refund, exceeded) {
            (Some(refund), _) => Settled::Refunded(refund),
            (None, true) => Settled::Exceeded,
            (None, false) => Settled::Unsettled,
        };
        run.refund_key(RefundKey { key, payment: paid.id.clone(), amount, settled });
    }
}
