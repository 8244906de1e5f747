//! What a gateway answer means. Every answer, to any call (create, retrieve, search), becomes
//! exactly one [`Outcome`]; `docs/lifecycle.md` ("Outcomes") has the table of what each does to
//! the payment, the key and the client.
//!
//! The classification is a pure function of what the gateway said ([`ErrorAnswer`],
//! [`IntentAnswer`]), so it is tested here without a network, answer by answer.

use serde_json::Value;

pub use crate::idempotency::{GatewayError, Refusal, RefusalReason};

/// The meaning of one gateway answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The money moved: `amount_received` of it (all of an automatic payment, what the capture
    /// took of an authorization). Final.
    Succeeded { payment_intent: String, amount_received: i64 },
    /// The customer's payment method was refused. Final, and the customer's outcome.
    Declined(Decline),
    /// The payment exists at the gateway and may still move money (a bank debit settling, an
    /// authentication the customer has not done yet). It moves on by webhook or reconciliation.
    Pending { payment_intent: String, status: PendingStatus, next_action: Option<Value> },
    /// The card was authorized for `amount_capturable` (a PaymentIntent created with
    /// `capture_method=manual`, now `requires_capture`): no money moved yet; a capture moves it,
    /// a cancel (or the authorization's expiry) releases it.
    Authorized { payment_intent: String, amount_capturable: i64 },
    /// The PaymentIntent was canceled (by a cancel, or the authorization expired): no money
    /// moved, and none will. What that means for a charge that was never authorized is the
    /// payment's to say (it is then a decline).
    Canceled { payment_intent: String },
    /// payonce's own fault: its credentials, its URL, its parameters. Never the customer's
    /// outcome: nothing is stored, the key stays resumable, an operator is told.
    Refused(Refusal),
    /// No answer that tells: the payment may or may not exist. Asking again (with the same
    /// downstream key, or by a look-up) is always safe and eventually tells which.
    Unknown(GatewayError),
}

impl Outcome {
    /// The `outcome` label of the gateway metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::Declined(_) => "declined",
            Self::Pending { .. } => "pending",
            Self::Authorized { .. } => "authorized",
            Self::Canceled { .. } => "canceled",
            Self::Refused(_) => "refused",
            Self::Unknown(GatewayError::Timeout(_)) => "timeout",
            Self::Unknown(GatewayError::Transport(_)) => "transport",
            Self::Unknown(GatewayError::Unavailable { .. }) => "unavailable",
            Self::Unknown(GatewayError::Unreadable(_)) => "unreadable",
        }
    }

    /// The PaymentIntent the answer names, if any.
    pub fn payment_intent(&self) -> Option<&str> {
        match self {
            Self::Succeeded { payment_intent, .. }
            | Self::Pending { payment_intent, .. }
            | Self::Authorized { payment_intent, .. }
            | Self::Canceled { payment_intent } => Some(payment_intent),
            Self::Declined(decline) => decline.payment_intent.as_deref(),
            Self::Refused(_) | Self::Unknown(_) => None,
        }
    }
}

/// A PaymentIntent that exists and is not final yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingStatus {
    /// `requires_action`: the customer must authenticate (3-D Secure).
    RequiresAction,
    /// `processing`: the payment method is settling (bank debits take days).
    Processing,
}

impl PendingStatus {
    /// Stripe's (and the payment's) name of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequiresAction => "requires_action",
            Self::Processing => "processing",
        }
    }
}

/// A final refusal of the customer's payment method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decline {
    pub payment_intent: Option<String>,
    /// Whose refusal: the card issuer's, or the gateway's about the payment method itself.
    pub by: DeclinedBy,
    pub code: String,
    pub decline_code: Option<String>,
    pub message: String,
}

impl Decline {
    /// A charge whose PaymentIntent was canceled before any money moved: for a payment that was
    /// never authorized, the gateway's refusal of it.
    pub fn canceled(payment_intent: String) -> Self {
        Self {
            payment_intent: Some(payment_intent),
            by: DeclinedBy::Gateway,
            code: "payment_intent_canceled".to_owned(),
            decline_code: None,
            message: "The PaymentIntent was canceled; no money moved.".to_owned(),
        }
    }
}

/// Who declined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclinedBy {
    /// The card issuer (`card_error`): answered as 402 `card-declined`.
    Issuer,
    /// The gateway, about the customer's payment method (it does not exist, it failed to
    /// settle, the PaymentIntent was canceled): answered as 402 `payment-rejected`.
    Gateway,
}

/// The meaning of one gateway answer about a refund: the same five classes as a payment's
/// [`Outcome`], and the same rules (unknown is never failure; refused is payonce's own fault).
#[derive(Debug, Clone, PartialEq)]
pub enum RefundOutcome {
    /// The money went back. Final.
    Succeeded {
        refund: String,
    },
    /// The gateway accepted the refund and is still settling it.
    Pending {
        refund: String,
    },
    /// The gateway will not refund: nothing remains on its side, or the refund failed. Final.
    Declined {
        refund: Option<String>,
        code: String,
        message: String,
    },
    Refused(Refusal),
    Unknown(GatewayError),
}

impl RefundOutcome {
    /// The `outcome` label of the gateway metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::Pending { .. } => "pending",
            Self::Declined { .. } => "declined",
            Self::Refused(refusal) => Outcome::Refused(refusal.clone()).label(),
            Self::Unknown(error) => Outcome::Unknown(error.clone()).label(),
        }
    }

    /// The gateway's refund id the answer names, if any.
    pub fn refund(&self) -> Option<&str> {
        match self {
            Self::Succeeded { refund } | Self::Pending { refund } => Some(refund),
            Self::Declined { refund, .. } => refund.as_deref(),
            Self::Refused(_) | Self::Unknown(_) => None,
        }
    }

    /// The meaning of a refund object: its `status`, and why it failed if it did.
    pub fn of_refund(id: &str, status: Option<&str>, failure_reason: Option<&str>) -> Self {
        let refund = id.to_owned();
        match status {
            Some("succeeded") => Self::Succeeded { refund },
            Some("pending" | "requires_action") => Self::Pending { refund },
            Some(status @ ("failed" | "canceled")) => Self::Declined {
                refund: Some(refund),
                code: failure_reason.unwrap_or(status).to_owned(),
                message: format!("The gateway's refund {id} is {status}."),
            },
            other => Self::Refused(Refusal {
                reason: RefusalReason::UnexpectedStatus,
                status: None,
                kind: "refund_status".to_owned(),
                code: other.map(str::to_owned),
                message: format!("refund {id} is in status {other:?}, which payonce does not know"),
            }),
        }
    }
}

impl ErrorAnswer<'_> {
    /// The meaning of an error answer to a refund: a payment's rules, except that the gateway
    /// saying nothing (or not that much) remains to refund is its final answer about the charge,
    /// not a request payonce should not have sent: payonce's own ledger reserved the amount, so
    /// the charge was refunded outside payonce (the Dashboard), and retrying cannot help.
    pub fn classify_refund(&self) -> RefundOutcome {
        if self.kind == "invalid_request_error"
            && matches!(self.code, Some("charge_already_refunded" | "amount_too_large"))
        {
            return RefundOutcome::Declined {
                refund: None,
                code: self.code.unwrap_or_default().to_owned(),
                message: self.message.to_owned(),
            };
        }
        match self.classify() {
            Outcome::Unknown(error) => RefundOutcome::Unknown(error),
            Outcome::Refused(refusal) => RefundOutcome::Refused(refusal),
            Outcome::Declined(decline) => {
                RefundOutcome::Declined { refund: None, code: decline.code, message: decline.message }
            }
            // An error answer is never a success, pending, an authorization or a cancel.
            Outcome::Succeeded { .. }
            | Outcome::Pending { .. }
            | Outcome::Authorized { .. }
            | Outcome::Canceled { .. } => {
                RefundOutcome::Unknown(GatewayError::Unreadable("an error answer that reads as a success".into()))
            }
        }
    }
}

/// An error answer, reduced to what its meaning depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorAnswer<'a> {
    pub status: u16,
    /// Stripe's error `type`: `card_error`, `invalid_request_error`, `idempotency_error`, `api_error`.
    pub kind: &'a str,
    pub code: Option<&'a str>,
    pub decline_code: Option<&'a str>,
    pub param: Option<&'a str>,
    pub message: &'a str,
    /// The PaymentIntent the error carries (a declined confirmation has one).
    pub payment_intent: Option<&'a str>,
    /// The answer's `Stripe-Should-Retry` header, if it had one.
    pub should_retry: Option<bool>,
}

impl ErrorAnswer<'_> {
    /// The meaning of an error answer.
    ///
    /// Stripe's own hint comes first, as its libraries read it: `Stripe-Should-Retry: true` is
    /// unknown (asking again may tell), whatever the status; `false` makes what would otherwise
    /// be unknown a refusal (`not_retryable`: asking again only repeats it). Then, in this order:
    /// what may resolve by itself (5xx, 409 "in use" or lock timeout, 429) is unknown, whatever its
    /// type; a card error is the issuer's decline; 401/403 are payonce's credentials; an error
    /// about the customer's `payment_method` that is not about the request's shape
    /// (`parameter_*`) is the gateway's decline, which Stripe saves and replays like any executed
    /// result; everything else is a request payonce should not have sent.
    pub fn classify(&self) -> Outcome {
        match (self.should_retry, self.classify_by_status()) {
            (Some(true), _) => Outcome::Unknown(GatewayError::Unavailable {
                status: self.status,
                kind: self.kind.to_owned(),
                message: self.message.to_owned(),
            }),
            (Some(false), Outcome::Unknown(_)) => Outcome::Refused(Refusal {
                reason: RefusalReason::NotRetryable,
                status: Some(self.status),
                kind: self.kind.to_owned(),
                code: self.code.map(str::to_owned),
                message: self.message.to_owned(),
            }),
            (_, outcome) => outcome,
        }
    }

    /// The meaning of an error answer without a retry hint.
    fn classify_by_status(&self) -> Outcome {
        let unknown = || {
            Outcome::Unknown(GatewayError::Unavailable {
                status: self.status,
                kind: self.kind.to_owned(),
                message: self.message.to_owned(),
            })
        };
        let refused = |reason| {
            Outcome::Refused(Refusal {
                reason,
                status: Some(self.status),
                kind: self.kind.to_owned(),
                code: self.code.map(str::to_owned),
                message: self.message.to_owned(),
            })
        };
        let decline = |by| {
            Outcome::Declined(Decline {
                payment_intent: self.payment_intent.map(str::to_owned),
                by,
                code: self.code.unwrap_or(self.kind).to_owned(),
                decline_code: self.decline_code.map(str::to_owned),
                message: self.message.to_owned(),
            })
        };
        match (self.status, self.kind) {
            (500.., _) | (409 | 429, _) => unknown(),
            (_, "card_error") => decline(DeclinedBy::Issuer),
            (401, _) => refused(RefusalReason::Authentication),
            (403, _) => refused(RefusalReason::Permission),
            (_, "idempotency_error") => refused(RefusalReason::Idempotency),
            (_, "invalid_request_error")
                if self.param == Some("payment_method")
                    && !self.code.is_some_and(|code| code.starts_with("parameter_")) =>
            {
                decline(DeclinedBy::Gateway)
            }
            (404, _) if self.message.starts_with("Unrecognized request URL") => refused(RefusalReason::UnknownUrl),
            (404, _) => refused(RefusalReason::NotFound),
            (_, "api_error") => unknown(),
            _ => refused(RefusalReason::InvalidRequest),
        }
    }
}

/// A PaymentIntent, reduced to what its meaning depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct IntentAnswer<'a> {
    pub id: &'a str,
    pub status: &'a str,
    /// What an authorization may still capture (`requires_capture`).
    pub amount_capturable: i64,
    /// The money that moved (`succeeded`).
    pub amount_received: i64,
    /// Stripe's `next_action`, as it sent it.
    pub next_action: Option<Value>,
    /// Why its last payment attempt failed, if it did.
    pub last_payment_error: Option<ErrorAnswer<'a>>,
}

impl IntentAnswer<'_> {
    /// The meaning of a PaymentIntent payonce created with `confirm=true` and redirects off.
    ///
    /// `requires_payment_method` after a confirmation means the attempt failed (a bank debit
    /// that did not settle); `canceled` means no money moved and none will. Both are final
    /// declines. `requires_capture` and `requires_confirmation` cannot come from payonce's
    /// request (automatic capture, confirmed at creation): payonce sent something it did not
    /// mean to, which is its own fault.
    pub fn classify(&self) -> Outcome {
        let payment_intent = self.id.to_owned();
        let pending = |status| Outcome::Pending {
            payment_intent: self.id.to_owned(),
            status,
            next_action: self.next_action.clone().filter(|action| !action.is_null()),
        };
        match self.status {
            "succeeded" => Outcome::Succeeded { payment_intent, amount_received: self.amount_received },
            "processing" => pending(PendingStatus::Processing),
            "requires_action" => pending(PendingStatus::RequiresAction),
            "requires_payment_method" => {
                let error = self.last_payment_error.as_ref();
                Outcome::Declined(Decline {
                    payment_intent: Some(payment_intent),
                    by: match error {
                        Some(error) if error.kind == "card_error" => DeclinedBy::Issuer,
                        _ => DeclinedBy::Gateway,
                    },
                    code: error.and_then(|e| e.code).unwrap_or("payment_failed").to_owned(),
                    decline_code: error.and_then(|e| e.decline_code).map(str::to_owned),
                    message: error.map_or("The payment attempt failed.", |e| e.message).to_owned(),
                })
            }
            "requires_capture" => Outcome::Authorized { payment_intent, amount_capturable: self.amount_capturable },
            "canceled" => Outcome::Canceled { payment_intent },
            other => Outcome::Refused(Refusal {
                reason: RefusalReason::UnexpectedStatus,
                status: None,
                kind: "payment_intent_status".to_owned(),
                code: Some(other.to_owned()),
                message: format!(
                    "PaymentIntent {} is in status '{other}', which payonce's request cannot produce",
                    self.id
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn error(
        status: u16,
        kind: &'static str,
        code: Option<&'static str>,
        param: Option<&'static str>,
    ) -> ErrorAnswer<'static> {
        ErrorAnswer {
            status,
            kind,
            code,
            decline_code: None,
            param,
            message: "msg",
            payment_intent: None,
            should_retry: None,
        }
    }

    fn class(answer: &ErrorAnswer<'_>) -> &'static str {
        match answer.classify() {
            Outcome::Refused(refusal) => refusal.reason.as_str(),
            Outcome::Declined(Decline { by: DeclinedBy::Issuer, .. }) => "declined by the issuer",
            Outcome::Declined(Decline { by: DeclinedBy::Gateway, .. }) => "declined by the gateway",
            other => other.label(),
        }
    }

    /// Each error answer of the outcome table, with the class it falls in.
    #[test]
    fn error_answers() {
        let cases = [
            (error(402, "card_error", Some("card_declined"), None), "declined by the issuer"),
            (
                error(400, "invalid_request_error", Some("resource_missing"), Some("payment_method")),
                "declined by the gateway",
            ),
            (
                error(400, "invalid_request_error", Some("payment_method_unactivated"), Some("payment_method")),
                "declined by the gateway",
            ),
            (error(400, "invalid_request_error", Some("parameter_missing"), Some("payment_method")), "invalid_request"),
            (
                error(400, "invalid_request_error", Some("parameter_unknown"), Some("confirmation_method")),
                "invalid_request",
            ),
            (error(400, "invalid_request_error", None, Some("return_url")), "invalid_request"),
            (error(400, "idempotency_error", None, None), "idempotency"),
            (error(401, "invalid_request_error", None, None), "authentication"),
            (error(403, "invalid_request_error", None, None), "permission"),
            (error(404, "invalid_request_error", Some("resource_missing"), Some("intent")), "not_found"),
            (error(409, "idempotency_error", None, None), "unavailable"),
            (error(409, "invalid_request_error", Some("lock_timeout"), None), "unavailable"),
            (error(429, "invalid_request_error", Some("rate_limit"), None), "unavailable"),
            (error(500, "api_error", None, None), "unavailable"),
            (error(503, "invalid_request_error", None, None), "unavailable"),
        ];
        for (answer, expected) in cases {
            assert_eq!(class(&answer), expected, "{answer:?}");
        }
        let url = ErrorAnswer {
            message: "Unrecognized request URL (POST: /v1/v1/payment_intents).",
            ..error(404, "invalid_request_error", None, None)
        };
        assert_eq!(class(&url), "unknown_url");
    }

    /// `Stripe-Should-Retry` decides first, as in Stripe's libraries: `true` makes any answer
    /// unknown, `false` makes what would be unknown a refusal; without it the status decides.
    #[test]
    fn the_gateways_retry_hint_decides_first() {
        let hinted = |answer: ErrorAnswer<'static>, hint| class(&ErrorAnswer { should_retry: Some(hint), ..answer });
        assert_eq!(hinted(error(500, "api_error", None, None), true), "unavailable");
        assert_eq!(hinted(error(500, "api_error", None, None), false), "not_retryable");
        assert_eq!(
            hinted(error(409, "idempotency_error", Some("idempotency_key_in_use"), None), false),
            "not_retryable"
        );
        assert_eq!(hinted(error(429, "invalid_request_error", Some("rate_limit"), None), true), "unavailable");
        assert_eq!(hinted(error(400, "invalid_request_error", Some("lock_timeout"), None), true), "unavailable");
        assert_eq!(
            hinted(error(400, "invalid_request_error", Some("parameter_unknown"), None), false),
            "invalid_request"
        );
        assert_eq!(hinted(error(402, "card_error", Some("card_declined"), None), false), "declined by the issuer");
        assert_eq!(class(&error(500, "api_error", None, None)), "unavailable", "no hint: the status decides");
        let refund = ErrorAnswer { should_retry: Some(false), ..error(503, "api_error", None, None) };
        assert_eq!(refund.classify_refund().label(), "refused");
    }

    /// A decline keeps the gateway's codes and PaymentIntent; a refusal keeps its message.
    #[test]
    fn details_survive_classification() {
        let answer = ErrorAnswer {
            decline_code: Some("insufficient_funds"),
            payment_intent: Some("pi_1"),
            ..error(402, "card_error", Some("card_declined"), None)
        };
        let Outcome::Declined(decline) = answer.classify() else { panic!() };
        assert_eq!(
            (decline.payment_intent.as_deref(), decline.code.as_str(), decline.decline_code.as_deref()),
            (Some("pi_1"), "card_declined", Some("insufficient_funds"))
        );
        let Outcome::Refused(refusal) = error(401, "invalid_request_error", None, None).classify() else { panic!() };
        assert_eq!((refusal.status, refusal.message.as_str()), (Some(401), "msg"));
    }

    /// Refund answers: nothing left at the gateway is final; the rest follows the payment's rules.
    #[test]
    fn refund_answers() {
        let label = |answer: ErrorAnswer<'_>| answer.classify_refund().label();
        assert_eq!(label(error(400, "invalid_request_error", Some("charge_already_refunded"), None)), "declined");
        assert_eq!(label(error(400, "invalid_request_error", Some("amount_too_large"), Some("amount"))), "declined");
        assert_eq!(label(error(400, "invalid_request_error", Some("parameter_unknown"), None)), "refused");
        assert_eq!(label(error(500, "api_error", None, None)), "unavailable");
        assert_eq!(label(error(409, "idempotency_error", None, None)), "unavailable");
        assert_eq!(RefundOutcome::of_refund("re_1", Some("succeeded"), None).label(), "succeeded");
        assert_eq!(RefundOutcome::of_refund("re_1", Some("pending"), None).label(), "pending");
        assert_eq!(RefundOutcome::of_refund("re_1", Some("failed"), Some("lost_or_stolen_card")).label(), "declined");
        assert_eq!(RefundOutcome::of_refund("re_1", None, None).label(), "refused");
    }

    /// Every PaymentIntent status, with the class it falls in.
    #[test]
    fn intent_statuses() {
        let intent = |status| IntentAnswer {
            id: "pi_1",
            status,
            amount_capturable: 0,
            amount_received: 0,
            next_action: None,
            last_payment_error: None,
        };
        let expected = [
            ("succeeded", "succeeded"),
            ("processing", "pending"),
            ("requires_action", "pending"),
            ("requires_payment_method", "declined"),
            ("canceled", "canceled"),
            ("requires_capture", "authorized"),
            ("requires_confirmation", "refused"),
            ("something_new", "refused"),
        ];
        for (status, class) in expected {
            assert_eq!(intent(status).classify().label(), class, "{status}");
        }
        let action = json!({"type": "use_stripe_sdk", "use_stripe_sdk": {}});
        let waiting = IntentAnswer { next_action: Some(action.clone()), ..intent("requires_action") };
        assert_eq!(
            waiting.classify(),
            Outcome::Pending {
                payment_intent: "pi_1".into(),
                status: PendingStatus::RequiresAction,
                next_action: Some(action)
            }
        );
        let failed = IntentAnswer {
            last_payment_error: Some(ErrorAnswer {
                message: "The account is closed.",
                ..error(400, "invalid_request_error", Some("bank_account_closed"), None)
            }),
            ..intent("requires_payment_method")
        };
        let Outcome::Declined(decline) = failed.classify() else { panic!() };
        assert_eq!((decline.by, decline.code.as_str()), (DeclinedBy::Gateway, "bank_account_closed"));
    }
}
