//! The payment resource: its row, its public id and its JSON representation.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use crate::customers::CustomerId;
use crate::gateway::{Outcome, PendingStatus};
use crate::payments::NewPayment;

/// A payment's public id: `pay_` and the hex of its uuid v7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PaymentId(pub Uuid);

impl PaymentId {
    const PREFIX: &str = "pay_";

    /// Parses a public id; `None` for anything that is not one (the caller answers 404).
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix(Self::PREFIX)?;
        (hex.len() == 32).then(|| Uuid::try_parse(hex).ok().map(Self)).flatten()
    }
}

impl std::fmt::Display for PaymentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.0.simple())
    }
}

/// Where a payment is in its life. Statuses only move forward, in this order (the database
/// refuses anything else, `payment_status_rank`): `pending` < `requires_action` < `processing` <
/// `requires_capture` < `succeeded` = `failed` = `canceled`, the last three terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Created locally; the gateway has not answered yet.
    Pending,
    /// The PaymentIntent waits for the customer to authenticate (3-D Secure).
    RequiresAction,
    /// The PaymentIntent is settling (a bank debit): money may still move, either way.
    Processing,
    /// Authorized (`"capture": "manual"`): the hold waits for a capture or a cancel.
    RequiresCapture,
    Succeeded,
    /// Declined (by the issuer or the gateway), or confirmed never charged.
    Failed,
    /// An authorization released: canceled, or expired uncaptured. No money moved.
    Canceled,
}

impl PaymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::RequiresAction => "requires_action",
            Self::Processing => "processing",
            Self::RequiresCapture => "requires_capture",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "requires_action" => Some(Self::RequiresAction),
            "processing" => Some(Self::Processing),
            "requires_capture" => Some(Self::RequiresCapture),
            "succeeded" => Some(Self::Succeeded),
            "failed" => Some(Self::Failed),
            "canceled" => Some(Self::Canceled),
            _ => None,
        }
    }

    /// Whether the payment can still change (by webhook, reconciliation, a capture or a cancel).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Canceled)
    }
}

impl From<PendingStatus> for PaymentStatus {
    fn from(status: PendingStatus) -> Self {
        match status {
            PendingStatus::RequiresAction => Self::RequiresAction,
            PendingStatus::Processing => Self::Processing,
        }
    }
}

/// Why a payment failed, as the gateway said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: String,
    pub decline_code: Option<String>,
    pub message: String,
}

/// What an answer that tells (succeeded, declined, pending) says a payment is.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    pub status: PaymentStatus,
    pub payment_intent: Option<String>,
    pub failure: Option<Failure>,
    pub next_action: Option<Value>,
    /// What an authorization may capture (`requires_capture`), 0 otherwise.
    pub amount_capturable: i64,
    /// The money that moved (`succeeded`), 0 otherwise.
    pub amount_received: i64,
}

impl Answered {
    /// `None` for refused and unknown answers, which say nothing about the payment.
    pub fn of(outcome: &Outcome) -> Option<Self> {
        Some(match outcome {
            Outcome::Succeeded { payment_intent, amount_received } => {
                Self { amount_received: *amount_received, ..Self::plain(PaymentStatus::Succeeded, payment_intent) }
            }
            Outcome::Pending { payment_intent, status, next_action } => {
                Self { next_action: next_action.clone(), ..Self::plain((*status).into(), payment_intent) }
            }
            Outcome::Authorized { payment_intent, amount_capturable } => Self {
                amount_capturable: *amount_capturable,
                ..Self::plain(PaymentStatus::RequiresCapture, payment_intent)
            },
            Outcome::Canceled { payment_intent } => Self::plain(PaymentStatus::Canceled, payment_intent),
            Outcome::Declined(decline) => Self {
                status: PaymentStatus::Failed,
                payment_intent: decline.payment_intent.clone(),
                failure: Some(Failure {
                    code: decline.code.clone(),
                    decline_code: decline.decline_code.clone(),
                    message: decline.message.clone(),
                }),
                next_action: None,
                amount_capturable: 0,
                amount_received: 0,
            },
            Outcome::Refused(_) | Outcome::Unknown(_) => return None,
        })
    }

    /// `status`, named by `payment_intent`, with nothing else to say.
    fn plain(status: PaymentStatus, payment_intent: &str) -> Self {
        Self {
            status,
            payment_intent: Some(payment_intent.to_owned()),
            failure: None,
            next_action: None,
            amount_capturable: 0,
            amount_received: 0,
        }
    }
}

/// One row of `payments`.
#[derive(Debug, Clone, PartialEq)]
pub struct Payment {
    pub id: PaymentId,
    pub customer_id: Uuid,
    pub amount: i64,
    /// How much of it is refunded, or being refunded (refunds pending at the gateway included).
    pub amount_refunded: i64,
    pub currency: String,
    pub payment_method: String,
    pub description: Option<String>,
    pub metadata: Value,
    pub status: PaymentStatus,
    pub payment_intent: Option<String>,
    pub failure: Option<Failure>,
    /// Stripe's `next_action` while the payment is `requires_action`.
    pub next_action: Option<Value>,
    /// Authorize only (`"capture": "manual"`): money moves when it is captured.
    pub manual_capture: bool,
    /// What its authorization may still capture (`requires_capture`), 0 otherwise.
    pub amount_capturable: i64,
    /// The money that moved: the whole amount once an automatic payment succeeded, what its
    /// capture took for a manual one. Refunds never take more.
    pub amount_captured: i64,
    pub created_at: OffsetDateTime,
}

impl Payment {
    /// A payment just inserted, before the gateway was asked.
    pub fn pending(
        id: PaymentId,
        customer_id: Uuid,
        request: &NewPayment,
        metadata: Value,
        created_at: OffsetDateTime,
    ) -> Self {
        Self {
            id,
            customer_id,
            amount: request.amount,
            amount_refunded: 0,
            currency: request.currency.clone(),
            payment_method: request.payment_method.clone(),
            description: request.description.clone(),
            metadata,
            status: PaymentStatus::Pending,
            payment_intent: None,
            failure: None,
            next_action: None,
            manual_capture: request.manual_capture(),
            amount_capturable: 0,
            amount_captured: 0,
            created_at,
        }
    }

    /// Records what the gateway answered (a final or pending outcome) on the payment. Refused
    /// and unknown answers say nothing about the payment and change nothing.
    pub fn apply(&mut self, outcome: &Outcome) {
        if let Some(answered) = Answered::of(outcome) {
            self.status = answered.status;
            self.payment_intent = answered.payment_intent.or(self.payment_intent.take());
            self.failure = answered.failure;
            self.next_action = answered.next_action;
            self.amount_capturable = answered.amount_capturable;
            if self.status == PaymentStatus::Succeeded && !self.manual_capture {
                self.amount_captured = self.amount;
            }
        }
    }

    /// The URL of the payment.
    pub fn location(&self) -> String {
        format!("/v1/payments/{}", self.id)
    }

    /// The API representation (`GET /v1/payments/{id}`, and the body of a 201 or 202).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.view()).expect("a payment always serialises")
    }

    /// The representation as its type, which the OpenAPI description documents.
    pub fn view(&self) -> PaymentView {
        PaymentView {
            id: self.id.to_string(),
            object: PaymentObject::Payment,
            customer: CustomerId(self.customer_id).to_string(),
            amount: self.amount,
            amount_refunded: self.amount_refunded,
            currency: self.currency.clone(),
            payment_method: self.payment_method.clone(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            status: self.status,
            capture: if self.manual_capture { CaptureMethod::Manual } else { CaptureMethod::Automatic },
            amount_capturable: self.amount_capturable,
            amount_captured: self.amount_captured,
            payment_intent: self.payment_intent.clone(),
            next_action: self.next_action.clone(),
            failure: self.failure.as_ref().map(|f| FailureView {
                code: f.code.clone(),
                decline_code: f.decline_code.clone(),
                message: f.message.clone(),
            }),
            created: self.created_at.format(&Rfc3339).unwrap_or_default(),
        }
    }
}

/// A payment as the API shows it. The members are serialised in this order, which is the order
/// of the stored (and replayed) bodies: keep it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = Payment)]
pub struct PaymentView {
    /// `pay_` and 32 hex digits.
    #[schema(pattern = "^pay_[0-9a-f]{32}$")]
    pub id: String,
    pub object: PaymentObject,
    /// The customer whose API key created it: `cus_` and 32 hex digits.
    #[schema(pattern = "^cus_[0-9a-f]{32}$")]
    pub customer: String,
    /// In the currency's minor unit (cents for USD).
    #[schema(minimum = 1, maximum = 99_999_999)]
    pub amount: i64,
    /// How much of `amount` has been refunded, in the same minor unit (0 when none).
    #[schema(minimum = 0, maximum = 99_999_999)]
    pub amount_refunded: i64,
    /// Lowercase ISO 4217.
    #[schema(pattern = "^[a-z]{3}$")]
    pub currency: String,
    /// The Stripe PaymentMethod charged.
    pub payment_method: String,
    pub description: Option<String>,
    /// The client's metadata, as sent.
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    pub metadata: Value,
    pub status: PaymentStatus,
    /// `automatic`: charged at once; `manual`: authorized, charged by a capture.
    pub capture: CaptureMethod,
    /// What its authorization may still capture (`requires_capture`), 0 otherwise.
    #[schema(minimum = 0, maximum = 99_999_999)]
    pub amount_capturable: i64,
    /// The money that moved: the whole amount once an automatic payment succeeded, what the
    /// capture took for a manual one (0 before). Refunds never take more.
    #[schema(minimum = 0, maximum = 99_999_999)]
    pub amount_captured: i64,
    /// The Stripe PaymentIntent, once the gateway answered.
    pub payment_intent: Option<String>,
    /// Stripe's `next_action` while the payment is `requires_action` (3-D Secure), as Stripe sent it.
    #[schema(value_type = Option<Object>)]
    pub next_action: Option<Value>,
    /// Why it failed, when it did.
    pub failure: Option<FailureView>,
    /// When payonce created it (RFC 3339).
    #[schema(format = DateTime)]
    pub created: String,
}

/// When a payment's money moves: at once, or when it is captured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMethod {
    #[default]
    Automatic,
    Manual,
}

/// The `object` member of a payment: always `payment`.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PaymentObject {
    Payment,
}

/// Why a payment failed, as the gateway said (`not_charged` when payonce gave it up).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = PaymentFailure)]
pub struct FailureView {
    pub code: String,
    pub decline_code: Option<String>,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Public ids round-trip, and nothing else parses.
    #[test]
    fn payment_ids() {
        let id = PaymentId(Uuid::now_v7());
        assert_eq!(PaymentId::parse(&id.to_string()), Some(id));
        assert_eq!(PaymentId::parse("pay_"), None);
        assert_eq!(PaymentId::parse(&id.0.to_string()), None);
        assert_eq!(PaymentId::parse(&format!("pay_{}", id.0.hyphenated())), None);
        assert_eq!(PaymentId::parse("pay_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"), None);
    }
}
