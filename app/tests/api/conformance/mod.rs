//! payonce and its simulator against Stripe's own API description.
//!
//! A recording proxy sits between payonce's gateway client and the simulator, and another
//! between the simulator and payonce's webhook route. The test drives the payment, refund,
//! webhook and reconciliation paths through payonce (and the rest of the simulator's surface
//! with plain requests), then checks every recorded exchange against the copy of Stripe's
//! OpenAPI description in `app/tests/stripe-openapi/` ([`spec`]):
//!
//! - every request payonce's gateway client sent: no unknown parameter, none missing, the right
//!   types and values;
//! - every answer the simulator gave, and every event it delivered: each property Stripe sends
//!   is there (nullable ones as `null`), none that Stripe's objects do not have, with the right
//!   types and values;
//! - the headers and error members Stripe's libraries read: `Request-Id`, `Stripe-Version`,
//!   `Idempotency-Key` echoed, `Original-Request` on a replay, `Stripe-Should-Retry` on a
//!   retryable error, an error's `doc_url` and `request_log_url`, a card error's
//!   `payment_intent` and `payment_method`.
//!
//! The report counts, per kind of request or answer, what violates the description.

mod recorder;
mod spec;

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use axum::http::Method;
use payonce::gateway::Gateway;
use payonce::http::webhooks::{INBOX, ROUTE};
use payonce::idempotency::EngineSettings;
use payonce::simulator::{self, DeliveryState, RunningSimulator};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Options, SIM_SECRET_KEY, TestApp, new_key, parts};
use recorder::{Exchange, Recorder};
use spec::Spec;

const WEBHOOK_SECRET: &str = "whsec_payonce_conformance";

/// What the whole surface must have produced, so that a flow that silently stops running cannot
/// make the test pass: request kinds payonce's gateway sent, and answer kinds of the simulator.
const EXPECTED_REQUESTS: &[&str] = &[
    "POST /v1/payment_intents",
    "GET /v1/payment_intents/{intent}",
    "GET /v1/payment_intents/search",
    "POST /v1/refunds",
    "GET /v1/refunds/{refund}",
    "GET /v1/refunds",
    "POST /v1/webhook_endpoints",
];
const EXPECTED_ANSWERS: &[&str] = &[
    "POST /v1/payment_intents → 200",
    "POST /v1/payment_intents → 400",
    "POST /v1/payment_intents → 402",
    "POST /v1/payment_intents → 409",
    "POST /v1/payment_intents → 500",
    "GET /v1/payment_intents → 200",
    "GET /v1/payment_intents/{intent} → 200",
    "GET /v1/payment_intents/{intent} → 404",
    "GET /v1/payment_intents/search → 200",
    "GET /v1/payment_intents/search → 400",
    "POST /v1/refunds → 200",
    "POST /v1/refunds → 400",
    "GET /v1/refunds → 200",
    "GET /v1/refunds/{refund} → 200",
    "GET /v1/charges/{charge} → 200",
    "GET /v1/charges/{charge} → 404",
    "POST /v1/webhook_endpoints → 200",
    "GET /v1/webhook_endpoints → 200",
    "GET /v1/webhook_endpoints/{webhook_endpoint} → 200",
    "DELETE /v1/webhook_endpoints/{webhook_endpoint} → 200",
    "GET /v1/events → 200",
    "GET /v1/events/{id} → 200",
    "GET /v1/events → 401",
    "(no operation) → 404",
    "webhook payment_intent.succeeded",
    "webhook payment_intent.payment_failed",
    "webhook payment_intent.processing",
    "webhook payment_intent.requires_action",
    "webhook charge.succeeded",
    "webhook charge.failed",
    "webhook charge.pending",
    "webhook charge.refunded",
    "webhook refund.created",
    "webhook refund.updated",
    "webhook refund.failed",
];

/// Every request payonce's gateway client sends and every answer the simulator gives, across
/// payments (cards that succeed, decline, need 3-D Secure; bank debits that settle or fail),
/// lost answers and outages, refunds (card and pending bank debit, settled and failed),
/// webhooks, and reconciliation (the sweeper, retrieve, search, the refund list), are what
/// Stripe's OpenAPI description says, in both directions; and the headers are Stripe's.
#[tokio::test]
async fn requests_and_answers_are_what_stripes_openapi_description_says() {
    let spec = Spec::load();
    let sim = simulator::start("127.0.0.1:0".parse().unwrap()).await.expect("start the simulator");
    let api = Recorder::start(&sim.base_url()).await;
    let app = TestApp::spawn_with(Options {
        stripe_api_base: Some(api.url.clone()),
        webhook_secret: Some(WEBHOOK_SECRET.into()),
        ..Default::default()
    })
    .await;
    let hooks = Recorder::start(&app.url("/")).await;
    let hook_url = format!("{}{}", hooks.url, ROUTE.trim_start_matches('/'));
    sim.simulator().add_webhook_endpoint(SIM_SECRET_KEY, &hook_url, WEBHOOK_SECRET).expect("an endpoint");
    app.ledger.set_settings(json!({"processing_ms": 300, "webhook_retry_base_ms": 50})).await;

    let run = Run { app: &app, raw: Raw::new(&api.url), api_key: app.customer("conformance").await };
    run.webhook_endpoints().await;
    let paid = run.payments().await;
    let refund = run.refunds(&paid).await;
    run.reconciliation(&paid, &refund, &api.url).await;
    run.surface(&paid).await;
    // The refunds' later updates come on the simulator's timers.
    quiet(&sim, &["refund.updated"]).await;

    let report = Report::of(&spec, &api.exchanges(), &hooks.exchanges());
    println!("{report}");
    assert!(report.is_clean(), "the report above says what violates Stripe's description");
}

/// The checks themselves: each kind of violation, in each direction, is caught (a checker that
/// accepted everything would make the test above pass on any simulator).
#[test]
fn the_checks_catch_each_kind_of_violation() {
    let spec = Spec::load();
    let create = |body: &str| spec.check_request(&Method::POST, "/v1/payment_intents", None, body.as_bytes());
    assert_eq!(
        create("amount=100&currency=usd&confirm=true&metadata[a]=b&expand[0]=latest_charge"),
        Vec::<String>::new()
    );
    let unknown = create("amount=100&currency=usd&colour=red");
    assert!(unknown.iter().any(|p| p.contains("colour")), "{unknown:?}");
    let missing = create("amount=100");
    assert!(missing.iter().any(|p| p.contains("\"currency\" is a required property")), "{missing:?}");
    let wrong = create("amount=ten&currency=usd&confirm=maybe");
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    let nested = create("amount=1&currency=usd&automatic_payment_methods[allow_redirects]=sometimes");
    assert_eq!(nested.len(), 2, "enabled is missing, the value is not an option: {nested:?}");
    let search = |query: &str| spec.check_request(&Method::GET, "/v1/payment_intents/search", Some(query), b"");
    assert!(search("query=status:'x'&limit=3").is_empty());
    assert_eq!(search("limit=x&page=1&total=1").len(), 3, "query missing, limit not an integer, total unknown");

    let refund = json!({"id": "re_1", "object": "refund", "amount": 100, "balance_transaction": null,
        "charge": "ch_1", "created": 1, "currency": "usd", "customer": null, "customer_account": null,
        "metadata": {}, "payment_intent": "pi_1", "payment_method": null, "reason": null,
        "receipt_number": null, "source_transfer_reversal": null, "status": "succeeded", "transfer_reversal": null});
    let answer = |value: &Value| spec.check_answer(&Method::GET, "/v1/refunds/re_1", 200, value.to_string().as_bytes());
    assert_eq!(answer(&refund), Vec::<String>::new());
    let mut absent = refund.clone();
    absent.as_object_mut().unwrap().remove("payment_method");
    assert!(answer(&absent)[0].contains("\"payment_method\" is a required property"), "a nullable property left out");
    let mut extra = refund.clone();
    extra["colour"] = "red".into();
    assert!(answer(&extra)[0].contains("colour"), "a property Stripe's refund does not have");
    let mut null = refund.clone();
    null["failure_reason"] = Value::Null;
    assert!(answer(&null)[0].contains("failure_reason"), "sent as null where Stripe leaves it out");
    let mut expanded = refund;
    expanded["charge"] = json!({"id": "ch_1", "object": "charge"});
    assert!(answer(&expanded).iter().any(|p| p.starts_with("/charge: ")), "an expanded charge is checked too");
}

/// Requests sent straight to the simulator (through the recorder), for the answers payonce
/// never asks for.
struct Raw {
    client: reqwest::Client,
    base: String,
}

impl Raw {
    fn new(base: &str) -> Self {
        Self { client: reqwest::Client::new(), base: base.to_owned() }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{}", self.base, path.trim_start_matches('/')))
            .bearer_auth(SIM_SECRET_KEY)
    }

    /// A GET's status and JSON body.
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (status, _, body) = parts(self.request(Method::GET, path).send().await.expect("an answer")).await;
        (status, body)
    }

    /// A form POST's status and JSON body.
    async fn post(&self, path: &str, key: Option<&str>, form: &[(&str, &str)]) -> (StatusCode, Value) {
        let mut request = self.request(Method::POST, path).form(form);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let (status, _, body) = parts(request.send().await.expect("an answer")).await;
        (status, body)
    }
}

/// The payments the flows made, by how they ended at the gateway.
struct Paid {
    /// payonce's id and the PaymentIntent of a card payment of 5000.
    card: (String, String),
    /// A bank debit of 2500 that settled.
    bank: (String, String),
}

struct Run<'a> {
    app: &'a TestApp,
    raw: Raw,
    api_key: String,
}

impl Run<'_> {
    /// `POST /v1/payments` through payonce: (status, body).
    async fn pay(&self, key: &str, payment_method: &str, amount: i64) -> (StatusCode, Value) {
        let body = json!({"amount": amount, "currency": "usd", "payment_method": payment_method,
            "metadata": {"order": "conformance"}});
        let (status, _, answer) =
            parts(self.app.post_payment(&self.api_key, Some(key), &body).send().await.unwrap()).await;
        (status, answer)
    }

    /// `POST /v1/refunds` through payonce: (status, body).
    async fn refund(&self, payment: &str, amount: i64) -> (StatusCode, Value) {
        let body = json!({"payment": payment, "amount": amount, "reason": "requested_by_customer"});
        let request = self.app.post_refund(&self.api_key, Some(&new_key()), &body);
        let (status, _, answer) = parts(request.send().await.unwrap()).await;
        (status, answer)
    }

    /// payonce's own registration call (what `payonce serve` sends its built-in simulator), then
    /// the endpoint read back, listed and deleted.
    async fn webhook_endpoints(&self) {
        let gateway = Gateway::new(SIM_SECRET_KEY, Some(&self.raw.base), Duration::from_secs(10)).unwrap();
        gateway
            .register_webhook_endpoint("http://127.0.0.1:9/unused", &INBOX.subscriptions())
            .await
            .expect("registered");
        let (status, list) = self.raw.get("v1/webhook_endpoints?limit=10").await;
        assert_eq!(status, StatusCode::OK, "{list}");
        let unused = list["data"].as_array().unwrap().iter().find(|e| e["url"] == "http://127.0.0.1:9/unused").unwrap();
        let id = unused["id"].as_str().unwrap();
        assert_eq!(self.raw.get(&format!("v1/webhook_endpoints/{id}")).await.0, StatusCode::OK);
        let deleted = self.raw.request(Method::DELETE, &format!("v1/webhook_endpoints/{id}")).send().await.unwrap();
        assert_eq!(deleted.status(), StatusCode::OK);
    }

    /// Every kind of confirmation, an outage and a lost answer (each retried with its key).
    async fn payments(&self) -> Paid {
        let (status, card) = self.pay(&new_key(), "pm_card_visa", 5000).await;
        assert_eq!(status, StatusCode::CREATED, "{card}");
        let card = (card["id"].as_str().unwrap().to_owned(), card["payment_intent"].as_str().unwrap().to_owned());
        for declined in [
            "pm_card_chargeDeclined",
            "pm_card_chargeDeclinedInsufficientFunds",
            "pm_card_chargeDeclinedExpiredCard",
            "pm_card_chargeDeclinedFraudulent",
            "pm_card_doesNotExist",
        ] {
            let (status, body) = self.pay(&new_key(), declined, 1000).await;
            assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{declined}: {body}");
        }
        for (card_method, outcome) in
            [("pm_card_threeDSecure2Required", "succeed"), ("pm_card_authenticationRequired", "fail")]
        {
            let (status, body) = self.pay(&new_key(), card_method, 1500).await;
            assert_eq!((status, body["status"].as_str()), (StatusCode::ACCEPTED, Some("requires_action")), "{body}");
            let intent = body["payment_intent"].as_str().unwrap();
            self.app
                .ledger
                .control(&format!("payment_intents/{intent}/authenticate"), json!({"outcome": outcome}))
                .await;
        }
        let mut bank = None;
        for bank_method in ["pm_usBankAccount_success", "pm_usBankAccount_accountClosed"] {
            let (status, body) = self.pay(&new_key(), bank_method, 2500).await;
            assert_eq!((status, body["status"].as_str()), (StatusCode::ACCEPTED, Some("processing")), "{body}");
            let ids = (body["id"].as_str().unwrap().to_owned(), body["payment_intent"].as_str().unwrap().to_owned());
            bank.get_or_insert(ids);
        }

        // An outage (500, Stripe-Should-Retry), then the retry of the same key.
        let key = new_key();
        self.app.set_faults(json!({"fail_rate": 1.0, "next_calls": 1})).await;
        let (status, body) = self.pay(&key, "pm_card_mastercard", 700).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(self.pay(&key, "pm_card_mastercard", 700).await.0, StatusCode::CREATED);
        // Charged, but the answer lost: the retry's create is replayed by the simulator.
        let key = new_key();
        self.app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1})).await;
        assert_eq!(self.pay(&key, "pm_card_amex", 800).await.0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(self.pay(&key, "pm_card_amex", 800).await.0, StatusCode::CREATED);
        assert_eq!(self.app.charges_for(&key).await.len(), 1);

        // The bank debits settle (their webhooks reach payonce).
        let started = Instant::now();
        while sqlx::query_scalar::<_, i64>(
            "select count(*) from payments where status in ('processing', 'requires_action')",
        )
        .fetch_one(&self.app.db)
        .await
        .unwrap()
            > 0
        {
            assert!(started.elapsed() < Duration::from_secs(15), "pending payments never settled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Paid { card, bank: bank.expect("a bank debit") }
    }

    /// Card refunds (the reference arrives later: `refund.updated`), a bank debit's refund left
    /// pending and failed, and the gateway's refusals of too much. Returns payonce's first refund.
    async fn refunds(&self, paid: &Paid) -> Value {
        let (status, first) = self.refund(&paid.card.0, 1000).await;
        assert_eq!((status, first["status"].as_str()), (StatusCode::CREATED, Some("succeeded")), "{first}");
        let (status, body) = self.refund(&paid.card.0, 1500).await;
        assert_eq!((status, body["status"].as_str()), (StatusCode::CREATED, Some("succeeded")), "{body}");
        self.app.ledger.set_settings(json!({"processing_ms": 600_000, "webhook_retry_base_ms": 50})).await;
        let (status, pending) = self.refund(&paid.bank.0, 1000).await;
        assert_eq!((status, pending["status"].as_str()), (StatusCode::CREATED, Some("pending")), "{pending}");
        self.app.ledger.set_settings(json!({"processing_ms": 300, "webhook_retry_base_ms": 50})).await;
        let gateway_refund = pending["gateway_refund"].as_str().unwrap();
        self.app.ledger.control(&format!("refunds/{gateway_refund}/settle"), json!({"outcome": "fail"})).await;
        let (status, body) = self.refund(&paid.bank.0, 500).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");

        let intent = &paid.card.1;
        let (status, body) =
            self.raw.post("v1/refunds", Some(&new_key()), &[("payment_intent", intent), ("amount", "999999")]).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("amount_too_large")),
            "{body}"
        );
        let (status, body) = self.raw.post("v1/refunds", Some(&new_key()), &[("payment_intent", intent)]).await;
        assert_eq!(status, StatusCode::OK, "the rest: {body}");
        let (status, body) = self.raw.post("v1/refunds", None, &[("payment_intent", intent)]).await;
        assert_eq!(body["error"]["code"], "charge_already_refunded", "{status} {body}");
        first
    }

    /// The sweeper's look-ups, and each reconciliation call of payonce's gateway.
    async fn reconciliation(&self, paid: &Paid, refund: &Value, gateway_url: &str) {
        let sweeper = self.app.database.sweeper(gateway_url, "sweeper:conformance", EngineSettings::default());
        let report = sweeper.sweep().await;
        assert_eq!(report.errors, 0, "{report:?}");
        let gateway = Gateway::new(SIM_SECRET_KEY, Some(gateway_url), Duration::from_secs(10)).unwrap();
        assert_eq!(gateway.retrieve(&paid.card.1).await.label(), "succeeded");
        let found = gateway.search(&paid.card.0).await.expect("found by payonce's metadata");
        assert_eq!(found.payment_intent(), Some(paid.card.1.as_str()));
        let gateway_refund = refund["gateway_refund"].as_str().expect("the gateway's refund");
        assert_eq!(gateway.retrieve_refund(gateway_refund).await.label(), "succeeded");
        let found = gateway.find_refund(&paid.card.1, refund["id"].as_str().unwrap()).await;
        assert_eq!(found.as_ref().and_then(|found| found.refund()), Some(gateway_refund));
    }

    /// The rest of the simulator's surface: lists and their pagination, expansion, search, the
    /// objects by id, and its errors.
    async fn surface(&self, paid: &Paid) {
        let raw = &self.raw;
        let (_, page) = raw.get("v1/payment_intents?limit=2").await;
        if let Some(last) = page["data"][1]["id"].as_str() {
            raw.get(&format!("v1/payment_intents?limit=2&starting_after={last}")).await;
            raw.get(&format!("v1/payment_intents?ending_before={last}&created[gte]=0")).await;
        }
        let (_, intent) = raw.get(&format!("v1/payment_intents/{}?expand[]=latest_charge", paid.card.1)).await;
        let charge = intent["latest_charge"]["id"].as_str().expect("the charge, expanded");
        raw.get(&format!("v1/charges/{charge}")).await;
        raw.get("v1/charges/ch_nope").await;
        raw.get("v1/payment_intents/pi_nope").await;
        raw.get(&format!("v1/charges/{}", paid_charge(raw, &paid.bank.1).await)).await;

        for query in [
            "status:'succeeded' AND currency:'usd'",
            "status:\"succeeded\" OR status:\"processing\"",
            "-status:'succeeded'",
            "amount>1000",
            "amount<=800 created>0",
            "customer:null",
            "metadata['order']:'conformance' AND -metadata['missing']:null",
            "currency~'usd'",
        ] {
            // What each query finds is the simulator's unit tests' business (tests/search.rs).
            let (_, body) = raw.get(&format!("v1/payment_intents/search?query={}&limit=2", urlencode(query))).await;
            if let Some(next) = body["next_page"].as_str() {
                raw.get(&format!("v1/payment_intents/search?query={}&page={next}", urlencode(query))).await;
            }
        }
        for refused in ["status:'a' AND currency:'usd' OR amount>1", "nope:'x'", "status:'succeeded", "currency~'us'"] {
            raw.get(&format!("v1/payment_intents/search?query={}", urlencode(refused))).await;
        }

        let (_, refunds) = raw.get(&format!("v1/refunds?limit=1&payment_intent={}", paid.card.1)).await;
        let first = refunds["data"][0]["id"].as_str().expect("a refund");
        raw.get(&format!("v1/refunds?limit=1&starting_after={first}")).await;
        raw.get(&format!("v1/refunds/{first}")).await;
        let (_, events) = raw.get("v1/events?limit=3&type=payment_intent.*").await;
        let event = events["data"][0]["id"].as_str().expect("an event");
        raw.get(&format!("v1/events/{event}")).await;
        raw.get(&format!("v1/events?limit=100&ending_before={event}")).await;
        raw.get("v1/events?types[0]=refund.created&types[1]=refund.updated").await;

        // Errors: no key, an unknown URL, an unknown parameter, a key reused with other
        // parameters, and a key in use.
        let anonymous = reqwest::Client::new().get(format!("{}v1/events", raw.base)).send().await.unwrap();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(raw.get("v1/nowhere").await.0, StatusCode::NOT_FOUND);
        let create = [
            ("amount", "100"),
            ("currency", "usd"),
            ("payment_method", "pm_card_visa"),
            ("confirm", "true"),
            ("automatic_payment_methods[enabled]", "true"),
            ("automatic_payment_methods[allow_redirects]", "never"),
        ];
        let (status, _) =
            raw.post("v1/payment_intents", None, &[("amount", "100"), ("currency", "usd"), ("colour", "red")]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let key = new_key();
        assert_eq!(raw.post("v1/payment_intents", Some(&key), &create).await.0, StatusCode::OK);
        let replayed = raw.request(Method::POST, "v1/payment_intents").header("Idempotency-Key", &key).form(&create);
        assert_eq!(replayed.send().await.unwrap().headers()["idempotent-replayed"], "true");
        let (status, body) =
            raw.post("v1/payment_intents", Some(&key), &[("amount", "101"), ("currency", "usd")]).await;
        assert_eq!((status, body["error"]["type"].as_str()), (StatusCode::BAD_REQUEST, Some("idempotency_error")));
        // The key in use: whichever arrives second while the first waits out its latency.
        self.app
            .set_faults(json!({"latency_ms": 2000, "operations": ["create_payment_intent"], "next_calls": 1}))
            .await;
        let key = new_key();
        let (first, second) = tokio::join!(raw.post("v1/payment_intents", Some(&key), &create), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            raw.post("v1/payment_intents", Some(&key), &create).await
        });
        let mut statuses = [first.0, second.0];
        statuses.sort();
        assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT], "{} {}", first.1, second.1);
        let (status, body) = raw
            .post(
                "v1/payment_intents",
                Some(&new_key()),
                &[
                    ("amount", "100"),
                    ("currency", "usd"),
                    ("payment_method", "pm_card_chargeDeclined"),
                    ("confirm", "true"),
                    ("payment_method_types[0]", "card"),
                ],
            )
            .await;
        assert_eq!((status, body["error"]["type"].as_str()), (StatusCode::PAYMENT_REQUIRED, Some("card_error")));
    }
}

/// The `latest_charge` of a PaymentIntent.
async fn paid_charge(raw: &Raw, intent: &str) -> String {
    let (_, intent) = raw.get(&format!("v1/payment_intents/{intent}")).await;
    intent["latest_charge"].as_str().expect("a charge").to_owned()
}

fn urlencode(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Waits until events of each of `kinds` happened and no webhook delivery is under way (each one
/// delivered or given up).
async fn quiet(sim: &RunningSimulator, kinds: &[&str]) {
    let started = Instant::now();
    loop {
        let events = sim.simulator().events();
        let happened = kinds.iter().all(|kind| events.iter().any(|event| event.kind == *kind));
        let busy = events
            .iter()
            .flat_map(|event| &event.deliveries)
            .any(|d| matches!(d.state, DeliveryState::Pending | DeliveryState::Held));
        if happened && !busy {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "webhook deliveries still under way");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What was checked, per kind of request or answer, and what violates the description.
struct Report {
    provenance: String,
    requests: BTreeMap<String, Kind>,
    answers: BTreeMap<String, Kind>,
}

#[derive(Default)]
struct Kind {
    seen: usize,
    /// Each distinct problem and how many times it occurred.
    problems: BTreeMap<String, usize>,
}

impl Kind {
    fn note(&mut self, problems: impl IntoIterator<Item = String>) {
        self.seen += 1;
        for problem in problems {
            *self.problems.entry(problem).or_default() += 1;
        }
    }

    fn instances(&self) -> usize {
        self.problems.values().sum()
    }
}

impl Report {
    fn of(spec: &Spec, api: &[Exchange], hooks: &[Exchange]) -> Self {
        let mut report =
            Self { provenance: spec.provenance.clone(), requests: BTreeMap::new(), answers: BTreeMap::new() };
        for exchange in api.iter().filter(|exchange| exchange.path.starts_with("/v1/")) {
            let template = spec.template(&exchange.method, &exchange.path);
            let from_gateway =
                exchange.request_header("user-agent").is_some_and(|agent| agent.contains("async-stripe"));
            if from_gateway {
                let kind = template.clone().unwrap_or_else(|| format!("{} {}", exchange.method, exchange.path));
                let problems = spec.check_request(
                    &exchange.method,
                    &exchange.path,
                    exchange.query.as_deref(),
                    &exchange.request_body,
                );
                report.requests.entry(kind).or_default().note(problems);
            }
            let Some(answer) = &exchange.answer else {
                let kind = format!("{} → (connection broken)", template.as_deref().unwrap_or("(no operation)"));
                report.answers.entry(kind).or_default().note([]);
                continue;
            };
            let kind = format!("{} → {}", template.as_deref().unwrap_or("(no operation)"), answer.status.as_u16());
            let mut problems = headers(exchange, answer);
            problems.extend(error_members(answer));
            if template.is_some() {
                problems.extend(spec.check_answer(
                    &exchange.method,
                    &exchange.path,
                    answer.status.as_u16(),
                    &answer.body,
                ));
            }
            report.answers.entry(kind).or_default().note(problems);
        }
        for delivery in hooks {
            let event: Value = serde_json::from_slice(&delivery.request_body).unwrap_or_default();
            let kind = format!("webhook {}", event["type"].as_str().unwrap_or("(no type)"));
            let mut problems = spec.check_event(&delivery.request_body);
            if !delivery.request_header("stripe-signature").is_some_and(|s| s.starts_with("t=") && s.contains(",v1=")) {
                problems.push("no Stripe-Signature".into());
            }
            report.answers.entry(kind).or_default().note(problems);
        }
        report
    }

    fn is_clean(&self) -> bool {
        let covered = EXPECTED_REQUESTS.iter().all(|kind| self.requests.contains_key(*kind))
            && EXPECTED_ANSWERS.iter().all(|kind| self.answers.contains_key(*kind));
        covered && self.requests.values().chain(self.answers.values()).all(|kind| kind.problems.is_empty())
    }
}

/// The headers Stripe sends, as its libraries read them.
fn headers(exchange: &Exchange, answer: &recorder::Answer) -> Vec<String> {
    let mut problems = Vec::new();
    let request_id = answer.header("request-id").unwrap_or_default();
    if !request_id.starts_with("req_") {
        problems.push(format!("Request-Id is {request_id:?}"));
    }
    if answer.header("stripe-version").is_none_or(str::is_empty) {
        problems.push("no Stripe-Version".into());
    }
    if exchange.method == Method::POST
        && let Some(key) = exchange.request_header("idempotency-key")
        && answer.header("idempotency-key") != Some(key)
    {
        problems.push("the Idempotency-Key is not echoed".into());
    }
    let original = answer.header("original-request").unwrap_or_default();
    if answer.header("idempotent-replayed") == Some("true") {
        if !original.starts_with("req_") || original == request_id {
            problems.push(format!("a replay's Original-Request is {original:?}"));
        }
    } else if !original.is_empty() && original != request_id {
        problems.push("a first answer's Original-Request names another request".into());
    }
    let retryable = answer.status.is_server_error() || matches!(answer.status.as_u16(), 409 | 429);
    if retryable && answer.header("stripe-should-retry") != Some("true") {
        problems.push("a retryable error without Stripe-Should-Retry: true".into());
    }
    problems
}

/// The members of Stripe's error objects that the spec leaves optional but Stripe always sends.
fn error_members(answer: &recorder::Answer) -> Vec<String> {
    if answer.status.is_success() {
        return Vec::new();
    }
    let body: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    let error = &body["error"];
    let mut problems = Vec::new();
    if !error["request_log_url"].as_str().is_some_and(|url| url.contains("req_")) {
        problems.push("error: no request_log_url".into());
    }
    if error["code"].is_string() && !error["doc_url"].as_str().is_some_and(|url| url.starts_with("https://")) {
        problems.push("error: a code without doc_url".into());
    }
    if error["type"] == "card_error" {
        for member in ["payment_intent", "payment_method", "charge", "decline_code"] {
            if error[member].is_null() {
                problems.push(format!("card error: no {member}"));
            }
        }
    }
    problems
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "conformance with {}", self.provenance)?;
        for (title, kinds, expected) in
            [("requests payonce sent", &self.requests, EXPECTED_REQUESTS), ("answers", &self.answers, EXPECTED_ANSWERS)]
        {
            let bad = kinds.values().filter(|kind| !kind.problems.is_empty()).count();
            let instances: usize = kinds.values().map(Kind::instances).sum();
            let exchanges: usize = kinds.values().map(|kind| kind.seen).sum();
            writeln!(
                f,
                "{title}: {exchanges} in {} kinds; {bad} kinds violate the spec ({instances} instances)",
                kinds.len()
            )?;
            for (name, kind) in kinds {
                let mark = if kind.problems.is_empty() { "ok " } else { "BAD" };
                writeln!(f, "  {mark} {name} ({} seen, {} problems)", kind.seen, kind.instances())?;
                for (problem, count) in &kind.problems {
                    writeln!(f, "        {count:>3} × {problem}")?;
                }
            }
            for missing in expected.iter().filter(|kind| !kinds.contains_key(**kind)) {
                writeln!(f, "  MISSING {missing} (no flow produced it)")?;
            }
        }
        Ok(())
    }
}
