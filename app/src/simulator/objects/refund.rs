//! The Refund (<https://docs.stripe.com/api/refunds/object>).

use std::collections::BTreeMap;

use serde::Serialize;

/// The reasons Stripe accepts on create.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RefundReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

impl RefundReason {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "duplicate" => Some(Self::Duplicate),
            "fraudulent" => Some(Self::Fraudulent),
            "requested_by_customer" => Some(Self::RequestedByCustomer),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Refund {
    /// `re_` + 24 alphanumerics.
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub balance_transaction: Option<String>,
    pub charge: String,
    pub created: i64,
    pub currency: String,
    /// Filled in by the later `refund.updated` (the acquirer's reference for the card refund).
    pub destination_details: Option<serde_json::Value>,
    pub metadata: BTreeMap<String, String>,
    pub payment_intent: String,
    pub reason: Option<RefundReason>,
    pub receipt_number: Option<String>,
    pub source_transfer_reversal: Option<String>,
    /// `succeeded` at once for a card; `pending` for a bank debit until it settles (after the
    /// processing knob, or `POST /_sim/refunds/{id}/settle`), then `succeeded` or `failed`.
    pub status: &'static str,
    /// Why a failed refund failed (`declined`); null otherwise.
    pub failure_reason: Option<&'static str>,
    pub transfer_reversal: Option<String>,
}
