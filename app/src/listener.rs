//! The HTTP/1.1 accept loop. `axum::serve` has no timeouts and no connection cap, so a few
//! hundred idle or slow connections could hold every file descriptor; this loop bounds them all:
//!
//! - **A connection cap**: a permit per open connection. At the cap the loop stops accepting and
//!   new connections wait in the kernel's listen queue until one closes. The cap is clamped at
//!   start below the process's file-descriptor limit (`RLIMIT_NOFILE`), keeping room for the
//!   database pool and the gateway's connections, so that `accept` never fails with `EMFILE`.
//! - **A header-read timeout**: a request head must arrive completely within it, counted from its
//!   first byte (for a connection's first request, from the connection's start). Slow-header
//!   clients ("slowloris") are closed without an answer, as hyper itself would.
//! - **An idle timeout**: a kept-alive connection with no request in flight is closed after this
//!   long without a new request.
//! - **A body timeout**: each request's body is wrapped in tower-http's `DeadlineBody`, counted
//!   from the end of the head; reading past it fails, and the extractors answer 408
//!   (`body::BodyFault::of`).
//! - **Graceful shutdown**: on stop, no more accepts; every connection is told to finish (hyper
//!   closes idle ones at once and in-flight ones after their response); `serve` returns when the
//!   last connection has closed.
//!
//! hyper has a header-read timeout of its own, but it also runs while a kept-alive connection
//! waits for its next request, so it cannot tell a slow head from an idle connection; the
//! [`watchdog`] here keeps the two apart, from what the connection reads and writes.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_http::timeout::DeadlineBody;

/// The largest request head (request line and headers) hyper reads; above it hyper answers 431.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// File descriptors a connection may cost at worst: its socket and, while a payment waits for the
/// gateway, the gateway's connection (a third when the simulator runs in this process: its end).
pub struct FdBudget {
    /// Descriptors kept for everything else: the database pool, the listeners, logs, the runtime.
    pub reserved: u64,
    pub per_connection: u64,
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves, then lets every open
/// connection finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &HttpConfig,
    fds: FdBudget,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cap = connection_cap(limits.max_connections, &fds, open_file_limit());
    let permits = Arc::new(Semaphore::new(cap));
    let (stop, stopping) = watch::channel(false);
    let mut builder = http1::Builder::new();
    builder.max_header_size(MAX_HEADER_BYTES).keep_alive(true).header_read_timeout(None);
    let mut shutdown = pin!(shutdown);
    let mut warned_at_cap: Option<Instant> = None;
    loop {
        if permits.available_permits() == 0 && warned_at_cap.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
            tracing::warn!(cap, "connection cap reached: new connections wait until one closes");
            warned_at_cap = Some(Instant::now());
        }
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // The peer gave up before we accepted: nothing to do. Anything else (the
                    // descriptors ran out despite the cap) is worth a line and a pause.
                    if !matches!(err.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) {
                        tracing::error!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let connection = Connection {
            app: app.clone(),
            builder: builder.clone(),
            limits: limits.clone(),
            stopping: stopping.clone(),
            _permit: permit,
        };
        tokio::spawn(connection.serve(stream, peer));
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a permit until it has closed.
    let _ = permits.acquire_many(u32::try_from(cap).unwrap_or(u32::MAX)).await;
    Ok(())
}

/// The soft `RLIMIT_NOFILE`, if there is one.
fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    (ok && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// `configured`, or fewer if the file-descriptor limit cannot hold that many connections.
fn connection_cap(configured: usize, fds: &FdBudget, limit: Option<u64>) -> usize {
    let Some(limit) = limit else {
        tracing::info!(cap = configured, "connection cap (no file-descriptor limit)");
        return configured;
    };
    let room = usize::try_from(limit.saturating_sub(fds.reserved) / fds.per_connection.max(1)).unwrap_or(usize::MAX);
    if configured <= room {
        tracing::info!(cap = configured, fd_limit = limit, "connection cap");
        return configured;
    }
    let cap = room.max(1);
    tracing::warn!(
        cap,
        configured,
        fd_limit = limit,
        reserved = fds.reserved,
        per_connection = fds.per_connection,
        "connection cap lowered to fit the file-descriptor limit (RLIMIT_NOFILE); raise it (ulimit -n) to allow more",
    );
    cap
}

/// One accepted connection and what it needs.
struct Connection {
    app: Router,
    builder: http1::Builder,
    limits: HttpConfig,
    stopping: watch::Receiver<bool>,
    /// Returned to the cap when the connection ends.
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    async fn serve(mut self, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Watched { inner: stream, activity: activity.clone() });
        let (app, body_timeout, requests) = (self.app, self.limits.body_timeout, activity.clone());
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let in_flight = requests.begin();
            let mut request = request.map(|body| DeadlineBody::new(body_timeout, body));
            // The admin login's rate limit keys on the peer's address.
            request.extensions_mut().insert(ConnectInfo(peer));
            let response = app.clone().oneshot(request);
            async move {
                let response = response.await;
                drop(in_flight);
                response
            }
        });
        let mut connection = pin!(self.builder.serve_connection(io, service));
        let mut closing = false;
        loop {
            tokio::select! {
                served = connection.as_mut() => {
                    if let Err(err) = served {
                        tracing::debug!(%peer, error = %err, "connection ended with an error");
                    }
                    return;
                }
                _ = self.stopping.wait_for(|stop| *stop), if !closing => {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                expired = watchdog(&activity, &self.limits) => match expired {
                    Expired::Idle if !closing => {
                        // Gracefully: a request that is arriving right now is still answered.
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    expired => {
                        tracing::debug!(%peer, ?expired, "connection closed by a timeout");
                        return;
                    }
                },
            }
        }
    }
}

/// What a connection has been doing, as its reads, writes and requests tell.
struct Activity {
    start: Instant,
    /// Requests handed to the app whose response is not ready yet.
    in_flight: AtomicUsize,
    /// When (ms after `start`) the connection last had nothing to do: accepted, or done writing
    /// with no request in flight.
    idle_since: AtomicU64,
    /// When (ms after `start`) the first byte of the next head was read, or [`NO_HEAD`].
    head_since: AtomicU64,
}

const NO_HEAD: u64 = u64::MAX;

impl Activity {
    /// A new connection owes its first request head from the start.
    fn new() -> Self {
        Self {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Bytes arrived: with no request in flight, they begin the next head.
    fn read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let _ = self.head_since.compare_exchange(NO_HEAD, self.now(), Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Bytes left: with no request in flight, the connection is idle from now.
    fn wrote(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            self.idle_since.store(self.now(), Ordering::Release);
        }
    }

    /// A complete head reached the app: a request is in flight until the guard is dropped.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NO_HEAD, Ordering::Release);
        InFlight(self.clone())
    }
}

struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity.idle_since.store(activity.now(), Ordering::Release);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Which timeout ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    /// No request for the idle timeout.
    Idle,
    /// A head began but was not complete within the header-read timeout.
    Header,
}

/// Resolves when the connection has been idle, or reading one head, for too long. While a
/// request is in flight nothing expires: the body timeout and the handlers' own deadlines apply.
async fn watchdog(activity: &Activity, limits: &HttpConfig) -> Expired {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2);
    let (header, idle) = (millis(limits.header_read_timeout), millis(limits.idle_timeout));
    loop {
        let now = activity.now();
        let (deadline, expired) = if activity.in_flight.load(Ordering::Acquire) > 0 {
            (now.saturating_add(header.min(idle)), None)
        } else {
            match activity.head_since.load(Ordering::Acquire) {
                NO_HEAD => (activity.idle_since.load(Ordering::Acquire).saturating_add(idle), Some(Expired::Idle)),
                since => (since.saturating_add(header), Some(Expired::Header)),
            }
        };
        if let Some(expired) = expired
            && now >= deadline
        {
            return expired;
        }
        tokio::time::sleep_until(activity.start + Duration::from_millis(deadline)).await;
    }
}

/// A stream that tells its [`Activity`] about every read and write.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HttpConfig {
        HttpConfig {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            ..HttpConfig::default()
        }
    }

    /// How long after `start` the watchdog fires, on paused time.
    async fn fires_after(activity: &Activity) -> (Expired, Duration) {
        let expired = watchdog(activity, &limits()).await;
        (expired, activity.start.elapsed())
    }

    /// A new connection that sends nothing owes its head from the start: the header timeout.
    #[tokio::test(start_paused = true)]
    async fn a_silent_new_connection_gets_the_header_timeout() {
        let activity = Activity::new();
        assert_eq!(fires_after(&activity).await, (Expired::Header, Duration::from_secs(10)));
    }

    /// After a response, a kept-alive connection may wait the idle timeout; once a new head
    /// begins, it has the header timeout from its first byte.
    #[tokio::test(start_paused = true)]
    async fn idle_then_a_slow_head() {
        let activity = Arc::new(Activity::new());
        tokio::time::advance(Duration::from_secs(1)).await;
        let request = activity.begin();
        tokio::time::advance(Duration::from_secs(30)).await;
        drop(request);
        activity.wrote();
        // In flight for 30 s did not count; idle from 31 s.
        let watch = {
            let activity = activity.clone();
            tokio::spawn(async move { fires_after(&activity).await })
        };
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(50)).await;
        activity.read();
        assert_eq!(watch.await.unwrap(), (Expired::Header, Duration::from_secs(91)));
    }

    /// An idle connection is closed after the idle timeout, counted from its last write.
    #[tokio::test(start_paused = true)]
    async fn idle_after_the_last_write() {
        let activity = Arc::new(Activity::new());
        drop(activity.begin());
        tokio::time::advance(Duration::from_secs(2)).await;
        activity.wrote();
        assert_eq!(fires_after(&activity).await, (Expired::Idle, Duration::from_secs(62)));
    }

    /// A request in flight (a payment waiting for the gateway) is never cut by either timeout.
    #[tokio::test(start_paused = true)]
    async fn nothing_expires_while_a_request_is_in_flight() {
        let activity = Arc::new(Activity::new());
        let request = activity.begin();
        let watch = {
            let activity = activity.clone();
            tokio::spawn(async move { fires_after(&activity).await })
        };
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(600)).await;
        assert!(!watch.is_finished());
        drop(request);
        assert_eq!(watch.await.unwrap(), (Expired::Idle, Duration::from_secs(660)));
    }

    /// The cap fits under the file-descriptor limit, or stays as configured when it fits.
    #[test]
    fn the_cap_fits_the_fd_limit() {
        let fds = FdBudget { reserved: 100, per_connection: 2 };
        assert_eq!(connection_cap(4096, &fds, Some(1024)), 462);
        assert_eq!(connection_cap(100, &fds, Some(1024)), 100);
        assert_eq!(connection_cap(4096, &fds, None), 4096);
        assert_eq!(connection_cap(4096, &fds, Some(50)), 1);
    }
}
