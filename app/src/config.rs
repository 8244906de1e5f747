//! Runtime configuration, resolved from flags and environment by [`crate::cli`] (or built
//! directly by tests).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::idempotency::EngineSettings;
use crate::sweeper::SweeperSettings;

/// Everything `payonce serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where the HTTP API listens.
    pub addr: SocketAddr,
    pub database: DatabaseConfig,
    pub engine: EngineSettings,
    pub gateway: GatewayConfig,
    pub sweeper: SweeperSettings,
    /// Mount `POST /bench/payments`, the payment handler without the idempotency layer, for the
    /// benchmark. Off by default; never on in production.
    pub bench_routes: bool,
    pub web: WebConfig,
}

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
}

impl Default for WebConfig {
    fn default() -> Self {
        Self { secure_cookies: false, admin_idle: Duration::from_secs(30 * 60) }
    }
}

/// Where the data lives.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `DATABASE_URL`. When absent, a private PostgreSQL is started under `local_dir`.
    pub url: Option<Secret>,
    /// The folder of the zero-config PostgreSQL (its data lives in `local_dir/postgres`).
    pub local_dir: PathBuf,
    /// The most connections the pool opens.
    pub pool_size: u32,
}

/// How payments reach the gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Real (or external) Stripe. `None` starts the built-in simulator.
    pub stripe: Option<StripeConfig>,
    /// Where the built-in simulator listens when it is started (port 0: any free port).
    pub simulator_addr: SocketAddr,
    /// The deadline of one gateway call.
    pub timeout: Duration,
    /// `STRIPE_WEBHOOK_SECRET`: the signing secret of payonce's webhook endpoint at Stripe. With
    /// the built-in simulator, payonce registers its own endpoint and uses the secret it gets.
    pub webhook_secret: Option<Secret>,
}

/// A Stripe account, or anything that speaks its API.
#[derive(Debug, Clone)]
pub struct StripeConfig {
    pub secret_key: Secret,
    /// `STRIPE_API_BASE`; Stripe's own when `None`.
    pub api_base: Option<String>,
}

/// A string that must never reach a log: its `Debug` prints nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// This process's name for leases and logs: `<role>:<host>:<pid>`.
pub fn owner_name(role: &str) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{role}:{host}:{}", std::process::id())
}
