//! Cross-site request forgery protection: a token in every form, checked before any handler.
//!
//! Two kinds of forms, two places for their token, one check ([`protect`], a middleware rather
//! than a line in each handler, so that no form can forget it):
//!
//! - **A session's forms** (a signed-in operator's or shopper's) carry the session's
//!   *synchronizer token*: random, kept in the session, replaced at sign-in ([`token`], [`rotate`]).
//! - **Anonymous forms** (the two sign-in forms) carry a *double-submit token*: random, kept in a
//!   cookie of its own (the router's [`Cookie::csrf`], with the session cookie's path, `SameSite`,
//!   `HttpOnly` and `Secure`) and repeated in the form ([`Anonymous`]). A visitor who only looks
//!   at a page has no session, so no session row is written for them: a session is saved only
//!   once it holds something worth keeping (tower-sessions saves modified sessions only).
//!
//! A POST is accepted only if its `csrf` field equals the session's token or, for a session that
//! has none, the anonymous cookie's, compared in constant time. A form forged on another site
//! cannot know either: it cannot read this origin's pages or cookies. docs/dashboard.md explains
//! why the anonymous token is not signed.
//!
//! The middleware reads the form (at most [`FORM_LIMIT`], within the listener's body timeout) and
//! refuses a field holding a NUL character with a 400 naming it, for every form at once (but the
//! sign-in's `next`, dropped when unsafe: [`super::is_return_hint`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tower_sessions::Session;

use super::is_return_hint;
use super::page::WebError;
use super::session::Cookie;
use crate::body::BodyFault;
use crate::db::can_store;
use crate::problem::{FieldError, invalid_fields};

/// The form field, and the session key, holding the token.
pub const FIELD: &str = "csrf";
/// The largest form accepted (the forms here are a few fields long).
const FORM_LIMIT: usize = 16 * 1024;
/// Tokens are 32 random bytes, hex-encoded.
const TOKEN_LEN: usize = 64;

/// This session's token, created on first use. Only for sessions worth keeping (signed in):
/// creating the token modifies the session, which writes its row.
pub async fn token(session: &Session) -> Result<String, WebError> {
    if let Some(token) = session.get::<String>(FIELD).await? {
        return Ok(token);
    }
    rotate(session).await
}

/// Replaces the token (at sign-in: a token seen before signing in is worth nothing after).
pub async fn rotate(session: &Session) -> Result<String, WebError> {
    let token = random_token()?;
    session.insert(FIELD, &token).await?;
    Ok(token)
}

fn random_token() -> Result<String, WebError> {
    let mut bytes = [0u8; TOKEN_LEN / 2];
    getrandom::fill(&mut bytes).map_err(|err| WebError::Internal(format!("random token: {err}")))?;
    Ok(hex::encode(bytes))
}

/// What [`protect`] needs to know about its router.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub cookie: Cookie,
    /// Mark the anonymous token's cookie `Secure`, like the session cookie.
    pub secure: bool,
}

/// The anonymous forms' token of this request: the one its cookie holds, or a new one that
/// [`protect`] sets as a cookie on the response if a page used it.
#[derive(Clone)]
pub struct Anonymous(Arc<AnonymousToken>);

struct AnonymousToken {
    value: String,
    /// Not from the request's cookie: the response must set it.
    fresh: bool,
    used: AtomicBool,
}

impl Anonymous {
    /// The token, for a form's hidden `csrf` field.
    pub fn token(&self) -> String {
        self.0.used.store(true, Ordering::Relaxed);
        self.0.value.clone()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Anonymous {
    type Rejection = WebError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Self>()
            .cloned()
            .ok_or_else(|| WebError::Internal("csrf::protect is not installed".into()))
    }
}

/// The token of the request's anonymous-token cookie, if it holds a well-formed one.
fn token_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(tower_sessions::cookie::Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|cookie| cookie.name() == name)
        .map(|cookie| cookie.value().to_owned())
        .filter(|value| value.len() == TOKEN_LEN && value.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Middleware: every request that is not GET or HEAD must carry the right token in its form.
pub async fn protect(State(policy): State<Policy>, session: Session, request: Request, next: Next) -> Response {
    let cookie = token_cookie(request.headers(), policy.cookie.csrf);
    let anonymous = match &cookie {
        Some(value) => AnonymousToken { value: value.clone(), fresh: false, used: AtomicBool::new(false) },
        None => match random_token() {
            Ok(value) => AnonymousToken { value, fresh: true, used: AtomicBool::new(false) },
            Err(err) => return err.into_response(),
        },
    };
    let anonymous = Anonymous(Arc::new(anonymous));
    let mut request = request;
    request.extensions_mut().insert(anonymous.clone());
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        request = match check(&session, cookie.as_deref(), request).await {
            Ok(request) => request,
            Err(refusal) => return refusal,
        };
    }
    let mut response = next.run(request).await;
    if anonymous.0.fresh && anonymous.0.used.load(Ordering::Relaxed) {
        let cookie = tower_sessions::cookie::Cookie::build((policy.cookie.csrf, anonymous.0.value.clone()))
            .path(policy.cookie.path)
            .same_site(policy.cookie.same_site)
            .http_only(true)
            .secure(policy.secure)
            .build();
        if let Ok(value) = HeaderValue::try_from(cookie.to_string()) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    response
}

/// Reads the form, refuses NUL characters in it and checks its token; gives the request back
/// with the form as its body.
async fn check(session: &Session, cookie: Option<&str>, request: Request) -> Result<Request, Response> {
    if let Some(too_large) = BodyFault::declared_over(request.headers(), FORM_LIMIT) {
        return Err(too_large.into_response());
    }
    let (parts, body) = request.into_parts();
    let bytes =
        axum::body::to_bytes(body, FORM_LIMIT).await.map_err(|err| BodyFault::of(&err, FORM_LIMIT).into_response())?;
    let mut form = form_urlencoded::parse(&bytes);
    let unstorable = |(name, value): &(Cow<str>, Cow<str>)| {
        !is_return_hint(parts.uri.path(), name) && (!can_store(name) || !can_store(value))
    };
    if let Some((name, _)) = form.clone().find(unstorable) {
        let detail = format!("the form field {name:?} holds a NUL character, which cannot be stored");
        return Err(invalid_fields(&[FieldError { field: name.into_owned(), detail }]).into_response());
    }
    let presented = form.find(|(name, _)| name == FIELD).map(|(_, value)| value);
    let expected = match session.get::<String>(FIELD).await {
        Ok(Some(token)) => Some(token),
        Ok(None) => cookie.map(str::to_owned),
        Err(err) => return Err(WebError::from(err).into_response()),
    };
    let valid = match (presented, expected) {
        (Some(presented), Some(expected)) => bool::from(presented.as_bytes().ct_eq(expected.as_bytes())),
        _ => false,
    };
    if !valid {
        return Err(WebError::Forbidden(
            "This form has expired or did not come from this site. Go back, reload the page and try again.",
        )
        .into_response());
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}
