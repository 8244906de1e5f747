//! The audit: the simulator's ledger against what the clients were told.
//!
//! The ledger is the ground truth of what was charged. Its charges for this run's keys (their
//! `payonce_idempotency_key` starts with the run id) are grouped by (customer, key):
//!
//! - a group with more than one charge is a **double charge**;
//! - a key a client got a 201 for, with no charge, is a **missing charge** (the service said
//!   "paid" and no money moved);
//! - a key whose 201 named another PaymentIntent than the one charged is a **mismatch**;
//! - a charge for a key no client got a 201 for is **unconfirmed**: the client gave up before
//!   the answer (a retry storm's timeouts). It is reported, and is not an error: the service
//!   finished the payment it had accepted.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::simulator::Charge;

/// A key charged more than once.
#[derive(Debug, Clone, Serialize)]
pub struct DoubleCharge {
    /// The customers the charges name (one, unless payonce mixed them up as well).
    pub customer: String,
    pub key: String,
    /// The PaymentIntents charged, with their downstream idempotency keys.
    pub charges: Vec<String>,
}

/// The verdict of the ledger on one run.
#[derive(Debug, Clone, Serialize)]
pub struct Audit {
    /// Charges in the ledger for this run's keys.
    pub charges: usize,
    /// Distinct (customer, key) charged.
    pub keys_charged: usize,
    pub double_charged: Vec<DoubleCharge>,
    /// Payments the clients were told succeeded (keys with a 201).
    pub believed_succeeded: usize,
    /// Keys with a 201 and no charge.
    pub missing: Vec<String>,
    /// Keys whose 201 named another PaymentIntent than the ledger's.
    pub mismatched: Vec<String>,
    /// Keys charged without any client seeing the 201.
    pub unconfirmed: usize,
}

impl Audit {
    /// Audits `ledger` for the keys of `run_id`, against `believed` (key → the 201's PaymentIntent).
    pub fn new(run_id: &str, ledger: &[Charge], believed: &HashMap<String, Option<String>>) -> Self {
        let prefix = format!("{run_id}-");
        // By key alone: a run is one customer's, so a second charge for a key is a double charge
        // whatever customer its metadata names.
        let mut charged: BTreeMap<&str, Vec<&Charge>> = BTreeMap::new();
        for charge in ledger {
            let Some(key) = charge.metadata.get("payonce_idempotency_key") else { continue };
            if key.starts_with(&prefix) {
                charged.entry(key.as_str()).or_default().push(charge);
            }
        }
        let double_charged = charged
            .iter()
            .filter(|(_, list)| list.len() > 1)
            .map(|(key, list)| DoubleCharge {
                customer: {
                    let mut customers: Vec<&str> = list
                        .iter()
                        .map(|c| c.metadata.get("payonce_customer").map_or("(none)", String::as_str))
                        .collect();
                    customers.dedup();
                    customers.join(", ")
                },
                key: (*key).to_owned(),
                charges: list
                    .iter()
                    .map(|c| {
                        format!(
                            "{} (downstream key {})",
                            c.payment_intent,
                            c.idempotency_key.as_deref().unwrap_or("none")
                        )
                    })
                    .collect(),
            })
            .collect();
        let mut missing: Vec<String> =
            believed.keys().filter(|key| !charged.contains_key(key.as_str())).cloned().collect();
        missing.sort();
        let mut mismatched: Vec<String> = believed
            .iter()
            .filter_map(|(key, intent)| {
                let list = charged.get(key.as_str())?;
                // A 201 that names no PaymentIntent cannot be matched to a charge: a mismatch too.
                let named = intent.as_deref().is_some_and(|intent| list.iter().any(|c| c.payment_intent == intent));
                (!named).then(|| key.clone())
            })
            .collect();
        mismatched.sort();
        Self {
            charges: charged.values().map(Vec::len).sum(),
            keys_charged: charged.len(),
            double_charged,
            believed_succeeded: believed.len(),
            missing,
            mismatched,
            unconfirmed: charged.keys().filter(|key| !believed.contains_key(**key)).count(),
        }
    }

    /// No double charge, no missing charge, no mismatch.
    #[cfg(test)]
    fn passed(&self) -> bool {
        self.double_charged.is_empty() && self.missing.is_empty() && self.mismatched.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(key: &str, intent: &str) -> Charge {
        charge_of("cus_1", key, intent)
    }

    fn charge_of(customer: &str, key: &str, intent: &str) -> Charge {
        Charge {
            payment_intent: intent.into(),
            idempotency_key: Some(format!("payonce-charge-{intent}")),
            amount: 1000,
            metadata: BTreeMap::from([
                ("payonce_customer".into(), customer.into()),
                ("payonce_idempotency_key".into(), key.into()),
            ]),
        }
    }

    /// A second charge for a key is a double charge even when its metadata names another
    /// customer; a 201 without a PaymentIntent is a mismatch.
    #[test]
    fn doubles_are_found_whatever_customer_they_name() {
        let ledger =
            [charge_of("cus_1", "run-1", "pi_a"), charge_of("cus_2", "run-1", "pi_b"), charge("run-2", "pi_c")];
        let believed = HashMap::from([("run-1".into(), Some("pi_a".into())), ("run-2".into(), None)]);
        let audit = Audit::new("run", &ledger, &believed);
        assert_eq!(audit.double_charged.len(), 1);
        assert_eq!(audit.double_charged[0].customer, "cus_1, cus_2");
        assert_eq!(audit.mismatched, ["run-2"]);
    }

    /// A clean run: one charge per believed key; other runs' charges are ignored.
    #[test]
    fn clean_run_passes() {
        let ledger =
            [charge("run-1", "pi_a"), charge("run-2", "pi_b"), charge("other-1", "pi_c"), charge("other-1", "pi_d")];
        let believed = HashMap::from([("run-1".into(), Some("pi_a".into())), ("run-2".into(), Some("pi_b".into()))]);
        let audit = Audit::new("run", &ledger, &believed);
        assert!(audit.passed(), "{audit:?}");
        assert_eq!((audit.charges, audit.keys_charged, audit.believed_succeeded, audit.unconfirmed), (2, 2, 2, 0));
    }

    /// Each way a run can be wrong is found and named.
    #[test]
    fn double_missing_mismatched_and_unconfirmed() {
        let ledger =
            [charge("run-1", "pi_a"), charge("run-1", "pi_b"), charge("run-3", "pi_x"), charge("run-4", "pi_d")];
        let believed = HashMap::from([
            ("run-1".into(), Some("pi_a".into())),
            ("run-2".into(), Some("pi_c".into())),
            ("run-3".into(), Some("pi_y".into())),
        ]);
        let audit = Audit::new("run", &ledger, &believed);
        assert!(!audit.passed());
        assert_eq!(audit.double_charged.len(), 1);
        assert_eq!(audit.double_charged[0].key, "run-1");
        assert_eq!(audit.missing, ["run-2"]);
        assert_eq!(audit.mismatched, ["run-3"]);
        assert_eq!(audit.unconfirmed, 1, "run-4 was charged but no client saw a 201");
    }
}
