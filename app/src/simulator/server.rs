//! The simulator's router (every Stripe route and the `/_sim` controls), the middleware every
//! request passes, and serving it on a port.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::error::ApiError;
use super::events::api_version;
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
            .layer(middleware::from_fn(stripe_headers_and_log))
            .with_state(self.clone())
    }
}

/// What every answer carries, as Stripe's: the request's `req_…` id (in the extensions for the
/// handlers, and in the `Request-Id` header), and on the API's routes the `Stripe-Version` it was
/// rendered in (the request's, else the account default: the version async-stripe pins), the
/// `Idempotency-Key` of a POST echoed, and an error's `request_log_url`. Writes one debug line per
/// request: method, path, Idempotency-Key, status and outcome. The API key is never logged.
async fn stripe_headers_and_log(mut request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let idempotency_key = request.headers().get("idempotency-key").cloned();
    let version = request.headers().get("stripe-version").cloned();
    let request_id = RequestId::new();
    let header = HeaderValue::from_str(&request_id.0).ok();
    request.extensions_mut().insert(request_id.clone());
    let mut response = next.run(request).await;
    if let Some(error) = response.extensions_mut().remove::<ApiError>() {
        // Rendered without knowing the request: again, naming it.
        *response.body_mut() = Body::from(error.body(Some(&request_id.0)));
        response.headers_mut().remove(CONTENT_LENGTH);
    }
    let headers = response.headers_mut();
    if let Some(header) = header {
        headers.insert("request-id", header);
    }
    if path.starts_with("/v1/") {
        let version = version.unwrap_or_else(|| HeaderValue::from_static(api_version()));
        headers.insert("stripe-version", version);
        if method == Method::POST
            && let Some(key) = idempotency_key.clone()
        {
            headers.insert("idempotency-key", key);
        }
    }
    tracing::debug!(
        %method,
        path,
        idempotency_key = idempotency_key.as_ref().and_then(|key| key.to_str().ok()),
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
