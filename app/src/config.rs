//! Runtime configuration, resolved from flags and environment by [`crate::cli`] (or built
//! directly by tests): what `payonce serve` assembles. Each part's settings live beside what
//! they configure (the database's in [`crate::db`], the listener's in [`crate::listener`], …) and
//! are re-exported here, so that this module sits above everything and nothing below imports it.

use std::net::SocketAddr;

pub use crate::db::DatabaseConfig;
pub use crate::gateway::{GatewayConfig, StripeConfig};
use crate::idempotency::EngineSettings;
pub use crate::listener::HttpConfig;
pub use crate::secret::Secret;
use crate::sweeper::SweeperSettings;
pub use crate::web::{WebConfig, default_password_checks};

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
