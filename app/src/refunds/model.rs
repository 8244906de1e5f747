//! The refund resource: its row, its public id and its JSON representation.

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use crate::payments::PaymentId;

/// A refund's public id: `re_` and the hex of its uuid v7 (32 characters, unlike Stripe's own
/// refund ids, which the JSON shows as `gateway_refund`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RefundId(pub Uuid);

impl RefundId {
    const PREFIX: &str = "re_";

    /// Parses a public id; `None` for anything that is not one (the caller answers 404).
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix(Self::PREFIX)?;
        (hex.len() == 32).then(|| Uuid::try_parse(hex).ok().map(Self)).flatten()
    }
}

impl std::fmt::Display for RefundId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.0.simple())
    }
}

/// Where a refund is. Only forward: `pending` → `succeeded` or `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundStatus {
    /// Reserved on the payment; the gateway has not confirmed it yet (or is still settling it).
    Pending,
    Succeeded,
    /// The gateway did not refund it; its amount was given back to the payment.
    Failed,
}

impl RefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "succeeded" => Some(Self::Succeeded),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// One row of `refunds`.
#[derive(Debug, Clone, PartialEq)]
pub struct Refund {
    pub id: RefundId,
    pub customer_id: Uuid,
    pub payment_id: PaymentId,
    pub amount: i64,
    pub currency: String,
    pub reason: Option<String>,
    pub metadata: Value,
    pub status: RefundStatus,
    /// Stripe's refund id (`re_…`), once the gateway answered.
    pub gateway_refund: Option<String>,
    /// Why it failed: the gateway's code and message.
    pub failure: Option<(String, String)>,
    pub created_at: OffsetDateTime,
}

impl Refund {
    /// The URL of the refund.
    pub fn location(&self) -> String {
        format!("/v1/refunds/{}", self.id)
    }

    /// The API representation (`GET /v1/refunds/{id}`, and the body of the 201).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.view()).expect("a refund always serialises")
    }

    /// The representation as its type, which the OpenAPI description documents.
    pub fn view(&self) -> RefundView {
        RefundView {
            id: self.id.to_string(),
            object: RefundObject::Refund,
            payment: self.payment_id.to_string(),
            amount: self.amount,
            currency: self.currency.clone(),
            reason: self.reason.clone(),
            metadata: self.metadata.clone(),
            status: self.status.as_str(),
            gateway_refund: self.gateway_refund.clone(),
            failure: self
                .failure
                .as_ref()
                .map(|(code, message)| RefundFailure { code: code.clone(), message: message.clone() }),
            created: self.created_at.format(&Rfc3339).unwrap_or_default(),
        }
    }
}

/// A refund as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = Refund)]
pub struct RefundView {
    /// `re_` and 32 hex digits.
    #[schema(pattern = "^re_[0-9a-f]{32}$")]
    pub id: String,
    pub object: RefundObject,
    /// The payment refunded: `pay_` and 32 hex digits.
    #[schema(pattern = "^pay_[0-9a-f]{32}$")]
    pub payment: String,
    /// In the currency's minor unit.
    #[schema(minimum = 1)]
    pub amount: i64,
    /// Lowercase ISO 4217, the payment's.
    #[schema(pattern = "^[a-z]{3}$")]
    pub currency: String,
    pub reason: Option<String>,
    /// The client's metadata, as sent.
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    pub metadata: Value,
    /// `pending` until the gateway confirms it, then `succeeded` or `failed`.
    #[schema(value_type = String, pattern = "^(pending|succeeded|failed)$")]
    pub status: &'static str,
    /// Stripe's refund id, once the gateway answered.
    pub gateway_refund: Option<String>,
    /// Why it failed, when it did.
    pub failure: Option<RefundFailure>,
    /// When payonce created it (RFC 3339).
    #[schema(format = DateTime)]
    pub created: String,
}

/// The `object` member of a refund: always `refund`.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundObject {
    Refund,
}

/// Why a refund failed, as the gateway said.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RefundFailure {
    pub code: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Public ids round-trip; Stripe's own refund ids and anything else do not parse.
    #[test]
    fn refund_ids() {
        let id = RefundId(Uuid::now_v7());
        assert_eq!(RefundId::parse(&id.to_string()), Some(id));
        assert_eq!(RefundId::parse("re_3MtwBwLkdIwHu7ix28a3tqPa"), None);
        assert_eq!(RefundId::parse(&id.0.to_string()), None);
    }
}
