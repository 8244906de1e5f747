//! Double submit: many clients send the same key at the same instant, for many keys.
//!
//! Each operation takes a fresh key and sends `--duplicates` identical requests with it, from
//! as many tasks released together by a barrier, spread round-robin over the targets (so with
//! two servers on one database, the race is also between servers). Allowed answers: a 201 with
//! the payment (exactly one request per key may *create* it), a replayed 201 with the same
//! payment, or a 409 with `Retry-After`. Anything else is unexpected.

use std::sync::Arc;

use super::{Request, Run, payment, pays};
use crate::client::Answer;
use crate::stats::Verdict;

pub async fn worker(run: Arc<Run>, worker: u32) {
    let duplicates = run.settings.duplicates as usize;
    let mut n = 0;
    while run.budget.allows_more() {
        let key = run.key(worker, n);
        let amount = 1000 + (n % 1000) as i64;
        n += 1;
        let replies = run.burst(Request::Pay, &key, payment(amount), duplicates).await;

        // The payment every 201 must name: the creator's, else the first replay's.
        let first_payment = replies
            .iter()
            .find(|r| matches!(r.answer, Answer::Created(_)))
            .or_else(|| replies.iter().find(|r| matches!(r.answer, Answer::Replayed(_))))
            .and_then(|r| r.answer.payment())
            .map(|p| p.id.clone());
        let mut created = 0;
        for reply in &replies {
            let verdict = match &reply.answer {
                Answer::Created(_) | Answer::Replayed(_) if !pays(&reply.answer, amount) => {
                    Verdict::Unexpected("not a succeeded payment of the amount sent")
                }
                Answer::Created(_) if created > 0 => Verdict::Unexpected("a second request created the same key"),
                answer @ (Answer::Created(_) | Answer::Replayed(_))
                    if answer.payment().map(|p| &p.id) != first_payment.as_ref() =>
                {
                    Verdict::Unexpected("answers for one key name different payments")
                }
                Answer::Created(_) | Answer::Replayed(_) => Verdict::Expected,
                Answer::InFlight { retry_after: Some(secs) } if *secs >= 1 => Verdict::Expected,
                Answer::InFlight { .. } => Verdict::Unexpected("409 without a Retry-After of at least 1 s"),
                _ => Verdict::Unexpected("not a 201 or a 409"),
            };
            if matches!(reply.answer, Answer::Created(_)) {
                created += 1;
            }
            run.record(&key, reply, verdict);
        }
    }
}
