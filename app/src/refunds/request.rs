//! The body of `POST /v1/refunds`, and its validation into the canonical [`NewRefund`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::money;
use crate::payments::PaymentId;
use crate::payments::request::check_metadata;
use crate::problem::FieldError;

/// Stripe allows 50 metadata keys; payonce adds four of its own to a refund (`payonce_refund`,
/// `payonce_payment`, `payonce_customer`, `payonce_idempotency_key`).
pub const MAX_METADATA_KEYS: usize = 46;

/// Why a refund is made, as Stripe names it.
pub const REASONS: [&str; 3] = ["duplicate", "fraudulent", "requested_by_customer"];

/// The request body exactly as the client may send it: a JSON object. Unknown fields are refused.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, remote = "Self")]
pub struct CreateRefund {
    /// The payment to refund (`pay_…`).
    #[schema(pattern = "^pay_[0-9a-fA-F]{32}$")]
    pub payment: String,
    /// In the payment currency's minor unit as Stripe defines it (see `amount` of a payment);
    /// default: all that remains.
    #[serde(default)]
    pub amount: Option<i64>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Only from a JSON object (serde's derive would also take the fields as an array, in order).
impl<'de> Deserialize<'de> for CreateRefund {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = CreateRefund;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the refund as a JSON object, e.g. {\"payment\": \"pay_…\", \"amount\": 500}")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                CreateRefund::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(Object)
    }
}

/// A validated refund request in canonical form: what the fingerprint covers and what is stored
/// with the key. `amount: None` ("all that remains") is a request of its own, resolved to an
/// amount by the refund's first write and fixed from then on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewRefund {
    /// The payment's public id.
    pub payment: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Who asked for it when it was not the customer: `operator:<name>` for a refund made from
    /// the dashboard on the customer's behalf. Never from the API's body (which has no such
    /// member), so a customer cannot claim to be an operator; part of the canonical request, so
    /// it is fingerprinted and kept with the key, and the refund's first write records it on the
    /// key's timeline (`refund_created`, `detail.by`) in the same statement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

impl NewRefund {
    /// The payment's id (validated when the request was).
    pub fn payment_id(&self) -> Option<PaymentId> {
        PaymentId::parse(&self.payment)
    }
}

impl CreateRefund {
    /// Checks every field and reports all problems at once.
    pub fn validate(self) -> Result<NewRefund, Vec<FieldError>> {
        let mut errors = Vec::new();
        if PaymentId::parse(&self.payment).is_none() {
            errors.push(FieldError::new("payment", "must be a payment id (pay_…)"));
        }
        errors.extend(self.amount.and_then(money::out_of_range).map(|why| FieldError::new("amount", why)));
        if let Some(reason) = &self.reason
            && !REASONS.contains(&reason.as_str())
        {
            errors.push(FieldError::new("reason", "must be one of duplicate, fraudulent, requested_by_customer"));
        }
        let metadata = self.metadata.unwrap_or_default();
        check_metadata(&metadata, MAX_METADATA_KEYS, &mut errors);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(NewRefund { payment: self.payment, amount: self.amount, reason: self.reason, metadata, by: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::fingerprint::canonical_json;

    fn body(json: &str) -> Result<NewRefund, Vec<FieldError>> {
        serde_json::from_str::<CreateRefund>(json).unwrap().validate()
    }

    /// Absent optional members and their defaults are the same request; "all that remains" is
    /// not the same request as any amount.
    #[test]
    fn canonical_form() {
        let pay = format!("pay_{}", uuid::Uuid::now_v7().simple());
        let a = body(&format!(r#"{{"payment": "{pay}"}}"#)).unwrap();
        let b = body(&format!(r#"{{"payment": "{pay}", "metadata": {{}}, "amount": null, "reason": null}}"#)).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            canonical_json(&serde_json::to_value(&a).unwrap()),
            format!(r#"{{"metadata":{{}},"payment":"{pay}"}}"#)
        );
        let c = body(&format!(r#"{{"payment": "{pay}", "amount": 100}}"#)).unwrap();
        assert_ne!(a, c);
    }

    /// Every invalid field is reported, each with its path.
    #[test]
    fn reports_every_invalid_field() {
        let errors =
            body(r#"{"payment": "ch_1", "amount": 0, "reason": "bored", "metadata": {"payonce_x": "1"}}"#).unwrap_err();
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["payment", "amount", "reason", "metadata.payonce_x"]);
        assert!(serde_json::from_str::<CreateRefund>(r#"["pay_x", 1]"#).is_err(), "only an object");
        assert!(serde_json::from_str::<CreateRefund>(r#"{"payment": "pay_x", "extra": 1}"#).is_err());
    }
}
