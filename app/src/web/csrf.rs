//! Cross-site request forgery protection: a synchronizer token.
//!
//! Every session gets a random token ([`token`]); every form renders it in a hidden `csrf` field;
//! [`protect`] refuses any POST whose field does not match the session's token, compared in
//! constant time, before the handler runs. A forged form on another site cannot know the token
//! (it never leaves this origin), so it cannot make a signed-in browser act. The check is a
//! middleware rather than a line in each handler so that no form can forget it.

use axum::body::Body;
use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tower_sessions::Session;

use super::page::WebError;

/// The form field, and the session key, holding the token.
pub const FIELD: &str = "csrf";
/// The largest form accepted (the forms here are a few fields long).
const FORM_LIMIT: usize = 16 * 1024;

/// This session's token, created on first use.
pub async fn token(session: &Session) -> Result<String, WebError> {
    if let Some(token) = session.get::<String>(FIELD).await? {
        return Ok(token);
    }
    rotate(session).await
}

/// Replaces the token (at sign-in: a token seen before signing in is worth nothing after).
pub async fn rotate(session: &Session) -> Result<String, WebError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|err| WebError::Internal(format!("random token: {err}")))?;
    let token = hex::encode(bytes);
    session.insert(FIELD, &token).await?;
    Ok(token)
}

/// Middleware: every request that is not GET or HEAD must carry the session's token in its form.
pub async fn protect(session: Session, request: Request, next: Next) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, FORM_LIMIT).await else {
        return WebError::BadRequest("the form is too large".into()).into_response();
    };
    let presented = form_urlencoded::parse(&bytes).find(|(name, _)| name == FIELD).map(|(_, value)| value);
    let expected = match session.get::<String>(FIELD).await {
        Ok(expected) => expected,
        Err(err) => return WebError::from(err).into_response(),
    };
    let valid = match (presented, expected) {
        (Some(presented), Some(expected)) => bool::from(presented.as_bytes().ct_eq(expected.as_bytes())),
        _ => false,
    };
    if !valid {
        return WebError::Forbidden(
            "This form has expired or did not come from this site. Go back, reload the page and try again.",
        )
        .into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}
