//! What every HTML response shares: the error page, the security headers, the static assets.

use askama::Template;
use axum::Router;
use axum::extract::{Path, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use crate::db::Failure;
use crate::problem::LoggedError;

/// Why a page could not be shown. Rendered as an HTML page (never as a problem document: these
/// are the routes people look at).
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("not found")]
    NotFound,
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("session error: {0}")]
    Session(#[from] tower_sessions::session::Error),
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    title: &'a str,
    detail: &'a str,
}

const UNAVAILABLE: (StatusCode, &str, &str) = (
    StatusCode::SERVICE_UNAVAILABLE,
    "Temporarily unavailable",
    "The database could not be reached. Reload the page in a moment.",
);
const INTERNAL: (StatusCode, &str, &str) =
    (StatusCode::INTERNAL_SERVER_ERROR, "Something went wrong", "The error was logged. Try again.");

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let (status, title, detail) = match &self {
            Self::NotFound => (StatusCode::NOT_FOUND, "Not found", "There is nothing at this address."),
            Self::BadRequest(detail) => (StatusCode::BAD_REQUEST, "Bad request", detail.as_str()),
            Self::Forbidden(detail) => (StatusCode::FORBIDDEN, "Forbidden", *detail),
            // The same classification as the API's (`crate::db::Failure`): only a database that
            // is unreachable or busy is an outage; a value it refuses is the request's fault.
            Self::Database(err) => match Failure::of(err) {
                Failure::Unavailable | Failure::Busy => UNAVAILABLE,
                Failure::BadData => (
                    StatusCode::BAD_REQUEST,
                    "Bad request",
                    "This request holds a value that cannot be stored. Sending it again will not help.",
                ),
                Failure::Bug => INTERNAL,
            },
            // The session store reports its errors as text, without a SQLSTATE to tell them apart.
            Self::Session(_) => UNAVAILABLE,
            Self::Internal(_) => INTERNAL,
        };
        let body = ErrorPage { status: status.as_u16(), title, detail }
            .render()
            .unwrap_or_else(|_| format!("{} {title}", status.as_u16()));
        let mut response = (status, Html(body)).into_response();
        // Logged by `http::error::log_errors`, like the API's errors.
        response.extensions_mut().insert(LoggedError { status, message: self.to_string() });
        response
    }
}

/// Renders a template into a response with `status`.
pub fn render(status: StatusCode, template: &impl Template) -> Result<Response, WebError> {
    let body = template.render().map_err(|err| WebError::Internal(format!("template: {err}")))?;
    Ok((status, Html(body)).into_response())
}

/// Whether the request is htmx's live refresh rather than a person's click.
pub fn is_live_refresh(headers: &HeaderMap) -> bool {
    headers.contains_key("hx-request")
}

/// The page's policy: scripts, styles and everything else from this origin only (no inline
/// script, no CDN), no framing, forms post only here.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// Middleware for the HTML routers: security headers, and no caching of pages that show
/// private, live data.
pub async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    secure(response.headers_mut());
    response
}

/// The headers of every HTML page ([`headers`]), for a page made outside the HTML routers.
pub fn secure(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
}

/// htmx, vendored from the npm package `htmx.org` (see `app/assets/vendor/README.md`).
pub const HTMX_PATH: &str = "/assets/htmx-2.0.11.min.js";

/// The static files, compiled into the binary so that the server needs no files beside it.
const ASSETS: &[(&str, &str, &[u8], bool)] = &[
    (
        "htmx-2.0.11.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../assets/vendor/htmx-2.0.11.min.js"),
        true,
    ),
    ("payonce.css", "text/css; charset=utf-8", include_bytes!("../../assets/payonce.css"), false),
    ("payonce.js", "text/javascript; charset=utf-8", include_bytes!("../../assets/payonce.js"), false),
];

/// `GET /assets/{file}`.
pub fn assets_router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/assets/{file}", get(asset))
}

async fn asset(Path(file): Path<String>) -> Response {
    let Some((_, content_type, body, versioned)) = ASSETS.iter().find(|(name, ..)| *name == file) else {
        return WebError::NotFound.into_response();
    };
    // A versioned file never changes under its name; our own files may change with any release.
    let cache = if *versioned { "public, max-age=31536000, immutable" } else { "no-cache" };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        (HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff")),
    ];
    (headers, *body).into_response()
}
