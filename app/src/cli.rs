//! The `payonce` command line. Every flag has an environment variable of the same meaning, so the
//! same settings work in a shell, in `docker-compose.yml` and in CI.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{
    DatabaseConfig, GatewayConfig, HttpConfig, Secret, ServeConfig, StripeConfig, WebConfig, default_password_checks,
    owner_name,
};
use crate::db::Database;
use crate::gateway::Gateway;
use crate::idempotency::{Backoff, Budget, Engine, EngineSettings, EventLog, Horizon};
use crate::lab::{LabSettings, Strategy};
use crate::server::{Server, shutdown_signal};
use crate::sweeper::{Sweeper, SweeperSettings};
use crate::telemetry::{self, LogFormat};
use crate::{admin, customers, simulator};

type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// payonce: a payments API where every request happens exactly once.
#[derive(Debug, Parser)]
#[command(name = "payonce", version, about, long_about = None)]
struct Cli {
    /// Log line format (logs go to stderr).
    #[arg(long, env = "PAYONCE_LOG_FORMAT", value_enum, default_value = "pretty", global = true)]
    log_format: LogFormat,

    /// Threads that run requests (tokio's workers). Unset: one per core. On a machine whose cores
    /// PostgreSQL shares, fewer threads wake each other less: on two cores, one thread cut the
    /// CPU of a replay by a fifth to a quarter (docs/performance.md, "Cost per payment").
    #[arg(long, env = "PAYONCE_WORKER_THREADS", global = true, value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: Option<u16>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply migrations and serve the HTTP API (with a sweeper inside) until SIGINT/SIGTERM.
    Serve(ServeArgs),
    /// Run the sweeper on its own: complete abandoned keys, reconcile spent ones and pending
    /// payments with the gateway, reap expired keys.
    Sweep(SweepArgs),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Manage API customers.
    Customers {
        #[command(subcommand)]
        command: CustomersCommand,
    },
    /// Manage the operators of the admin dashboard (/admin).
    Admins {
        #[command(subcommand)]
        command: AdminsCommand,
    },
    /// Run the Stripe-compatible simulator on its own.
    StripeSim(SimulatorArgs),
    /// The zero-config local PostgreSQL (used when DATABASE_URL is unset): its URL, start, stop.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
    /// Bulk operations through the HTTP API, safe to run again (docs/batch.md).
    Batch {
        #[command(subcommand)]
        command: crate::batch::BatchCommand,
    },
}

#[derive(Debug, Subcommand)]
enum DbCommand {
    /// Print the URL of payonce's database on the local PostgreSQL, on the port it keeps across
    /// restarts (whether it runs now or not), e.g. `psql "$(payonce db url)"`.
    Url(LocalDbArgs),
    /// Start the local PostgreSQL (on the port it remembers) if it is not running; prints its URL.
    Start(LocalDbArgs),
    /// Stop the local PostgreSQL, whoever started it.
    Stop {
        /// Stop it as a crash would (`pg_ctl stop -m immediate`: no checkpoint, crash recovery
        /// at the next start), for outage drills.
        #[arg(long)]
        immediate: bool,
        #[command(flatten)]
        local: LocalDbArgs,
    },
}

#[derive(Debug, Args)]
struct LocalDbArgs {
    /// Folder of the zero-config PostgreSQL.
    #[arg(long, env = "PAYONCE_DATA_DIR", default_value = ".payonce")]
    data_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
enum AdminsCommand {
    /// Create an operator. The password is read from PAYONCE_ADMIN_PASSWORD, or else from the
    /// first line of stdin (e.g. `read -rs pw && printf '%s\n' "$pw" | payonce admins create alice`).
    Create {
        /// The operator's sign-in name: lowercase letters, digits, '.', '_' or '-'.
        name: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Subcommand)]
enum CustomersCommand {
    /// Create a customer; prints its new API key as the only line on stdout.
    Create {
        /// A name for the customer (shown on the dashboard).
        name: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Args)]
struct DatabaseArgs {
    /// PostgreSQL URL. When unset, payonce starts a private PostgreSQL under --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,

    /// Folder for the zero-config PostgreSQL (used only without DATABASE_URL).
    #[arg(long, env = "PAYONCE_DATA_DIR", default_value = ".payonce")]
    data_dir: PathBuf,

    /// A read replica (a standby) for the dashboard's read-only pages, which then show its lag.
    /// Keys are always claimed and read on the primary (DATABASE_URL), never here.
    #[arg(long, env = "PAYONCE_READ_REPLICA_URL", hide_env_values = true)]
    read_replica_url: Option<String>,

    /// Most database connections to open.
    #[arg(long, env = "PAYONCE_DB_POOL_SIZE", default_value_t = 16)]
    db_pool_size: u32,

    /// A statement running longer is cancelled (503, retry): PostgreSQL's statement_timeout on
    /// every pooled connection. 0: none. Keep it below the gateway timeout.
    #[arg(long, env = "PAYONCE_DB_STATEMENT_TIMEOUT_SECS", default_value_t = 5)]
    db_statement_timeout_secs: u64,

    /// A statement waiting longer for a lock gives up (503, retry): lock_timeout on every pooled
    /// connection. 0: none.
    #[arg(long, env = "PAYONCE_DB_LOCK_TIMEOUT_SECS", default_value_t = 2)]
    db_lock_timeout_secs: u64,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address the HTTP API listens on.
    #[arg(long, env = "PAYONCE_ADDR", default_value = "127.0.0.1:3000")]
    addr: SocketAddr,

    /// Address of the built-in simulator, started when no STRIPE_SECRET_KEY is set (port 0: any).
    #[arg(long, env = "PAYONCE_SIM_ADDR", default_value = "127.0.0.1:12111")]
    sim_addr: SocketAddr,

    #[command(flatten)]
    worker: WorkerArgs,

    /// Also serve POST /bench/payments, the payment handler WITHOUT the idempotency layer, so a
    /// benchmark can measure the layer's cost. Never enable it for real clients.
    #[arg(long, env = "PAYONCE_BENCH_ROUTES", hide = true)]
    bench_routes: bool,

    #[command(flatten)]
    web: WebArgs,

    #[command(flatten)]
    http: HttpArgs,

    /// Serve only the dashboard, the shop and the health checks: no payments API, no sweeper, no
    /// simulator of its own (its gateway panel uses the one at PAYONCE_SIM_ADDR, or STRIPE_API_BASE).
    /// A dashboard in its own process stays up while the servers it watches are killed.
    #[arg(long, env = "PAYONCE_ADMIN_ONLY", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    admin_only: bool,

    #[command(flatten)]
    lab: LabArgs,
}

/// The claim strategy, and the lab that compares them (docs/strategies.md).
#[derive(Debug, Args)]
struct LabArgs {
    /// How a key is claimed: on-conflict (the engine: INSERT … ON CONFLICT, a lease and a fencing
    /// token), for-update (a transaction held across the gateway call), redis (a lease in Redis)
    /// or check-then-insert (double charges by design; only with --lab).
    #[arg(long, env = "PAYONCE_CLAIM_STRATEGY", default_value = "on-conflict")]
    claim_strategy: Strategy,

    /// Lab mode: allow check-then-insert, serve POST /lab/{strategy}/v1/payments for all four
    /// strategies side by side, and the dashboard's Lab page. Never for real payments.
    #[arg(long, env = "PAYONCE_LAB", value_parser = clap::builder::BoolishValueParser::new())]
    lab: bool,

    /// Redis, for the redis strategy.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379", hide_env_values = true)]
    redis_url: String,

    /// The redis strategy's lease (SET … PX): how long a key stays claimed when its holder dies.
    #[arg(long, env = "PAYONCE_REDIS_LEASE_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    redis_lease_ms: u64,

    /// check-then-insert's pause between its check and its insert, which makes its race happen on
    /// every storm (0: none; the race remains).
    #[arg(long, env = "PAYONCE_LAB_GAP_MS", default_value_t = 50)]
    lab_gap_ms: u64,
}

/// The listener's limits (docs/operations.md, "Limits and timeouts").
#[derive(Debug, Args)]
struct HttpArgs {
    /// Most connections open at once; more wait in the kernel's queue. Lowered at start if the
    /// file-descriptor limit (ulimit -n) cannot hold them.
    #[arg(long, env = "PAYONCE_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,

    /// Seconds a client has to send a complete request head (from its first byte; for a new
    /// connection, from the connection's start). Slower connections are closed.
    #[arg(long, env = "PAYONCE_HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_secs: u64,

    /// Seconds a client has to send a request body, from the end of its head (408 after).
    #[arg(long, env = "PAYONCE_BODY_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_secs: u64,

    /// Seconds a kept-alive connection may wait for its next request before it is closed.
    #[arg(long, env = "PAYONCE_IDLE_TIMEOUT_SECS", default_value_t = 75, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_secs: u64,
}

#[derive(Debug, Args)]
struct WebArgs {
    /// Mark the dashboard's and shop's session cookies `Secure`. Required whenever payonce is
    /// reached over HTTPS (including behind a TLS-terminating proxy); leave off for http://localhost.
    #[arg(long, env = "PAYONCE_SECURE_COOKIES", default_value_t = false, action = clap::ArgAction::Set)]
    secure_cookies: bool,

    /// Minutes without a click after which an operator is signed out of the dashboard.
    #[arg(long, env = "PAYONCE_ADMIN_IDLE_MINS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=1440))]
    admin_idle_mins: u64,

    /// Sign-in passwords checked at once (each takes 19 MiB and tens of ms of CPU). Default: the
    /// number of cores.
    #[arg(long, env = "PAYONCE_PASSWORD_CHECKS", value_parser = clap::value_parser!(u64).range(1..=256))]
    password_checks: Option<u64>,

    /// Seconds a sign-in waits for its turn to be checked before it is answered 429.
    #[arg(long, env = "PAYONCE_PASSWORD_CHECK_WAIT_SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=60))]
    password_check_wait_secs: u64,

    /// Workshop mode, for a classroom: the dashboard's live refresh keeps an operator signed in
    /// (no idle sign-out on the projector), and the gateway panel can reset the simulator's
    /// ledger and delete every key and payment. Never in production.
    #[arg(long, env = "PAYONCE_WORKSHOP", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    workshop: bool,
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// Make one pass and exit (prints what it did).
    #[arg(long)]
    once: bool,

    #[command(flatten)]
    worker: WorkerArgs,
}

/// What every process that drives payments needs, `serve` and `sweep` alike.
#[derive(Debug, Args)]
struct WorkerArgs {
    #[command(flatten)]
    database: DatabaseArgs,

    #[command(flatten)]
    engine: EngineArgs,

    #[command(flatten)]
    gateway: GatewayArgs,

    #[command(flatten)]
    sweeper: SweeperArgs,
}

#[derive(Debug, Args)]
struct EngineArgs {
    /// Lease length: how long a worker keeps a key without a heartbeat before others may take it.
    #[arg(long, env = "PAYONCE_LEASE_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    lease_secs: u64,

    /// How long completed keys are kept and replayed.
    #[arg(long, env = "PAYONCE_KEY_TTL_SECS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    key_ttl_secs: u64,

    /// Holders a key may have (the first counts) before clients may no longer take it over; after
    /// that only the sweeper does, every PAYONCE_BACKOFF_CAP_SECS, to confirm its outcome with the
    /// gateway.
    #[arg(long, env = "PAYONCE_MAX_ATTEMPTS", default_value_t = 12, value_parser = clap::value_parser!(i32).range(1..=1000))]
    max_attempts: i32,

    /// Wait before the first retries of a key; doubled for each further one.
    #[arg(long, env = "PAYONCE_BACKOFF_BASE_SECS", default_value_t = 1.0, value_parser = non_negative_secs)]
    backoff_base_secs: f64,

    /// The longest wait between two attempts on a key, and the interval at which a key whose
    /// budget is spent is reconciled.
    #[arg(long, env = "PAYONCE_BACKOFF_CAP_SECS", default_value_t = 60.0, value_parser = non_negative_secs)]
    backoff_cap_secs: f64,

    /// The longest wait between two look-ups of a pending (requires_action, processing) payment.
    #[arg(long, env = "PAYONCE_RECONCILE_CAP_SECS", default_value_t = 600.0, value_parser = positive_secs)]
    reconcile_cap_secs: f64,

    /// No create call is sent for a key older than this (Stripe forgets idempotency keys after
    /// 24 hours); after it, payonce only looks the payment up.
    #[arg(long, env = "PAYONCE_DOWNSTREAM_KEY_TTL_SECS", default_value_t = 82_800, value_parser = downstream_key_ttl)]
    downstream_key_ttl_secs: u64,

    /// How long after the last possible create call an empty search by metadata is believed
    /// (Stripe's search index lags behind).
    #[arg(long, env = "PAYONCE_SEARCH_SETTLE_SECS", default_value_t = 3600.0, value_parser = non_negative_secs)]
    search_settle_secs: f64,
}

#[derive(Debug, Args)]
struct GatewayArgs {
    /// Deadline of one gateway call.
    #[arg(long, env = "PAYONCE_GATEWAY_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    gateway_timeout_secs: u64,

    /// Stripe secret key. When unset, `serve` starts its built-in Stripe simulator.
    #[arg(long, env = "STRIPE_SECRET_KEY", hide_env_values = true)]
    stripe_secret_key: Option<String>,

    /// Base URL of the Stripe API (e.g. an external `payonce stripe-sim`).
    #[arg(long, env = "STRIPE_API_BASE")]
    stripe_api_base: Option<String>,

    /// The signing secret (`whsec_…`) of the webhook endpoint Stripe delivers events to
    /// (`POST /webhooks/stripe`). Without it (and without the built-in simulator, which issues
    /// its own), every event is refused.
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    stripe_webhook_secret: Option<String>,
}

#[derive(Debug, Args)]
struct SweeperArgs {
    /// Time between two sweeper passes.
    #[arg(long, env = "PAYONCE_SWEEP_INTERVAL_SECS", default_value_t = 5.0, value_parser = positive_secs)]
    sweep_interval_secs: f64,

    /// How many days key events and webhook inbox entries are kept (whole UTC days, dropped a day
    /// at a time). At least 3: Stripe redelivers a webhook event for up to 3 days, and the inbox
    /// must remember it that long to apply it once (docs/expiry.md).
    #[arg(long, env = "PAYONCE_EVENT_RETENTION_DAYS", default_value_t = crate::retention::DEFAULT_DAYS,
          value_parser = clap::value_parser!(u32).range(i64::from(crate::retention::MIN_DAYS)..=3650))]
    event_retention_days: u32,

    /// How many expired keys each sweeper deletes per second at most, in ten evenly spaced
    /// batches. 0: as fast as it can, 500 per batch back to back, for the payments' latency to
    /// pay (docs/performance.md, "Retention and the reaper").
    #[arg(long, env = "PAYONCE_REAP_RATE", default_value_t = crate::sweeper::DEFAULT_REAP_RATE)]
    reap_rate: u32,
}

fn positive_secs(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 => Ok(secs),
        _ => Err(format!("{value:?} is not a positive number of seconds")),
    }
}

fn non_negative_secs(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => Err(format!("{value:?} is not a number of seconds (0 or more)")),
    }
}

/// The horizon must stay under Stripe's 24 hours: refused at startup otherwise.
fn downstream_key_ttl(value: &str) -> Result<u64, String> {
    let secs: u64 = value.parse().map_err(|_| format!("{value:?} is not a whole number of seconds"))?;
    Horizon { downstream_key_ttl: Duration::from_secs(secs), ..Horizon::default() }.check()?;
    Ok(secs)
}

#[derive(Debug, Args)]
struct SimulatorArgs {
    /// Address the simulator listens on.
    #[arg(long, env = "PAYONCE_SIM_ADDR", default_value = "127.0.0.1:12111")]
    addr: SocketAddr,
    /// Deliver every event of the account of --webhook-api-key to this URL (a payonce server's
    /// `/webhooks/stripe`), signed with --webhook-secret: the endpoint is fixed at startup, so
    /// that every server configured with the same secret verifies the deliveries.
    #[arg(long, env = "PAYONCE_SIM_WEBHOOK_URL", requires_all = ["webhook_secret", "webhook_api_key"])]
    webhook_url: Option<String>,
    /// The `whsec_…` secret the deliveries to --webhook-url are signed with (the servers'
    /// STRIPE_WEBHOOK_SECRET).
    #[arg(long, env = "STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// The API key (`sk_…`) whose events go to --webhook-url (the servers' STRIPE_SECRET_KEY).
    #[arg(long, env = "STRIPE_SECRET_KEY", hide_env_values = true)]
    webhook_api_key: Option<String>,
}

impl DatabaseArgs {
    fn config(&self) -> DatabaseConfig {
        DatabaseConfig {
            url: self.database_url.clone().filter(|url| !url.is_empty()).map(Secret::new),
            local_dir: self.data_dir.clone(),
            pool_size: self.db_pool_size,
            statement_timeout: Duration::from_secs(self.db_statement_timeout_secs),
            lock_timeout: Duration::from_secs(self.db_lock_timeout_secs),
            read_replica_url: self.read_replica_url.clone().filter(|url| !url.is_empty()).map(Secret::new),
        }
    }
}

impl EngineArgs {
    fn settings(&self) -> EngineSettings {
        EngineSettings {
            lease: Duration::from_secs(self.lease_secs),
            key_ttl: Duration::from_secs(self.key_ttl_secs),
            budget: Budget {
                max_attempts: self.max_attempts,
                backoff: Backoff {
                    base: Duration::from_secs_f64(self.backoff_base_secs),
                    cap: Duration::from_secs_f64(self.backoff_cap_secs),
                },
                pending_cap: Duration::from_secs_f64(self.reconcile_cap_secs),
            },
            horizon: Horizon {
                downstream_key_ttl: Duration::from_secs(self.downstream_key_ttl_secs),
                search_settle: Duration::from_secs_f64(self.search_settle_secs),
            },
            // Set from the gateway's settings where the engine is built.
            ..EngineSettings::default()
        }
    }
}

impl GatewayArgs {
    fn stripe(&self) -> Option<StripeConfig> {
        self.stripe_secret_key.clone().filter(|key| !key.is_empty()).map(|key| StripeConfig {
            secret_key: Secret::new(key),
            api_base: self.stripe_api_base.clone().filter(|url| !url.is_empty()),
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.gateway_timeout_secs)
    }

    fn webhook_secret(&self) -> Option<Secret> {
        self.stripe_webhook_secret.clone().filter(|secret| !secret.is_empty()).map(Secret::new)
    }
}

impl SweeperArgs {
    fn settings(&self) -> SweeperSettings {
        SweeperSettings {
            interval: Duration::from_secs_f64(self.sweep_interval_secs),
            event_retention_days: self.event_retention_days,
            reap_rate: std::num::NonZeroU32::new(self.reap_rate),
        }
    }
}

impl ServeArgs {
    fn config(&self) -> ServeConfig {
        ServeConfig {
            addr: self.addr,
            database: self.worker.database.config(),
            engine: self.worker.engine.settings(),
            gateway: GatewayConfig {
                stripe: self.worker.gateway.stripe(),
                simulator_addr: self.sim_addr,
                timeout: self.worker.gateway.timeout(),
                webhook_secret: self.worker.gateway.webhook_secret(),
            },
            sweeper: self.worker.sweeper.settings(),
            bench_routes: self.bench_routes,
            web: WebConfig {
                secure_cookies: self.web.secure_cookies,
                admin_idle: Duration::from_secs(self.web.admin_idle_mins * 60),
                password_checks: self.web.password_checks.map_or_else(default_password_checks, |n| n as usize),
                password_check_wait: Duration::from_secs(self.web.password_check_wait_secs),
                workshop: self.web.workshop,
            },
            admin_only: self.admin_only,
            http: HttpConfig {
                max_connections: self.http.max_connections as usize,
                header_read_timeout: Duration::from_secs(self.http.header_read_timeout_secs),
                body_timeout: Duration::from_secs(self.http.body_timeout_secs),
                idle_timeout: Duration::from_secs(self.http.idle_timeout_secs),
            },
            lab: LabSettings {
                strategy: self.lab.claim_strategy,
                lab: self.lab.lab,
                redis_url: self.lab.redis_url.clone(),
                redis_lease: Duration::from_millis(self.lab.redis_lease_ms),
                gap: Duration::from_millis(self.lab.lab_gap_ms),
            },
        }
    }
}

/// Entry point of the `payonce` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = cli.worker_threads {
        builder.worker_threads(usize::from(threads));
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("payonce: could not start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // The batch client has exit codes of its own (docs/batch.md).
    if let Command::Batch { command } = cli.command {
        return runtime.block_on(crate::batch::main(command));
    }
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            eprintln!("payonce: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> CliResult {
    match command {
        Command::Serve(args) => {
            let server = Server::start(args.config()).await?;
            server.run(shutdown_signal()).await?;
        }
        Command::Sweep(args) => sweep(args).await?,
        Command::Migrate(args) => {
            let database = Database::open(&args.config()).await?;
            // The session store keeps its own table, created here too so that a database migrated
            // ahead of a deployment is complete.
            let sessions = crate::web::session::migrate(&database.pool).await;
            database.close().await;
            sessions?;
            tracing::info!(migrations = crate::db::MIGRATOR.iter().count(), "database is up to date");
        }
        Command::Customers { command: CustomersCommand::Create { name, database } } => {
            let database = Database::open(&database.config()).await?;
            let created = customers::create(&database.pool, &name).await;
            database.close().await;
            let (customer, key) = created?;
            tracing::info!(customer = %customers::CustomerId(customer.id), name = %customer.name, "customer created; its API key follows on stdout");
            println!("{}", key.expose());
        }
        Command::Admins { command: AdminsCommand::Create { name, database } } => {
            let password = admin_password()?;
            let database = Database::open(&database.config()).await?;
            let created = admin::accounts::create(&database.pool, &name, &password).await;
            database.close().await;
            created?;
            tracing::info!(name, "admin created; sign in at /admin/login");
        }
        Command::Batch { .. } => unreachable!("handled in main"),
        Command::StripeSim(args) => {
            let listener = tokio::net::TcpListener::bind(args.addr).await?;
            tracing::info!(addr = %listener.local_addr()?, "Stripe simulator listening (ledger: /_sim/charges, faults: /_sim/faults)");
            let sim = simulator::Simulator::new();
            if let (Some(url), Some(secret), Some(api_key)) =
                (&args.webhook_url, &args.webhook_secret, &args.webhook_api_key)
            {
                let id = sim.add_webhook_endpoint(api_key, url, secret)?;
                tracing::info!(endpoint = id, url, "webhook endpoint registered: every event is delivered there");
            }
            simulator::serve(listener, sim, shutdown_signal()).await?;
        }
        Command::Db { command: DbCommand::Url(local) } => {
            let url = Database::local_url(&local.data_dir).ok_or_else(|| {
                format!(
                    "no local PostgreSQL in {} has started yet: run `payonce db start` (or `payonce serve` without \
                     DATABASE_URL)",
                    local.data_dir.display()
                )
            })?;
            println!("{url}");
        }
        Command::Db { command: DbCommand::Start(local) } => {
            println!("{}", Database::start_local(&local.data_dir).await?);
        }
        Command::Db { command: DbCommand::Stop { immediate, local } } => {
            Database::stop_local(&local.data_dir, immediate).await?;
            tracing::info!(immediate, "the local PostgreSQL is stopped");
        }
    }
    Ok(())
}

/// An operator's new password: `PAYONCE_ADMIN_PASSWORD`, or the first line of stdin.
fn admin_password() -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    if let Ok(password) = std::env::var("PAYONCE_ADMIN_PASSWORD")
        && !password.is_empty()
    {
        return Ok(password);
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!("password (typed text is visible; prefer PAYONCE_ADMIN_PASSWORD or a pipe):");
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let password = line.strip_suffix('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).unwrap_or(&line);
    if password.is_empty() {
        return Err("no password given: set PAYONCE_ADMIN_PASSWORD or pipe it on stdin".into());
    }
    Ok(password.to_owned())
}

/// `payonce sweep`: the sweeper without the HTTP API.
async fn sweep(args: SweepArgs) -> CliResult {
    // A sweeper with a private simulator would charge a ledger nobody else sees: the standalone
    // sweeper must use the servers' gateway.
    let stripe = args.worker.gateway.stripe().ok_or(
        "the sweeper charges through the same gateway as the servers: set STRIPE_SECRET_KEY \
         (and STRIPE_API_BASE to point at a `payonce stripe-sim`)",
    )?;
    let gateway = Gateway::new(stripe.secret_key.expose(), stripe.api_base.as_deref(), args.worker.gateway.timeout())?;
    let database = Database::open(&args.worker.database.config()).await?;
    let (events, event_writer) = EventLog::spawn(database.pool.clone());
    let settings = EngineSettings { gateway_timeout: args.worker.gateway.timeout(), ..args.worker.engine.settings() };
    let engine = Engine::new(database.pool.clone(), settings, events);
    let sweeper = Sweeper::new(engine, gateway, args.worker.sweeper.settings(), owner_name("sweeper"));
    if args.once {
        let report = sweeper.sweep().await;
        eprintln!("{report:?}");
        // The event writer ends when its last sender is gone, and the sweeper holds one: without
        // this, `sweep --once` printed its report and then waited forever.
        drop(sweeper);
    } else {
        sweeper.run(shutdown_signal()).await;
    }
    let _ = event_writer.await;
    database.close().await;
    Ok(())
}
