//! The ledger: one entry per successful charge, the simulator's ground truth.
//!
//! Tests and load tests prove "nothing was charged twice" by counting these entries per
//! PaymentIntent, per Idempotency-Key and per order (metadata). An entry is appended in the same
//! critical section that creates the PaymentIntent and saves the idempotent result, so the
//! ledger never disagrees with what a replay returns.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One successful charge.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Charge {
    /// The PaymentIntent that was charged (`pi_…`).
    pub payment_intent: String,
    /// The charge's id (`ch_…`), the PaymentIntent's `latest_charge`.
    pub charge: String,
    /// The `Idempotency-Key` of the create request that charged, if it had one.
    pub idempotency_key: Option<String>,
    /// In the currency's smallest unit.
    pub amount: i64,
    /// Lowercase ISO code.
    pub currency: String,
    /// The test payment method charged, e.g. `pm_card_visa`.
    pub payment_method: String,
    /// The PaymentIntent's metadata, which is how a caller ties a charge to its own records.
    pub metadata: BTreeMap<String, String>,
    /// Unix seconds.
    pub created: i64,
}

/// Every successful charge, in the order they happened. Append-only until a reset.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    charges: Vec<Charge>,
}

impl Ledger {
    pub fn record(&mut self, charge: Charge) {
        self.charges.push(charge);
    }

    pub fn charges(&self) -> &[Charge] {
        &self.charges
    }
}
