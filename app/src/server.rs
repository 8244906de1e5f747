//! `payonce serve`: assembles the database, the gateway, the engine and the HTTP application,
//! and takes them down again in order.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::app;
use crate::config::{HttpConfig, ServeConfig, owner_name};
use crate::customers::Authenticator;
use crate::db::{Database, OpenError};
use crate::gateway::Gateway;
use crate::idempotency::{Engine, EventLog};
use crate::lab::{Lab, Strategy};
use crate::listener::{self, FdBudget};
use crate::simulator::{self, RunningSimulator};
use crate::state::{AppState, Services};
use crate::sweeper::{Sweeper, SweeperSettings};

/// The secret key payonce gives async-stripe when it talks to its own simulator.
const SIMULATOR_SECRET_KEY: &str = "sk_test_payonce_simulator";

/// File descriptors the listener leaves to everything but its connections (and the pool's):
/// listeners, logs, the runtime, the simulator's control client.
const RESERVED_FDS: u64 = 64;

/// How often expired dashboard and shop sessions are deleted.
const SESSION_CLEANUP: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Database(#[from] OpenError),
    #[error(
        "could not start the built-in Stripe simulator on {addr}: {source}. If a `payonce stripe-sim` \
         runs there, charge through it (STRIPE_SECRET_KEY=sk_test_any STRIPE_API_BASE=http://{addr}/); \
         otherwise pick another address with PAYONCE_SIM_ADDR (port 0 takes any free port)"
    )]
    Simulator { addr: SocketAddr, source: std::io::Error },
    #[error("could not configure the Stripe client: {0}")]
    Gateway(#[from] stripe::StripeError),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("could not create the session table: {0}")]
    Sessions(sqlx::Error),
    #[error("could not listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// A server that is listening but not yet serving.
pub struct Server {
    listener: TcpListener,
    state: AppState,
    sweeper: SweeperSettings,
    bench_routes: bool,
    /// Only the dashboard, the shop and the health checks; no sweeper.
    admin_only: bool,
    http: HttpConfig,
    /// What the listener may not spend of the file-descriptor limit.
    fds: FdBudget,
    database: Database,
    simulator: Option<RunningSimulator>,
    event_writer: JoinHandle<()>,
}

impl Server {
    /// Opens the database (migrating it), sets up the gateway and binds the listener.
    pub async fn start(config: ServeConfig) -> Result<Self, StartError> {
        config.engine.horizon.check().map_err(StartError::Config)?;
        config.lab.check().map_err(StartError::Config)?;
        // Ports first: a taken port should fail fast, before a local PostgreSQL is started.
        let addr = config.addr;
        let listener = TcpListener::bind(addr).await.map_err(|source| StartError::Listen { addr, source })?;
        let local = listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
        let mut webhook_secret = config.gateway.webhook_secret.clone();
        let (gateway, simulator) = match &config.gateway.stripe {
            None if config.admin_only => {
                // The dashboard of servers that run elsewhere: their built-in simulator is the
                // gateway panel's, at the address they use by default.
                let base = format!("http://{}/", reachable(config.gateway.simulator_addr));
                let gateway = Gateway::new(SIMULATOR_SECRET_KEY, Some(&base), config.gateway.timeout)?;
                tracing::info!(base_url = gateway.base_url(), "admin only: the gateway panel reads this simulator");
                (gateway, None)
            }
            Some(stripe) => {
                let gateway =
                    Gateway::new(stripe.secret_key.expose(), stripe.api_base.as_deref(), config.gateway.timeout)?;
                tracing::info!(base_url = gateway.base_url(), "charging through Stripe");
                (gateway, None)
            }
            None => {
                let addr = config.gateway.simulator_addr;
                let sim = simulator::start(addr).await.map_err(|source| StartError::Simulator { addr, source })?;
                let gateway = Gateway::new(SIMULATOR_SECRET_KEY, Some(&sim.base_url()), config.gateway.timeout)?;
                tracing::info!(
                    "no STRIPE_SECRET_KEY set: charging through the built-in Stripe simulator at {url} \
                     (ledger: {url}_sim/charges, faults: {url}_sim/faults)",
                    url = sim.base_url(),
                );
                // Webhooks with zero configuration: the simulator delivers to this server, signed
                // with the secret it issues for the endpoint.
                let url = format!("http://{}{}", reachable(local), crate::http::webhooks::ROUTE);
                let secret = gateway
                    .register_webhook_endpoint(&url, &crate::http::webhooks::INBOX.subscriptions())
                    .await
                    .map_err(|err| {
                        StartError::Config(format!("could not register {url} with the built-in simulator: {err}"))
                    })?;
                webhook_secret = Some(secret);
                (gateway, Some(sim))
            }
        };
        let database = Database::open(&config.database).await?;
        if let Err(err) = crate::web::session::migrate(&database.pool).await {
            database.close().await;
            return Err(StartError::Sessions(err));
        }
        let (events, event_writer) = EventLog::spawn(database.pool.clone());
        let settings = crate::idempotency::EngineSettings { gateway_timeout: config.gateway.timeout, ..config.engine };
        let engine = Engine::new(database.pool.clone(), settings, events);
        let web = crate::web::WebState::new(config.web.clone(), gateway.base_url());
        let lab = Arc::new(Lab::new(config.lab.clone()));
        if lab.strategy() == Strategy::Redis
            && let Err(err) = lab.redis().await
        {
            database.close().await;
            return Err(StartError::Config(format!(
                "PAYONCE_CLAIM_STRATEGY=redis, but Redis at REDIS_URL cannot be reached: {err}"
            )));
        }
        if lab.strategy() != Strategy::OnConflict || lab.is_lab() {
            tracing::warn!(
                strategy = %lab.strategy(),
                lab = lab.is_lab(),
                "claim strategy {}{}",
                lab.strategy(),
                if lab.is_lab() { " (lab mode: /lab/{strategy}/v1/payments is mounted)" } else { "" }
            );
        }
        let operations = crate::operations::registry(&gateway);
        let state = AppState::new(Services {
            auth: Arc::new(Authenticator::new(database.pool.clone())),
            engine,
            gateway,
            owner: Arc::from(owner_name("http")),
            metrics: crate::metrics::install(),
            web,
            webhook_secret: webhook_secret.map(Arc::new),
            lab,
            operations,
            reads: database.reads.clone(),
        });
        let fds = FdBudget {
            reserved: RESERVED_FDS + u64::from(config.database.pool_size),
            per_connection: if simulator.is_some() { 3 } else { 2 },
        };
        Ok(Self {
            listener,
            state,
            sweeper: config.sweeper,
            bench_routes: config.bench_routes,
            admin_only: config.admin_only,
            http: config.http,
            fds,
            database,
            simulator,
            event_writer,
        })
    }

    /// Where the API listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// The built-in simulator's base URL, when it runs.
    pub fn simulator_url(&self) -> Option<String> {
        self.simulator.as_ref().map(RunningSimulator::base_url)
    }

    /// Serves (and sweeps) until `shutdown` resolves, lets in-flight requests and the current
    /// sweep finish, then stops everything this server started.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let Self { listener, state, sweeper, bench_routes, admin_only, http, fds, database, simulator, event_writer } =
            self;
        let (stop, stopping) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
        });
        // No sweeper for a dashboard alone; and none built either, since its handle on the
        // event log would keep the writer (awaited below) from ever ending.
        let sweeper = if admin_only {
            tokio::spawn(std::future::ready(()))
        } else {
            let sweeper = Sweeper::new(state.engine.clone(), state.gateway.clone(), sweeper, owner_name("sweeper"));
            tokio::spawn(sweeper.run(stopped(stopping.clone())))
        };

        let sessions = crate::web::session::spawn_cleanup(state.engine.pool(), SESSION_CLEANUP);

        tracing::info!(addr = %listener.local_addr()?, admin_only, "payonce is listening");
        welcome(reachable(listener.local_addr()?), admin_only);
        let app = if admin_only { app::admin_router(state) } else { app::router(state, bench_routes) };
        let served = listener::serve(listener, app, &http, fds, stopped(stopping)).await;
        sessions.abort();
        let _ = sweeper.await;
        // The router and the sweeper (and with them the last handles on the event log) are gone:
        // the writer flushes what it holds and ends.
        let _ = event_writer.await;
        if let Some(sim) = simulator {
            sim.shutdown().await;
        }
        database.close().await;
        tracing::info!("payonce stopped");
        served
    }
}

/// An address a client on this machine can reach a listener bound to `addr` at (a listener on
/// every interface is reached on loopback).
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => SocketAddr::from(([127, 0, 0, 1], addr.port())),
        ip if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port())),
        _ => addr,
    }
}

/// What a newcomer needs next, said once at startup: where the shop, the dashboard and the API
/// are, and the two commands that come first, spelled as this process was started (`cargo run
/// -- …` when cargo started it, which sets `CARGO_PKG_NAME` for the program it runs).
fn welcome(addr: SocketAddr, admin_only: bool) {
    let command = if std::env::var_os("CARGO_PKG_NAME").is_some_and(|name| name == "payonce") {
        "cargo run -q --"
    } else {
        "payonce"
    };
    tracing::info!("the shop:      http://{addr}/");
    tracing::info!("the dashboard: http://{addr}/admin  (an operator first: `{command} admins create alice`)");
    if !admin_only {
        tracing::info!(
            "the API:       POST http://{addr}/v1/payments  (an API key first: `{command} customers create demo`; \
             docs/errors.md, GET /openapi.json)"
        );
    }
}

/// Resolves once `stopping` turns true.
async fn stopped(mut stopping: watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
