//! End-to-end tests: a started simulator on port 0, driven by the real async-stripe client (what
//! payonce uses) and by raw HTTP (to see headers and send what async-stripe would not).

mod cancel;
mod capture;
mod control;
mod faults;
mod idempotency;
mod payment_methods;
mod payments;
mod refunds;
mod search;
mod webhooks;

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use tokio::sync::Semaphore;

use reqwest::{Method, RequestBuilder};
use serde_json::Value;
use stripe::{ApiErrors, IdempotencyKey, RequestStrategy, StripeError, StripeRequest};
use stripe_core::PaymentIntent;
use stripe_core::payment_intent::{
    CreatePaymentIntent, CreatePaymentIntentAutomaticPaymentMethods,
    CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects,
};
use stripe_types::Currency;

use super::{Charge, RunningSimulator, Simulator, start};
use crate::gateway::Transport;

const API_KEY: &str = "sk_test_payonce";

/// A running simulator plus the clients that talk to it.
struct TestSim {
    running: RunningSimulator,
    http: reqwest::Client,
}

impl TestSim {
    async fn start() -> Self {
        let running = start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await.expect("bind port 0");
        Self { running, http: reqwest::Client::new() }
    }

    fn sim(&self) -> &Simulator {
        self.running.simulator()
    }

    /// The client payonce uses (async-stripe's requests over payonce's transport), with another
    /// API key. Its deadline is short, so a call the simulator wrongly holds fails the test.
    fn stripe_with_key(&self, api_key: &str) -> Transport {
        Transport::new(api_key, self.running.base_url(), Duration::from_secs(5)).expect("valid client")
    }

    fn stripe(&self) -> Transport {
        self.stripe_with_key(API_KEY)
    }

    /// The order-1 [`payment`] with `payment_method`, sent through async-stripe with the
    /// default API key and `key` as its Idempotency-Key.
    async fn pay(&self, payment_method: &str, key: &str) -> Result<PaymentIntent, StripeError> {
        send(&self.stripe(), &payment(payment_method), key).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.running.base_url(), path.trim_start_matches('/'))
    }

    /// A raw request to `path` (relative to the base URL), not yet sent.
    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, self.url(path))
    }

    /// A raw `POST /v1/payment_intents` with the default API key.
    async fn post_form(&self, idempotency_key: Option<&str>, form: &[(&str, &str)]) -> Response {
        let mut request = self.request(Method::POST, "v1/payment_intents").bearer_auth(API_KEY).form(form);
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        Response::send(request).await
    }

    /// Sets faults through the control API, as a load test would.
    async fn set_faults(&self, faults: Value) {
        let request = self.request(Method::PUT, "_sim/faults").json(&faults);
        let response = Response::send(request).await;
        assert_eq!(response.status, 200, "faults accepted: {}", response.body);
    }

    /// Sets the knobs through the control API.
    async fn set_settings(&self, settings: Value) {
        let response = Response::send(self.request(Method::PUT, "_sim/settings").json(&settings)).await;
        assert_eq!(response.status, 200, "settings accepted: {}", response.body);
    }

    /// Short processing and retry waits, so that tests of later transitions end quickly (the
    /// tests wait for states, never for durations).
    async fn fast(&self) {
        self.set_settings(serde_json::json!({"processing_ms": 50, "webhook_retry_base_ms": 20})).await;
    }

    /// Waits (bounded) until the ledger holds `count` charges: work that outlives its client
    /// finishes in the background.
    async fn wait_for_charges(&self, count: usize) -> Vec<Charge> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let charges = self.sim().charges();
            if charges.len() >= count || Instant::now() > deadline {
                return charges;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Registers `hook` for every event through async-stripe; returns the endpoint's secret.
    async fn register(&self, hook: &Hook) -> String {
        let all = vec![stripe_misc::webhook_endpoint::CreateWebhookEndpointEnabledEvents::All];
        let create = stripe_misc::webhook_endpoint::CreateWebhookEndpoint::new(all, hook.url.clone());
        let endpoint = create.send(&self.stripe()).await.expect("endpoint created");
        endpoint.secret.expect("the secret is in the create response")
    }
}

/// The types and `request` of the account's events about `id`, oldest first.
async fn events_about(sim: &TestSim, id: &str) -> Vec<(String, Value)> {
    let list = sim.request(Method::GET, "v1/events?limit=100").bearer_auth(API_KEY);
    let events = Response::send(list).await.body;
    let mut about: Vec<_> = events["data"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|event| event["data"]["object"]["id"] == id || event["data"]["object"]["payment_intent"] == id)
        .map(|event| (event["type"].as_str().unwrap_or_default().to_owned(), event["request"].clone()))
        .collect();
    about.reverse();
    about
}

/// Polls `probe` until it yields a value; panics naming `what` after ten seconds. (A bound on a
/// wait, not a timing assertion: the tests never depend on how long something took.)
async fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One delivery a [`Hook`] received.
#[derive(Clone, Debug)]
struct Received {
    signature: String,
    body: String,
}

/// A webhook endpoint on port 0: records every delivery, answers the scripted statuses in turn
/// (then 200), and while closed holds every request (after recording it) until opened.
struct Hook {
    url: String,
    inner: Arc<HookInner>,
    _server: tokio::task::JoinHandle<()>,
}

struct HookInner {
    received: Mutex<Vec<Received>>,
    statuses: Mutex<VecDeque<u16>>,
    gate: Option<Semaphore>,
}

impl Hook {
    async fn start(statuses: &[u16]) -> Self {
        Self::serve(statuses, None).await
    }

    /// A hook that holds every request until [`Hook::open`].
    async fn closed() -> Self {
        Self::serve(&[], Some(Semaphore::new(0))).await
    }

    async fn serve(statuses: &[u16], gate: Option<Semaphore>) -> Self {
        let inner = Arc::new(HookInner {
            received: Mutex::default(),
            statuses: Mutex::new(statuses.iter().copied().collect()),
            gate,
        });
        let router = axum::Router::new().route("/hook", post(receive)).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("hook serves");
        });
        Self { url, inner, _server: server }
    }

    fn received(&self) -> Vec<Received> {
        self.inner.received.lock().expect("hook lock").clone()
    }

    /// Lets every held and future request through.
    fn open(&self) {
        if let Some(gate) = &self.inner.gate {
            gate.add_permits(1_000_000);
        }
    }

    /// Waits until `count` deliveries have arrived.
    async fn wait_for(&self, count: usize) -> Vec<Received> {
        wait_for(&format!("{count} deliveries"), || Some(self.received()).filter(|received| received.len() >= count))
            .await
    }

    /// The `(type, data.object.id)` of every delivery received, in arrival order.
    fn kinds(&self) -> Vec<String> {
        self.received()
            .iter()
            .map(|received| {
                let event: Value = serde_json::from_str(&received.body).expect("JSON");
                event["type"].as_str().unwrap_or_default().to_owned()
            })
            .collect()
    }
}

async fn receive(State(inner): State<Arc<HookInner>>, headers: HeaderMap, body: String) -> StatusCode {
    let signature = headers.get("stripe-signature").and_then(|value| value.to_str().ok()).unwrap_or_default();
    inner.received.lock().expect("hook lock").push(Received { signature: signature.to_owned(), body });
    if let Some(gate) = &inner.gate {
        let _permit = gate.acquire().await.expect("gate open");
    }
    let status = inner.statuses.lock().expect("hook lock").pop_front().unwrap_or(200);
    StatusCode::from_u16(status).unwrap_or(StatusCode::OK)
}

/// A raw HTTP response, read completely.
struct Response {
    status: u16,
    replayed: bool,
    should_retry: Option<String>,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Response {
    /// Sends `request` and reads the whole response (the body as JSON, `null` if it is not).
    async fn send(request: RequestBuilder) -> Self {
        let response = request.send().await.expect("the simulator answers");
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        let should_retry = header("stripe-should-retry");
        let headers = response.headers().clone();
        let body = response.json().await.unwrap_or(Value::Null);
        Self { status, replayed, should_retry, headers, body }
    }

    /// A response header, as text (`""` when absent).
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or_default()
    }
}

/// The order-1 payment: $12.50 on the test Visa, confirmed, with redirects off (what payonce
/// sends, so that no `return_url` is needed).
fn payment(payment_method: &str) -> CreatePaymentIntent {
    CreatePaymentIntent::new(1250, Currency::USD)
        .confirm(true)
        .payment_method(payment_method)
        .automatic_payment_methods(no_redirects())
        .metadata(HashMap::from([("order_id".to_owned(), "order-1".to_owned())]))
}

fn no_redirects() -> CreatePaymentIntentAutomaticPaymentMethods {
    let mut automatic = CreatePaymentIntentAutomaticPaymentMethods::new(true);
    automatic.allow_redirects = Some(CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects::Never);
    automatic
}

/// The same payment as raw form fields (async-stripe's encoding, in another order).
const PAYMENT_FORM: &[(&str, &str)] = &[
    ("metadata[order_id]", "order-1"),
    ("payment_method", "pm_card_visa"),
    ("automatic_payment_methods[allow_redirects]", "never"),
    ("confirm", "true"),
    ("currency", "usd"),
    ("automatic_payment_methods[enabled]", "true"),
    ("amount", "1250"),
];

fn idempotent(key: &str) -> RequestStrategy {
    RequestStrategy::Idempotent(IdempotencyKey::new(key).expect("a valid idempotency key"))
}

/// Sends a create call the way payonce does: one attempt, with our own key.
async fn send(client: &Transport, request: &CreatePaymentIntent, key: &str) -> Result<PaymentIntent, StripeError> {
    request.customize().request_strategy(idempotent(key)).send(client).await
}

/// The Stripe error of a failed call, after checking its HTTP status; panics on any other
/// outcome.
fn stripe_error<T: std::fmt::Debug>(result: Result<T, StripeError>, status: u16) -> ApiErrors {
    match result {
        Err(StripeError::Stripe(error, actual)) => {
            assert_eq!(actual, status, "HTTP status of {error:?}");
            *error
        }
        other => panic!("expected a Stripe error, got {other:?}"),
    }
}
