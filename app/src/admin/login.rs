//! `/admin/login` and `/admin/logout`.

use std::net::SocketAddr;
use std::time::Duration;

use askama::Template;
use axum::extract::{ConnectInfo, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use tower_sessions::Session;

use super::accounts::{self, Admission, Verdict};
use super::{OPERATOR, is_local};
use crate::state::AppState;
use crate::web::csrf;
use crate::web::flash::{self, Flash};
use crate::web::page::{self, WebError};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/admin/login", get(show).post(login)).route("/admin/logout", post(logout))
}

#[derive(Template)]
#[template(path = "admin/login.html")]
struct LoginPage {
    csrf: String,
    name: String,
    next: String,
    /// Why the last attempt failed, or what just happened.
    message: Option<String>,
    /// `error` or `success`.
    level: &'static str,
}

#[derive(Deserialize)]
struct LoginQuery {
    #[serde(default)]
    next: String,
    #[serde(default)]
    signed_out: Option<String>,
    /// The visitor's session ran out (set by the redirect that sent them here).
    #[serde(default)]
    expired: Option<String>,
}

/// The address of the client, for the rate limit. Behind a reverse proxy this is the proxy's:
/// see docs/dashboard.md.
struct ClientIp(String);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let ip = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(addr)| addr.ip().to_string());
        Ok(Self(ip.unwrap_or_else(|| "unknown".to_owned())))
    }
}

/// `GET /admin/login`.
async fn show(
    State(state): State<AppState>,
    session: Session,
    anonymous: csrf::Anonymous,
    Query(query): Query<LoginQuery>,
) -> Result<Response, WebError> {
    if session.get::<String>(OPERATOR).await?.is_some() {
        return Ok(Redirect::to("/admin").into_response());
    }
    let next = local_next(&query.next);
    let (message, level) = match (&query.signed_out, &query.expired) {
        (Some(_), _) => (Some("You are signed out.".to_owned()), "success"),
        (None, Some(_)) => {
            let idle = state.web.config.admin_idle.as_secs().div_ceil(60);
            let back = if next.is_empty() { String::new() } else { format!(" You will return to {next}.") };
            let message = format!(
                "Your session expired after {idle} minute{} without use. Sign in again.{back}",
                if idle == 1 { "" } else { "s" },
            );
            (Some(message), "warning")
        }
        (None, None) => (None, "success"),
    };
    let page = LoginPage { csrf: anonymous.token(), name: String::new(), next, message, level };
    page::render(StatusCode::OK, &page)
}

/// `next` if it is a dashboard path to return to, else nothing.
fn local_next(next: &str) -> String {
    if is_local(next) { next.to_owned() } else { String::new() }
}

#[derive(Deserialize)]
struct LoginForm {
    name: String,
    password: String,
    #[serde(default)]
    next: String,
}

/// `POST /admin/login`.
async fn login(
    State(state): State<AppState>,
    session: Session,
    anonymous: csrf::Anonymous,
    ClientIp(client_ip): ClientIp,
    Form(form): Form<LoginForm>,
) -> Result<Response, WebError> {
    let pool = state.engine.pool();
    // Names are lowercase; keep what is recorded for the rate limit short whatever was typed.
    let name: String = form.name.trim().to_lowercase().chars().take(64).collect();
    let next = local_next(&form.next);
    let attempt = match accounts::admit(pool, &name, &client_ip).await? {
        Admission::Admitted(attempt) => attempt,
        Admission::Refused { retry_after } => {
            tracing::warn!(name, client_ip, "admin login refused: too many failures");
            let minutes = retry_after.as_secs().div_ceil(60);
            let message = format!(
                "Too many failed sign-ins. Try again in {minutes} minute{}.",
                if minutes == 1 { "" } else { "s" }
            );
            return again(&anonymous, &name, next, message, StatusCode::TOO_MANY_REQUESTS, Some(retry_after));
        }
    };
    let (turns, wait) = (&state.web.password_checks, state.web.config.password_check_wait);
    match accounts::verify(pool, turns, wait, &name, &form.password).await? {
        Verdict::Right => {}
        Verdict::Wrong => {
            tracing::info!(name, client_ip, "admin login failed");
            return again(
                &anonymous,
                &name,
                next,
                "Wrong name or password.".to_owned(),
                StatusCode::UNAUTHORIZED,
                None,
            );
        }
        Verdict::Busy => {
            // The password was not looked at: the attempt does not count against the limit.
            accounts::cancel(pool, attempt).await?;
            tracing::warn!(name, client_ip, "admin login refused: too many sign-ins being checked");
            let message = "The server is busy checking other sign-ins. Try again in a few seconds.".to_owned();
            let retry_after = wait.max(Duration::from_secs(1));
            return again(&anonymous, &name, next, message, StatusCode::TOO_MANY_REQUESTS, Some(retry_after));
        }
    }
    accounts::clear_failures(pool, &name, &client_ip).await?;
    // A new session id at sign-in: an id planted before (session fixation) is worth nothing.
    session.cycle_id().await?;
    session.insert(OPERATOR, &name).await?;
    csrf::rotate(&session).await?;
    flash::push(&session, Flash::success(format!("Signed in as {name}."))).await?;
    tracing::info!(name, client_ip, "admin signed in");
    Ok(Redirect::to(if next.is_empty() { "/admin" } else { &next }).into_response())
}

/// The login form again, with what went wrong (and when to try again).
fn again(
    anonymous: &csrf::Anonymous,
    name: &str,
    next: String,
    message: String,
    status: StatusCode,
    retry_after: Option<Duration>,
) -> Result<Response, WebError> {
    let page =
        LoginPage { csrf: anonymous.token(), name: name.to_owned(), next, message: Some(message), level: "error" };
    let mut response = page::render(status, &page)?;
    if let Some(wait) = retry_after {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs()));
    }
    Ok(response)
}

/// `POST /admin/logout`: the session is deleted from the store, not just forgotten by the browser.
async fn logout(session: Session) -> Result<Response, WebError> {
    if let Some(name) = session.get::<String>(OPERATOR).await? {
        tracing::info!(name, "admin signed out");
    }
    session.flush().await?;
    Ok(Redirect::to("/admin/login?signed_out=1").into_response())
}
