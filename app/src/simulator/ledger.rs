//! The ledger: one entry per successful charge and one per refund, the simulator's ground truth.
//!
//! Tests and load tests prove "nothing was charged twice" by counting charge entries per
//! PaymentIntent, per Idempotency-Key and per order (metadata), and "never more refunded than
//! charged, one refund per key" by summing refund entries per charge and counting them per key.
//! Entries are written in the same critical section that changes the objects and saves the
//! idempotent result, so the ledger never disagrees with what a replay returns. A charge enters
//! the ledger when money actually moves (`succeeded`), exactly once per PaymentIntent, whether at
//! once (a card), after processing (a bank debit), after the customer authenticated (3-D Secure)
//! or when an authorization is captured (`capture_method=manual`). An authorization alone moves
//! no money, so it is never an entry: one that is canceled or expires leaves no trace here, and
//! a captured one enters with what was captured, not what was authorized.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::objects;

/// One successful charge.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Charge {
    /// The PaymentIntent that was charged (`pi_…`).
    pub payment_intent: String,
    /// The charge's id (`ch_…`), the PaymentIntent's `latest_charge`.
    pub charge: String,
    /// The `Idempotency-Key` of the create request that charged, if it had one.
    pub idempotency_key: Option<String>,
    /// What moved, in the currency's smallest unit: the charge's `amount_captured` (all of it,
    /// or what a capture took of an authorization).
    pub amount: i64,
    /// The sum of this charge's refunds (each one is in [`Simulator::refunds`]).
    ///
    /// [`Simulator::refunds`]: super::Simulator::refunds
    #[serde(default)]
    pub amount_refunded: i64,
    /// Lowercase ISO code.
    pub currency: String,
    /// The test payment method charged, e.g. `pm_card_visa`.
    pub payment_method: String,
    /// The PaymentIntent's metadata, which is how a caller ties a charge to its own records.
    pub metadata: BTreeMap<String, String>,
    /// Unix seconds.
    pub created: i64,
}

impl Charge {
    /// The entry of `charge`, whose money just moved, made by `intent`: what was captured, under
    /// the key of the create call that made the PaymentIntent.
    pub(crate) fn of(intent: &objects::PaymentIntent, charge: &objects::Charge) -> Self {
        Self {
            payment_intent: intent.id.clone(),
            charge: charge.id.clone(),
            idempotency_key: intent.created_with_key.clone(),
            amount: charge.amount_captured,
            amount_refunded: 0,
            currency: intent.currency.clone(),
            payment_method: charge.payment_method.clone(),
            metadata: intent.metadata.clone(),
            created: charge.created,
        }
    }
}

/// One successful refund.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Refund {
    /// `re_…`
    pub refund: String,
    /// The charge refunded (`ch_…`), an entry of the charges ledger.
    pub charge: String,
    pub payment_intent: String,
    /// The `Idempotency-Key` of the `POST /v1/refunds` that made it, if it had one.
    pub idempotency_key: Option<String>,
    pub amount: i64,
    pub currency: String,
    /// `duplicate`, `fraudulent`, `requested_by_customer` or none.
    pub reason: Option<String>,
    /// The refund's own metadata.
    pub metadata: BTreeMap<String, String>,
    /// Unix seconds.
    pub created: i64,
}

/// Every successful charge and refund, in the order they happened. Append-only until a reset (a
/// refund also adds to its charge's `amount_refunded`), but for a refund that fails after it
/// succeeded, which leaves it.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// Drawn afresh for every ledger (a reset, a restarted simulator): a reader that keeps the
    /// charges it has seen and asks only for the ones after them (`GET /_sim/charges?from=N`)
    /// learns from a different id that what it kept is gone.
    id: u64,
    charges: Vec<Charge>,
    refunds: Vec<Refund>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self { id: fastrand::u64(..), charges: Vec::new(), refunds: Vec::new() }
    }
}

impl Ledger {
    /// This ledger's identity, as `GET /_sim/charges` names it.
    pub fn id(&self) -> String {
        format!("{:016x}", self.id)
    }

    pub fn record(&mut self, charge: Charge) {
        self.charges.push(charge);
    }

    /// Records a refund and adds it to its charge's `amount_refunded`.
    pub fn record_refund(&mut self, refund: Refund) {
        if let Some(charge) = self.charges.iter_mut().rev().find(|charge| charge.charge == refund.charge) {
            charge.amount_refunded += refund.amount;
        }
        self.refunds.push(refund);
    }

    /// A refund that failed after it succeeded: the money came back, so it leaves the ledger and
    /// its charge's `amount_refunded`.
    pub fn reverse_refund(&mut self, refund: &str) {
        let Some(at) = self.refunds.iter().position(|r| r.refund == refund) else { return };
        let reversed = self.refunds.remove(at);
        if let Some(charge) = self.charges.iter_mut().rev().find(|charge| charge.charge == reversed.charge) {
            charge.amount_refunded -= reversed.amount;
        }
    }

    pub fn charges(&self) -> &[Charge] {
        &self.charges
    }

    pub fn refunds(&self) -> &[Refund] {
        &self.refunds
    }
}
