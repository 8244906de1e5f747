//! The simulator's router (every Stripe route and the `/_sim` controls), the middleware every
//! request passes, and serving it on a port.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::Router;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::http::{RequestId, unrecognized};
use super::response::Outcome;
use super::state::Simulator;
use super::webhooks::endpoints;
use super::{charges, control, events, payment_intents, refunds};

impl Simulator {
    /// The Stripe routes (`/v1/…`) and the control routes (`/_sim/…`). Every response, even
    /// for an unknown URL, is in Stripe's error format.
    ///
    /// The router has its own fallback (Stripe's 404), so serve it on its own listener (see
    /// [`start`] and [`serve`]) or `nest` it under a prefix; `merge`-ing it into a router that
    /// has a fallback too makes axum panic.
    pub fn router(&self) -> Router {
        Router::new()
            .merge(payment_intents::router())
            .merge(refunds::router())
            .merge(charges::router())
            .merge(endpoints::router())
            .merge(events::routes::router())
            .merge(control::router())
            .fallback(unrecognized)
            .method_not_allowed_fallback(unrecognized)
            .layer(middleware::from_fn(request_id_and_log))
            .with_state(self.clone())
    }
}

/// Gives every request its `req_…` id (in the extensions for the handlers, and in the
/// `Request-Id` response header, as Stripe does), and writes one debug line per request:
/// method, path, Idempotency-Key, status and outcome. The API key is never logged.
async fn request_id_and_log(mut request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let idempotency_key = request.headers().get("idempotency-key").and_then(|key| key.to_str().ok()).map(str::to_owned);
    let request_id = RequestId::new();
    let header = HeaderValue::from_str(&request_id.0).ok();
    request.extensions_mut().insert(request_id);
    let mut response = next.run(request).await;
    if let Some(header) = header {
        response.headers_mut().insert("request-id", header);
    }
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
