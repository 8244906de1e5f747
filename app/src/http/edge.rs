//! The edge: what every request passes before any route sees it, and the shape of every error
//! response on its way out. Both are middleware on the whole application (API and pages), so no
//! route can forget them.
//!
//! - [`refuse`] answers at once what no route may receive: a body declared larger than any route
//!   accepts (413, from `Content-Length`, before a byte of it is read), a `Content-Encoding`
//!   other than `identity` (415: payonce decodes none, and must not read a compressed body as if
//!   it were plain), and a NUL character in the path or the query (400 naming where: PostgreSQL
//!   cannot store it, so it could only fail later, as a misleading database error), except in
//!   the sign-in's `next`, which is dropped when unsafe ([`crate::web::is_return_hint`]).
//! - [`problems`] turns any error response that is not already a problem document or an HTML
//!   page into one: axum's own extractor rejections (plain text), the tower layers' bare
//!   statuses, and the session layer's empty 500s. Statuses payonce has a type for keep it; any
//!   other becomes RFC 9457's `about:blank`.
//! - [`catch_panic`] makes a handler that panics a 500 problem instead of a dropped connection.
//!
//! What hyper answers by itself (a malformed head, too many headers) never reaches this code:
//! see docs/errors.md, "Answered by hyper".

use std::any::Any;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::extract::MAX_BODY;
use crate::body::BodyFault;
use crate::db::can_store;
use crate::problem::FieldError;
use crate::problem::LoggedError;
use crate::problem::{CONTENT_TYPE as PROBLEM, Problem};
use crate::web::is_return_hint;

/// The longest text kept from an error body as the problem's detail.
const DETAIL_LIMIT: usize = 1024;

/// Middleware: refuses oversized bodies, content codings, and NUL characters in the URL.
pub async fn refuse(request: Request, next: Next) -> Response {
    if let Some(err) = BodyFault::declared_over(request.headers(), MAX_BODY) {
        return err.into_response();
    }
    let encoded = request.headers().get_all(header::CONTENT_ENCODING).iter().any(|value| {
        value.to_str().map_or(true, |value| {
            value.split(',').map(str::trim).any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"))
        })
    });
    if encoded {
        return ApiError::UnsupportedContentEncoding.into_response();
    }
    if let Some(field) = unstorable_in_url(request.uri()) {
        return ApiError::invalid_fields(vec![FieldError {
            detail: format!("the {} holds a NUL character (%00), which cannot be stored", where_in_url(&field)),
            field,
        }])
        .into_response();
    }
    next.run(request).await
}

/// The part of the URL holding a NUL character once decoded: `path`, or the query parameter's name.
fn unstorable_in_url(uri: &axum::http::Uri) -> Option<String> {
    // A raw NUL cannot be in a request line (hyper refuses it); only its escape can.
    if uri.path().contains("%00") {
        return Some("path".to_owned());
    }
    let query = uri.query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(name, value)| !is_return_hint(uri.path(), name) && (!can_store(name) || !can_store(value)))
        .map(|(name, _)| name.into_owned())
}

fn where_in_url(field: &str) -> String {
    if field == "path" { "path".to_owned() } else { format!("query parameter {field:?}") }
}

/// Middleware: every error response leaves as a problem document (or the page it already is).
pub async fn problems(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let content_type = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.starts_with(PROBLEM) || content_type.starts_with("text/html") {
        return response;
    }
    let is_text = content_type.starts_with("text/plain");
    let (mut parts, body) = response.into_parts();
    let text = if is_text {
        let bytes = axum::body::to_bytes(body, DETAIL_LIMIT * 4).await.unwrap_or_default();
        String::from_utf8_lossy(&bytes).chars().take(DETAIL_LIMIT).collect::<String>()
    } else {
        String::new()
    };
    let problem = Problem::for_status(status, text.trim());
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM));
    parts.headers.remove(header::CONTENT_LENGTH);
    if parts.extensions.get::<LoggedError>().is_none() {
        parts.extensions.insert(LoggedError { status, message: problem.detail.clone() });
    }
    Response::from_parts(parts, Body::from(problem.to_json()))
}

/// For `tower_http::catch_panic::CatchPanicLayer`: a panicking handler is a 500 problem, logged
/// with the panic's message.
pub fn catch_panic(panic: Box<dyn Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a handler panicked".to_owned());
    ApiError::Internal(format!("panic: {message}")).into_response()
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;

    async fn boom() -> &'static str {
        panic!("boom")
    }

    fn app() -> Router {
        Router::new()
            .route("/text", get(|| async { (StatusCode::UNPROCESSABLE_ENTITY, "Failed to deserialize: lease_token") }))
            .route("/bare", get(|| async { StatusCode::REQUEST_TIMEOUT }))
            .route("/page", get(|| async { (StatusCode::NOT_FOUND, axum::response::Html("<p>gone</p>")) }))
            .route("/panic", get(boom))
            .route("/echo", post(|body: String| async move { body }))
            .layer(tower_http::catch_panic::CatchPanicLayer::custom(catch_panic))
            .layer(axum::middleware::from_fn(refuse))
            .layer(axum::middleware::from_fn(problems))
    }

    async fn call(request: axum::http::Request<Body>) -> (StatusCode, String, Value) {
        let response = app().oneshot(request).await.unwrap();
        let status = response.status();
        let content_type =
            response.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, content_type, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    fn get_(uri: &str) -> axum::http::Request<Body> {
        axum::http::Request::get(uri).body(Body::empty()).unwrap()
    }

    /// Plain-text and empty error responses become problems; known statuses keep their type.
    #[tokio::test]
    async fn bare_errors_become_problems() {
        let (status, content_type, body) = call(get_("/text")).await;
        assert_eq!((status, content_type.as_str()), (StatusCode::UNPROCESSABLE_ENTITY, PROBLEM));
        assert_eq!(body["type"], "about:blank");
        assert_eq!(body["detail"], "Failed to deserialize: lease_token");
        let (status, _, body) = call(get_("/bare")).await;
        assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(body["type"], "https://payonce.dev/problems/request-timeout");
        let (status, _, body) = call(get_("/nowhere")).await;
        assert_eq!(
            (status, body["type"].as_str()),
            (StatusCode::NOT_FOUND, Some("https://payonce.dev/problems/not-found"))
        );
    }

    /// An HTML error page stays a page.
    #[tokio::test]
    async fn pages_stay_pages() {
        let (status, content_type, _) = call(get_("/page")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(content_type.starts_with("text/html"));
    }

    /// A panic is a 500 problem, not a dropped connection.
    #[tokio::test]
    async fn panics_are_problems() {
        let (status, content_type, body) = call(get_("/panic")).await;
        assert_eq!((status, content_type.as_str()), (StatusCode::INTERNAL_SERVER_ERROR, PROBLEM));
        assert_eq!(body["type"], "https://payonce.dev/problems/internal");
    }

    /// NUL characters in the URL, encodings and declared sizes are refused before any route.
    #[tokio::test]
    async fn refuses_before_routing() {
        let (status, _, body) = call(get_("/text?a=1&q=x%00y")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["errors"][0]["field"], "q");
        let (status, _, body) = call(get_("/text/%00")).await;
        assert_eq!((status, body["errors"][0]["field"].as_str()), (StatusCode::BAD_REQUEST, Some("path")));
        let (status, _, _) = call(get_("/admin/login?next=%2Fadmin%00")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "the sign-in's next passes (to a route this app lacks)");
        for uri in ["/admin/login?next=a&q=%00", "/text?next=%00"] {
            assert_eq!(call(get_(uri)).await.0, StatusCode::BAD_REQUEST, "{uri}");
        }
        let post = |headers: &[(&str, &str)]| {
            let mut request = axum::http::Request::post("/echo");
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            request.body(Body::from("hi")).unwrap()
        };
        let (status, _, body) = call(post(&[("content-encoding", "gzip")])).await;
        assert_eq!(
            (status, body["type"].as_str()),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("https://payonce.dev/problems/unsupported-content-encoding"))
        );
        let (status, _, _) = call(post(&[("content-encoding", "identity")])).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _, body) = call(post(&[("content-length", "10000000000")])).await;
        assert_eq!(
            (status, body["type"].as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, Some("https://payonce.dev/problems/payload-too-large"))
        );
    }
}
