//! RFC 9457 problem details: the body of every error payonce returns.
//!
//! A problem is built once and can become a live response ([`IntoResponse`]) or be stored as part
//! of an idempotent result and replayed later (a declined card is a final answer, so its 402 is
//! stored like a 201). Both paths serialise through [`Problem::to_json`], so a replay is
//! byte-for-byte the original.
//!
//! Every `type` is listed in [`TYPES`] (the OpenAPI description documents each from there, see
//! `http::openapi`) and, with what a client should do about it, in `docs/errors.md`. A new type
//! goes in both, or the conformance test (tests/api/openapi.rs) refuses the responses that carry it.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

/// Media type of problem documents (RFC 9457 §3).
pub const CONTENT_TYPE: &str = "application/problem+json";

/// Where problem type URIs live. The URIs are identifiers first; `docs/errors.md` documents each.
const TYPE_BASE: &str = "https://payonce.dev/problems/";

/// One kind of problem: what its `type` URI ends with, its status and its title.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    pub slug: &'static str,
    pub status: StatusCode,
    pub title: &'static str,
    /// When it is answered, in a sentence (the OpenAPI description's; docs/errors.md says more).
    pub when: &'static str,
}

impl ProblemType {
    /// The `type` URI.
    pub fn uri(&self) -> String {
        format!("{TYPE_BASE}{}", self.slug)
    }

    /// A problem of this type, saying `detail`: what the domain stores as a final answer.
    pub fn problem(&self, detail: impl Into<String>) -> Problem {
        Problem::new(self.status, self.slug, self.title, detail)
    }

    /// That problem as a final answer (not replayed with a location).
    pub fn stored(&self, problem: Problem) -> crate::idempotency::StoredResponse {
        crate::idempotency::StoredResponse::new(self.status, CONTENT_TYPE, None, problem.to_json())
    }

    /// The type of this slug.
    pub fn of(slug: &str) -> Option<&'static ProblemType> {
        TYPES.iter().find(|t| t.slug == slug)
    }
}

macro_rules! problem_types {
    ($($name:ident = ($slug:literal, $status:ident, $title:literal, $when:literal);)+) => {
        $(
            #[doc = $when]
            pub const $name: ProblemType =
                ProblemType { slug: $slug, status: StatusCode::$status, title: $title, when: $when };
        )+
        /// Every problem type payonce answers with (besides RFC 9457's `about:blank`).
        pub const TYPES: &[ProblemType] = &[$($name),+];
    };
}

problem_types! {
    UNAUTHORIZED = ("unauthorized", UNAUTHORIZED, "Authentication required",
        "No `Authorization: Bearer po_…` header, or an unknown API key.");
    IDEMPOTENCY_KEY_MISSING = ("idempotency-key-missing", BAD_REQUEST, "Idempotency-Key required",
        "The request has no `Idempotency-Key` header.");
    IDEMPOTENCY_KEY_INVALID = ("idempotency-key-invalid", BAD_REQUEST, "Invalid Idempotency-Key",
        "The key is empty, longer than 255 characters, not printable ASCII, a broken Structured Field String, or sent more than once.");
    INVALID_REQUEST = ("invalid-request", BAD_REQUEST, "Invalid request",
        "The body, a query parameter or a path segment is malformed or invalid (`errors` names each field), or holds a value the database cannot store.");
    UNSUPPORTED_MEDIA_TYPE = ("unsupported-media-type", UNSUPPORTED_MEDIA_TYPE, "Unsupported media type",
        "The body is not sent as `application/json`.");
    UNSUPPORTED_CONTENT_ENCODING = ("unsupported-content-encoding", UNSUPPORTED_MEDIA_TYPE, "Unsupported content encoding",
        "The request has a `Content-Encoding` other than `identity`.");
    PAYLOAD_TOO_LARGE = ("payload-too-large", PAYLOAD_TOO_LARGE, "Request body too large",
        "The body is larger than the route accepts (64 KiB for the API, 256 KiB for a webhook event).");
    REQUEST_TIMEOUT = ("request-timeout", REQUEST_TIMEOUT, "Request timeout",
        "The body did not arrive within the body timeout.");
    NOT_FOUND = ("not-found", NOT_FOUND, "Not found",
        "An unknown URL, or a payment that does not exist or belongs to another customer.");
    METHOD_NOT_ALLOWED = ("method-not-allowed", METHOD_NOT_ALLOWED, "Method not allowed",
        "The URL does not support the method.");
    IDEMPOTENCY_KEY_IN_USE = ("idempotency-key-in-use", CONFLICT, "Request in progress",
        "The key may not be taken now (`reason`: in_flight, backoff or reconciling); retry the same request after `Retry-After`.");
    IDEMPOTENCY_KEY_REUSED = ("idempotency-key-reused", UNPROCESSABLE_ENTITY, "Idempotency-Key reused",
        "The key was first used with a different body, or for another endpoint.");
    CARD_DECLINED = ("card-declined", PAYMENT_REQUIRED, "Card declined",
        "The card issuer declined. Final, and replayed to every retry of the key.");
    PAYMENT_REJECTED = ("payment-rejected", PAYMENT_REQUIRED, "Payment rejected by the gateway",
        "The gateway refused the payment method. Final, and replayed to every retry of the key.");
    PAYMENT_ABANDONED = ("payment-abandoned", BAD_GATEWAY, "Payment abandoned",
        "The key's budget was spent and the gateway confirmed that no charge was made. Final, and replayed.");
    GATEWAY_UNAVAILABLE = ("gateway-unavailable", SERVICE_UNAVAILABLE, "Payment gateway unavailable",
        "No answer that tells from the gateway; retry with the same key after `Retry-After`.");
    GATEWAY_REFUSED = ("gateway-refused", SERVICE_UNAVAILABLE, "Payment gateway refused payonce's request",
        "The gateway refused payonce's own request (its configuration); retry with the same key later.");
    SERVICE_UNAVAILABLE = ("service-unavailable", SERVICE_UNAVAILABLE, "Service temporarily unavailable",
        "The database is unreachable, busy, or a statement ran past its timeout; retry after `Retry-After`.");
    PAYMENT_NOT_REFUNDABLE = ("payment-not-refundable", CONFLICT, "Payment not refundable",
        "`POST /v1/refunds` of a payment that has not succeeded. Not stored: the key may be used again.");
    REFUND_EXCEEDS_PAYMENT = ("refund-exceeds-payment", CONFLICT, "Refund exceeds what remains of the payment",
        "`POST /v1/refunds` for more than remains of the payment (its other refunds, in progress included, take the rest). Not stored.");
    REFUND_REJECTED = ("refund-rejected", BAD_GATEWAY, "Refund rejected by the gateway",
        "The gateway would not refund (already refunded, not that much remains, or the refund failed). Final, and replayed.");
    PAYMENT_NOT_CAPTURABLE = ("payment-not-capturable", CONFLICT, "Payment not capturable",
        "A capture or cancel of a payment that is not authorized and unsettled: not `requires_capture`, or already claimed by a capture or a cancel (one, once), or its authorization expired.");
    SETTLEMENT_ABANDONED = ("settlement-abandoned", BAD_GATEWAY, "Capture or cancel abandoned",
        "The gateway confirmed it never made the capture (or cancel): the authorization is as it was. Send it again with a new key.");
    REFUND_ABANDONED = ("refund-abandoned", BAD_GATEWAY, "Refund abandoned",
        "The refund key's budget was spent and the gateway confirmed it never made the refund. Final, and replayed.");
    LOCK_SERVICE_UNAVAILABLE = ("lock-service-unavailable", SERVICE_UNAVAILABLE, "Lock service unavailable",
        "Only the lab's `redis` claim strategy: Redis, which holds its leases, cannot be reached; retry with the same key after `Retry-After`.");
    INTERNAL = ("internal", INTERNAL_SERVER_ERROR, "Internal error",
        "A bug; it is logged with the request id.");
    WEBHOOK_SIGNATURE_INVALID = ("webhook-signature-invalid", BAD_REQUEST, "Webhook signature invalid",
        "No `Stripe-Signature`, one that does not sign the body with the endpoint's secret, or a stale one.");
    WEBHOOK_UNREADABLE = ("webhook-unreadable", BAD_REQUEST, "Webhook event unreadable",
        "A correctly signed event that this version cannot read.");
    WEBHOOKS_NOT_CONFIGURED = ("webhooks-not-configured", SERVICE_UNAVAILABLE, "Webhooks not configured",
        "No webhook signing secret is configured, so no event can be verified.");
}

/// One invalid field, reported to the client in the problem's `errors` member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// The field's JSON path, e.g. `amount` or `metadata.order`.
    pub field: String,
    /// What is wrong with it.
    pub detail: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { field: field.into(), detail: detail.into() }
    }
}

/// The 400 for a request that was not processed: `detail` says why, `errors` (when any) name each
/// invalid field. Its key was not used, so the same key may carry the corrected request.
pub fn invalid_request(detail: &str, errors: &[FieldError]) -> Problem {
    let problem = INVALID_REQUEST
        .problem(format!("{detail}. The request was not processed and its Idempotency-Key was not used."));
    if errors.is_empty() { problem } else { problem.with("errors", serde_json::to_value(errors).unwrap_or_default()) }
}

/// The 400 for invalid fields: [`invalid_request`] with every field's error in `detail` too.
pub fn invalid_fields(errors: &[FieldError]) -> Problem {
    invalid_request(&fields_detail(errors), errors)
}

/// The fields' errors in one sentence.
pub fn fields_detail(errors: &[FieldError]) -> String {
    errors.iter().map(|e| format!("{}: {}", e.field, e.detail)).collect::<Vec<_>>().join("; ")
}

/// What `http::error::log_errors` logs for a failed request: every error response (the API's
/// problems, the pages' error pages) leaves one in its extensions, and nothing logs on the way.
#[derive(Debug, Clone)]
pub struct LoggedError {
    pub status: StatusCode,
    pub message: String,
}

/// One problem document.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// A stable URI naming the kind of problem; clients branch on this, never on `title`.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short, human-readable summary of the kind of problem; the same for every occurrence.
    pub title: &'static str,
    /// The HTTP status, repeated in the body for clients that lose the status line.
    #[serde(serialize_with = "serialize_status")]
    pub status: StatusCode,
    /// What went wrong this time, and what to do about it.
    pub detail: String,
    /// Extension members (RFC 9457 §3.2), e.g. `retry_after` or the decline code.
    #[serde(flatten)]
    pub extensions: Map<String, Value>,
}

fn serialize_status<S: serde::Serializer>(status: &StatusCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(status.as_u16())
}

impl Problem {
    /// A problem of kind `slug` (the last segment of its type URI).
    pub fn new(status: StatusCode, slug: &str, title: &'static str, detail: impl Into<String>) -> Self {
        Self { type_uri: format!("{TYPE_BASE}{slug}"), title, status, detail: detail.into(), extensions: Map::new() }
    }

    /// The problem for a response that came without one (see `http::edge::problems`): the type
    /// payonce has for `status`, or RFC 9457's `about:blank` ("nothing more than the status").
    /// `detail` is what the response said, if anything.
    pub fn for_status(status: StatusCode, detail: &str) -> Self {
        use StatusCode as S;
        let (slug, title, default_detail) = match status {
            S::BAD_REQUEST => ("invalid-request", "Invalid request", "The request is malformed."),
            S::NOT_FOUND => ("not-found", "Not found", "There is nothing at this URL."),
            S::METHOD_NOT_ALLOWED => {
                ("method-not-allowed", "Method not allowed", "This URL does not support this HTTP method.")
            }
            S::REQUEST_TIMEOUT => ("request-timeout", "Request timeout", "The request did not arrive in time."),
            S::PAYLOAD_TOO_LARGE => ("payload-too-large", "Request body too large", "The request body is too large."),
            S::UNSUPPORTED_MEDIA_TYPE => {
                ("unsupported-media-type", "Unsupported media type", "The request body's media type is not accepted.")
            }
            S::INTERNAL_SERVER_ERROR => {
                ("internal", "Internal error", "Something unexpected went wrong; it was logged.")
            }
            S::SERVICE_UNAVAILABLE => ("service-unavailable", "Service temporarily unavailable", "Retry in a moment."),
            _ => {
                let title = status.canonical_reason().unwrap_or("Error");
                let detail = if detail.is_empty() { title } else { detail };
                return Self {
                    type_uri: "about:blank".to_owned(),
                    title,
                    status,
                    detail: detail.to_owned(),
                    extensions: Map::new(),
                };
            }
        };
        Self::new(status, slug, title, if detail.is_empty() { default_detail } else { detail })
    }

    /// Adds an extension member.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// The serialised document.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising a struct of strings, numbers and JSON values cannot fail.
        serde_json::to_vec(self).expect("a problem document always serialises")
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = self.to_json();
        (self.status, [(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE))], body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire shape has the five RFC 9457 members and flattened extensions.
    #[test]
    fn serialises_members_and_extensions() {
        let problem =
            Problem::new(StatusCode::CONFLICT, "idempotency-key-in-use", "In use", "wait").with("retry_after", 3);
        let json: Value = serde_json::from_slice(&problem.to_json()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "type": "https://payonce.dev/problems/idempotency-key-in-use",
                "title": "In use",
                "status": 409,
                "detail": "wait",
                "retry_after": 3
            })
        );
    }
}
