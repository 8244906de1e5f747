//! Where the gateway is called: Stripe, through async-stripe.
//!
//! Every charge is one `POST /v1/payment_intents` with `confirm=true` and a *downstream*
//! idempotency key derived from the payonce key's row id ([`downstream_key`]). A retry of the same
//! payonce key, by the client, by another server, or by the sweeper after a crash, therefore
//! sends Stripe the same key and gets the same PaymentIntent back: the gateway itself makes the
//! charge happen once, even if payonce forgot that it asked.
//!
//! The same code talks to real Stripe and to the built-in simulator ([`crate::simulator`]): only
//! the base URL and the secret key differ.

use std::collections::HashMap;
use std::time::Duration;

mod transport;

use stripe::{ApiErrorsType, IdempotencyKey, RequestStrategy, StripeError, StripeRequest};
use stripe_core::payment_intent::CreatePaymentIntent;
use stripe_core::{PaymentIntent, PaymentIntentStatus};
use uuid::Uuid;

pub(crate) use transport::Transport;

/// How payonce reaches its gateway.
#[derive(Clone)]
pub struct Gateway {
    transport: Transport,
    /// Per-call deadline; past it the outcome is unknown and the key is released for a retry.
    timeout: Duration,
    /// Where the calls go, for logs and the dashboard (never includes the secret key).
    base_url: String,
}

/// What to charge.
#[derive(Debug, Clone)]
pub struct Charge<'a> {
    pub amount: i64,
    pub currency: &'a str,
    pub payment_method: &'a str,
    pub description: Option<&'a str>,
    /// Client metadata plus payonce's audit keys.
    pub metadata: HashMap<String, String>,
    /// The deterministic downstream idempotency key.
    pub idempotency_key: String,
}

/// A final answer from the gateway: the same request would get the same answer again.
#[derive(Debug, Clone, PartialEq)]
pub enum ChargeOutcome {
    /// The money moved.
    Succeeded { payment_intent: String },
    /// The card was declined (`card_error`).
    Declined { payment_intent: Option<String>, code: String, decline_code: Option<String>, message: String },
    /// The gateway refused the request itself (`invalid_request_error`, e.g. an unknown
    /// PaymentMethod) or left the PaymentIntent in a state this API does not support.
    Rejected { payment_intent: Option<String>, code: String, message: String },
}

/// No final answer: the charge may or may not have happened. Retrying with the same downstream
/// key is always safe and eventually tells which.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the gateway did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the gateway could not be reached: {0}")]
    Transport(String),
    #[error("the gateway answered {status} ({kind}): {message}")]
    Unavailable { status: u16, kind: String, message: String },
    #[error("the gateway's answer could not be read: {0}")]
    Unreadable(String),
}

/// The downstream idempotency key of a payonce key: a pure function of the row id, so every
/// worker computes the same one, and not the client's raw key (which is only unique per customer).
pub fn downstream_key(key_id: Uuid) -> String {
    format!("payonce-charge-{}", key_id.simple())
}

impl Gateway {
    /// A gateway at `base_url` (Stripe's own when `None`). A base URL with a path must end in `/`.
    pub fn new(secret_key: &str, base_url: Option<&str>, timeout: Duration) -> Result<Self, StripeError> {
        let base_url = match base_url {
            Some(url) if url.ends_with('/') => url.to_owned(),
            Some(url) => format!("{url}/"),
            None => "https://api.stripe.com/".to_owned(),
        };
        let transport = Transport::new(secret_key, base_url.clone(), timeout)?;
        Ok(Self { transport, timeout, base_url })
    }

    /// The deadline of one call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Where the calls go.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Creates and confirms a PaymentIntent. One attempt, with the caller's downstream key: the
    /// caller decides when to retry, so retries survive restarts.
    pub async fn charge(&self, charge: Charge<'_>) -> Result<ChargeOutcome, GatewayError> {
        let key = IdempotencyKey::new(&charge.idempotency_key)
            .map_err(|err| GatewayError::Transport(format!("invalid downstream key: {err}")))?;
        let mut request = CreatePaymentIntent::new(
            charge.amount,
            charge.currency.parse::<stripe_types::Currency>().unwrap_or_default(),
        )
        .payment_method(charge.payment_method)
        .confirm(true)
        .metadata(charge.metadata);
        if let Some(description) = charge.description {
            request = request.description(description);
        }
        let started = std::time::Instant::now();
        let result = request
            .customize()
            .request_strategy(RequestStrategy::Idempotent(key))
            .timeout(self.timeout)
            .send(&self.transport)
            .await;
        let elapsed = started.elapsed();
        let outcome = self.interpret(result);
        let label = match &outcome {
            Ok(ChargeOutcome::Succeeded { .. }) => "succeeded",
            Ok(ChargeOutcome::Declined { .. }) => "declined",
            Ok(ChargeOutcome::Rejected { .. }) => "rejected",
            Err(GatewayError::Timeout(_)) => "timeout",
            Err(GatewayError::Transport(_)) => "transport",
            Err(GatewayError::Unavailable { .. }) => "unavailable",
            Err(GatewayError::Unreadable(_)) => "unreadable",
        };
        metrics::histogram!("payonce_gateway_request_duration_seconds", "outcome" => label)
            .record(elapsed.as_secs_f64());
        tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, outcome = label, "gateway call");
        outcome
    }

    /// Sorts the result of a call into a final outcome or "unknown, retry".
    fn interpret(&self, result: Result<PaymentIntent, StripeError>) -> Result<ChargeOutcome, GatewayError> {
        match result {
            Ok(intent) => Ok(match intent.status {
                PaymentIntentStatus::Succeeded => ChargeOutcome::Succeeded { payment_intent: intent.id.to_string() },
                other => ChargeOutcome::Rejected {
                    payment_intent: Some(intent.id.to_string()),
                    code: format!("payment_intent_{}", other.as_str()),
                    message: format!(
                        "the PaymentIntent ended in status '{}', which this API does not complete",
                        other.as_str()
                    ),
                },
            }),
            Err(err) => self.classify(err),
        }
    }

    /// Sorts an error answer into a final outcome or "unknown, retry".
    fn classify(&self, err: StripeError) -> Result<ChargeOutcome, GatewayError> {
        match err {
            StripeError::Stripe(api, status) => {
                let code =
                    api.code.as_ref().map(|c| c.as_str().to_owned()).unwrap_or_else(|| api.type_.as_str().to_owned());
                let message = api.message.clone().unwrap_or_default();
                let payment_intent = api.payment_intent.as_ref().map(|pi| pi.id.to_string());
                match (&api.type_, status) {
                    (ApiErrorsType::CardError, _) => Ok(ChargeOutcome::Declined {
                        payment_intent,
                        code,
                        decline_code: api.decline_code.clone(),
                        message,
                    }),
                    // A request error is final, except the ones about *us* rather than the payment:
                    // a bad API key (401/403), rate limiting (429) and a concurrent request with
                    // the same key (409). Those must be retried, not recorded as the outcome.
                    (ApiErrorsType::InvalidRequestError, 400 | 402 | 404) => {
                        Ok(ChargeOutcome::Rejected { payment_intent, code, message })
                    }
                    (kind, status) => {
                        Err(GatewayError::Unavailable { status, kind: kind.as_str().to_owned(), message })
                    }
                }
            }
            StripeError::Timeout => Err(GatewayError::Timeout(self.timeout)),
            StripeError::ClientError(msg) | StripeError::ConfigError(msg) => Err(GatewayError::Transport(msg)),
            StripeError::JSONDeserialize(msg) => Err(GatewayError::Unreadable(msg)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The downstream key depends on the row only, and fits Stripe's 255-character limit.
    #[test]
    fn downstream_key_is_deterministic() {
        let id = Uuid::now_v7();
        assert_eq!(downstream_key(id), downstream_key(id));
        assert_ne!(downstream_key(id), downstream_key(Uuid::now_v7()));
        assert!(downstream_key(id).len() <= 255);
    }
}
