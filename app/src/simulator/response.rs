//! What the Stripe routes answer with: JSON bodies, saved results, the request-log label.
//!
//! A leaf module: everything above renders through it, and it knows no simulator concept.

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// A label for the request log, put in the response's extensions by whoever decided the outcome
/// (`succeeded`, `card_declined`, `idempotency_key_in_use`, `fault_fail`, …).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outcome(pub &'static str);

/// The status and body of an answer, as saved for idempotent replays (and replayed verbatim).
#[derive(Clone, Debug)]
pub(crate) struct SavedResponse {
    pub status: StatusCode,
    pub body: Bytes,
    /// A label for the request log, e.g. `succeeded` or `card_declined`.
    pub outcome: &'static str,
    /// The `Request-Id` of the request that executed, once saved for an `Idempotency-Key`: sent
    /// as `Original-Request` with the answer and every replay of it, as Stripe does.
    pub original_request: Option<String>,
}

impl SavedResponse {
    pub fn new(status: StatusCode, body: Bytes, outcome: &'static str) -> Self {
        Self { status, body, outcome, original_request: None }
    }

    /// A 200 with `value` as its JSON body.
    pub fn ok(value: &impl Serialize, outcome: &'static str) -> Self {
        Self::new(StatusCode::OK, to_json(value), outcome)
    }

    /// Renders the answer, marking replays as Stripe does (`Idempotent-Replayed: true`).
    pub fn respond(self, replayed: bool) -> Response {
        let mut response =
            (self.status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], self.body).into_response();
        if replayed {
            response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        if let Some(original) = self.original_request.and_then(|id| HeaderValue::from_str(&id).ok()) {
            response.headers_mut().insert("original-request", original);
        }
        response.extensions_mut().insert(Outcome(self.outcome));
        response
    }

    /// The work is done (and saved), but the client must not learn the result: the body fails,
    /// so hyper aborts the connection instead of completing the response (in practice before even
    /// the buffered status line is flushed). The client sees the connection close with no answer,
    /// as when a connection dies after the server committed; async-stripe reports
    /// `StripeError::ClientError`.
    pub fn lose(self) -> Response {
        let failing_body = futures_util::stream::once(async {
            Err::<Bytes, _>(std::io::Error::other("response lost on purpose (drop_after_charge_rate)"))
        });
        let mut response = (
            self.status,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            Body::from_stream(failing_body),
        )
            .into_response();
        response.extensions_mut().insert(Outcome("fault_lost_response"));
        response
    }
}

/// Serialises one of the simulator's own response types.
pub(crate) fn to_json(value: &impl Serialize) -> Bytes {
    // Only our own structs reach this (string keys, no floats that could be NaN), for which
    // serde_json cannot fail; a failure would be a bug in the simulator, not in a request.
    Bytes::from(serde_json::to_vec(value).expect("simulator objects always serialise to JSON"))
}

/// The JSON value of one of the simulator's own types (an object snapshot for an event, an
/// expanded field).
pub(crate) fn to_value(value: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).expect("simulator objects always serialise to JSON")
}
