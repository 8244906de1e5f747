//! Sends the rows: `--concurrency` workers, each taking the next row of the file and driving it
//! to a final answer, retrying the *same* request (same key, same body) as the answers ask.
//!
//! The retry policy, per row:
//!
//! - `409` (in flight, backoff, reconciling), `429`, `503`: wait the server's `Retry-After` plus a
//!   jitter of up to a fifth of it (at least 100 ms, at most 5 s), so that the workers of two runs,
//!   or the rows of one, do not come back in step.
//! - `408`, `500`, other `5xx`, a connection refused or reset, a timeout: an exponential backoff
//!   (250 ms doubling to 10 s, "equal jitter": between half of it and all of it).
//! - A row that has no final answer `--give-up-after-secs` seconds after its first attempt is
//!   `unresolved`: the run moves on, and a re-run resumes it. If no row at all reached a final
//!   answer in that time, the API is down: the run stops rather than wait that long for every row.
//!
//! Retrying is always safe: the key was derived before the first attempt and never changes, so
//! the server charges at most once whatever happened to the earlier attempts.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use tokio::sync::watch;

use super::answer::{self, Answer, RowResult};
use super::file::Row;
use super::key::BatchId;
use super::progress::Progress;

/// How the rows are sent.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The API's base URL, e.g. `http://127.0.0.1:3000`.
    pub api_url: String,
    /// The customer's API key (`po_…`).
    pub api_key: String,
    /// Rows in flight at once.
    pub concurrency: usize,
    /// A row without a final answer this long after its first attempt is given up (unresolved).
    pub give_up_after: Duration,
    /// The longest one request may take (payonce answers within its gateway timeout, 30 s).
    pub request_timeout: Duration,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("the API at {url} cannot be used: {why}")]
    Unusable { url: String, why: String },
}

/// A way to stop the run early: workers take no new row once it is set, and rows waiting to be
/// retried give up at once.
#[derive(Clone)]
pub struct Stop {
    flag: watch::Sender<bool>,
    reason: Arc<Mutex<Option<String>>>,
}

impl Default for Stop {
    fn default() -> Self {
        Self { flag: watch::Sender::new(false), reason: Arc::default() }
    }
}

impl Stop {
    /// Stops the run; the first reason given is the one reported.
    pub fn request(&self, reason: impl Into<String>) {
        let mut current = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if current.is_none() {
            *current = Some(reason.into());
        }
        drop(current);
        self.flag.send_replace(true);
    }

    /// Why the run was stopped, if it was.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn is_set(&self) -> bool {
        *self.flag.borrow()
    }

    /// Sleeps for `wait`; false if the run was stopped meanwhile.
    pub(super) async fn sleep(&self, wait: Duration) -> bool {
        let mut flag = self.flag.subscribe();
        tokio::select! {
            () = tokio::time::sleep(wait) => true,
            _ = flag.wait_for(|stopped| *stopped) => false,
        }
    }
}

/// The client of `POST /v1/payments`.
pub struct Runner {
    client: reqwest::Client,
    endpoint: String,
    auth: HeaderValue,
    settings: Settings,
    started: Instant,
    /// One more than the milliseconds from `started` to the latest final answer of any row
    /// (0: none yet).
    last_final_ms: AtomicU64,
}

impl Runner {
    pub fn new(settings: Settings) -> Result<Self, StartError> {
        let base = settings.api_url.trim_end_matches('/');
        let url = reqwest::Url::parse(base).map_err(|err| StartError::Config(format!("--api-url {base:?}: {err}")))?;
        if url.scheme() != "http" {
            // payonce serves plain HTTP (TLS, if any, ends in front of it), and this client
            // carries no TLS of its own: it runs where the servers are reachable directly.
            return Err(StartError::Config(format!(
                "--api-url {base:?}: only http:// URLs are supported: run the batch where payonce's own \
                 (plain HTTP) address is reachable"
            )));
        }
        let mut auth = HeaderValue::try_from(format!("Bearer {}", settings.api_key))
            .map_err(|_| StartError::Config("the API key holds characters a header cannot carry".into()))?;
        auth.set_sensitive(true);
        let client = reqwest::Client::builder()
            .timeout(settings.request_timeout)
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(settings.concurrency)
            .tcp_nodelay(true)
            .user_agent(concat!("payonce-batch/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| StartError::Config(format!("cannot build the HTTP client: {err}")))?;
        Ok(Self {
            client,
            endpoint: format!("{base}/v1/payments"),
            auth,
            settings,
            started: Instant::now(),
            last_final_ms: AtomicU64::new(0),
        })
    }

    /// One cheap authenticated read (`GET /v1/payments?limit=1`) before the first charge: a wrong
    /// URL or API key is reported at once, not as a failure of every row.
    pub async fn preflight(&self) -> Result<(), StartError> {
        let unusable = |why: String| StartError::Unusable { url: self.settings.api_url.clone(), why };
        let response = self.get(format!("{}?limit=1", self.endpoint)).await.map_err(unusable)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap_or_default();
        if status.is_success() && body.starts_with(b"{") {
            return Ok(());
        }
        Err(unusable(match answer::classify(status, &headers, &body) {
            Answer::Abort(why) => why,
            _ => format!("GET /v1/payments answered {status}"),
        }))
    }

    /// `GET /v1/payments/{id}`: the payment as it is now, or why it could not be read.
    pub async fn look_up(&self, payment_id: &str) -> Result<serde_json::Value, String> {
        // The id comes from the server's answer; it still must not steer the URL anywhere else.
        if payment_id.is_empty() || !payment_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("{payment_id:?} is not a payment id"));
        }
        let response = self.get(format!("{}/{payment_id}", self.endpoint)).await?;
        let status = response.status();
        let body = response.bytes().await.map_err(|err| format!("GET {payment_id}: {err}"))?;
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(payment) if status == reqwest::StatusCode::OK && payment["status"].is_string() => Ok(payment),
            Ok(problem) => {
                Err(format!("GET {payment_id} answered {status} {}", problem["type"].as_str().unwrap_or("")))
            }
            Err(_) => Err(format!("GET {payment_id} answered {status}")),
        }
    }

    /// An authenticated `GET`; a transport error in the words of [`answer::transport`].
    async fn get(&self, url: String) -> Result<reqwest::Response, String> {
        self.client.get(url).header(AUTHORIZATION, self.auth.clone()).send().await.map_err(
            |err| match answer::transport(&err) {
                Answer::Retry { why, .. } => why,
                _ => err.to_string(),
            },
        )
    }

    /// Sends every row; returns one result per row, in the file's order.
    pub async fn run(
        self: Arc<Self>,
        batch: &BatchId,
        rows: Arc<[Row]>,
        progress: Arc<Progress>,
        stop: Stop,
    ) -> Vec<RowResult> {
        let next = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..self.settings.concurrency.min(rows.len()).max(1) {
            let (runner, rows, progress, stop, next, batch) =
                (self.clone(), rows.clone(), progress.clone(), stop.clone(), next.clone(), batch.clone());
            workers.push(tokio::spawn(async move {
                let mut done = Vec::new();
                while !stop.is_set() {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(row) = rows.get(i) else { break };
                    let result = runner.charge(&batch, row, &stop).await;
                    progress.record(result.outcome);
                    done.push((i, result));
                }
                done
            }));
        }
        let mut results: Vec<Option<RowResult>> = vec![None; rows.len()];
        for worker in workers {
            // A worker only ends by returning; a panic in one is a bug worth seeing.
            for (i, result) in worker.await.expect("a batch worker panicked") {
                results[i] = Some(result);
            }
        }
        let why = stop.reason().unwrap_or_else(|| "the run stopped".to_owned());
        results.into_iter().map(|result| result.unwrap_or_else(|| RowResult::not_sent(&why))).collect()
    }

    /// Drives one row to its final answer, or gives up on it.
    async fn charge(&self, batch: &BatchId, row: &Row, stop: &Stop) -> RowResult {
        let key = batch.row_key(&row.row_id);
        let key = HeaderValue::try_from(key.to_sf_string()).expect("a batch key is printable ASCII");
        let body = bytes::Bytes::from(serde_json::to_vec(&row.payment).expect("a payment always serialises"));
        let first_attempt = Instant::now();
        let mut retries = 0u32;
        loop {
            let answer = match self
                .client
                .post(&self.endpoint)
                .header(AUTHORIZATION, self.auth.clone())
                .header("idempotency-key", key.clone())
                .header(CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await
            {
                Ok(response) => {
                    let (status, headers) = (response.status(), response.headers().clone());
                    match response.bytes().await {
                        Ok(body) => answer::classify(status, &headers, &body),
                        Err(err) => answer::transport(&err),
                    }
                }
                Err(err) => answer::transport(&err),
            };
            match answer {
                Answer::Final(result) => {
                    let ms = self.started.elapsed().as_millis() as u64 + 1;
                    self.last_final_ms.fetch_max(ms, Ordering::Relaxed);
                    return result;
                }
                Answer::Abort(why) => {
                    stop.request(why.clone());
                    return RowResult::not_sent(&why);
                }
                Answer::Retry { status, after, why } => {
                    retries += 1;
                    let wait = delay(retries, after);
                    if first_attempt.elapsed() + wait > self.settings.give_up_after {
                        self.gave_up(first_attempt, stop);
                        let waited = first_attempt.elapsed().as_secs();
                        return RowResult::unresolved(
                            status,
                            format!("{why}; gave up after {retries} attempt(s) in {waited} s: run the batch again"),
                        );
                    }
                    if !stop.sleep(wait).await {
                        return RowResult::unresolved(
                            status,
                            format!("{why}; the run was stopped: run the batch again"),
                        );
                    }
                }
            }
        }
    }

    /// A row was given up: if no row at all got a final answer since it was first tried, nothing
    /// is getting through, and the other rows would only wait as long each.
    fn gave_up(&self, row_started: Instant, stop: &Stop) {
        let row_started_ms = row_started.duration_since(self.started).as_millis() as u64;
        if self.last_final_ms.load(Ordering::Relaxed) <= row_started_ms {
            stop.request(format!(
                "no row got a final answer in {} s: the API is unavailable; run the batch again later",
                self.settings.give_up_after.as_secs()
            ));
        }
    }
}

/// How long to wait before retry number `retries` (1, 2, …).
fn delay(retries: u32, retry_after: Option<Duration>) -> Duration {
    match retry_after {
        Some(after) => {
            let spread = (after / 5).clamp(Duration::from_millis(100), Duration::from_secs(5));
            after + spread.mul_f64(fastrand::f64())
        }
        None => {
            let backoff =
                (Duration::from_millis(250) * 2u32.pow(retries.saturating_sub(1).min(6))).min(Duration::from_secs(10));
            backoff / 2 + (backoff / 2).mul_f64(fastrand::f64())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retry-After is a floor; the jitter on top of it is bounded.
    #[test]
    fn delays_honour_retry_after_with_bounded_jitter() {
        for _ in 0..200 {
            let wait = delay(1, Some(Duration::from_secs(3)));
            assert!(wait >= Duration::from_secs(3) && wait <= Duration::from_millis(3600), "{wait:?}");
            let wait = delay(1, Some(Duration::from_secs(60)));
            assert!(wait >= Duration::from_secs(60) && wait <= Duration::from_secs(65), "{wait:?}");
            let wait = delay(1, Some(Duration::ZERO));
            assert!(wait <= Duration::from_millis(100), "{wait:?}");
        }
    }

    /// The backoff doubles from 250 ms up to 10 s, never below half of its step.
    #[test]
    fn backoff_doubles_to_a_cap() {
        for _ in 0..200 {
            let first = delay(1, None);
            assert!(first >= Duration::from_millis(125) && first <= Duration::from_millis(250), "{first:?}");
            let late = delay(40, None);
            assert!(late >= Duration::from_secs(5) && late <= Duration::from_secs(10), "{late:?}");
        }
    }

    /// A row given up while others get final answers is that row's problem; a row given up with
    /// no final answer anywhere since it started means the API is down: the run stops.
    #[test]
    fn stops_the_run_only_when_nothing_gets_through() {
        let settings = Settings {
            api_url: "http://127.0.0.1:9".into(),
            api_key: "po_x".into(),
            concurrency: 1,
            give_up_after: Duration::from_secs(300),
            request_timeout: Duration::from_secs(1),
        };
        let runner = Runner::new(settings.clone()).unwrap();
        let stop = Stop::default();
        runner.last_final_ms.store(u64::MAX / 2, Ordering::Relaxed);
        runner.gave_up(Instant::now(), &stop);
        assert_eq!(stop.reason(), None, "other rows got through after this one started");
        let runner = Runner::new(settings.clone()).unwrap();
        runner.gave_up(runner.started, &stop);
        assert!(stop.reason().is_some_and(|why| why.contains("the API is unavailable")));
        let https = Runner::new(Settings { api_url: "https://example.com".into(), ..settings });
        assert!(matches!(https, Err(StartError::Config(_))));
    }

    /// Stopping wakes a sleeping retry at once.
    #[tokio::test(start_paused = true)]
    async fn stopping_wakes_a_waiting_retry() {
        let stop = Stop::default();
        let sleeper = tokio::spawn({
            let stop = stop.clone();
            async move { stop.sleep(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        stop.request("interrupted");
        stop.request("a later reason");
        assert!(!sleeper.await.unwrap(), "the sleep was cut short");
        assert_eq!(stop.reason().as_deref(), Some("interrupted"));
        assert!(!stop.sleep(Duration::from_secs(1)).await, "a stopped run does not sleep");
    }
}
