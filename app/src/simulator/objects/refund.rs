//! The Refund (<https://docs.stripe.com/api/refunds/object>).

use std::collections::BTreeMap;

use serde::Serialize;

use super::payment_method::Instrument;
use super::{Charge, Null};

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

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
        }
    }
}

/// `succeeded` at once for a card; `pending` for a bank debit until it settles, then
/// `succeeded` or `failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RefundStatus {
    Pending,
    Succeeded,
    Failed,
}

/// Where the money goes back to, and the reference the customer's bank will know it by
/// (`null` until it arrives).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum DestinationDetails {
    Card { card: CardDestination },
    UsBankTransfer { us_bank_transfer: BankDestination },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct CardDestination {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// `pending` until the acquirer's reference arrives, then `available`.
    pub reference_status: &'static str,
    pub reference_type: &'static str,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct BankDestination {
    pub reference: Option<String>,
    pub reference_status: &'static str,
}

impl DestinationDetails {
    fn pending(instrument: Instrument) -> Self {
        match instrument {
            Instrument::Card { .. } => Self::Card {
                card: CardDestination {
                    reference: None,
                    reference_status: "pending",
                    reference_type: "acquirer_reference_number",
                    kind: "refund",
                },
            },
            Instrument::UsBankAccount { .. } => Self::UsBankTransfer {
                us_bank_transfer: BankDestination { reference: None, reference_status: "pending" },
            },
        }
    }

    /// The reference arrived.
    pub fn arrive(&mut self, reference: String) {
        match self {
            Self::Card { card } => {
                card.reference = Some(reference);
                card.reference_status = "available";
            }
            Self::UsBankTransfer { us_bank_transfer } => {
                us_bank_transfer.reference = Some(reference);
                us_bank_transfer.reference_status = "available";
            }
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Refund {
    /// `re_` + 24 alphanumerics.
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub balance_transaction: Null,
    pub charge: String,
    pub created: i64,
    pub currency: String,
    pub customer: Null,
    pub customer_account: Null,
    pub destination_details: DestinationDetails,
    /// Why a failed refund failed (`declined`); left out otherwise, as Stripe does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<&'static str>,
    pub metadata: BTreeMap<String, String>,
    pub payment_intent: String,
    pub payment_method: String,
    /// Why it is still pending (`processing`); left out once it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<&'static str>,
    pub reason: Option<RefundReason>,
    pub receipt_number: Null,
    pub source_transfer_reversal: Null,
    pub status: RefundStatus,
    pub transfer_reversal: Null,
}

impl Refund {
    /// A refund of `amount` of `charge`: `succeeded` at once for a card, `pending` for a bank
    /// debit.
    pub fn new(charge: &Charge, amount: i64, reason: Option<RefundReason>, metadata: BTreeMap<String, String>) -> Self {
        let pending = matches!(charge.instrument, Instrument::UsBankAccount { .. });
        Self {
            id: super::new_id("re"),
            object: "refund",
            amount,
            balance_transaction: Null,
            charge: charge.id.clone(),
            created: super::now(),
            currency: charge.currency.clone(),
            customer: Null,
            customer_account: Null,
            destination_details: DestinationDetails::pending(charge.instrument),
            failure_reason: None,
            metadata,
            payment_intent: charge.payment_intent.clone(),
            payment_method: charge.payment_method.clone(),
            pending_reason: pending.then_some("processing"),
            reason,
            receipt_number: Null,
            source_transfer_reversal: Null,
            status: if pending { RefundStatus::Pending } else { RefundStatus::Succeeded },
            transfer_reversal: Null,
        }
    }

    /// A pending refund settles: `succeeded`, or `failed` (`declined`).
    pub fn settle(&mut self, succeeded: bool) {
        self.pending_reason = None;
        if succeeded {
            self.status = RefundStatus::Succeeded;
        } else {
            self.status = RefundStatus::Failed;
            self.failure_reason = Some("declined");
        }
    }
}
