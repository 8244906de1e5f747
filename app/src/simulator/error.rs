//! Stripe's error envelope: `{"error": {"type": …, "code": …, "doc_url": …, "message": …,
//! "param": …, "request_log_url": …}}`.
//!
//! Clients branch on `type` (always present) and `code`/`decline_code`, so those use Stripe's exact
//! values; the messages follow Stripe's wording closely enough to be recognisable in logs. A code
//! comes with its `doc_url`; the envelope names the request in `request_log_url` (the request
//! that executed, for a saved result); a card error carries the PaymentIntent and PaymentMethod.
//! Members without a value are left out, as Stripe does. See <https://docs.stripe.com/api/errors>.

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
    /// What to do about a decline: `do_not_try_again` for a card reported lost or stolen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice_code: Option<&'static str>,
    /// For declines, the id of the failed charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
    /// A short machine-readable reason, e.g. `card_declined` or `parameter_missing`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    /// For card errors, the issuer's reason, e.g. `insufficient_funds`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<&'static str>,
    /// Stripe's page about the `code`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doc_url: Option<String>,
    /// A sentence for the developer (and, for card errors, one that can be shown to the customer).
    pub message: String,
    /// The request parameter the error is about, e.g. `amount` or `metadata[order_id]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// For errors during confirmation, the PaymentIntent as it was left (Stripe includes it so a
    /// client can see `status` and `last_payment_error` without another request). A JSON
    /// snapshot, so that this module stays below the objects it describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_intent: Option<serde_json::Value>,
    /// For card errors, the PaymentMethod that was declined (a JSON snapshot too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<serde_json::Value>,
    /// Where the request is logged (Stripe's Dashboard), on the envelope's error only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_log_url: Option<String>,
    /// The error category (see [`ErrorType`]).
    #[serde(rename = "type")]
    pub kind: ErrorType,
}

impl ErrorObject {
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        Self {
            advice_code: None,
            charge: None,
            code: None,
            decline_code: None,
            doc_url: None,
            message: message.into(),
            param: None,
            payment_intent: None,
            payment_method: None,
            request_log_url: None,
            kind,
        }
    }

    /// Sets the code, and its `doc_url` (`card_declined` → `…/error-codes/card-declined`).
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self.doc_url = Some(format!("https://stripe.com/docs/error-codes/{}", code.replace('_', "-")));
        self
    }
}

/// Stripe's Dashboard page of a request's log. (The simulator has no Dashboard: the link has
/// Stripe's shape and names the request, whose `Request-Id` the simulator's log shows.)
fn request_log_url(request_id: &str) -> String {
    format!("https://dashboard.stripe.com/test/logs/{request_id}?t={}", super::objects::now())
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
        Self { status, error: Box::new(ErrorObject::new(kind, message)), should_retry: false }
    }

    /// A 400 `invalid_request_error` with no code; chain [`Self::code`] and [`Self::param`].
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, message)
    }

    pub fn code(mut self, code: &'static str) -> Self {
        *self.error = self.error.with_code(code);
        self
    }

    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }

    /// Attaches the PaymentIntent as it is (a JSON snapshot), as Stripe does on the errors of a
    /// call on one PaymentIntent (a confirmation's decline, a capture or cancel it refuses).
    pub fn payment_intent(mut self, intent: serde_json::Value) -> Self {
        self.error.payment_intent = Some(intent);
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

    /// The JSON body; `request_id` names the request in `request_log_url`.
    pub fn body(&self, request_id: Option<&str>) -> Bytes {
        let mut error = (*self.error).clone();
        error.request_log_url = request_id.map(request_log_url);
        to_json(&Envelope { error: &error })
    }

    /// The error as a saved result of request `request_id`: errors decided during execution are
    /// replayed like successes, naming the request that executed.
    pub fn saved(&self, request_id: &str) -> SavedResponse {
        SavedResponse::new(self.status, self.body(Some(request_id)), self.outcome())
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

/// Renders the error without knowing the request; the server's middleware, which does, renders
/// it again with its `request_log_url` (it finds the error in the response's extensions).
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], self.body(None))
                .into_response();
        let headers = response.headers_mut();
        if self.should_retry {
            headers.insert("stripe-should-retry", HeaderValue::from_static("true"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"Stripe\""));
        }
        response.extensions_mut().insert(Outcome(self.outcome()));
        response.extensions_mut().insert(self);
        response
    }
}
