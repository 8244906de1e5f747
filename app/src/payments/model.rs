//! The payment resource: its row, its public id and its JSON representation.

use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use crate::customers::CustomerId;
use crate::gateway::ChargeOutcome;
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

/// Where a payment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStatus {
    /// Created locally; the gateway has not given a final answer yet.
    Pending,
    Succeeded,
    /// Declined by the card issuer or refused by the gateway.
    Failed,
}

impl PaymentStatus {
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

/// Why a payment failed, as the gateway said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: String,
    pub decline_code: Option<String>,
    pub message: String,
}

/// One row of `payments`.
#[derive(Debug, Clone, PartialEq)]
pub struct Payment {
    pub id: PaymentId,
    pub customer_id: Uuid,
    pub amount: i64,
    pub currency: String,
    pub payment_method: String,
    pub description: Option<String>,
    pub metadata: Value,
    pub status: PaymentStatus,
    pub payment_intent: Option<String>,
    pub failure: Option<Failure>,
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
            currency: request.currency.clone(),
            payment_method: request.payment_method.clone(),
            description: request.description.clone(),
            metadata,
            status: PaymentStatus::Pending,
            payment_intent: None,
            failure: None,
            created_at,
        }
    }

    /// Records the gateway's final answer on the payment.
    pub fn apply(&mut self, outcome: &ChargeOutcome) {
        match outcome {
            ChargeOutcome::Succeeded { payment_intent } => {
                self.status = PaymentStatus::Succeeded;
                self.payment_intent = Some(payment_intent.clone());
                self.failure = None;
            }
            ChargeOutcome::Declined { payment_intent, code, decline_code, message } => {
                self.status = PaymentStatus::Failed;
                self.payment_intent = payment_intent.clone();
                self.failure =
                    Some(Failure { code: code.clone(), decline_code: decline_code.clone(), message: message.clone() });
            }
            ChargeOutcome::Rejected { payment_intent, code, message } => {
                self.status = PaymentStatus::Failed;
                self.payment_intent = payment_intent.clone();
                self.failure = Some(Failure { code: code.clone(), decline_code: None, message: message.clone() });
            }
        }
    }

    /// The URL of the payment.
    pub fn location(&self) -> String {
        format!("/v1/payments/{}", self.id)
    }

    /// The API representation (`GET /v1/payments/{id}`, and the body of a 201).
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id.to_string(),
            "object": "payment",
            "customer": CustomerId(self.customer_id).to_string(),
            "amount": self.amount,
            "currency": self.currency,
            "payment_method": self.payment_method,
            "description": self.description,
            "metadata": self.metadata,
            "status": self.status.as_str(),
            "payment_intent": self.payment_intent,
            "failure": self.failure.as_ref().map(|f| json!({
                "code": f.code,
                "decline_code": f.decline_code,
                "message": f.message,
            })),
            "created": self.created_at.format(&Rfc3339).unwrap_or_default(),
        })
    }
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
