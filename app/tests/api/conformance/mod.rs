//! payonce and its simulator against Stripe's own API description.
//!
//! A recording proxy sits between payonce's gateway client and the simulator, and another
//! between the simulator and payonce's webhook route. The test drives the payment, refund,
//! webhook and reconciliation paths through payonce, authorize-then-capture or cancel through
//! async-stripe's own client (the request types payonce's gateway uses for them), and the rest
//! of the simulator's surface with plain requests, then checks every recorded exchange against
//! the copy of Stripe's OpenAPI description in `app/tests/stripe-openapi/` ([`spec`]):
//!
//! - every request payonce's gateway client (or async-stripe) sent: no unknown parameter, none
//!   missing, the right types and values;
//! - every answer the simulator gave, and every event it delivered: each property Stripe sends
//!   is there (nullable ones as `null`), none that Stripe's objects do not have, with the right
//!   types and values;
//! - the headers and error members Stripe's libraries read: `Request-Id`, `Stripe-Version`,
//!   `Idempotency-Key` echoed, `Original-Request` on a replay, `Stripe-Should-Retry` on a
//!   retryable error, an error's `doc_url` and `request_log_url`, a card error's
//!   `payment_intent` and `payment_method`.
//!
//! The report ([`report`]) counts, per kind of request or answer, what violates the description.

mod captures;
mod recorder;
mod report;
mod spec;

use std::time::{Duration, Instant};

use axum::http::Method;
use payonce::gateway::Gateway;
use payonce::http::webhooks::{INBOX, ROUTE};
use payonce::idempotency::EngineSettings;
use payonce::simulator::{self, DeliveryState, RunningSimulator};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Options, SIM_SECRET_KEY, TestApp, new_key, parts};
use recorder::Recorder;
use report::Report;
use spec::Spec;

const WEBHOOK_SECRET: &str = "whsec_payonce_conformance";

/// Every request payonce's gateway client sends and every answer the simulator gives, across
/// payments (cards that succeed, decline, need 3-D Secure; bank debits that settle or fail),
/// lost answers and outages, refunds (card and pending bank debit, settled and failed),
/// webhooks, reconciliation (the sweeper, retrieve, search, the refund list), and authorizations
/// (captured, canceled, expired, refused), are what Stripe's OpenAPI description says, in both
/// directions; and the headers are Stripe's.
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
    run.captures(&api.url).await;
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
    let capture =
        |body: &str| spec.check_request(&Method::POST, "/v1/payment_intents/pi_1/capture", None, body.as_bytes());
    assert!(capture("amount_to_capture=500&expand[0]=latest_charge").is_empty());
    assert_eq!(capture("amount_to_capture=five&final_capture=false").len(), 2, "not an integer; unknown in 2023");
    let cancel =
        |body: &str| spec.check_request(&Method::POST, "/v1/payment_intents/pi_1/cancel", None, body.as_bytes());
    assert!(cancel("cancellation_reason=requested_by_customer").is_empty() && cancel("").is_empty());
    assert_eq!(cancel("cancellation_reason=bored").len(), 1, "not one of Stripe's reasons");
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
