//! A request body that could not be read, and its answer: the same for the API's JSON
//! (`http::extract`), the webhook events and the pages' forms (`web::csrf`), so that a form over
//! its limit is the same 413 as a payment over its own.

use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::problem::{LoggedError, PAYLOAD_TOO_LARGE, Problem, REQUEST_TIMEOUT, invalid_request};

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyFault {
    #[error("the request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the request body did not arrive within the body timeout")]
    Timeout,
    /// Anything else: the connection broke mid-body.
    #[error("the request body could not be read")]
    Unreadable,
}

impl BodyFault {
    /// The 413 for a request whose declared `Content-Length` is over `limit`: answered at once,
    /// without reading (or waiting for) any of the body.
    pub fn declared_over(headers: &HeaderMap, limit: usize) -> Option<Self> {
        let declared = headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse::<u64>().ok()?;
        (declared > limit as u64).then_some(Self::TooLarge { limit })
    }

    /// Why reading a body failed: over `limit` (413), not complete within the listener's body
    /// timeout (408), or anything else (400). Looks through the error's whole chain, since axum
    /// and http-body wrap the cause in layers of their own.
    pub fn of(err: &(dyn std::error::Error + 'static), limit: usize) -> Self {
        let mut cause = Some(err);
        while let Some(err) = cause {
            if err.is::<http_body_util::LengthLimitError>() {
                return Self::TooLarge { limit };
            }
            if err.is::<tower_http::timeout::TimeoutError>() {
                return Self::Timeout;
            }
            cause = err.source();
        }
        Self::Unreadable
    }

    pub fn problem(&self) -> Problem {
        match self {
            Self::TooLarge { limit } => PAYLOAD_TOO_LARGE.problem(format!("The body may be at most {limit} bytes.")),
            Self::Timeout => REQUEST_TIMEOUT.problem(
                "The request body did not arrive within the server's body timeout; the connection is closed. \
                 Nothing was processed: send the request again (with the same Idempotency-Key).",
            ),
            Self::Unreadable => invalid_request(&self.to_string(), &[]),
        }
    }

    /// Adds what the response says besides its problem: a body left unread (too large, too slow)
    /// means the connection cannot carry another request.
    pub fn headers(&self, headers: &mut HeaderMap) {
        if matches!(self, Self::TooLarge { .. } | Self::Timeout) {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
}

impl IntoResponse for BodyFault {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let status = problem.status;
        let mut response = problem.into_response();
        self.headers(response.headers_mut());
        response.extensions_mut().insert(LoggedError { status, message: self.to_string() });
        response
    }
}
