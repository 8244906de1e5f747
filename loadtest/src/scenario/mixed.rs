//! Mixed traffic: new keys, replays and reused keys with another payload (`--mix`, default
//! 70/25/5), each request to the next target round-robin, so replays usually reach another server
//! than the one that created the payment.
//!
//! | request                      | allowed answer                                        |
//! |------------------------------|-------------------------------------------------------|
//! | new key                      | 201, not replayed, a succeeded payment of the amount  |
//! | same key, same payload       | 201 replayed, the original payment                    |
//! | same key, different payload  | 422 (`idempotency-key-reused`)                        |

use std::sync::Arc;

use serde_json::Value;

use super::{Run, payment, pays};
use crate::client::Answer;
use crate::stats::Verdict;

/// How many finished payments a worker remembers for replays and reuses.
const MEMORY: usize = 200;

/// A payment this worker created: what a replay or a reuse sends again.
struct Finished {
    key: String,
    body: Value,
    amount: i64,
    /// `pay_…`, what a replay must return.
    id: String,
}

pub async fn worker(run: Arc<Run>, worker: u32) {
    let mix = run.settings.mix;
    let mut finished: Vec<Finished> = Vec::new();
    let mut n = 0;
    while run.budget.allows_more() {
        let roll = fastrand::u32(0..100);
        if finished.is_empty() || roll < mix.new {
            let key = run.key(worker, n);
            n += 1;
            let amount = 100 + fastrand::i64(0..9900);
            let body = payment(amount);
            let reply = run.pay(run.api.next_target(), &key, &body).await;
            let verdict = match &reply.answer {
                answer @ Answer::Created(Some(p)) if pays(answer, amount) => {
                    finished.push(Finished { key: key.clone(), body, amount, id: p.id.clone() });
                    if finished.len() > MEMORY {
                        finished.remove(0);
                    }
                    Verdict::Expected
                }
                Answer::Created(_) => Verdict::Unexpected("not a succeeded payment of the amount sent"),
                _ => Verdict::Unexpected("a new key must be created"),
            };
            run.record(&key, &reply, verdict);
        } else {
            let original = &finished[fastrand::usize(0..finished.len())];
            if roll < mix.new + mix.replay {
                let reply = run.pay(run.api.next_target(), &original.key, &original.body).await;
                let verdict = match &reply.answer {
                    Answer::Replayed(Some(p)) if p.id == original.id && pays(&reply.answer, original.amount) => {
                        Verdict::Expected
                    }
                    Answer::Replayed(_) => Verdict::Unexpected("a replay with another payment"),
                    _ => Verdict::Unexpected("a retry with the same payload must be replayed"),
                };
                run.record(&original.key, &reply, verdict);
            } else {
                let changed = payment(original.amount + 1);
                let reply = run.pay(run.api.next_target(), &original.key, &changed).await;
                let verdict = match reply.answer {
                    Answer::KeyReused => Verdict::Expected,
                    _ => Verdict::Unexpected("a reused key with another payload must be refused with 422"),
                };
                run.record(&original.key, &reply, verdict);
            }
        }
    }
}
