//! The browser-facing half of payonce: what the admin dashboard ([`crate::admin`]) and the shop
//! ([`crate::shop`]) share.
//!
//! The JSON API (`/v1/…`) stays free of cookies: sessions, CSRF tokens and HTML error pages exist
//! only on the routers of this half, each of which applies its own session layer
//! ([`session::layer`]).
//!
//! ```text
//! session    the cookie-backed sessions, stored in PostgreSQL (tower-sessions)
//! csrf       a token in every form (the session's, or an anonymous cookie's), checked on every
//!            POST before any handler runs
//! flash      one-shot messages shown on the next page (post/redirect/get)
//! format     how the pages write durations and counts (also as template filters); amounts of
//!            money are crate::money's, as `money`
//! page       the HTML error type, security headers, and the static assets under /assets/
//! simulator  the built-in (or external) simulator's control API, for the gateway panel
//! ```

pub mod csrf;
pub mod flash;
pub mod format;
pub mod page;
pub mod session;
pub mod simulator;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

/// Whether `name` is the sign-in's return-to hint: `next` on `/admin/login`, in the query or in
/// the form. It is never stored or looked up, only followed when it is a safe dashboard path and
/// dropped otherwise (`admin::is_local`), so the refusals of a NUL character (which PostgreSQL
/// cannot store: `http::edge::refuse`, [`csrf`]) pass it by: a correct sign-in must not fail for
/// a hint that it ignores.
pub fn is_return_hint(path: &str, name: &str) -> bool {
    path == "/admin/login" && name == "next"
}

/// What the browser-facing routers need beyond the API's state. Cheap to clone.
#[derive(Clone)]
pub struct WebState {
    /// Cookie and session policy.
    pub config: Arc<WebConfig>,
    /// The simulator's control API, when the gateway is a simulator.
    pub simulator: simulator::SimulatorControl,
    /// Turns for checking sign-in passwords ([`WebConfig::password_checks`] at once).
    pub password_checks: Arc<Semaphore>,
    /// The overview chart's buckets that can no longer change, kept between two loads.
    pub settled: Arc<Mutex<Settled>>,
    /// The gateway audit's charged payments known to be succeeded, kept between two loads.
    pub confirmed: Arc<Mutex<Confirmed>>,
}

/// The payments of the simulator's charges that the database records as succeeded, a status
/// that never changes again: kept by this server so that each load of the gateway audit asks the
/// database only about charges it has not confirmed yet (at a million payments, asking about
/// every charge of a load test cost 100-250 ms a load). Valid for one ledger and one payments
/// table (`of`), and for [`Confirmed::FOR`] at most: another ledger id (a reset), another table
/// answering (a restore, a failover onto a standby that may lack payments, a truncate) or time
/// starts it again, so that a database that forgot a payment is caught on the next load (rows
/// deleted by hand, at the latest a minute later).
#[derive(Debug, Default)]
pub struct Confirmed {
    /// The ledger's id and the payments table's incarnation these are valid for.
    pub of: String,
    /// Since when.
    pub since: Option<std::time::Instant>,
    pub ids: std::collections::HashSet<uuid::Uuid>,
}

impl Confirmed {
    /// How long a confirmation is trusted at most.
    pub const FOR: Duration = Duration::from_secs(60);

    /// The confirmations valid for `of` now (none, when they were of something else or too old).
    pub fn valid_for(&mut self, of: &str) -> &std::collections::HashSet<uuid::Uuid> {
        if self.of != of || self.since.is_none_or(|since| since.elapsed() > Self::FOR) {
            *self = Self { of: of.to_owned(), since: Some(std::time::Instant::now()), ids: Default::default() };
        }
        &self.ids
    }
}

/// Counts per time bucket that can no longer change, kept by this server between two loads of the
/// overview (whose chart would otherwise count fifteen minutes of events every two seconds).
#[derive(Debug, Default)]
pub struct Settled {
    /// Every bucket up to this one is settled: in `counts`, or none of its events were counted.
    pub through: Option<i64>,
    /// Bucket (its start in Unix seconds / the bucket's width) → counts per event kind.
    pub counts: BTreeMap<i64, Vec<(String, i64)>>,
}

impl WebState {
    /// The web state of a server whose gateway is at `gateway_base_url`.
    pub fn new(config: WebConfig, gateway_base_url: &str) -> Self {
        Self {
            password_checks: Arc::new(Semaphore::new(config.password_checks.max(1))),
            config: Arc::new(config),
            simulator: simulator::SimulatorControl::new(gateway_base_url),
            settled: Arc::default(),
            confirmed: Arc::default(),
        }
    }
}

/// Time of day as `HH:MM:SS` (UTC), for tables and timelines.
pub fn clock(at: time::OffsetDateTime) -> String {
    format!("{:02}:{:02}:{:02}", at.hour(), at.minute(), at.second())
}

/// A full UTC timestamp (RFC 3339), for `<time datetime=…>` and tooltips.
pub fn rfc3339(at: time::OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// "4 s ago", "3 min ago", "2 h ago", "5 d ago": how long ago `secs` seconds is, for people.
pub fn ago(secs: f64) -> String {
    let secs = secs.max(0.0) as u64;
    match secs {
        0..60 => format!("{secs} s ago"),
        60..3600 => format!("{} min ago", secs / 60),
        3600..86_400 => format!("{} h ago", secs / 3600),
        _ => format!("{} d ago", secs / 86_400),
    }
}

/// An amount in minor units as money, in the currency's own units: `12.50 USD`, `100,000 JPY`,
/// `12.340 KWD` ([`crate::money`]).
pub use crate::money::format as money;

/// The browser-facing side: the admin dashboard and the shop ([`crate::web`]).
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// `PAYONCE_SECURE_COOKIES`: mark session cookies `Secure`. Must be true whenever payonce is
    /// reached over HTTPS (behind a TLS-terminating proxy too); false only for `http://localhost`,
    /// where a browser would refuse to send a `Secure` cookie back.
    pub secure_cookies: bool,
    /// An operator is signed out after this long without using the dashboard. The dashboard's
    /// own live refresh does not count as use.
    pub admin_idle: Duration,
    /// How many sign-in passwords are checked at once. Each argon2 check holds 19 MiB for tens of
    /// milliseconds of CPU: more than the cores can run only adds memory.
    pub password_checks: usize,
    /// How long a sign-in waits for its turn to be checked before it is answered 429.
    pub password_check_wait: Duration,
    /// `PAYONCE_WORKSHOP`: a classroom, not production. The dashboard's live refresh keeps the
    /// session alive (a projected dashboard is never signed out), and the gateway panel offers a
    /// reset that empties the simulator's ledger and deletes every key and payment.
    pub workshop: bool,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            secure_cookies: false,
            admin_idle: Duration::from_secs(30 * 60),
            password_checks: default_password_checks(),
            password_check_wait: Duration::from_secs(5),
            workshop: false,
        }
    }
}

/// One password check per core.
pub fn default_password_checks() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative times pick the largest whole unit.
    #[test]
    fn relative_times() {
        assert_eq!(ago(-1.0), "0 s ago");
        assert_eq!(ago(59.9), "59 s ago");
        assert_eq!(ago(61.0), "1 min ago");
        assert_eq!(ago(7200.0), "2 h ago");
        assert_eq!(ago(200_000.0), "2 d ago");
        assert_eq!(money(1250, "usd"), "12.50 USD");
        assert_eq!(money(5, "eur"), "0.05 EUR");
        assert_eq!(money(100_000, "jpy"), "100,000 JPY");
    }
}
