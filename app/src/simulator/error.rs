//! Stripe's error envelope: `{"error": {"type": …, "code": …, "message": …, "param": …}}`.
//!
//! Clients branch on `type` (always present) and `code`/`decline_code`, so those use Stripe's exact
//! values; the messages follow Stripe's wording closely enough to be recognisable in logs. See
//! <https://docs.stripe.com/api/errors>.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::response::{Outcome, SavedResponse, to_json};

/// Stripe's error `type`: the one field every Stripe client requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum ErrorType {
    /// Something went wrong on Stripe's side (here: an injected outage).
    #[serde(rename = "api_error")]
    Api,
    /// The card was declined; the HTTP status is 402.
    #[serde(rename = "card_error")]
    Card,
    /// An `Idempotency-Key` was reused with other parameters, or while still in use.
    #[serde(rename = "idempotency_error")]
    Idempotency,
    /// The request itself is wrong: bad parameters, unknown object, missing API key.
    #[serde(rename = "invalid_request_error")]
    InvalidRequest,
}

/// The object under `"error"`. It is also a PaymentIntent's `last_payment_error`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ErrorObject {
    /// The error category (see [`ErrorType`]).
    #[serde(rename = "type")]
    pub kind: ErrorType,
    /// A short machine-readable reason, e.g. `card_declined` or `parameter_missing`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    /// For card errors, the issuer's reason, e.g. `insufficient_funds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<&'static str>,
    /// A sentence for the developer (and, for card errors, one that can be shown to the customer).
    pub message: String,
    /// The request parameter the error is about, e.g. `amount` or `metadata[order_id]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// For declines, the id of the failed charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
    /// For errors during confirmation, the PaymentIntent as it was left (Stripe includes it so a
    /// client can see `status` and `last_payment_error` without another request). A JSON
    /// snapshot, so that this module stays below the objects it describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_intent: Option<serde_json::Value>,
}

/// A Stripe error response: an HTTP status and the error object.
///
/// Building one has no side effects; `IntoResponse` only renders it.
#[derive(Clone, Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    /// Boxed: the object is large, and errors travel through many `Result`s.
    pub error: Box<ErrorObject>,
    /// Sends `Stripe-Should-Retry: true`, the hint Stripe clients use to decide to retry.
    pub should_retry: bool,
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: &'a ErrorObject,
}

impl ApiError {
    fn new(status: StatusCode, kind: ErrorType, message: impl Into<String>) -> Self {
        let error = Box::new(ErrorObject {
            kind,
            code: None,
            decline_code: None,
            message: message.into(),
            param: None,
            charge: None,
            payment_intent: None,
        });
        Self { status, error, should_retry: false }
    }

    /// A 400 `invalid_request_error` with no code; chain [`Self::code`] and [`Self::param`].
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, message)
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.error.code = Some(code);
        self
    }

    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn parameter_missing(param: &str) -> Self {
        Self::invalid_request(format!("Missing required param: {param}.")).code("parameter_missing").param(param)
    }

    /// `supported` names what the route accepts, for the developer who hit the subset's edge.
    pub fn parameter_unknown(param: &str, supported: &str) -> Self {
        Self::invalid_request(format!(
            "Received unknown parameter: {param}. (The payonce Stripe simulator supports only \
             {supported} here.)"
        ))
        .code("parameter_unknown")
        .param(param)
    }

    /// Stripe treats an empty value as "unset this parameter", which a required one cannot be.
    pub fn parameter_empty(param: &str) -> Self {
        Self::invalid_request(format!(
            "You passed an empty string for '{param}'. We assume empty values are an attempt to \
             unset a parameter; however '{param}' cannot be unset. You should remove '{param}' \
             from your request or supply a non-empty value."
        ))
        .code("parameter_invalid_empty")
        .param(param)
    }

    /// `kind` is Stripe's object name in messages, e.g. `PaymentMethod` or `payment_intent`.
    pub fn resource_missing(kind: &str, id: &str, param: &str) -> Self {
        Self::invalid_request(format!("No such {kind}: '{id}'")).code("resource_missing").param(param)
    }

    /// A 404 for an object id in the URL path (`GET /v1/refunds/re_nope`).
    pub fn not_found(kind: &str, id: &str, param: &str) -> Self {
        Self::resource_missing(kind, id, param).with_status(StatusCode::NOT_FOUND)
    }

    pub fn idempotency_mismatch() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorType::Idempotency,
            "Keys for idempotent requests can only be used with the same parameters they were \
             first used with. Try using a key other than the one used for this request if you \
             meant to execute a different request.",
        )
    }

    pub fn idempotency_key_in_use() -> Self {
        let mut error = Self::new(
            StatusCode::CONFLICT,
            ErrorType::Idempotency,
            "There is currently another in-progress request using this Idempotent Key (that \
             probably means you submitted twice, and the other request is still going through). \
             Please try again later.",
        )
        .code("idempotency_key_in_use");
        error.should_retry = true;
        error
    }

    /// A 401; the message depends on whether a key was sent at all.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorType::InvalidRequest, message)
    }

    /// A 500 `api_error` that tells the client to retry.
    pub fn internal(message: impl Into<String>) -> Self {
        let mut error = Self::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorType::Api, message);
        error.should_retry = true;
        error
    }

    /// A 402 `card_error` for a decline. (No `Stripe-Should-Retry`: only the status and body of
    /// an executed request are saved, and a replay must look like the original.)
    pub fn card_error(error: ErrorObject) -> Self {
        Self { status: StatusCode::PAYMENT_REQUIRED, error: Box::new(error), should_retry: false }
    }

    /// The JSON body, as saved for idempotent replays.
    pub fn body(&self) -> Bytes {
        to_json(&Envelope { error: &self.error })
    }

    /// The error as a saved result: errors decided during execution are replayed like successes.
    pub fn saved(&self) -> SavedResponse {
        SavedResponse { status: self.status, body: self.body(), outcome: self.outcome() }
    }

    /// A short label for the request log: the code if there is one, else the type.
    pub fn outcome(&self) -> &'static str {
        match (self.error.code, self.error.kind) {
            (Some(code), _) => code,
            (None, ErrorType::Api) => "api_error",
            (None, ErrorType::Card) => "card_error",
            (None, ErrorType::Idempotency) => "idempotency_error",
            (None, ErrorType::InvalidRequest) => "invalid_request_error",
        }
    }
}

// axum's extractor rejections (a body over the size limit, an undecodable path) in Stripe's
// envelope, so that no response from the simulator is plain text.
impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        Self::invalid_request(rejection.body_text()).with_status(rejection.status())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::invalid_request(rejection.body_text()).with_status(rejection.status())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], self.body()).into_response();
        let headers = response.headers_mut();
        if self.should_retry {
            headers.insert("stripe-should-retry", HeaderValue::from_static("true"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"Stripe\""));
        }
        response.extensions_mut().insert(Outcome(self.outcome()));
        response
    }
}
