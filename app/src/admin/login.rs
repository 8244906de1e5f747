//! `/admin/login` and `/admin/logout`.

use std::net::SocketAddr;

use askama::Template;
use axum::extract::{ConnectInfo, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use tower_sessions::Session;

use super::{OPERATOR, accounts, is_local};
use crate::http::AppState;
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
async fn show(session: Session, Query(query): Query<LoginQuery>) -> Result<Response, WebError> {
    if session.get::<String>(OPERATOR).await?.is_some() {
        return Ok(Redirect::to("/admin").into_response());
    }
    let page = LoginPage {
        csrf: csrf::token(&session).await?,
        name: String::new(),
        next: query.next,
        message: query.signed_out.map(|_| "You are signed out.".to_owned()),
        level: "success",
    };
    page::render(StatusCode::OK, &page)
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
    ClientIp(client_ip): ClientIp,
    Form(form): Form<LoginForm>,
) -> Result<Response, WebError> {
    let pool = state.engine.pool();
    // Names are lowercase; keep what is recorded for the rate limit short whatever was typed.
    let name: String = form.name.trim().to_lowercase().chars().take(64).collect();
    if let Some(wait) = accounts::blocked_for(pool, &name, &client_ip).await? {
        tracing::warn!(name, client_ip, "admin login refused: too many failures");
        let minutes = wait.as_secs().div_ceil(60);
        let mut response = again(
            &session,
            &name,
            form.next,
            format!("Too many failed sign-ins. Try again in {minutes} minute{}.", if minutes == 1 { "" } else { "s" }),
            StatusCode::TOO_MANY_REQUESTS,
        )
        .await?;
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs()));
        return Ok(response);
    }
    if !accounts::verify(pool, &name, &form.password).await? {
        accounts::record_failure(pool, &name, &client_ip).await?;
        tracing::info!(name, client_ip, "admin login failed");
        return again(&session, &name, form.next, "Wrong name or password.".to_owned(), StatusCode::UNAUTHORIZED).await;
    }
    accounts::clear_failures(pool, &name, &client_ip).await?;
    // A new session id at sign-in: an id planted before (session fixation) is worth nothing.
    session.cycle_id().await?;
    session.insert(OPERATOR, &name).await?;
    csrf::rotate(&session).await?;
    flash::push(&session, Flash::success(format!("Signed in as {name}."))).await?;
    tracing::info!(name, client_ip, "admin signed in");
    let next = if is_local(&form.next) { form.next.as_str() } else { "/admin" };
    Ok(Redirect::to(next).into_response())
}

/// The login form again, with what went wrong.
async fn again(
    session: &Session,
    name: &str,
    next: String,
    message: String,
    status: StatusCode,
) -> Result<Response, WebError> {
    let page = LoginPage {
        csrf: csrf::token(session).await?,
        name: name.to_owned(),
        next,
        message: Some(message),
        level: "error",
    };
    page::render(status, &page)
}

/// `POST /admin/logout`: the session is deleted from the store, not just forgotten by the browser.
async fn logout(session: Session) -> Result<Response, WebError> {
    if let Some(name) = session.get::<String>(OPERATOR).await? {
        tracing::info!(name, "admin signed out");
    }
    session.flush().await?;
    Ok(Redirect::to("/admin/login?signed_out=1").into_response())
}
