//! The admin dashboard: the state of every key at a glance, the operator's two actions on keys,
//! and refunds made from a payment's page.
//!
//! Server-rendered HTML (askama templates in `templates/admin/`), usable without JavaScript; the
//! vendored htmx only refreshes the live parts of a page. Every page needs a signed-in operator
//! ([`Operator`]); every form carries the session's CSRF token ([`crate::web::csrf`]).
//!
//! ```text
//! accounts   operators: argon2 password hashes, `payonce admins create`, the login rate limit
//! login      /admin/login, /admin/logout
//! queries    what the pages show, read from idempotency_keys, payments and idempotency_events
//! chart      the outcomes chart, drawn as SVG on the server
//! pages      /admin (overview), /admin/keys, /admin/keys/{id} and its two actions
//! payment    /admin/payments/{id}: a payment, its refunds, and the refund form (the API's
//!            idempotent path, under a key generated with the page)
//! gateway    /admin/gateway: the simulator's faults, and the double-charge audit
//! lab        /admin/lab: the claim-strategy lab's storms, run and stored (lab mode only)
//! ```
//!
//! Routes:
//!
//! ```text
//! GET  /admin/login  POST /admin/login  POST /admin/logout
//! GET  /admin                                overview: counts by state, outcomes chart
//! GET  /admin/keys?state=&operation=&customer=&q=&before=&after=
//! GET  /admin/keys/{id}                      one key: facts, response, payment or refund, timeline
//! POST /admin/keys/{id}/release              release a stuck key (fenced by lease_token)
//! POST /admin/keys/{id}/expire               expire a final key now (fenced by lease_token)
//! GET  /admin/payments/{id}                  one payment (`pay_…`): refunded, remaining, its refunds
//! POST /admin/payments/{id}/refunds          refund it (form: key, amount, reason): idempotent by key
//! GET  /admin/gateway  POST /admin/gateway/faults   (only while the gateway is a simulator)
//! GET  /admin/lab  POST /admin/lab/runs  GET /admin/lab/runs/{id}   (lab mode only)
//! ```

pub mod accounts;
mod chart;
mod gateway;
mod lab;
mod login;
mod pages;
mod payment;
mod queries;

use axum::Router;
use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use tower_sessions::Session;
use tower_sessions::cookie::SameSite;

use crate::state::AppState;
use crate::web::flash::{self, Flash};
use crate::web::page::{self, WebError};
use crate::web::{csrf, session};

/// The session key holding the signed-in operator's name.
const OPERATOR: &str = "admin";

/// The dashboard's cookie: sent to `/admin` only, never on a cross-site request.
const COOKIE: session::Cookie =
    session::Cookie { name: "payonce_admin", path: "/admin", same_site: SameSite::Strict, csrf: "payonce_admin_csrf" };

/// The dashboard's routes, with their session, CSRF and header layers.
pub fn router(state: &AppState) -> Router<AppState> {
    let config = &state.web.config;
    Router::new()
        .merge(login::router())
        .merge(pages::router())
        .merge(payment::router())
        .merge(gateway::router())
        .merge(lab::router())
        .layer(axum::middleware::from_fn_with_state(
            csrf::Policy { cookie: COOKIE, secure: config.secure_cookies },
            csrf::protect,
        ))
        .layer(session::layer(state.engine.pool(), config, COOKIE, config.admin_idle))
        .layer(axum::middleware::from_fn(page::headers))
}

/// A signed-in operator, and what every dashboard page shows around its content. Extracting it
/// from a request without one redirects to the login page.
pub struct Operator {
    pub name: String,
    pub session: Session,
    /// The session's CSRF token, for the page's forms.
    pub csrf: String,
    /// Whether this request is the page's own live refresh (not a person's action).
    pub live: bool,
}

impl Operator {
    /// The frame of a dashboard page: who is signed in, the token, the messages, the nav.
    async fn chrome(&self, state: &AppState, current: &'static str) -> Result<Chrome, WebError> {
        // A live refresh swaps part of the page: the messages would be taken and never shown.
        let flashes = if self.live { Vec::new() } else { flash::take(&self.session).await? };
        let refusal = queries::recent_refusal(state.engine.pool(), REFUSAL_WINDOW.as_secs_f64()).await?.map(|r| {
            RefusalBanner { reason: r.reason, message: r.message, at: crate::web::rfc3339(r.at), count: r.count }
        });
        let replica = state.reads.lag().await?.map(|behind_secs| ReplicaBanner { behind_secs });
        Ok(Chrome {
            replica,
            operator: self.name.clone(),
            csrf: self.csrf.clone(),
            flashes,
            current,
            simulator: state.web.simulator.is_active().await,
            htmx: page::HTMX_PATH,
            refusal,
            strategy: StrategyBanner::of(&state.lab),
        })
    }

    /// Queues a message for the next page.
    async fn flash(&self, message: Flash) -> Result<(), WebError> {
        flash::push(&self.session, message).await
    }
}

/// What the dashboard's layout template needs.
pub struct Chrome {
    pub operator: String,
    pub csrf: String,
    pub flashes: Vec<Flash>,
    /// Which nav entry is the current page.
    pub current: &'static str,
    /// Whether the gateway is a simulator (the Gateway entry is shown only then).
    pub simulator: bool,
    pub htmx: &'static str,
    /// The gateway refused payonce's own requests lately: its configuration needs an operator.
    pub refusal: Option<RefusalBanner>,
    /// Which claim strategy runs, shown on every page unless it is the engine's own outside the
    /// lab ([`crate::lab`]).
    pub strategy: Option<StrategyBanner>,
    /// The read replica some pages read from, and how far behind it is.
    pub replica: Option<ReplicaBanner>,
}

/// What the replica's note says.
pub struct ReplicaBanner {
    pub behind_secs: f64,
}

impl ReplicaBanner {
    /// Its lag, to a tenth of a second.
    pub fn behind(&self) -> String {
        format!("{:.1}", self.behind_secs)
    }
}

/// What the claim-strategy banner says.
pub struct StrategyBanner {
    pub name: &'static str,
    /// Whether the strategy charges at most once (check-then-insert does not).
    pub safe: bool,
    /// Lab mode: every strategy at /lab/{strategy}/v1/payments, and the Lab page.
    pub lab: bool,
    /// What the strategy does not guarantee that the engine does.
    pub lacks: &'static [&'static str],
}

impl StrategyBanner {
    fn of(lab: &crate::lab::Lab) -> Option<Self> {
        let strategy = lab.strategy();
        (strategy != crate::lab::Strategy::OnConflict || lab.is_lab()).then(|| Self {
            name: strategy.as_str(),
            safe: strategy.is_safe(),
            lab: lab.is_lab(),
            lacks: strategy.lacks(),
        })
    }
}

/// How far back the refusal banner looks.
const REFUSAL_WINDOW: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// What the refusal banner says.
pub struct RefusalBanner {
    pub reason: String,
    /// The gateway's own message (Stripe's messages never contain the secret key).
    pub message: String,
    /// When the latest refusal happened (RFC 3339).
    pub at: String,
    /// Refusals within the window.
    pub count: i64,
}

impl RefusalBanner {
    pub fn minutes(&self) -> u64 {
        REFUSAL_WINDOW.as_secs() / 60
    }
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let session = Session::from_request_parts(parts, state).await.map_err(IntoResponse::into_response)?;
        let live = page::is_live_refresh(&parts.headers);
        let name = session.get::<String>(OPERATOR).await.map_err(|err| WebError::from(err).into_response())?;
        let Some(name) = name else {
            let uri = OriginalUri::from_request_parts(parts, state).await.map(|OriginalUri(uri)| uri);
            let next = uri.ok().and_then(|uri| uri.path_and_query().map(|pq| pq.as_str().to_owned()));
            // The browser still sends a session cookie that the store no longer knows: the
            // session ran out (idle time) or was deleted. The login page says so.
            let expired = had_session_cookie(&parts.headers);
            return Err(to_login(next.as_deref(), live, expired));
        };
        // Reading a session is not activity; a person's request is. The page's own live refresh
        // is not: a dashboard left open on a projector signs out after the idle time, except in
        // a workshop, where the projected dashboard must stay signed in.
        if !live || state.web.config.workshop {
            session::touch(&session).await.map_err(|err| WebError::from(err).into_response())?;
        }
        let csrf = csrf::token(&session).await.map_err(IntoResponse::into_response)?;
        Ok(Self { name, session, csrf, live })
    }
}

/// Whether the request carries the dashboard's session cookie.
fn had_session_cookie(headers: &axum::http::HeaderMap) -> bool {
    headers.get_all(axum::http::header::COOKIE).iter().filter_map(|value| value.to_str().ok()).any(|cookies| {
        cookies.split(';').any(|cookie| cookie.trim().split_once('=').is_some_and(|(name, _)| name == COOKIE.name))
    })
}

/// The way to the login page: a redirect for a person, `HX-Redirect` for htmx (which would
/// otherwise swap the login page into the middle of the dashboard). `expired`: the visitor had a
/// session that ran out, which the login page tells them.
fn to_login(next: Option<&str>, live: bool, expired: bool) -> Response {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(next) = next.filter(|next| is_local(next) && *next != "/admin") {
        query.append_pair("next", next);
    }
    if expired {
        query.append_pair("expired", "1");
    }
    let query = query.finish();
    let target = if query.is_empty() { "/admin/login".to_owned() } else { format!("/admin/login?{query}") };
    if live {
        let mut response = StatusCode::UNAUTHORIZED.into_response();
        if let Ok(value) = HeaderValue::try_from(target) {
            response.headers_mut().insert("hx-redirect", value);
        }
        return response;
    }
    Redirect::to(&target).into_response()
}

/// `cus_<hex>` (a customer's public id) back to its uuid.
fn parse_customer(s: &str) -> Option<uuid::Uuid> {
    s.strip_prefix("cus_").and_then(|hex| uuid::Uuid::try_parse(hex).ok())
}

/// Whether `next` is a dashboard path to return to: a relative path under `/admin` (never another
/// site: no scheme, no `//evil`, no `/\evil`) of printable ASCII without spaces, so that it is
/// always a valid `Location` header (a control character in it was once a 500).
fn is_local(next: &str) -> bool {
    let under_admin = next == "/admin" || next.starts_with("/admin/") || next.starts_with("/admin?");
    under_admin && !next.contains("//") && !next.contains('\\') && next.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only dashboard paths are followed after login.
    #[test]
    fn next_must_be_local() {
        assert!(is_local("/admin/keys?state=stuck"));
        assert!(!is_local("//evil.example/admin"));
        assert!(!is_local("https://evil.example/admin"));
        assert!(!is_local("/admin//evil.example"));
        assert!(!is_local("/admin\\evil"));
        assert!(!is_local("/v1/payments"));
        assert!(!is_local("/adminx"));
        for control in ["/admin\u{1}", "/admin\r\nSet-Cookie: x", "/admin\u{7f}", "/admin/k\u{e9}ys", "/admin/ keys"] {
            assert!(!is_local(control), "{control:?}");
        }
        assert!(is_local("/admin") && is_local("/admin?state=stuck"));
    }
}
