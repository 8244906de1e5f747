//! Sessions: a random id in a cookie, the data in PostgreSQL (`tower_sessions.session`), so any
//! server sharing the database serves any session and a restart signs nobody out.
//!
//! The cookie is `HttpOnly` (no script can read it), `SameSite` (not sent on cross-site
//! requests: the first line of CSRF defence, [`super::csrf`] is the second) and `Secure` when
//! [`super::WebConfig::secure_cookies`] says the site is served over HTTPS.

use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tower_sessions::ExpiredDeletion;
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, SessionManagerLayer};
use tower_sessions_sqlx_store::PostgresStore;

use super::WebConfig;

/// Which cookie a router's sessions use.
#[derive(Debug, Clone, Copy)]
pub struct Cookie {
    /// The cookie's name. The admin and the shop have one each, so signing into one is not
    /// signing into the other.
    pub name: &'static str,
    /// The URL path the browser sends it to.
    pub path: &'static str,
    /// `Strict` for the dashboard (a link from elsewhere never arrives signed in), `Lax` for the
    /// shop (a link to it from an e-mail keeps the customer signed in).
    pub same_site: SameSite,
    /// The cookie holding the CSRF token of the anonymous forms (sign-in), which have no session
    /// ([`super::csrf`]); same path and attributes.
    pub csrf: &'static str,
}

/// The session layer of one router: sessions expire after `idle` without a change (signing in,
/// submitting a form, or [`touch`]).
pub fn layer(pool: &PgPool, config: &WebConfig, cookie: Cookie, idle: Duration) -> SessionManagerLayer<PostgresStore> {
    let idle = time::Duration::try_from(idle).unwrap_or(time::Duration::minutes(30));
    SessionManagerLayer::new(PostgresStore::new(pool.clone()))
        .with_name(cookie.name)
        .with_path(cookie.path)
        .with_same_site(cookie.same_site)
        .with_http_only(true)
        .with_secure(config.secure_cookies)
        .with_expiry(Expiry::OnInactivity(idle))
}

/// Creates the session table if needed. Run at startup, after the app's own migrations.
pub async fn migrate(pool: &PgPool) -> sqlx::Result<()> {
    PostgresStore::new(pool.clone()).migrate().await
}

/// Deletes expired sessions every `period` until aborted.
pub fn spawn_cleanup(pool: &PgPool, period: Duration) -> JoinHandle<()> {
    let store = PostgresStore::new(pool.clone());
    tokio::spawn(async move {
        if let Err(err) = store.continuously_delete_expired(period).await {
            tracing::warn!(error = %err, "deleting expired sessions stopped");
        }
    })
}

/// Marks the session as used now, which pushes its expiry back by the idle time.
pub async fn touch(session: &tower_sessions::Session) -> Result<(), tower_sessions::session::Error> {
    session.insert("seen", time::OffsetDateTime::now_utc().unix_timestamp()).await
}
