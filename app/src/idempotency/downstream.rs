//! What a downstream call (a payment gateway, any other service an operation calls) can leave
//! undecided, in the engine's own words: a provider maps its answers into these, so that the
//! engine's [`super::ProcessError`] never carries one provider's types.
//!
//! * [`GatewayError`]: **unknown**, no answer that tells (a timeout, a broken connection, a 5xx,
//!   an unreadable body). The effect may or may not have happened; asking again (the same
//!   downstream key, or a look-up) is always safe and eventually tells.
//! * [`Refusal`]: **refused**, payonce's own request was not accepted (its credentials, its URL,
//!   its parameters). Never the customer's outcome: nothing is stored, an operator is told.
//!
//! What *did* happen (succeeded, declined, pending) is each operation's vocabulary, since it
//! depends on what the operation does (a payment, a refund).

use std::time::Duration;

/// No answer that tells: the call may or may not have had its effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

/// The downstream service refused payonce's own request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: RefusalReason,
    /// The HTTP status of the answer; `None` when the refusal is payonce's reading of a
    /// PaymentIntent it could not have produced.
    pub status: Option<u16>,
    /// The service's own name for the error (Stripe's error `type`, or `payment_intent_status`).
    pub kind: String,
    pub code: Option<String>,
    /// The gateway's own message, for operators (logged and shown on the dashboard, never
    /// sent to API clients).
    pub message: String,
}

impl Refusal {
    /// The refusal as stored on the key's timeline and in its release (what the dashboard shows).
    pub fn detail(&self) -> serde_json::Value {
        serde_json::json!({
            "reason": self.reason.as_str(),
            "status": self.status,
            "type": self.kind,
            "code": self.code,
            "message": self.message,
        })
    }
}

/// Why payonce's request was refused: the `reason` label of `payonce_gateway_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// 401: the secret key is wrong.
    Authentication,
    /// 403: the key may not do this.
    Permission,
    /// 404 "Unrecognized request URL": the base URL is wrong (e.g. ends in `/v1`).
    UnknownUrl,
    /// 404 for an object payonce named (a PaymentIntent the account does not have).
    NotFound,
    /// Any other `invalid_request_error`: a parameter payonce sent or forgot.
    InvalidRequest,
    /// `idempotency_error`: the downstream key was used with other parameters.
    Idempotency,
    /// A PaymentIntent status payonce's request could not have produced.
    UnexpectedStatus,
    /// An error the gateway said retrying would not fix (`Stripe-Should-Retry: false`) where it
    /// would otherwise be unknown (a 5xx, a 409): asking again with the same key only repeats it.
    NotRetryable,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Authentication => "authentication",
            Self::Permission => "permission",
            Self::UnknownUrl => "unknown_url",
            Self::NotFound => "not_found",
            Self::InvalidRequest => "invalid_request",
            Self::Idempotency => "idempotency",
            Self::UnexpectedStatus => "unexpected_status",
            Self::NotRetryable => "not_retryable",
        }
    }

    /// What an API client is told (the gateway's own message stays with the operators).
    pub fn describe(self) -> &'static str {
        match self {
            Self::Authentication => "the gateway did not accept payonce's API key",
            Self::Permission => "payonce's API key may not make this request",
            Self::UnknownUrl => "payonce is configured with a wrong gateway URL",
            Self::NotFound => "the gateway does not know an object payonce named",
            Self::InvalidRequest => "the gateway refused the parameters payonce sent",
            Self::Idempotency => "the gateway saw payonce's downstream idempotency key with other parameters",
            Self::UnexpectedStatus => "the gateway left the payment in a state payonce's request cannot produce",
            Self::NotRetryable => "the gateway answered an error it says retrying will not fix",
        }
    }
}
