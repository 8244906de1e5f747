//! The refund audit of a refund storm: the simulator's refund ledger, payonce's answers and
//! payonce's own view of each payment, against one another.
//!
//! The ledger's refunds for this run's keys (their `payonce_idempotency_key` starts with the run
//! id) are grouped by key and by PaymentIntent. Violations:
//!
//! - a payment whose refunds answered 201 add up to more than was paid (**over-refunded**, by
//!   payonce's answers), or whose ledger refunds do (**over-refunded at the gateway**);
//! - payonce's `amount_refunded` for a payment that is not the ledger's sum for it (checked when
//!   every key refunding it got a final answer; a key left in flight may still hold a
//!   reservation);
//! - a key answered 201 with no gateway refund, with more than one, or whose 201 names another
//!   gateway refund (or amount) than the ledger's;
//! - a key answered 409 `refund-exceeds-payment` that has a gateway refund.
//!
//! A ledger refund for a key with no final answer is **unconfirmed**: reported, not an error (the
//! client gave up before the answer; payonce finishes what it accepted).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::client;
use crate::simulator::Refund as LedgerRefund;

/// A payment the storm refunds, created before it.
#[derive(Debug, Clone)]
pub struct Paid {
    /// `pay_…`
    pub id: String,
    pub amount: i64,
    /// `pi_…`: what the ledger's refunds name.
    pub payment_intent: String,
}

/// How a refund key's requests ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// A 201 (fresh or replayed) with this refund.
    Refunded(client::Refund),
    /// 409 `refund-exceeds-payment`.
    Exceeded,
    /// No final answer (every request was in flight, unavailable or timed out).
    Unsettled,
}

/// One refund key of the storm: what it asked for and how it ended.
#[derive(Debug, Clone)]
pub struct RefundKey {
    pub key: String,
    /// The payment refunded (`pay_…`).
    pub payment: String,
    pub amount: i64,
    pub settled: Settled,
}

/// The verdict of the ledger, payonce's answers and payonce's payments on one refund storm.
#[derive(Debug, Clone, Serialize)]
pub struct RefundAudit {
    pub payments: usize,
    /// What the payments charged, together.
    pub paid_total: i64,
    pub keys: usize,
    /// Keys answered 201.
    pub keys_refunded: usize,
    /// Keys answered 409 `refund-exceeds-payment`.
    pub keys_exceeded: usize,
    /// Keys with no final answer.
    pub keys_unsettled: usize,
    /// The amounts of the keys answered 201, together.
    pub refunded_answered: i64,
    /// Refunds in the ledger for this run's keys.
    pub ledger_refunds: usize,
    pub refunded_ledger: i64,
    /// Payments the ledger shows refunded in full.
    pub payments_refunded_in_full: usize,
    /// Payments whose 201 refunds add up to more than was paid.
    pub over_refunded_answered: Vec<String>,
    /// Payments whose ledger refunds add up to more than was paid.
    pub over_refunded_ledger: Vec<String>,
    /// Payments whose `amount_refunded` at payonce is not the ledger's sum (or is over the amount).
    pub payonce_disagrees: Vec<String>,
    /// Keys answered 201 with no gateway refund.
    pub refunded_without_gateway_refund: Vec<String>,
    /// Keys with more than one gateway refund.
    pub refunded_more_than_once: Vec<String>,
    /// Keys whose 201 names another gateway refund than the ledger's, or whose ledger refund is not
    /// the amount asked.
    pub other_gateway_refund: Vec<String>,
    /// Keys answered 409 `refund-exceeds-payment` with a gateway refund.
    pub exceeded_but_refunded: Vec<String>,
    /// Ledger refunds of keys with no final answer.
    pub unconfirmed: usize,
}

impl RefundAudit {
    /// Audits `ledger` for the keys of `run_id`: the storm's payments `paid`, its `keys`, and
    /// payonce's `amount_refunded` by payment id.
    pub fn new(
        run_id: &str,
        paid: &[Paid],
        keys: &[RefundKey],
        ledger: &[LedgerRefund],
        amount_refunded: &HashMap<String, i64>,
    ) -> Self {
        let prefix = format!("{run_id}-");
        let mut by_key: BTreeMap<&str, Vec<&LedgerRefund>> = BTreeMap::new();
        let mut by_intent: HashMap<&str, i64> = HashMap::new();
        for refund in ledger {
            let Some(key) = refund.metadata.get("payonce_idempotency_key") else { continue };
            if key.starts_with(&prefix) {
                by_key.entry(key.as_str()).or_default().push(refund);
                *by_intent.entry(refund.payment_intent.as_str()).or_default() += refund.amount;
            }
        }
        let mut answered: HashMap<&str, i64> = HashMap::new();
        let mut unsettled_payments: Vec<&str> = Vec::new();
        let (mut without, mut more_than_once, mut other, mut exceeded_but_refunded) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut settled_keys = 0;
        for key in keys {
            let refunds = by_key.get(key.key.as_str()).map_or(&[][..], Vec::as_slice);
            if refunds.len() > 1 {
                more_than_once.push(key.key.clone());
            }
            match &key.settled {
                Settled::Refunded(refund) => {
                    settled_keys += 1;
                    *answered.entry(key.payment.as_str()).or_default() += refund.amount;
                    match refunds {
                        [] => without.push(key.key.clone()),
                        [one] if Some(&one.refund) != refund.gateway_refund.as_ref() || one.amount != key.amount => {
                            other.push(key.key.clone())
                        }
                        _ => {}
                    }
                }
                Settled::Exceeded => {
                    settled_keys += 1;
                    if !refunds.is_empty() {
                        exceeded_but_refunded.push(key.key.clone());
                    }
                }
                Settled::Unsettled => unsettled_payments.push(key.payment.as_str()),
            }
        }
        let mut over_answered = Vec::new();
        let mut over_ledger = Vec::new();
        let mut disagrees = Vec::new();
        let mut in_full = 0;
        for payment in paid {
            let refunded = by_intent.get(payment.payment_intent.as_str()).copied().unwrap_or(0);
            if answered.get(payment.id.as_str()).copied().unwrap_or(0) > payment.amount {
                over_answered.push(payment.id.clone());
            }
            if refunded > payment.amount {
                over_ledger.push(payment.id.clone());
            }
            in_full += usize::from(refunded == payment.amount);
            let payonce = amount_refunded.get(&payment.id).copied();
            let all_answered = !unsettled_payments.contains(&payment.id.as_str());
            if payonce.is_none_or(|payonce| payonce > payment.amount || (all_answered && payonce != refunded)) {
                disagrees.push(payment.id.clone());
            }
        }
        let settled: Vec<&str> =
            keys.iter().filter(|key| !matches!(key.settled, Settled::Unsettled)).map(|key| key.key.as_str()).collect();
        Self {
            payments: paid.len(),
            paid_total: paid.iter().map(|p| p.amount).sum(),
            keys: keys.len(),
            keys_refunded: keys.iter().filter(|k| matches!(k.settled, Settled::Refunded(_))).count(),
            keys_exceeded: keys.iter().filter(|k| k.settled == Settled::Exceeded).count(),
            keys_unsettled: keys.len() - settled_keys,
            refunded_answered: answered.values().sum(),
            ledger_refunds: by_key.values().map(Vec::len).sum(),
            refunded_ledger: by_intent.values().sum(),
            payments_refunded_in_full: in_full,
            over_refunded_answered: over_answered,
            over_refunded_ledger: over_ledger,
            payonce_disagrees: disagrees,
            refunded_without_gateway_refund: without,
            refunded_more_than_once: more_than_once,
            other_gateway_refund: other,
            exceeded_but_refunded,
            unconfirmed: by_key.keys().filter(|key| !settled.contains(*key)).count(),
        }
    }

    /// Everything that fails the run, as sentences.
    pub fn violations(&self) -> Vec<String> {
        let found = [
            (self.over_refunded_answered.len(), "payment(s) with more answered refunded (201) than paid"),
            (self.over_refunded_ledger.len(), "payment(s) refunded at the gateway beyond what was paid"),
            (self.payonce_disagrees.len(), "payment(s) whose amount_refunded at payonce is not the gateway's"),
            (self.refunded_without_gateway_refund.len(), "refund key(s) answered 201 with no gateway refund"),
            (self.refunded_more_than_once.len(), "refund key(s) refunded more than once at the gateway"),
            (self.other_gateway_refund.len(), "refund key(s) whose 201 names another gateway refund or amount"),
            (self.exceeded_but_refunded.len(), "refund key(s) answered 409 refund-exceeds-payment yet refunded"),
        ];
        found.iter().filter(|(n, _)| *n > 0).map(|(n, what)| format!("{n} {what}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paid(id: &str, amount: i64) -> Paid {
        Paid { id: id.into(), amount, payment_intent: format!("pi_{id}") }
    }

    fn refunded(key: &str, payment: &str, amount: i64, gateway: &str) -> RefundKey {
        let refund = client::Refund {
            id: format!("re_{key}"),
            payment: payment.into(),
            amount,
            status: "succeeded".into(),
            gateway_refund: Some(gateway.into()),
        };
        RefundKey { key: key.into(), payment: payment.into(), amount, settled: Settled::Refunded(refund) }
    }

    fn exceeded(key: &str, payment: &str, amount: i64) -> RefundKey {
        RefundKey { key: key.into(), payment: payment.into(), amount, settled: Settled::Exceeded }
    }

    fn ledger(key: &str, payment: &str, amount: i64, gateway: &str) -> LedgerRefund {
        LedgerRefund {
            refund: gateway.into(),
            payment_intent: format!("pi_{payment}"),
            amount,
            metadata: BTreeMap::from([("payonce_idempotency_key".into(), key.into())]),
        }
    }

    /// A clean storm: two keys fit in the payment, the third exceeds it; another run's refund
    /// is not counted.
    #[test]
    fn clean_storm_passes() {
        let payments = [paid("a", 1000)];
        let keys =
            [refunded("run-1", "a", 600, "re_g1"), refunded("run-2", "a", 400, "re_g2"), exceeded("run-3", "a", 300)];
        let ledger =
            [ledger("run-1", "a", 600, "re_g1"), ledger("run-2", "a", 400, "re_g2"), ledger("other-1", "a", 5, "re_x")];
        let audit = RefundAudit::new("run", &payments, &keys, &ledger, &HashMap::from([("a".into(), 1000)]));
        assert!(audit.violations().is_empty(), "{audit:?}");
        assert_eq!((audit.keys_refunded, audit.keys_exceeded, audit.ledger_refunds), (2, 1, 2));
        assert_eq!((audit.refunded_answered, audit.refunded_ledger, audit.payments_refunded_in_full), (1000, 1000, 1));
    }

    /// Each way a storm can be wrong is found and named.
    #[test]
    fn every_violation_is_found() {
        let payments = [paid("a", 1000), paid("b", 1000)];
        let keys = [
            refunded("run-1", "a", 700, "re_g1"),
            refunded("run-2", "a", 700, "re_g2"),
            refunded("run-3", "b", 100, "re_g3"),
            refunded("run-4", "b", 100, "re_g4"),
            exceeded("run-5", "b", 100),
            refunded("run-6", "b", 100, "re_g6"),
        ];
        let ledger = [
            ledger("run-1", "a", 700, "re_g1"),
            ledger("run-2", "a", 700, "re_g2"),
            ledger("run-4", "b", 100, "re_other"),
            ledger("run-5", "b", 100, "re_g5"),
            ledger("run-6", "b", 100, "re_g6"),
            ledger("run-6", "b", 100, "re_g6b"),
        ];
        let audit = RefundAudit::new("run", &payments, &keys, &ledger, &HashMap::from([("a".into(), 1000)]));
        assert_eq!(audit.over_refunded_answered, ["a"]);
        assert_eq!(audit.over_refunded_ledger, ["a"]);
        assert_eq!(audit.payonce_disagrees, ["a", "b"], "a: not the ledger's 1400; b: not shown at all");
        assert_eq!(audit.refunded_without_gateway_refund, ["run-3"]);
        assert_eq!(audit.other_gateway_refund, ["run-4"]);
        assert_eq!(audit.exceeded_but_refunded, ["run-5"]);
        assert_eq!(audit.refunded_more_than_once, ["run-6"]);
        assert_eq!(audit.violations().len(), 7);
    }

    /// A key without a final answer whose refund the gateway made is unconfirmed, not an error,
    /// and payonce's sum for its payment is not compared (its reservation may still be open).
    #[test]
    fn unsettled_keys_are_reported_only() {
        let payments = [paid("a", 1000)];
        let keys = [RefundKey { key: "run-1".into(), payment: "a".into(), amount: 300, settled: Settled::Unsettled }];
        let ledger = [ledger("run-1", "a", 300, "re_g1")];
        let audit = RefundAudit::new("run", &payments, &keys, &ledger, &HashMap::from([("a".into(), 0)]));
        assert!(audit.violations().is_empty(), "{audit:?}");
        assert_eq!((audit.unconfirmed, audit.keys_unsettled), (1, 1));
    }
}
