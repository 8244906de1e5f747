//! The API's one error type, and how each error becomes a problem response.
//!
//! As in axum's `error-handling` example, turning an error into a response has no side effects:
//! [`ApiError::into_response`] only builds the problem document and leaves a [`LoggedError`] in
//! the response's extensions; [`log_errors`] (a middleware inside the request's trace span) logs
//! it, once, with the request id.

use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::body::BodyFault;
use crate::db::Failure;
use crate::gateway::GatewayError;
use crate::gateway::outcome::RefusalReason;
use crate::idempotency::claim::retry_after as whole_seconds;
use crate::idempotency::{Busy, ClaimError, KeyError};
use crate::payments::process::ProcessError;
use crate::problem::{FieldError, LoggedError, Problem, fields_detail, invalid_request};

/// How long a client should wait while the database is unreachable.
const DATABASE_RETRY_AFTER: Duration = Duration::from_secs(2);

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid API key")]
    Unauthorized,
    #[error(transparent)]
    IdempotencyKey(#[from] KeyError),
    #[error("invalid request: {detail}")]
    InvalidRequest { detail: String, errors: Vec<FieldError> },
    #[error("the request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error(transparent)]
    Body(#[from] BodyFault),
    #[error("the request body has a Content-Encoding other than identity")]
    UnsupportedContentEncoding,
    #[error("not found")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("the idempotency key may not be taken now ({})", .reason.as_str())]
    InFlight { retry_after: Duration, reason: Busy },
    #[error("{0}")]
    KeyReused(String),
    /// No answer that tells from the gateway; the key was released.
    #[error("{error}")]
    Gateway { error: GatewayError, retry_after: Duration },
    /// The gateway refused payonce's own request; the key was released, nothing stored.
    #[error("the gateway refused payonce's request: {}", .reason.describe())]
    GatewayRefused { reason: RefusalReason, retry_after: Duration },
    #[error("webhook signature refused: {0}")]
    WebhookSignature(String),
    #[error("the webhook event could not be read")]
    WebhookUnreadable,
    #[error("no webhook secret is configured")]
    WebhooksNotConfigured,
    #[error("database unavailable: {0}")]
    DatabaseUnavailable(sqlx::Error),
    /// The database refused a value of the request (a data exception that validation at the
    /// edge should have caught first).
    #[error("the database refused a value: {0}")]
    DatabaseRefused(sqlx::Error),
    /// The lab's redis strategy could not reach Redis, its lock service.
    #[error("the lock service (Redis) is unavailable: {detail}")]
    LockServiceUnavailable { detail: String, retry_after: Duration },
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 for a body that parsed but did not validate.
    pub fn invalid_fields(errors: Vec<FieldError>) -> Self {
        Self::InvalidRequest { detail: fields_detail(&errors), errors }
    }

    /// A 400 with a single message.
    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::InvalidRequest { detail: detail.into(), errors: Vec::new() }
    }

    fn problem(&self) -> Problem {
        use StatusCode as S;
        match self {
            Self::Unauthorized => Problem::new(
                S::UNAUTHORIZED,
                "unauthorized",
                "Authentication required",
                "Send your API key as `Authorization: Bearer po_…` (create one with `payonce customers create NAME`).",
            ),
            Self::IdempotencyKey(KeyError::Missing) => {
                Problem::new(S::BAD_REQUEST, "idempotency-key-missing", "Idempotency-Key required", KeyError::Missing.to_string())
            }
            Self::IdempotencyKey(err) => {
                Problem::new(S::BAD_REQUEST, "idempotency-key-invalid", "Invalid Idempotency-Key", format!("{err}. The request was not processed."))
            }
            Self::InvalidRequest { detail, errors } => invalid_request(detail, errors),
            Self::UnsupportedMediaType => Problem::new(
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
                "Send the body as JSON with `Content-Type: application/json`.",
            ),
            Self::Body(fault) => fault.problem(),
            Self::UnsupportedContentEncoding => Problem::new(
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-content-encoding",
                "Unsupported content encoding",
                "Send the body uncompressed, without Content-Encoding (or `Content-Encoding: identity`).",
            ),
            Self::NotFound => Problem::new(S::NOT_FOUND, "not-found", "Not found", "There is nothing at this URL for your API key."),
            Self::MethodNotAllowed => Problem::new(
                S::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                "This URL does not support this HTTP method.",
            ),
            Self::InFlight { retry_after, reason } => {
                let secs = retry_after.as_secs();
                let detail = match reason {
                    Busy::InFlight => format!(
                        "A request with this Idempotency-Key is still being processed. Retry with the same key and payload; \
                         within {secs} s (Retry-After) it is either finished and replayed, or its lease has run out and the \
                         retry resumes it."
                    ),
                    Busy::Backoff => format!(
                        "The last attempt with this Idempotency-Key got no answer from the payment gateway moments ago, and \
                         payonce spaces attempts out. Retry with the same key and payload after {secs} s (Retry-After): it \
                         resumes the payment and can never charge twice."
                    ),
                    Busy::Reconciling => format!(
                        "payonce is confirming the outcome of this payment with the payment gateway: the attempts allowed \
                         for this Idempotency-Key are spent, so instead of trying again payonce asks the gateway what became \
                         of it. Retry with the same key and payload after {secs} s (Retry-After) to get the answer; do not \
                         pay again with a new key meanwhile."
                    ),
                };
                Problem::new(S::CONFLICT, "idempotency-key-in-use", "Request in progress", detail)
                    .with("retry_after", secs)
                    .with("reason", reason.as_str())
            }
            Self::KeyReused(detail) => Problem::new(
                S::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key reused",
                format!("{detail}. A key identifies one request: send this request with a new key, or retry the original request unchanged."),
            ),
            Self::Gateway { error, retry_after } => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "gateway-unavailable",
                "Payment gateway unavailable",
                format!(
                    "{error}. The payment was not completed and may or may not have been charged; retry with the same \
                     Idempotency-Key after Retry-After: it resumes the payment and can never charge twice."
                ),
            )
            .with("retry_after", whole_seconds(retry_after.as_secs_f64()).as_secs()),
            Self::GatewayRefused { reason, retry_after } => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "gateway-refused",
                "Payment gateway refused payonce's request",
                format!(
                    "The payment could not be completed because {}. This is payonce's own configuration, not a problem with \
                     the payment, and its operators have been alerted. Nothing was stored under this Idempotency-Key: \
                     retry with the same key later (after Retry-After); once the configuration is fixed it resumes the \
                     payment and can never charge twice.",
                    reason.describe()
                ),
            )
            .with("retry_after", whole_seconds(retry_after.as_secs_f64()).as_secs()),
            Self::WebhookSignature(why) => Problem::new(
                S::BAD_REQUEST,
                "webhook-signature-invalid",
                "Webhook signature invalid",
                format!("{why}. The event was not applied."),
            ),
            Self::WebhookUnreadable => Problem::new(
                S::BAD_REQUEST,
                "webhook-unreadable",
                "Webhook event unreadable",
                "The signature is valid but the body is not a Stripe event this version can read. It was not applied; \
                 check that the endpoint's API version matches payonce's.",
            ),
            Self::WebhooksNotConfigured => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "webhooks-not-configured",
                "Webhooks not configured",
                "payonce has no webhook signing secret (STRIPE_WEBHOOK_SECRET), so it cannot verify any event. The event \
                 was not applied; it is accepted once the secret is configured.",
            ),
            Self::DatabaseUnavailable(err) => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "service-unavailable",
                "Service temporarily unavailable",
                format!(
                    "{} Retry with the same Idempotency-Key; the request resumes where it stopped.",
                    match err {
                        // No pooled connection in time: every one is busy, or none can connect.
                        sqlx::Error::PoolTimedOut => "The database could not be reached in time.",
                        err if Failure::of(err) == Failure::Busy => {
                            "The database did not answer in time (it is busy, or a lock is held too long)."
                        }
                        _ => "The database could not be reached.",
                    }
                ),
            )
            .with("retry_after", DATABASE_RETRY_AFTER.as_secs()),
            Self::DatabaseRefused(err) => Problem::new(
                S::BAD_REQUEST,
                "invalid-request",
                "Invalid request",
                format!(
                    "The database cannot store a value of this request ({}). Retrying it unchanged fails the same way.",
                    err.as_database_error().map_or_else(|| err.to_string(), |db| db.message().to_owned())
                ),
            ),
            Self::LockServiceUnavailable { retry_after, .. } => Problem::new(
                S::SERVICE_UNAVAILABLE,
                "lock-service-unavailable",
                "Lock service unavailable",
                "This server claims keys in Redis (the lab's redis strategy) and Redis cannot be reached. Nothing was \
                 charged by this request; retry with the same Idempotency-Key after Retry-After.",
            )
            .with("retry_after", retry_after.as_secs()),
            Self::Internal(_) => Problem::new(
                S::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                "Something unexpected went wrong; it was logged. Retrying with the same Idempotency-Key is safe.",
            ),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after, .. } => Some(*retry_after),
            Self::Gateway { retry_after, .. } | Self::GatewayRefused { retry_after, .. } => {
                Some(whole_seconds(retry_after.as_secs_f64()))
            }
            Self::DatabaseUnavailable(_) => Some(DATABASE_RETRY_AFTER),
            Self::LockServiceUnavailable { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        match Failure::of(&err) {
            Failure::Unavailable | Failure::Busy => Self::DatabaseUnavailable(err),
            Failure::BadData => Self::DatabaseRefused(err),
            Failure::Bug => Self::Internal(err.to_string()),
        }
    }
}

impl From<ClaimError> for ApiError {
    fn from(err: ClaimError) -> Self {
        match err {
            ClaimError::RouteMismatch { .. } | ClaimError::PayloadMismatch => Self::KeyReused(err.to_string()),
            ClaimError::Database(err) => err.into(),
            ClaimError::Corrupt(_) => Self::Internal(err.to_string()),
        }
    }
}

impl From<ProcessError> for ApiError {
    fn from(err: ProcessError) -> Self {
        match err {
            // The caller retries the claim on LeaseLost; reaching here means it kept changing hands.
            ProcessError::LeaseLost(_) => {
                Self::InFlight { retry_after: Duration::from_secs(1), reason: Busy::InFlight }
            }
            ProcessError::Gateway { error, retry_after } => Self::Gateway { error, retry_after },
            ProcessError::Refused { refusal, retry_after } => {
                Self::GatewayRefused { reason: refusal.reason, retry_after }
            }
            // Only the sweeper searches; a client never holds a key that needs it.
            ProcessError::Unconfirmed { retry_after } => Self::InFlight { retry_after, reason: Busy::Reconciling },
            ProcessError::Database(err) => err.into(),
            ProcessError::Corrupt { .. } => Self::Internal(err.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let status = problem.status;
        let mut response = problem.into_response();
        if let Some(retry_after) = self.retry_after() {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after.as_secs()));
        }
        match self {
            Self::Unauthorized => {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            // RFC 9110 §15.5.16: say which codings are accepted.
            Self::UnsupportedContentEncoding => {
                response.headers_mut().insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            }
            Self::Body(fault) => fault.headers(response.headers_mut()),
            _ => {}
        }
        response.extensions_mut().insert(LoggedError { status, message: self.to_string() });
        response
    }
}

/// Logs the [`LoggedError`] of a response: 5xx as errors, 4xx at debug (they are the client's).
pub async fn log_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if let Some(err) = response.extensions().get::<LoggedError>() {
        if err.status.is_server_error() {
            tracing::error!(status = err.status.as_u16(), error = %err.message, "request failed");
        } else {
            tracing::debug!(status = err.status.as_u16(), error = %err.message, "request refused");
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::GatewayError;
    use crate::problem::{ProblemType, TYPES};

    /// Every problem the API's errors become is one of the catalogued types (which the OpenAPI
    /// description documents), with the catalogue's status and title; so is every problem a bare
    /// status becomes on the way out.
    #[test]
    fn every_problem_is_catalogued() {
        let second = Duration::from_secs(1);
        let errors = [
            ApiError::Unauthorized,
            ApiError::IdempotencyKey(KeyError::Missing),
            ApiError::IdempotencyKey(KeyError::Empty),
            ApiError::invalid("x"),
            ApiError::UnsupportedMediaType,
            ApiError::Body(BodyFault::TooLarge { limit: 1 }),
            ApiError::Body(BodyFault::Timeout),
            ApiError::Body(BodyFault::Unreadable),
            ApiError::UnsupportedContentEncoding,
            ApiError::NotFound,
            ApiError::MethodNotAllowed,
            ApiError::InFlight { retry_after: second, reason: Busy::InFlight },
            ApiError::KeyReused("x".into()),
            ApiError::Gateway { error: GatewayError::Timeout(second), retry_after: second },
            ApiError::GatewayRefused { reason: RefusalReason::Authentication, retry_after: second },
            ApiError::WebhookSignature("x".into()),
            ApiError::WebhookUnreadable,
            ApiError::WebhooksNotConfigured,
            ApiError::DatabaseUnavailable(sqlx::Error::PoolTimedOut),
            ApiError::DatabaseRefused(sqlx::Error::Protocol("x".into())),
            ApiError::LockServiceUnavailable { detail: "x".into(), retry_after: second },
            ApiError::Internal("x".into()),
        ];
        let check = |problem: &Problem| {
            let slug = problem.type_uri.rsplit('/').next().unwrap();
            let known = ProblemType::of(slug).unwrap_or_else(|| panic!("{slug} is not in problem::TYPES"));
            assert_eq!((problem.status, problem.title), (known.status, known.title), "{slug}");
        };
        for err in &errors {
            check(&err.problem());
        }
        for status in 400..600 {
            let problem = Problem::for_status(StatusCode::from_u16(status).unwrap(), "");
            if problem.type_uri != "about:blank" {
                check(&problem);
            }
        }
        // The payment's own final problems (402, 502) are built in payments::process, the
        // refund's (409, 502) in refunds::process, the capture's and cancel's in captures.
        let built_here: Vec<_> = errors.iter().map(|e| e.problem().type_uri).collect();
        let elsewhere = [
            "card-declined",
            "payment-rejected",
            "payment-abandoned",
            "payment-not-refundable",
            "refund-exceeds-payment",
            "refund-rejected",
            "refund-abandoned",
            "payment-not-capturable",
            "settlement-abandoned",
        ];
        for known in TYPES {
            assert!(
                built_here.contains(&known.uri()) || elsewhere.contains(&known.slug),
                "{} is catalogued but never answered",
                known.slug
            );
        }
    }
}
