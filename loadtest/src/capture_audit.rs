//! The capture audit of a capture storm: what the clients were told, payonce's payments (as its
//! database holds them, through `GET /v1/payments/{id}`) and the simulator's ledger, against one
//! another.
//!
//! An authorization moves no money: it is never in the ledger. A capture is one ledger entry, of
//! the amount captured, naming the PaymentIntent (and, in its metadata, the authorization's
//! `payonce_idempotency_key`). A cancel moves no money. So, per payment of the storm:
//!
//! - at most one key is answered 200 (**settled twice** otherwise: two settlements told);
//! - at most one ledger entry (**captured twice** at the gateway otherwise);
//! - a key answered 200 to a capture ⇔ exactly one entry, of the amount the 200 says was captured
//!   (**captured without an entry**, **another amount**); a key answered 200 to a cancel ⇔ no
//!   entry (**canceled yet captured**); an entry, or a settled payment at payonce, with no key
//!   answered 200 is **settled untold** (the money moved, or the hold was released, and no client
//!   was told: a lost acknowledgement);
//! - payonce's payment says what the answers and the ledger say: `succeeded` with that
//!   `amount_captured`, `canceled`, or still `requires_capture` (**payonce disagrees**);
//! - a 200 is the settlement that key asked for, of that payment (**not what was asked**).
//!
//! Per key: at most one request creates its answer (**answered fresh twice**); every 200 of the key
//! is the same bytes (**replays differ**); a key answered 200 is never also refused 409
//! `payment-not-capturable` (**both 200 and 409**); every key ends with a final answer (**no
//! final answer**); a key answered 200, sent again after the storm, is answered with the replay
//! (**lost acknowledgement**), and sent with another body, 422 (**reuse not refused**).
//! Ledger entries of the run's keys that belong to no authorization of the run are **unknown**.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::client::Payment;
use crate::simulator::Charge;

/// A payment authorized before the storm (`"capture": "manual"`).
#[derive(Debug, Clone)]
pub struct Authorized {
    /// The authorization's `Idempotency-Key` (the ledger's `payonce_idempotency_key`).
    pub key: String,
    /// `pay_…`
    pub id: String,
    /// What was authorized (all of it capturable).
    pub amount: i64,
    /// `pi_…`: what a capture's ledger entry names.
    pub payment_intent: String,
}

/// What a settle key asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// `POST /v1/payments/{id}/capture`, of `amount_to_capture` (all that is capturable when none).
    Capture { amount: Option<i64> },
    /// `POST /v1/payments/{id}/cancel`.
    Cancel,
}

impl Action {
    /// The route's last segment: `capture` or `cancel`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Capture { .. } => "capture",
            Self::Cancel => "cancel",
        }
    }
}

/// A final answer to a settle request (409 in flight and 503 are not final: the client retries).
#[derive(Debug, Clone, PartialEq)]
pub enum Final {
    /// 200 with the payment; `replayed` with `Idempotent-Replayed: true`.
    Settled { replayed: bool, body: Vec<u8> },
    /// 409 `payment-not-capturable`: another key settled the payment (this key was not used).
    Refused,
    /// Any other answer, by label (only recorded for the key sent again after the storm).
    Other(String),
}

/// One key of a storm: what it asked, and every final answer it got.
#[derive(Debug, Clone)]
pub struct SettleKey {
    pub key: String,
    pub action: Action,
    /// The final answers of the storm and of the client's retries, in the order they came.
    pub answers: Vec<Final>,
    /// The key sent once more after the storm, with the same request: what came back.
    pub resent: Option<Final>,
    /// A key answered 200, sent again with another body: whether that was refused 422.
    pub reuse_refused: Option<bool>,
}

impl SettleKey {
    pub fn new(key: String, action: Action) -> Self {
        Self { key, action, answers: Vec::new(), resent: None, reuse_refused: None }
    }

    /// Every 200 body of the key, the one sent again after the storm included.
    fn settled(&self) -> impl Iterator<Item = (bool, &[u8])> {
        self.answers.iter().chain(&self.resent).filter_map(|answer| match answer {
            Final::Settled { replayed, body } => Some((*replayed, body.as_slice())),
            _ => None,
        })
    }

    fn was_settled(&self) -> bool {
        self.answers.iter().any(|a| matches!(a, Final::Settled { .. }))
    }

    fn was_refused(&self) -> bool {
        self.answers.iter().chain(&self.resent).any(|a| *a == Final::Refused)
    }
}

/// One payment's storm: every key that tried to settle it.
#[derive(Debug, Clone)]
pub struct Storm {
    /// `pay_…`
    pub payment: String,
    pub keys: Vec<SettleKey>,
}

/// The verdict of the answers, payonce's payments and the ledger on one capture storm.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CaptureAudit {
    pub payments_authorized: usize,
    /// What the authorizations held, together.
    pub amount_authorized: i64,
    pub payments_stormed: usize,
    pub keys: usize,
    pub capture_keys: usize,
    pub cancel_keys: usize,
    /// Keys answered 200 (their settlement was made).
    pub keys_settled: usize,
    /// Keys answered 409 `payment-not-capturable` (another key settled the payment first).
    pub keys_refused: usize,
    /// 200s: fresh, and replayed (the storm's duplicates and the resend after it).
    pub answered_200_fresh: usize,
    pub answered_200_replayed: usize,
    /// Payments a key was told were captured, the amount those 200s say, and those told canceled.
    pub payments_captured: usize,
    pub amount_captured_answers: i64,
    pub payments_canceled: usize,
    /// Payments no key settled (not stormed, or every key refused).
    pub payments_unsettled: usize,
    /// Ledger entries of the run's authorizations, and their amount.
    pub ledger_captures: usize,
    pub amount_captured_ledger: i64,
    /// Keys answered 200 sent again after the storm, and those sent with another body.
    pub resent: usize,
    pub reuse_probes: usize,
    // Violations, each a list of payment ids or keys.
    pub settled_twice: Vec<String>,
    pub captured_twice: Vec<String>,
    pub captured_without_entry: Vec<String>,
    pub other_amount: Vec<String>,
    pub canceled_yet_captured: Vec<String>,
    pub settled_untold: Vec<String>,
    pub payonce_disagrees: Vec<String>,
    pub not_what_was_asked: Vec<String>,
    pub answered_fresh_twice: Vec<String>,
    pub replays_differ: Vec<String>,
    pub settled_and_refused: Vec<String>,
    pub no_final_answer: Vec<String>,
    pub lost_acknowledgements: Vec<String>,
    pub reuse_not_refused: Vec<String>,
    pub unknown_entries: Vec<String>,
}

impl CaptureAudit {
    /// Audits the storms of `run_id`: its `authorized` payments, the `storms` (one per payment
    /// stormed), the `ledger` and payonce's view of each payment now (`shown`, by id).
    pub fn new(
        run_id: &str,
        authorized: &[Authorized],
        storms: &[Storm],
        ledger: &[Charge],
        shown: &HashMap<String, Payment>,
    ) -> Self {
        let prefix = format!("{run_id}-");
        let mut audit = Self {
            payments_authorized: authorized.len(),
            amount_authorized: authorized.iter().map(|a| a.amount).sum(),
            payments_stormed: storms.len(),
            ..Self::default()
        };
        // The run's ledger entries, each claimed by the authorization it names (by PaymentIntent,
        // or by the authorization's key in its metadata: an entry under another PaymentIntent is
        // a second movement of money for that authorization all the same).
        let run_entries: Vec<&Charge> = ledger
            .iter()
            .filter(|c| c.metadata.get("payonce_idempotency_key").is_some_and(|k| k.starts_with(&prefix)))
            .collect();
        let mut entries: HashMap<&str, Vec<&Charge>> = HashMap::new();
        for entry in &run_entries {
            let owner = authorized.iter().find(|a| {
                a.payment_intent == entry.payment_intent
                    || entry.metadata.get("payonce_idempotency_key") == Some(&a.key)
            });
            match owner {
                Some(a) => entries.entry(a.id.as_str()).or_default().push(entry),
                None => audit.unknown_entries.push(entry.payment_intent.clone()),
            }
        }
        audit.ledger_captures = run_entries.len();
        audit.amount_captured_ledger = run_entries.iter().map(|c| c.amount).sum();

        let by_payment: HashMap<&str, &Storm> = storms.iter().map(|s| (s.payment.as_str(), s)).collect();
        for paid in authorized {
            let keys = by_payment.get(paid.id.as_str()).map_or(&[][..], |s| s.keys.as_slice());
            let entries = entries.get(paid.id.as_str()).map_or(&[][..], Vec::as_slice);
            audit.payment(paid, keys, entries, shown.get(&paid.id));
        }
        for list in [&mut audit.unknown_entries, &mut audit.settled_twice, &mut audit.captured_twice] {
            list.sort();
        }
        audit
    }

    /// One payment: its keys, its ledger entries, payonce's view of it.
    fn payment(&mut self, paid: &Authorized, keys: &[SettleKey], entries: &[&Charge], shown: Option<&Payment>) {
        for key in keys {
            self.key(paid, key);
        }
        if entries.len() > 1 {
            self.captured_twice.push(paid.id.clone());
        }
        let winners: Vec<&SettleKey> = keys.iter().filter(|k| k.was_settled()).collect();
        if winners.len() > 1 {
            self.settled_twice.push(paid.id.clone());
        }
        // What payonce must show: the first winner's settlement (one, when all is well).
        let told = winners.first().and_then(|winner| {
            let (_, body) = winner.settled().next()?;
            Some((winner, serde_json::from_slice::<Payment>(body).ok()?))
        });
        let amount_captured_told = match &told {
            Some((winner, payment)) if matches!(winner.action, Action::Capture { .. }) => {
                self.payments_captured += 1;
                self.amount_captured_answers += payment.amount_captured;
                match entries {
                    [] => self.captured_without_entry.push(winner.key.clone()),
                    [entry] if entry.amount != payment.amount_captured => self.other_amount.push(winner.key.clone()),
                    _ => {}
                }
                Some(payment.amount_captured)
            }
            Some((winner, _)) => {
                self.payments_canceled += 1;
                if !entries.is_empty() {
                    self.canceled_yet_captured.push(winner.key.clone());
                }
                None
            }
            None => {
                self.payments_unsettled += 1;
                let settled_at_payonce = shown.is_some_and(|p| p.status != "requires_capture");
                if !entries.is_empty() || settled_at_payonce {
                    self.settled_untold.push(paid.id.clone());
                }
                None
            }
        };
        let agrees = shown.is_some_and(|p| {
            let (status, captured, capturable) = match (&told, amount_captured_told) {
                (Some(_), Some(captured)) => ("succeeded", captured, 0),
                (Some(_), None) => ("canceled", 0, 0),
                (None, _) => ("requires_capture", 0, paid.amount),
            };
            p.status == status && p.amount_captured == captured && p.amount_capturable == capturable
        });
        // A payment whose answers already contradict each other is reported there.
        if !agrees && winners.len() <= 1 {
            self.payonce_disagrees.push(paid.id.clone());
        }
    }

    /// One key: its answers against one another and against what it asked.
    fn key(&mut self, paid: &Authorized, key: &SettleKey) {
        self.keys += 1;
        match key.action {
            Action::Capture { .. } => self.capture_keys += 1,
            Action::Cancel => self.cancel_keys += 1,
        }
        let settled: Vec<(bool, &[u8])> = key.settled().collect();
        let fresh = settled.iter().filter(|(replayed, _)| !replayed).count();
        self.answered_200_fresh += fresh;
        self.answered_200_replayed += settled.len() - fresh;
        if fresh > 1 {
            self.answered_fresh_twice.push(key.key.clone());
        }
        if settled.iter().any(|(_, body)| *body != settled[0].1) {
            self.replays_differ.push(key.key.clone());
        }
        let refused = key.was_refused();
        match (key.was_settled(), refused) {
            (true, true) => self.settled_and_refused.push(key.key.clone()),
            (true, false) => self.keys_settled += 1,
            (false, true) => self.keys_refused += 1,
            (false, false) => self.no_final_answer.push(key.key.clone()),
        }
        if let Some((_, body)) = settled.first()
            && !is_what_was_asked(paid, key.action, body)
        {
            self.not_what_was_asked.push(key.key.clone());
        }
        if key.was_settled() {
            match &key.resent {
                Some(Final::Settled { .. }) => self.resent += 1,
                Some(_) => {
                    self.resent += 1;
                    self.lost_acknowledgements.push(key.key.clone());
                }
                None => {}
            }
        }
        if let Some(refused) = key.reuse_refused {
            self.reuse_probes += 1;
            if !refused {
                self.reuse_not_refused.push(key.key.clone());
            }
        }
    }

    /// Everything that fails the run, as sentences.
    pub fn violations(&self) -> Vec<String> {
        self.checks()
            .iter()
            .filter(|check| !check.found.is_empty())
            .map(|check| format!("{} {}", check.found.len(), check.sentence))
            .collect()
    }

    /// Every check, in the order the table shows them.
    pub fn checks(&self) -> [Check<'_>; 15] {
        let check = |found, row, tag, sentence| Check { found, row, tag, sentence };
        [
            check(
                &self.settled_twice,
                "settled twice (answers)",
                "SETTLED TWICE",
                "payment(s) settled by two keys (two 200s)",
            ),
            check(
                &self.captured_twice,
                "captured twice (ledger)",
                "CAPTURED TWICE",
                "payment(s) with more than one capture in the ledger",
            ),
            check(
                &self.captured_without_entry,
                "200 capture, no entry",
                "CAPTURED WITHOUT ENTRY",
                "capture(s) answered 200 with no ledger entry",
            ),
            check(
                &self.other_amount,
                "200 capture, other amount",
                "OTHER AMOUNT",
                "capture(s) whose ledger entry is not the amount answered",
            ),
            check(
                &self.canceled_yet_captured,
                "200 cancel, yet an entry",
                "CANCELED YET CAPTURED",
                "cancel(s) answered 200 of a payment captured",
            ),
            check(
                &self.settled_untold,
                "settled, no 200 told",
                "SETTLED UNTOLD",
                "payment(s) settled with no key answered 200",
            ),
            check(
                &self.payonce_disagrees,
                "payonce shows otherwise",
                "PAYONCE DISAGREES",
                "payment(s) payonce shows otherwise than answered",
            ),
            check(
                &self.not_what_was_asked,
                "200 not what was asked",
                "NOT WHAT WAS ASKED",
                "200(s) that are not the settlement the key asked for",
            ),
            check(
                &self.answered_fresh_twice,
                "key answered fresh twice",
                "FRESH TWICE",
                "key(s) answered 200 fresh (not replayed) more than once",
            ),
            check(&self.replays_differ, "key's 200s differ", "REPLAYS DIFFER", "key(s) whose 200s differ"),
            check(
                &self.settled_and_refused,
                "key answered 200 and 409",
                "200 AND 409",
                "key(s) answered both 200 and 409 payment-not-capturable",
            ),
            check(&self.no_final_answer, "key with no final answer", "NO FINAL ANSWER", "key(s) with no final answer"),
            check(
                &self.lost_acknowledgements,
                "lost acknowledgements",
                "LOST ACKNOWLEDGEMENT",
                "key(s) answered 200 not replayed after the storm",
            ),
            check(
                &self.reuse_not_refused,
                "reuse not refused 422",
                "REUSE NOT REFUSED",
                "key(s) reused with another body and not refused 422",
            ),
            check(
                &self.unknown_entries,
                "entries of no authorization",
                "UNKNOWN ENTRY",
                "ledger entries of the run that belong to no authorization",
            ),
        ]
    }
}

/// One check of the capture audit.
pub struct Check<'a> {
    /// The payments or keys (or PaymentIntents) found: none, when it holds.
    pub found: &'a [String],
    /// Its line in the table.
    pub row: &'static str,
    /// The word before each one listed.
    pub tag: &'static str,
    /// The verdict's sentence, after the count.
    pub sentence: &'static str,
}

/// Whether a 200's body is the settlement `action` asked for, of `paid`.
fn is_what_was_asked(paid: &Authorized, action: Action, body: &[u8]) -> bool {
    let Ok(payment) = serde_json::from_slice::<Payment>(body) else { return false };
    let of_it = payment.id == paid.id && payment.payment_intent.as_deref() == Some(&paid.payment_intent);
    of_it
        && payment.amount_capturable == 0
        && match action {
            Action::Capture { amount } => {
                payment.status == "succeeded" && payment.amount_captured == amount.unwrap_or(paid.amount)
            }
            Action::Cancel => payment.status == "canceled" && payment.amount_captured == 0,
        }
}

/// How many answers were a 5xx other than the honest 503 (labelled `503 unavailable`), from the
/// run's counts by answer label: each of them fails the run.
pub fn server_errors(answers: &BTreeMap<String, u64>) -> u64 {
    answers.iter().filter(|(label, _)| label.len() == 3 && label.starts_with('5')).map(|(_, n)| n).sum()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn authorized(n: u32, amount: i64) -> Authorized {
        Authorized { key: format!("run-auth-{n}"), id: format!("pay_{n}"), amount, payment_intent: format!("pi_{n}") }
    }

    /// The payment as a 200 (or payonce's `GET`) shows it.
    fn shown(paid: &Authorized, status: &str, captured: i64) -> Payment {
        let capturable = if status == "requires_capture" { paid.amount } else { 0 };
        serde_json::from_value(json!({
            "id": paid.id, "amount": paid.amount, "status": status, "payment_intent": paid.payment_intent,
            "amount_captured": captured, "amount_capturable": capturable,
        }))
        .unwrap()
    }

    fn body(paid: &Authorized, status: &str, captured: i64) -> Vec<u8> {
        let p = shown(paid, status, captured);
        json!({"id": p.id, "amount": p.amount, "status": p.status, "payment_intent": p.payment_intent,
               "amount_captured": p.amount_captured, "amount_capturable": p.amount_capturable})
        .to_string()
        .into_bytes()
    }

    fn entry(paid: &Authorized, intent: &str, amount: i64) -> Charge {
        Charge {
            payment_intent: intent.into(),
            idempotency_key: Some(format!("payonce-charge-{}", paid.id)),
            amount,
            metadata: BTreeMap::from([("payonce_idempotency_key".into(), paid.key.clone())]),
        }
    }

    /// A key answered `answers`, then sent again after the storm (replayed when it was settled).
    fn key(name: &str, action: Action, answers: Vec<Final>) -> SettleKey {
        let resent = answers.iter().find_map(|a| match a {
            Final::Settled { body, .. } => Some(Final::Settled { replayed: true, body: body.clone() }),
            _ => None,
        });
        let reuse_refused = resent.is_some().then_some(true);
        let resent = resent.or(Some(Final::Refused));
        SettleKey { key: name.into(), action, answers, resent, reuse_refused }
    }

    fn ok(body: &[u8]) -> Final {
        Final::Settled { replayed: false, body: body.to_vec() }
    }

    fn replay(body: &[u8]) -> Final {
        Final::Settled { replayed: true, body: body.to_vec() }
    }

    const FULL: Action = Action::Capture { amount: None };

    /// A clean storm: one payment captured in part, one canceled, one never stormed; every other
    /// key refused; another run's entry ignored.
    #[test]
    fn a_clean_storm_passes() {
        let (a, b, c) = (authorized(1, 5_000), authorized(2, 3_000), authorized(3, 2_000));
        let part = Action::Capture { amount: Some(1_200) };
        let captured = body(&a, "succeeded", 1_200);
        let canceled = body(&b, "canceled", 0);
        let storms = [
            Storm {
                payment: a.id.clone(),
                keys: vec![
                    key("run-1-0-capture", part, vec![ok(&captured), replay(&captured)]),
                    key("run-1-1-cancel", Action::Cancel, vec![Final::Refused, Final::Refused]),
                ],
            },
            Storm {
                payment: b.id.clone(),
                keys: vec![
                    key("run-2-0-capture", FULL, vec![Final::Refused]),
                    key("run-2-1-cancel", Action::Cancel, vec![ok(&canceled)]),
                ],
            },
        ];
        let mut other = entry(&a, "pi_other", 99);
        other.metadata.insert("payonce_idempotency_key".into(), "other-run-1".into());
        let ledger = [entry(&a, &a.payment_intent, 1_200), other];
        let shown = HashMap::from([
            (a.id.clone(), shown(&a, "succeeded", 1_200)),
            (b.id.clone(), shown(&b, "canceled", 0)),
            (c.id.clone(), shown(&c, "requires_capture", 0)),
        ]);
        let audit = CaptureAudit::new("run", &[a, b, c], &storms, &ledger, &shown);
        assert!(audit.violations().is_empty(), "{audit:#?}");
        assert_eq!((audit.payments_captured, audit.payments_canceled, audit.payments_unsettled), (1, 1, 1));
        assert_eq!((audit.keys_settled, audit.keys_refused, audit.ledger_captures), (2, 2, 1));
        assert_eq!((audit.amount_captured_answers, audit.amount_captured_ledger), (1_200, 1_200));
        assert_eq!((audit.answered_200_fresh, audit.answered_200_replayed), (2, 3));
    }

    /// The fabricated double capture: the payment was captured once through payonce and a
    /// second time at the gateway under another PaymentIntent (as a payonce that lost its
    /// settlement would). The audit fails the run on it, naming the payment.
    #[test]
    fn a_double_capture_fails_the_audit() {
        let a = authorized(1, 5_000);
        let captured = body(&a, "succeeded", 5_000);
        let storms = [Storm {
            payment: a.id.clone(),
            keys: vec![
                key("run-1-0-capture", FULL, vec![ok(&captured)]),
                key("run-1-1-cancel", Action::Cancel, vec![Final::Refused]),
            ],
        }];
        let ledger = [entry(&a, &a.payment_intent, 5_000), entry(&a, "pi_second", 5_000)];
        let shown = HashMap::from([(a.id.clone(), shown(&a, "succeeded", 5_000))]);
        let audit = CaptureAudit::new("run", &[a], &storms, &ledger, &shown);
        assert_eq!(audit.captured_twice, ["pay_1"]);
        assert_eq!(audit.violations(), ["1 payment(s) with more than one capture in the ledger"]);
    }

    /// Two keys of one payment both told 200 (a capture and a cancel): settled twice, and the
    /// cancel's 200 contradicts the ledger's capture.
    #[test]
    fn two_settlements_told_fail_the_audit() {
        let a = authorized(1, 5_000);
        let (captured, canceled) = (body(&a, "succeeded", 5_000), body(&a, "canceled", 0));
        let storms = [Storm {
            payment: a.id.clone(),
            keys: vec![
                key("run-1-0-capture", FULL, vec![ok(&captured)]),
                key("run-1-1-cancel", Action::Cancel, vec![ok(&canceled)]),
            ],
        }];
        let ledger = [entry(&a, &a.payment_intent, 5_000)];
        let shown = HashMap::from([(a.id.clone(), shown(&a, "succeeded", 5_000))]);
        let audit = CaptureAudit::new("run", &[a], &storms, &ledger, &shown);
        assert_eq!(audit.settled_twice, ["pay_1"]);
        assert!(audit.payonce_disagrees.is_empty(), "reported as settled twice, not twice over");
        assert_eq!(audit.violations().len(), 1, "{audit:#?}");
    }

    /// Each other way a storm can be wrong is found and named.
    #[test]
    fn every_violation_is_found() {
        let p: Vec<Authorized> = (1..=7).map(|n| authorized(n, 4_000)).collect();
        let part = Action::Capture { amount: Some(1_000) };
        let captured = |paid: &Authorized, amount| body(paid, "succeeded", amount);
        let storms = [
            // 1: a capture answered 200, nothing in the ledger; its resend lost.
            Storm {
                payment: p[0].id.clone(),
                keys: vec![SettleKey {
                    resent: Some(Final::Other("409 in flight".into())),
                    ..key("k1", FULL, vec![ok(&captured(&p[0], 4_000))])
                }],
            },
            // 2: a capture of 1 000 that the ledger says took 4 000 (and payonce shows 1 000).
            Storm { payment: p[1].id.clone(), keys: vec![key("k2", part, vec![ok(&captured(&p[1], 1_000))])] },
            // 3: a cancel answered 200 of a payment captured at the gateway.
            Storm {
                payment: p[2].id.clone(),
                keys: vec![key("k3", Action::Cancel, vec![ok(&body(&p[2], "canceled", 0))])],
            },
            // 4: every key refused, yet the money moved: settled untold; one key never answered.
            Storm {
                payment: p[3].id.clone(),
                keys: vec![key("k4a", FULL, vec![Final::Refused]), SettleKey::new("k4b".into(), Action::Cancel)],
            },
            // 5: a key created twice, its 200s different, and also refused; the 200 not the
            // amount asked; its reuse not refused.
            Storm {
                payment: p[4].id.clone(),
                keys: vec![SettleKey {
                    reuse_refused: Some(false),
                    ..key("k5", part, vec![ok(&captured(&p[4], 4_000)), ok(&captured(&p[4], 3_999)), Final::Refused])
                }],
            },
        ];
        let mut stray = entry(&p[0], "pi_stray", 10);
        stray.metadata.insert("payonce_idempotency_key".into(), "run-stray".into());
        let ledger = [
            entry(&p[1], &p[1].payment_intent, 4_000),
            entry(&p[2], &p[2].payment_intent, 4_000),
            entry(&p[3], &p[3].payment_intent, 4_000),
            entry(&p[4], &p[4].payment_intent, 4_000),
            stray,
        ];
        let shown: HashMap<String, Payment> = [
            shown(&p[0], "succeeded", 4_000),
            shown(&p[1], "succeeded", 1_000),
            shown(&p[2], "canceled", 0),
            shown(&p[3], "succeeded", 4_000),
            shown(&p[4], "succeeded", 4_000),
            // 6: never stormed, yet payonce shows it canceled.
            shown(&p[5], "canceled", 0),
            // 7: not shown at all.
        ]
        .into_iter()
        .map(|payment| (payment.id.clone(), payment))
        .collect();
        let audit = CaptureAudit::new("run", &p, &storms, &ledger, &shown);
        assert_eq!(audit.captured_without_entry, ["k1"]);
        assert_eq!(audit.lost_acknowledgements, ["k1"]);
        assert_eq!(audit.other_amount, ["k2"]);
        assert_eq!(audit.canceled_yet_captured, ["k3"]);
        assert_eq!(audit.settled_untold, ["pay_4", "pay_6"]);
        assert_eq!(audit.no_final_answer, ["k4b"]);
        assert_eq!(audit.answered_fresh_twice, ["k5"]);
        assert_eq!(audit.replays_differ, ["k5"]);
        assert_eq!(audit.settled_and_refused, ["k5"]);
        assert_eq!(audit.not_what_was_asked, ["k5"]);
        assert_eq!(audit.reuse_not_refused, ["k5"]);
        assert_eq!(audit.payonce_disagrees, ["pay_4", "pay_6", "pay_7"]);
        assert_eq!(audit.unknown_entries, ["pi_stray"]);
        assert!(audit.settled_twice.is_empty() && audit.captured_twice.is_empty());
        assert_eq!(audit.violations().len(), 13, "{:#?}", audit.violations());
    }

    /// Server errors are the three-digit 5xx labels; the honest 503 has a label of its own.
    #[test]
    fn server_errors_are_5xx_but_503() {
        let answers = BTreeMap::from([
            ("200 captured".into(), 5),
            ("500".into(), 2),
            ("502".into(), 1),
            ("503 unavailable".into(), 7),
        ]);
        assert_eq!(server_errors(&answers), 3);
    }
}
