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
    /// Serve only the dashboard, the shop and the health checks (`payonce serve --admin-only`):
    /// no payments API, no sweeper, no simulator of its own. A dashboard in a process of its own
    /// stays up while the servers it watches are killed (docs/workshop.md).
    pub admin_only: bool,
    pub http: HttpConfig,
    /// The claim strategy and lab mode ([`crate::lab`]).
    pub lab: crate::lab::LabSettings,
}

/// How the HTTP listener protects itself ([`crate::listener`]). Every limit, what it defaults
/// to and what a client sees when it is hit: docs/operations.md, "Limits and timeouts".
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The most connections open at once; the listener stops accepting at the cap (new ones wait
    /// in the kernel's queue). Clamped below the file-descriptor limit at start.
    pub max_connections: usize,
    /// A request head (request line and headers) must arrive completely within this, counted
    /// from its first byte, or from the connection's start for its first request.
    pub header_read_timeout: Duration,
    /// A request body must arrive completely within this, counted from the end of its head.
    pub body_timeout: Duration,
    /// A kept-alive connection with no request in flight is closed after this long without a
    /// new one.
    pub idle_timeout: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(75),
        }
    }
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

/// Where the data lives.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `DATABASE_URL`. When absent, a private PostgreSQL is started under `local_dir`.
    pub url: Option<Secret>,
    /// The folder of the zero-config PostgreSQL (its data lives in `local_dir/postgres`).
    pub local_dir: PathBuf,
    /// The most connections the pool opens.
    pub pool_size: u32,
    /// `statement_timeout` of every pooled connection (zero: none). Below the gateway timeout, so
    /// that a stuck statement ends as a 503 long before a client gives up.
    pub statement_timeout: Duration,
    /// `lock_timeout` of every pooled connection (zero: none): a statement waiting this long for
    /// a lock gives up, so waiters cannot drain the pool behind one long lock.
    pub lock_timeout: Duration,
    /// `PAYONCE_READ_REPLICA_URL`: a standby the dashboard's read-only pages may read from, with
    /// its lag shown. Never used for a key's claim or read, nor any write (docs/ha.md).
    pub read_replica_url: Option<Secret>,
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
