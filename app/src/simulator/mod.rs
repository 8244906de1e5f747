//! A Stripe-wire-compatible simulator, with an exact ledger of charges and injectable faults.
//!
//! payonce talks to Stripe through async-stripe. Pointed at this simulator instead (a base URL
//! such as `http://127.0.0.1:PORT/`), the same client code runs unchanged, offline, and every
//! failure an exactly-once design must survive can be produced on demand. It runs inside
//! `payonce serve` when no `STRIPE_SECRET_KEY` is set, or alone as `payonce stripe-sim`.
//!
//! # What it is
//!
//! - **Stripe's wire format** for the calls payonce makes: `POST /v1/payment_intents` (form
//!   encoded, `metadata[k]=v`, `confirm=true`) and `GET /v1/payment_intents/{id}`, Bearer (or
//!   Basic) auth with `sk_…`/`rk_…` keys, Stripe's ids, objects, error envelope and status codes.
//!   Stripe's test payment methods (`pm_card_visa`, `pm_card_chargeDeclinedInsufficientFunds`,
//!   …) decide the outcome.
//! - **Stripe's idempotency semantics**, per API key and `Idempotency-Key`: saved results,
//!   replays with `Idempotent-Replayed: true`, 400 on reused keys with other parameters, 409
//!   while in flight. Work that has begun always finishes, even if the client hangs up.
//! - **A ledger** ([`Simulator::charges`], `GET /_sim/charges`): one entry per successful charge,
//!   with the Idempotency-Key and metadata it was made with. This is how tests and load tests
//!   *prove* that nothing was charged twice.
//! - **Faults** ([`Faults`], `PUT /_sim/faults`): latency, outages, timeouts that still charge,
//!   and responses lost after the charge, optionally scoped to a payment method or the next N
//!   calls, reproducible with a seed.
//!
//! # What it is not
//!
//! Not a Stripe emulator. There are no customers, captures, refunds, webhooks, 3-D Secure
//! (`requires_action`), rate limits or live mode; saved idempotent results never expire (Stripe
//! keeps them 24 hours); all state is in memory and lost when the process exits. What is outside
//! the subset is refused loudly (`parameter_unknown`, Stripe's 404) rather than ignored; only
//! `expand`, which changes how ids are rendered and not what happens, is accepted and ignored.
//!
//! # Layout
//!
//! ```text
//! mod.rs              Simulator (the shared state), start / serve / RunningSimulator
//! api.rs              the Stripe routes: auth, create (the execution task), retrieve
//! form.rs             form decoding and create-parameter validation (Stripe's 400s)
//! idempotency.rs      claims, saved results, replays, mismatches
//! faults.rs           Faults: validation, scope, the per-call draw
//! payment_methods.rs  Stripe's test payment methods and what each one does
//! objects.rs          the PaymentIntent object and Stripe-like ids
//! ledger.rs           Charge and the append-only ledger
//! error.rs            Stripe's error envelope
//! control.rs          the /_sim routes
//! ```

mod api;
mod control;
mod error;
mod faults;
mod form;
mod idempotency;
mod ledger;
mod objects;
mod payment_methods;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use faults::{Faults, FaultsError};
pub use ledger::Charge;

use api::Outcome;
use faults::FaultState;
use idempotency::Keys;
use ledger::Ledger;
use objects::PaymentIntent;

/// The simulator: its state and its HTTP routes.
///
/// Cheap to clone (an `Arc` inside); every clone is the same simulator. All state is in memory
/// for the life of the process.
#[derive(Clone, Default)]
pub struct Simulator {
    state: Arc<Mutex<State>>,
}

/// Everything the simulator knows. One mutex guards it all: critical sections are short and never
/// span an `.await`, and one lock makes "create the PaymentIntent, append the charge, save the
/// idempotent result" a single atomic step.
#[derive(Debug, Default)]
struct State {
    /// Incremented by every reset. A request that began before a reset finds a different epoch
    /// when it comes to execute, and executes nothing: a reset is a clean cut.
    epoch: u64,
    /// Objects and idempotency keys per API key, as Stripe scopes them per account.
    accounts: HashMap<String, Account>,
    /// Every successful charge.
    ledger: Ledger,
    /// The faults to inject and the random source of their draws.
    faults: FaultState,
}

/// What one API key owns.
#[derive(Debug, Default)]
struct Account {
    /// PaymentIntents by id.
    payment_intents: HashMap<String, PaymentIntent>,
    /// Idempotency keys: claims in flight and saved results.
    keys: Keys,
}

impl State {
    fn account(&mut self, api_key: &str) -> &mut Account {
        // Look up before `entry`, which would allocate the key on every call of every request.
        if !self.accounts.contains_key(api_key) {
            self.accounts.insert(api_key.to_owned(), Account::default());
        }
        self.accounts.get_mut(api_key).expect("inserted just above")
    }
}

impl Simulator {
    /// A simulator with no objects, no charges and no faults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The Stripe routes (`/v1/…`) and the control routes (`/_sim/…`). Every response, even
    /// for an unknown URL, is in Stripe's error format.
    ///
    /// The router has its own fallback (Stripe's 404), so serve it on its own listener (see
    /// [`start`] and [`serve`]) or `nest` it under a prefix; `merge`-ing it into a router that
    /// has a fallback too makes axum panic.
    pub fn router(&self) -> Router {
        Router::new()
            .merge(api::router())
            .merge(control::router())
            .fallback(api::unrecognized)
            .method_not_allowed_fallback(api::unrecognized)
            .layer(middleware::from_fn(log_request))
            .with_state(self.clone())
    }

    /// A snapshot of the ledger: every successful charge, in the order they were made.
    pub fn charges(&self) -> Vec<Charge> {
        self.state().ledger.charges().to_vec()
    }

    /// The faults in force (with `next_calls` showing how many calls remain).
    pub fn faults(&self) -> Faults {
        self.state().faults.faults().clone()
    }

    /// Replaces the faults after validating them; on error the current faults stay.
    pub fn set_faults(&self, faults: Faults) -> Result<(), FaultsError> {
        self.state().faults.set(faults)
    }

    /// Forgets everything: ledger, objects, saved results, claims and faults. Requests in flight
    /// are answered with a 500 and execute nothing (see `State::epoch`).
    fn reset(&self) {
        let mut state = self.state();
        *state = State { epoch: state.epoch + 1, ..State::default() };
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; if something ever did, the state is still
        // consistent (each critical section is one step), so keep serving rather than fail
        // every later request.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").finish_non_exhaustive()
    }
}

/// One debug line per request: method, path, Idempotency-Key, status and outcome. The API key
/// is never logged.
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let idempotency_key = request.headers().get("idempotency-key").and_then(|key| key.to_str().ok()).map(str::to_owned);
    let response = next.run(request).await;
    tracing::debug!(
        %method,
        path,
        idempotency_key,
        status = response.status().as_u16(),
        outcome = response.extensions().get::<Outcome>().map_or("-", |outcome| outcome.0),
        replayed = response.headers().contains_key("idempotent-replayed"),
        "stripe simulator request"
    );
    response
}

/// A simulator serving on its own port, for tests and `payonce serve`.
///
/// Dropping it stops the server immediately; [`RunningSimulator::shutdown`] stops it gracefully.
#[derive(Debug)]
pub struct RunningSimulator {
    addr: SocketAddr,
    simulator: Simulator,
    /// Sending (or dropping) this asks the server to shut down gracefully.
    shutdown: Option<oneshot::Sender<()>>,
    /// The server task; `None` once shut down.
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// Binds `addr` (port 0 picks a free port) and serves a new simulator in a spawned task until
/// the returned handle is shut down or dropped.
pub async fn start(addr: SocketAddr) -> std::io::Result<RunningSimulator> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let simulator = Simulator::new();
    let (shutdown, shutdown_requested) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, simulator.clone(), async {
        // A send and a dropped sender both mean "stop".
        let _ = shutdown_requested.await;
    }));
    Ok(RunningSimulator { addr, simulator, shutdown: Some(shutdown), task: Some(task) })
}

impl RunningSimulator {
    /// The address the simulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to give async-stripe: `http://127.0.0.1:PORT/`, with the trailing slash
    /// async-stripe needs before it appends `v1/…`. A wildcard bind address becomes loopback.
    pub fn base_url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}/", SocketAddr::new(ip, self.addr.port()))
    }

    /// The simulator, to read its ledger or set faults directly.
    pub fn simulator(&self) -> &Simulator {
        &self.simulator
    }

    /// Stops accepting connections and waits for open ones to finish. A request held by a
    /// timeout fault keeps its connection open, so this waits for the hold too.
    pub async fn shutdown(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(%error, "stripe simulator server failed"),
                Err(error) => tracing::warn!(%error, "stripe simulator server task failed"),
            }
        }
    }
}

impl Drop for RunningSimulator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Serves `sim` on `listener` until `shutdown` resolves, then finishes open requests: the
/// `payonce stripe-sim` command.
pub async fn serve(
    listener: TcpListener,
    sim: Simulator,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, sim.router()).with_graceful_shutdown(shutdown).await
}
