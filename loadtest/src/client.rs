//! The payonce API as a client sees it: one `POST /v1/payments` (or `POST /v1/refunds`, or a
//! capture or cancel of an authorized payment), timed, and sorted into an [`Answer`] by what it
//! tells the client to do next.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

/// The HTTP client shared by the workers and the simulator calls: keep-alive connections, no
/// idle limit (every worker keeps its connections), Nagle off.
pub fn http_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|err| format!("cannot build the HTTP client: {err}"))
}

/// The servers under test and the customer the load runs as.
pub struct Api {
    http: reqwest::Client,
    /// Base URLs, used round-robin.
    targets: Vec<String>,
    api_key: String,
    /// `/v1/payments`, or a lab strategy's `/lab/{strategy}/v1/payments`.
    payments_path: String,
    /// The round-robin position.
    turn: AtomicUsize,
}

/// The fields of a payment the checks look at.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Payment {
    /// `pay_…`
    pub id: String,
    pub amount: i64,
    pub status: String,
    /// `pi_…`, the gateway's PaymentIntent (what the ledger records).
    pub payment_intent: Option<String>,
    /// What a capture took (or the whole amount of an automatic payment); 0 before.
    #[serde(default)]
    pub amount_captured: i64,
    /// What an authorization (`requires_capture`) may still capture; 0 otherwise.
    #[serde(default)]
    pub amount_capturable: i64,
}

/// The fields of a refund the checks look at.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Refund {
    /// payonce's `re_…` (32 hex digits).
    pub id: String,
    /// The payment refunded (`pay_…`).
    pub payment: String,
    pub amount: i64,
    /// `succeeded` or `pending` in a 201.
    pub status: String,
    /// The gateway's refund id (what the ledger records).
    pub gateway_refund: Option<String>,
}

/// What an answer tells the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// 201: this request created the payment. `None` if the body was not a payment.
    Created(Option<Payment>),
    /// 201 with `Idempotent-Replayed: true`: the stored answer of an earlier request.
    Replayed(Option<Payment>),
    /// 201 to a refund; `replayed` with `Idempotent-Replayed: true`. `None` if the body was not
    /// a refund.
    Refunded { refund: Option<Refund>, replayed: bool },
    /// 409 `refund-exceeds-payment`: the payment has not that much left. Nothing was refunded,
    /// and the key was not used.
    ExceedsPayment,
    /// 200 to a capture or cancel, with the payment settled (`None` if the body was not a
    /// payment); `replayed` with `Idempotent-Replayed: true`.
    Settled { payment: Option<Payment>, replayed: bool },
    /// 409 `payment-not-capturable`: the payment is not (or no longer) an authorization to settle:
    /// another key captured or canceled it. The key was not used.
    NotCapturable,
    /// 409: the key is being worked on; come back after `Retry-After` seconds.
    InFlight { retry_after: Option<u64> },
    /// 422: the key was first used with another payload.
    KeyReused,
    /// 503: no final answer from the gateway (or the database); retrying with the key is safe.
    Unavailable { retry_after: Option<u64> },
    /// Any other status (400, 402, 500, …).
    Status(u16),
    /// No answer within the client's timeout.
    Timeout,
    /// The connection failed.
    Transport(String),
}

impl Answer {
    /// A short label for tables: `201 created`, `409 in flight`, `500`, `timeout`, …
    pub fn label(&self) -> String {
        match self {
            Self::Created(_) | Self::Refunded { replayed: false, .. } => "201 created".into(),
            Self::Replayed(_) | Self::Refunded { replayed: true, .. } => "201 replayed".into(),
            Self::ExceedsPayment => "409 exceeds payment".into(),
            Self::Settled { replayed: true, .. } => "200 replayed".into(),
            Self::Settled { payment, .. } => match payment.as_ref().map(|p| p.status.as_str()) {
                Some("succeeded") => "200 captured".into(),
                Some("canceled") => "200 canceled".into(),
                _ => "200 settled".into(),
            },
            Self::NotCapturable => "409 not capturable".into(),
            Self::InFlight { .. } => "409 in flight".into(),
            Self::KeyReused => "422 key reused".into(),
            Self::Unavailable { .. } => "503 unavailable".into(),
            Self::Status(status) => status.to_string(),
            Self::Timeout => "timeout".into(),
            Self::Transport(_) => "transport error".into(),
        }
    }

    /// The payment of a 201, fresh or replayed.
    pub fn payment(&self) -> Option<&Payment> {
        match self {
            Self::Created(payment) | Self::Replayed(payment) => payment.as_ref(),
            _ => None,
        }
    }

    /// The refund of a 201 to a refund, fresh or replayed.
    pub fn refund(&self) -> Option<&Refund> {
        match self {
            Self::Refunded { refund, .. } => refund.as_ref(),
            _ => None,
        }
    }

    /// `Retry-After` of a 409 or 503, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::InFlight { retry_after } | Self::Unavailable { retry_after } => *retry_after,
            _ => None,
        }
    }
}

/// One request's answer and how long it took (send to last body byte).
#[derive(Debug, Clone)]
pub struct Reply {
    pub answer: Answer,
    pub latency: Duration,
    /// The body as it came, for byte-for-byte comparisons (empty without an answer).
    pub body: Vec<u8>,
}

impl Api {
    /// The API at `targets`; with a `strategy`, a lab server's `/lab/{strategy}/v1/payments`.
    pub fn new(http: reqwest::Client, targets: Vec<String>, api_key: String, strategy: Option<&str>) -> Self {
        let payments_path = strategy.map_or_else(|| "/v1/payments".to_owned(), |s| format!("/lab/{s}/v1/payments"));
        Self { http, targets, api_key, payments_path, turn: AtomicUsize::new(0) }
    }

    pub fn targets(&self) -> &[String] {
        &self.targets
    }

    /// The next server, round-robin.
    pub fn next_target(&self) -> &str {
        &self.targets[self.turn.fetch_add(1, Ordering::Relaxed) % self.targets.len()]
    }

    /// `POST /v1/payments` (or the lab strategy's) with `key` and `body` to `target`, giving up
    /// after `timeout`.
    pub async fn pay(&self, target: &str, key: &str, body: &Value, timeout: Duration) -> Reply {
        let request = self.http.post(format!("{target}{}", self.payments_path)).header("Idempotency-Key", key);
        self.send(request, body, timeout, Resource::Payment).await
    }

    /// `POST /bench/payments` (the route without the idempotency layer, `--bench-routes`).
    pub async fn pay_unprotected(&self, target: &str, body: &Value, timeout: Duration) -> Reply {
        self.send(self.http.post(format!("{target}/bench/payments")), body, timeout, Resource::Payment).await
    }

    /// `POST /v1/refunds` with `key` and `body` to `target`, giving up after `timeout`.
    pub async fn refund(&self, target: &str, key: &str, body: &Value, timeout: Duration) -> Reply {
        let request = self.http.post(format!("{target}/v1/refunds")).header("Idempotency-Key", key);
        self.send(request, body, timeout, Resource::Refund).await
    }

    /// `POST /v1/payments/{payment}/{action}` (`capture` or `cancel`) with `key` and `body` to
    /// `target`, giving up after `timeout`.
    pub async fn settle(
        &self,
        target: &str,
        payment: &str,
        action: &str,
        key: &str,
        body: &Value,
        timeout: Duration,
    ) -> Reply {
        let request = self.http.post(format!("{target}/v1/payments/{payment}/{action}")).header("Idempotency-Key", key);
        self.send(request, body, timeout, Resource::Settle).await
    }

    /// `GET /v1/payments/{id}` from the first target: the payment as payonce shows it now.
    pub async fn payment(&self, id: &str) -> Result<Value, String> {
        let url = format!("{}/v1/payments/{id}", self.targets[0]);
        let response =
            self.http.get(&url).bearer_auth(&self.api_key).send().await.map_err(|err| format!("GET {url}: {err}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: {}", response.status()));
        }
        response.json().await.map_err(|err| format!("GET {url}: not JSON: {err}"))
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        body: &Value,
        timeout: Duration,
        resource: Resource,
    ) -> Reply {
        let started = Instant::now();
        let request = request.bearer_auth(&self.api_key).json(body).timeout(timeout);
        let (answer, body) = match request.send().await {
            Ok(response) => read(response, resource).await,
            Err(err) => (failure(err), Vec::new()),
        };
        Reply { answer, latency: started.elapsed(), body }
    }
}

/// What a request creates, which says how to read its 201 and 409.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Payment,
    Refund,
    /// A capture or cancel of an authorized payment: 200 with the payment.
    Settle,
}

/// The problem type of a refund that asks for more than remains.
const EXCEEDS_PAYMENT: &str = "https://payonce.dev/problems/refund-exceeds-payment";
/// The problem type of a capture or cancel of a payment that is not an authorization to settle.
const NOT_CAPTURABLE: &str = "https://payonce.dev/problems/payment-not-capturable";

/// Reads a whole response into an [`Answer`], and its body.
async fn read(response: reqwest::Response, resource: Resource) -> (Answer, Vec<u8>) {
    let status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(err) => return (failure(err), Vec::new()),
    };
    let answer = match (status, resource) {
        (201, Resource::Payment) => {
            let payment = serde_json::from_slice(&body).ok();
            if replayed { Answer::Replayed(payment) } else { Answer::Created(payment) }
        }
        (201, Resource::Refund) => Answer::Refunded { refund: serde_json::from_slice(&body).ok(), replayed },
        (409, Resource::Refund) if problem_type(&body).as_deref() == Some(EXCEEDS_PAYMENT) => Answer::ExceedsPayment,
        (200, Resource::Settle) => Answer::Settled { payment: serde_json::from_slice(&body).ok(), replayed },
        (409, Resource::Settle) if problem_type(&body).as_deref() == Some(NOT_CAPTURABLE) => Answer::NotCapturable,
        (409, _) => Answer::InFlight { retry_after },
        (422, _) => Answer::KeyReused,
        (503, _) => Answer::Unavailable { retry_after },
        (other, _) => Answer::Status(other),
    };
    (answer, body.to_vec())
}

/// The `type` of a problem document.
fn problem_type(body: &[u8]) -> Option<String> {
    let problem: Value = serde_json::from_slice(body).ok()?;
    problem["type"].as_str().map(str::to_owned)
}

fn failure(err: reqwest::Error) -> Answer {
    if err.is_timeout() { Answer::Timeout } else { Answer::Transport(err.to_string()) }
}
