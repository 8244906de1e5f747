//! The OpenAPI description served at `GET /openapi.json` is true of the real responses.
//!
//! Every exchange below is a real request to a real server, checked against the description
//! the server itself serves ([`Described::check`]): the operation exists, the status is
//! documented for it, the body validates against the documented schema (a JSON Schema 2020-12
//! validator, OpenAPI 3.1's dialect), every header documented as required is there and matches
//! its schema, and none of the headers the contract is about (`Location`, `Retry-After`,
//! `Idempotent-Replayed`, …) appears undocumented. A handler whose answer drifts from its
//! annotation fails here. The exchanges cover every operation and every problem type the API
//! can produce over HTTP (`internal` is a bug, and has no request that produces it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use payonce::idempotency::{Backoff, Budget, Horizon};
use payonce::problem;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use stripe_webhook::Webhook;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{Options, TestApp, new_key, payment};

/// Response headers whose presence is part of the contract: each one a response carries must be
/// documented for it.
const TRACKED_HEADERS: [&str; 5] =
    ["location", "retry-after", "idempotent-replayed", "www-authenticate", "accept-encoding"];

const WEBHOOK_SECRET: &str = "whsec_payonce_openapi_test";

/// One real answer.
struct Exchange {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Exchange {
    async fn of(response: reqwest::Response) -> Self {
        let (status, headers) = (response.status(), response.headers().clone());
        Self { status, headers, body: response.bytes().await.expect("a body").to_vec() }
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The problem type's slug, for a problem document.
    fn problem_slug(&self) -> Option<String> {
        self.json()["type"].as_str()?.rsplit('/').next().map(str::to_owned)
    }
}

/// The served description, and what has been checked against it.
struct Described {
    doc: Value,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
    /// (method, path template, status) of every checked exchange.
    seen: Mutex<BTreeSet<(String, String, u16)>>,
    /// Problem types seen.
    problems: Mutex<BTreeSet<String>>,
}

/// A JSON pointer segment (RFC 6901).
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

impl Described {
    async fn fetch(app: &TestApp) -> Self {
        let response = app.client.get(app.url("/openapi.json")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let exchange = Exchange::of(response).await;
        let described = Self {
            doc: exchange.json(),
            validators: Mutex::default(),
            seen: Mutex::default(),
            problems: Mutex::default(),
        };
        assert_eq!(described.doc["openapi"], "3.1.0");
        described.check_exchange("get", "/openapi.json", &exchange);
        described
    }

    /// Sends `request` and checks its answer as one of `method template`.
    async fn check(&self, method: &str, template: &str, request: reqwest::RequestBuilder) -> Exchange {
        let exchange = Exchange::of(request.send().await.expect("an answer")).await;
        self.check_exchange(method, template, &exchange);
        exchange
    }

    fn validator(&self, pointer: &str) -> Arc<jsonschema::Validator> {
        let mut validators = self.validators.lock().unwrap();
        validators
            .entry(pointer.to_owned())
            .or_insert_with(|| {
                // The whole description is the root resource, so that `#/components/…` resolves.
                let mut root = self.doc.clone();
                // A JSON pointer in a URI fragment: percent-encoded (`{id}`, a media type's spaces).
                let fragment: String = pointer
                    .bytes()
                    .map(|b| match b {
                        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'~' | b'-' | b'.' | b'_' => {
                            char::from(b).to_string()
                        }
                        other => format!("%{other:02X}"),
                    })
                    .collect();
                root["$ref"] = Value::from(format!("#{fragment}"));
                let validator = jsonschema::draft202012::options()
                    .should_validate_formats(true)
                    .build(&root)
                    .unwrap_or_else(|err| panic!("the schema at {pointer} does not compile: {err}"));
                Arc::new(validator)
            })
            .clone()
    }

    fn validate(&self, pointer: &str, instance: &Value, what: &str) {
        let validator = self.validator(pointer);
        let errors: Vec<String> =
            validator.iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path())).collect();
        assert!(errors.is_empty(), "{what} does not match its schema ({pointer}): {errors:#?}\n{instance:#}");
    }

    fn check_exchange(&self, method: &str, template: &str, exchange: &Exchange) {
        let status = exchange.status.as_u16();
        let what = format!("{} {template} → {status}", method.to_uppercase());
        let operation =
            self.doc["paths"][template][method].as_object().unwrap_or_else(|| panic!("{what}: no such operation"));
        let responses = operation["responses"].as_object().expect("responses");
        let code = status.to_string();
        let response = responses.get(&code).unwrap_or_else(|| {
            panic!(
                "{what}: status not documented (documented: {:?})\n{}",
                responses.keys().collect::<Vec<_>>(),
                exchange.json()
            )
        });
        let base = format!("/paths/{}/{method}/responses/{code}", escape(template));

        // The body: one of the documented media types, and valid against its schema.
        // (An empty text is a body too: `/metrics` before anything was measured.)
        let content = response["content"].as_object().filter(|content| !content.is_empty());
        let content_type = exchange.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        match content {
            None => assert!(exchange.body.is_empty(), "{what}: a body, but no content documented"),
            Some(content) => {
                let essence = |media: &str| media.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
                let (media, _) =
                    content.iter().find(|(media, _)| essence(media) == essence(content_type)).unwrap_or_else(|| {
                        panic!("{what}: Content-Type {content_type:?} not documented ({:?})", content.keys())
                    });
                let instance = if essence(media).ends_with("json") {
                    serde_json::from_slice(&exchange.body).unwrap_or_else(|err| panic!("{what}: not JSON: {err}"))
                } else {
                    Value::String(String::from_utf8_lossy(&exchange.body).into_owned())
                };
                self.validate(&format!("{base}/content/{}/schema", escape(media)), &instance, &what);
            }
        }

        // The headers: the required ones there, each matching its schema; none of the contract's
        // undocumented.
        let documented = response["headers"].as_object().cloned().unwrap_or_default();
        for (name, header) in &documented {
            match exchange.headers.get(name.as_str()) {
                Some(value) => {
                    let value = Value::from(value.to_str().expect("an ASCII header"));
                    self.validate(
                        &format!("{base}/headers/{}/schema", escape(name)),
                        &value,
                        &format!("{what}: {name}"),
                    );
                }
                None => assert_ne!(header["required"], true, "{what}: the required header {name} is missing"),
            }
        }
        for name in TRACKED_HEADERS {
            if exchange.headers.contains_key(name) {
                assert!(
                    documented.keys().any(|d| d.eq_ignore_ascii_case(name)),
                    "{what}: sends {name}, which is not documented for it"
                );
            }
        }

        if let Some(slug) = exchange.problem_slug().filter(|_| exchange.status.as_u16() >= 400) {
            self.problems.lock().unwrap().insert(slug);
        }
        self.seen.lock().unwrap().insert((method.to_owned(), template.to_owned(), status));
    }

    /// Every operation of the description.
    fn operations(&self) -> BTreeSet<(String, String)> {
        let mut operations = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("a path item").keys() {
                operations.insert((method.clone(), path.clone()));
            }
        }
        operations
    }
}

/// A customer's API request to `path` (a concrete URL, not the template).
fn api(app: &TestApp, method: reqwest::Method, path: &str, api_key: &str) -> reqwest::RequestBuilder {
    app.client.request(method, app.url(path)).bearer_auth(api_key)
}

fn post(app: &TestApp, api_key: &str, key: Option<&str>) -> reqwest::RequestBuilder {
    let request = api(app, reqwest::Method::POST, "/v1/payments", api_key);
    match key {
        Some(key) => request.header("Idempotency-Key", key),
        None => request,
    }
}

fn paying_with(method: &str) -> Value {
    json!({"amount": 700, "currency": "usd", "payment_method": method})
}

/// Sends a head declaring a body that never comes, and reads the answer the body timeout gives.
async fn a_body_that_never_arrives(addr: std::net::SocketAddr, api_key: String) -> Exchange {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\nIdempotency-Key: {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
        new_key()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw)).await.expect("answered").unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.lines();
    let status: u16 = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("a status");
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line.split_once(':').unwrap();
        headers.append(
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).unwrap(),
            value.trim().parse().unwrap(),
        );
    }
    Exchange { status: StatusCode::from_u16(status).unwrap(), headers, body: body.as_bytes().to_vec() }
}

/// Every operation, every documented kind of answer the API can give over HTTP, each checked
/// against the served description; then: every operation was exercised, and every problem type
/// seen.
#[tokio::test]
async fn real_responses_match_the_description() {
    let app = TestApp::spawn_with(Options {
        webhook_secret: Some(WEBHOOK_SECRET.into()),
        // Two quick attempts and a short horizon, so that a key can be given up (502) in seconds.
        budget: Budget {
            max_attempts: 2,
            backoff: Backoff { base: Duration::from_millis(20), cap: Duration::from_millis(20) },
            ..Budget::default()
        },
        horizon: Horizon { downstream_key_ttl: Duration::from_secs(2), search_settle: Duration::from_secs(1) },
        ..Default::default()
    })
    .await;
    let spec = Described::fetch(&app).await;
    let api_key = app.customer("acme").await;
    let get = reqwest::Method::GET;
    // The body timeout takes its 10 s meanwhile.
    let slow = tokio::spawn(a_body_that_never_arrives(app.addr, api_key.clone()));

    // Operations.
    spec.check("get", "/healthz", app.client.get(app.url("/healthz"))).await;
    spec.check("get", "/readyz", app.client.get(app.url("/readyz"))).await;
    let metrics = spec.check("get", "/metrics", app.client.get(app.url("/metrics"))).await;
    assert_eq!(metrics.status, StatusCode::OK);

    // A payment: created, replayed, read, listed.
    let key = new_key();
    let created = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&key)).json(&payment(500))).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json());
    // The key as a Structured Field String is the same key.
    let replay =
        spec.check("post", "/v1/payments", post(&app, &api_key, Some(&format!("\"{key}\""))).json(&payment(500))).await;
    assert_eq!(
        (replay.status, replay.headers.get("idempotent-replayed").map(|v| v.to_str().unwrap())),
        (StatusCode::CREATED, Some("true"))
    );
    assert_eq!(replay.body, created.body, "a replay is the first answer");
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let shown =
        spec.check("get", "/v1/payments/{id}", api(&app, get.clone(), &format!("/v1/payments/{id}"), &api_key)).await;
    assert_eq!(shown.status, StatusCode::OK);
    let listed = spec.check("get", "/v1/payments", api(&app, get.clone(), "/v1/payments?limit=1", &api_key)).await;
    assert_eq!(listed.json()["data"][0]["id"], id.as_str());
    let page = format!("/v1/payments?starting_after={id}");
    assert_eq!(spec.check("get", "/v1/payments", api(&app, get.clone(), &page, &api_key)).await.status, StatusCode::OK);

    // Pending (202), declined and rejected (402), and their replays.
    for (method, status) in [
        ("pm_usBankAccount_success", StatusCode::ACCEPTED),
        ("pm_card_threeDSecure2Required", StatusCode::ACCEPTED),
        ("pm_card_chargeDeclined", StatusCode::PAYMENT_REQUIRED),
        ("pm_does_not_exist", StatusCode::PAYMENT_REQUIRED),
    ] {
        let key = new_key();
        for _ in 0..2 {
            let answer =
                spec.check("post", "/v1/payments", post(&app, &api_key, Some(&key)).json(&paying_with(method))).await;
            assert_eq!(answer.status, status, "{method}: {}", answer.json());
        }
    }

    // The client's mistakes.
    let refused = |exchange: &Exchange, status: StatusCode, slug: &str| {
        assert_eq!((exchange.status, exchange.problem_slug().as_deref()), (status, Some(slug)), "{}", exchange.json());
    };
    let body = payment(500);
    let e = spec
        .check(
            "post",
            "/v1/payments",
            app.client.post(app.url("/v1/payments")).header("Idempotency-Key", new_key()).json(&body),
        )
        .await;
    refused(&e, StatusCode::UNAUTHORIZED, "unauthorized");
    let e =
        spec.check("post", "/v1/payments", post(&app, "po_0000000000000000_00", Some(&new_key())).json(&body)).await;
    refused(&e, StatusCode::UNAUTHORIZED, "unauthorized");
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, None).json(&body)).await;
    refused(&e, StatusCode::BAD_REQUEST, "idempotency-key-missing");
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some("two words")).json(&body)).await;
    refused(&e, StatusCode::BAD_REQUEST, "idempotency-key-invalid");
    let e = spec
        .check(
            "post",
            "/v1/payments",
            post(&app, &api_key, Some(&new_key()))
                .json(&json!({"amount": 0, "currency": "usd", "payment_method": "card"})),
        )
        .await;
    refused(&e, StatusCode::BAD_REQUEST, "invalid-request");
    assert_eq!(e.json()["errors"].as_array().map(Vec::len), Some(2));
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&new_key())).body(body.to_string())).await;
    refused(&e, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type");
    let e = spec
        .check(
            "post",
            "/v1/payments",
            post(&app, &api_key, Some(&new_key())).header("content-encoding", "gzip").json(&body),
        )
        .await;
    refused(&e, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-content-encoding");
    let large =
        json!({"amount": 1, "currency": "usd", "payment_method": "pm_card_visa", "description": "x".repeat(70_000)});
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&new_key())).json(&large)).await;
    refused(&e, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large");
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&key)).json(&payment(501))).await;
    refused(&e, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused");
    let e = spec.check("get", "/v1/payments/{id}", api(&app, get.clone(), "/v1/payments/pay_nope", &api_key)).await;
    refused(&e, StatusCode::NOT_FOUND, "not-found");
    let e = spec.check("get", "/v1/payments", api(&app, get.clone(), "/v1/payments?limit=0", &api_key)).await;
    refused(&e, StatusCode::BAD_REQUEST, "invalid-request");
    let e = spec.check("get", "/v1/payments", api(&app, get.clone(), "/v1/payments?q=a%00b", &api_key)).await;
    refused(&e, StatusCode::BAD_REQUEST, "invalid-request");
    let e = spec.check("get", "/healthz", app.client.get(app.url("/healthz?x=%00"))).await;
    refused(&e, StatusCode::BAD_REQUEST, "invalid-request");
    let e = spec.check("get", "/v1/payments", app.client.get(app.url("/v1/payments"))).await;
    refused(&e, StatusCode::UNAUTHORIZED, "unauthorized");

    // In flight (409): a slow gateway, and a retry while the first request waits for it.
    app.set_faults(json!({"latency_ms": 1500, "next_calls": 1})).await;
    let key = new_key();
    let first = tokio::spawn(post(&app, &api_key, Some(&key)).json(&payment(900)).send());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&key)).json(&payment(900))).await;
    refused(&e, StatusCode::CONFLICT, "idempotency-key-in-use");
    let first = Exchange::of(first.await.unwrap().unwrap()).await;
    spec.check_exchange("post", "/v1/payments", &first);
    assert_eq!(first.status, StatusCode::CREATED);

    // The gateway down (503), then the key given up once the gateway confirms no charge (502).
    app.set_faults(json!({"fail_rate": 1.0, "operations": ["create_payment_intent"]})).await;
    let key = new_key();
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&key)).json(&payment(800))).await;
    refused(&e, StatusCode::SERVICE_UNAVAILABLE, "gateway-unavailable");
    let sweeper = app.database.sweeper(
        &app.sim_url,
        "sweeper:openapi",
        payonce::idempotency::EngineSettings {
            budget: Budget {
                max_attempts: 2,
                backoff: Backoff { base: Duration::from_millis(20), cap: Duration::from_millis(20) },
                ..Budget::default()
            },
            horizon: Horizon { downstream_key_ttl: Duration::from_secs(2), search_settle: Duration::from_secs(1) },
            ..Default::default()
        },
    );
    let started = std::time::Instant::now();
    while app.database.key_state(&key).await.unwrap().0 == "processing" {
        assert!(started.elapsed() < Duration::from_secs(15), "the key was never given up");
        sweeper.sweep().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&key)).json(&payment(800))).await;
    refused(&e, StatusCode::BAD_GATEWAY, "payment-abandoned");
    app.set_faults(json!({})).await;

    // Refunds: created, replayed, read, listed; the client's mistakes; more than remains and a
    // payment not succeeded (409); the gateway refusing (502 refund-rejected); the gateway down
    // (503), then the key given up once the gateway confirms no refund (502 refund-abandoned).
    let refund = |key: Option<&str>, body: &Value| {
        let request = api(&app, reqwest::Method::POST, "/v1/refunds", &api_key).json(body);
        match key {
            Some(key) => request.header("Idempotency-Key", key.to_owned()),
            None => request,
        }
    };
    let refund_key = new_key();
    let body = json!({"payment": id, "amount": 200, "reason": "requested_by_customer"});
    let made = spec.check("post", "/v1/refunds", refund(Some(&refund_key), &body)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.json());
    let replay = spec.check("post", "/v1/refunds", refund(Some(&refund_key), &body)).await;
    assert_eq!(
        (replay.status, replay.headers.get("idempotent-replayed").map(|v| v.to_str().unwrap())),
        (StatusCode::CREATED, Some("true"))
    );
    let refund_id = made.json()["id"].as_str().unwrap().to_owned();
    let shown = spec
        .check("get", "/v1/refunds/{id}", api(&app, get.clone(), &format!("/v1/refunds/{refund_id}"), &api_key))
        .await;
    assert_eq!(shown.status, StatusCode::OK);
    let listed =
        spec.check("get", "/v1/refunds", api(&app, get.clone(), &format!("/v1/refunds?payment={id}"), &api_key)).await;
    assert_eq!(listed.json()["data"][0]["id"], refund_id.as_str());
    let page = format!("/v1/refunds?limit=1&starting_after={refund_id}");
    assert_eq!(spec.check("get", "/v1/refunds", api(&app, get.clone(), &page, &api_key)).await.status, StatusCode::OK);
    let e = spec.check("get", "/v1/refunds/{id}", api(&app, get.clone(), "/v1/refunds/re_nope", &api_key)).await;
    refused(&e, StatusCode::NOT_FOUND, "not-found");
    let e = spec.check("get", "/v1/refunds", api(&app, get.clone(), "/v1/refunds?payment=nope", &api_key)).await;
    refused(&e, StatusCode::BAD_REQUEST, "invalid-request");
    let e = spec.check("post", "/v1/refunds", refund(None, &body)).await;
    refused(&e, StatusCode::BAD_REQUEST, "idempotency-key-missing");
    let e =
        spec.check("post", "/v1/refunds", refund(Some(&new_key()), &json!({"payment": id, "amount": 10_000}))).await;
    refused(&e, StatusCode::CONFLICT, "refund-exceeds-payment");
    let pending = spec
        .check(
            "post",
            "/v1/payments",
            post(&app, &api_key, Some(&new_key())).json(&paying_with("pm_usBankAccount_success")),
        )
        .await;
    assert_eq!(pending.status, StatusCode::ACCEPTED);
    let pending = pending.json()["id"].as_str().unwrap().to_owned();
    let e = spec.check("post", "/v1/refunds", refund(Some(&new_key()), &json!({"payment": pending}))).await;
    refused(&e, StatusCode::CONFLICT, "payment-not-refundable");
    // Refunded outside payonce (as in Stripe's Dashboard): the gateway will not refund it again.
    let outside = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&new_key())).json(&payment(300))).await;
    assert_eq!(outside.status, StatusCode::CREATED);
    let outside_intent = outside.json()["payment_intent"].as_str().unwrap().to_owned();
    let direct = app
        .client
        .post(format!("{}v1/refunds", app.sim_url))
        .bearer_auth(crate::helpers::SIM_SECRET_KEY)
        .form(&[("payment_intent", outside_intent.as_str())])
        .send()
        .await
        .unwrap();
    assert!(direct.status().is_success(), "{:?}", direct.text().await);
    let outside = outside.json()["id"].as_str().unwrap().to_owned();
    let rejected_key = new_key();
    for _ in 0..2 {
        let e = spec.check("post", "/v1/refunds", refund(Some(&rejected_key), &json!({"payment": outside}))).await;
        refused(&e, StatusCode::BAD_GATEWAY, "refund-rejected");
    }
    app.set_faults(json!({"fail_rate": 1.0, "operations": ["create_refund"]})).await;
    let key = new_key();
    let body = json!({"payment": id, "amount": 100});
    let e = spec.check("post", "/v1/refunds", refund(Some(&key), &body)).await;
    refused(&e, StatusCode::SERVICE_UNAVAILABLE, "gateway-unavailable");
    let started = std::time::Instant::now();
    while app.database.key_state(&key).await.unwrap().0 == "processing" {
        assert!(started.elapsed() < Duration::from_secs(15), "the refund key was never given up");
        sweeper.sweep().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = spec.check("post", "/v1/refunds", refund(Some(&key), &body)).await;
    refused(&e, StatusCode::BAD_GATEWAY, "refund-abandoned");
    app.set_faults(json!({})).await;

    // Captures and cancels: an authorization (201 requires_capture) captured in part (200) and
    // replayed; more than authorized (400); settled twice (409); cancelled (200); the gateway down
    // (503), then the capture given up once the gateway shows the hold untouched (502).
    let settle = |action: &str, payment: &str, key: Option<&str>, body: &Value| {
        let path = format!("/v1/payments/{payment}/{action}");
        let request = api(&app, reqwest::Method::POST, &path, &api_key).json(body);
        match key {
            Some(key) => request.header("Idempotency-Key", key.to_owned()),
            None => request,
        }
    };
    let (capture, cancel) = ("/v1/payments/{id}/capture", "/v1/payments/{id}/cancel");
    let mut manual = payment(1_000);
    manual["capture"] = "manual".into();
    let authorize = async || {
        let held = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&new_key())).json(&manual)).await;
        assert_eq!((held.status, held.json()["status"].as_str()), (StatusCode::CREATED, Some("requires_capture")));
        held.json()["id"].as_str().unwrap().to_owned()
    };
    let held = authorize().await;
    let e =
        spec.check("post", capture, settle("capture", &held, Some(&new_key()), &json!({"amount_to_capture": 1_001})));
    refused(&e.await, StatusCode::BAD_REQUEST, "invalid-request");
    let e = spec.check("post", capture, settle("capture", &held, None, &json!({}))).await;
    refused(&e, StatusCode::BAD_REQUEST, "idempotency-key-missing");
    let capture_key = new_key();
    let part = json!({"amount_to_capture": 600});
    let captured = spec.check("post", capture, settle("capture", &held, Some(&capture_key), &part)).await;
    assert_eq!((captured.status, captured.json()["amount_captured"].as_i64()), (StatusCode::OK, Some(600)));
    let replay = spec.check("post", capture, settle("capture", &held, Some(&capture_key), &part)).await;
    assert_eq!((replay.status, replay.headers.contains_key("idempotent-replayed")), (StatusCode::OK, true));
    let e = spec.check("post", cancel, settle("cancel", &held, Some(&new_key()), &json!({}))).await;
    refused(&e, StatusCode::CONFLICT, "payment-not-capturable");
    let other = authorize().await;
    let canceled = spec.check("post", cancel, settle("cancel", &other, Some(&new_key()), &json!({}))).await;
    assert_eq!((canceled.status, canceled.json()["status"].as_str()), (StatusCode::OK, Some("canceled")));
    let third = authorize().await;
    app.set_faults(json!({"fail_rate": 1.0, "operations": ["capture_payment_intent"]})).await;
    let key = new_key();
    let e = spec.check("post", capture, settle("capture", &third, Some(&key), &json!({}))).await;
    refused(&e, StatusCode::SERVICE_UNAVAILABLE, "gateway-unavailable");
    let started = std::time::Instant::now();
    while app.database.key_state(&key).await.unwrap().0 == "processing" {
        assert!(started.elapsed() < Duration::from_secs(15), "the capture key was never given up");
        sweeper.sweep().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = spec.check("post", capture, settle("capture", &third, Some(&key), &json!({}))).await;
    refused(&e, StatusCode::BAD_GATEWAY, "settlement-abandoned");
    app.set_faults(json!({})).await;

    // The database too slow (503): a lock held past the lock timeout.
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("lock table idempotency_keys in access exclusive mode").execute(&mut *lock).await.unwrap();
    let e = spec.check("post", "/v1/payments", post(&app, &api_key, Some(&new_key())).json(&payment(100))).await;
    refused(&e, StatusCode::SERVICE_UNAVAILABLE, "service-unavailable");
    lock.rollback().await.unwrap();

    // Webhooks: a signed event (200), a delivery without or with a bad signature, one whose
    // object cannot be read (400).
    let event = |id: &str, object: Value| {
        json!({
            "id": id, "object": "event", "api_version": "2026-09-30.endive", "created": time::OffsetDateTime::now_utc().unix_timestamp(),
            "livemode": false, "pending_webhooks": 1, "type": "payment_intent.succeeded",
            "request": {"id": null, "idempotency_key": null}, "data": {"object": object},
        })
        .to_string()
    };
    let deliver = |body: String, signature: Option<String>| {
        let request =
            app.client.post(app.url("/webhooks/stripe")).header("content-type", "application/json").body(body);
        match signature {
            Some(signature) => request.header("stripe-signature", signature),
            None => request,
        }
    };
    let intent = created.json()["payment_intent"].as_str().unwrap().to_owned();
    let stored: Value = app
        .client
        .get(format!("{}v1/payment_intents/{intent}", app.sim_url))
        .bearer_auth(crate::helpers::SIM_SECRET_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let body = event("evt_openapi_1", stored);
    let signature = Webhook::generate_test_header(&body, WEBHOOK_SECRET, None);
    for _ in 0..2 {
        let e = spec.check("post", "/webhooks/stripe", deliver(body.clone(), Some(signature.clone()))).await;
        assert_eq!(e.status, StatusCode::OK, "{}", e.json());
    }
    let e = spec.check("post", "/webhooks/stripe", deliver(body.clone(), None)).await;
    refused(&e, StatusCode::BAD_REQUEST, "webhook-signature-invalid");
    let unreadable = event("evt_openapi_2", json!({"object": "payment_intent", "id": "pi_x", "amount": "lots"}));
    let signature = Webhook::generate_test_header(&unreadable, WEBHOOK_SECRET, None);
    let e = spec.check("post", "/webhooks/stripe", deliver(unreadable, Some(signature))).await;
    refused(&e, StatusCode::BAD_REQUEST, "webhook-unreadable");

    // The body that never came (408).
    let e = slow.await.unwrap();
    spec.check_exchange("post", "/v1/payments", &e);
    refused(&e, StatusCode::REQUEST_TIMEOUT, "request-timeout");

    // A server whose gateway refuses its key (503 gateway-refused) and that has no webhook
    // secret (503 webhooks-not-configured).
    let refusing =
        TestApp::spawn_with(Options { stripe_secret_key: "pk_test_not_a_secret_key", ..Default::default() }).await;
    let other_key = refusing.customer("acme").await;
    let e = spec.check("post", "/v1/payments", post(&refusing, &other_key, Some(&new_key())).json(&payment(100))).await;
    refused(&e, StatusCode::SERVICE_UNAVAILABLE, "gateway-refused");
    let e = spec
        .check(
            "post",
            "/webhooks/stripe",
            refusing.client.post(refusing.url("/webhooks/stripe")).header("stripe-signature", "t=1,v1=00").body("{}"),
        )
        .await;
    refused(&e, StatusCode::SERVICE_UNAVAILABLE, "webhooks-not-configured");

    // A server whose claim strategy is the lab's redis, and Redis gone once it runs (503
    // lock-service-unavailable): it reaches Redis through a relay that is then cut. Its /healthz
    // carries the lab strategy's warning.
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let links = Arc::new(std::sync::Mutex::new(Vec::<tokio::task::AbortHandle>::new()));
    let relaying = {
        let links = links.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = relay.accept().await {
                let link = tokio::spawn(async move {
                    if let Ok(mut redis) = tokio::net::TcpStream::connect("127.0.0.1:6379").await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut redis).await;
                    }
                });
                links.lock().unwrap().push(link.abort_handle());
            }
        })
    };
    let lockless = TestApp::spawn_with(Options {
        lab: payonce::lab::LabSettings {
            strategy: payonce::lab::Strategy::Redis,
            lab: true,
            redis_url: format!("redis://{relay_addr}"),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let health = spec.check("get", "/healthz", lockless.client.get(lockless.url("/healthz"))).await;
    assert!(health.json()["warning"].is_string(), "{}", health.json());
    let other_key = lockless.customer("acme").await;
    relaying.abort();
    let _ = relaying.await;
    for link in links.lock().unwrap().drain(..) {
        link.abort();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut e =
        spec.check("post", "/v1/payments", post(&lockless, &other_key, Some(&new_key())).json(&payment(100))).await;
    // The first command may only find the connection broken; the next finds nothing to reconnect to.
    for _ in 0..5 {
        if e.problem_slug().as_deref() == Some("lock-service-unavailable") {
            break;
        }
        e = spec.check("post", "/v1/payments", post(&lockless, &other_key, Some(&new_key())).json(&payment(100))).await;
    }
    refused(&e, StatusCode::SERVICE_UNAVAILABLE, "lock-service-unavailable");

    // Every operation exercised, every problem type seen: but `internal`, which no request can
    // produce, and `method-not-allowed`, which is the answer to a method no operation has (see
    // every_route_is_described_and_served).
    let exercised: BTreeSet<(String, String)> =
        spec.seen.lock().unwrap().iter().map(|(m, p, _)| (m.clone(), p.clone())).collect();
    assert_eq!(exercised, spec.operations(), "operations never exercised");
    let seen = spec.problems.lock().unwrap().clone();
    let expected: BTreeSet<String> = problem::TYPES
        .iter()
        .filter(|t| !["internal", "method-not-allowed"].contains(&t.slug))
        .map(|t| t.slug.to_owned())
        .collect();
    assert_eq!(seen, expected, "problem types never produced");
    let by_status: BTreeMap<u16, usize> =
        spec.seen.lock().unwrap().iter().fold(BTreeMap::new(), |mut acc, (_, _, s)| {
            *acc.entry(*s).or_default() += 1;
            acc
        });
    for status in [200, 201, 202, 400, 401, 402, 404, 408, 409, 413, 415, 422, 502, 503] {
        assert!(by_status.contains_key(&status), "no {status} was checked: {by_status:?}");
    }
}

/// The paths an axum router routes. axum has no API that lists them, but its `Router`'s `Debug`
/// names each (`RouteId(3): "/v1/payments/{id}"`): read from there, so that a route added
/// anywhere in the application is seen.
fn routed_paths(router: &axum::Router) -> BTreeSet<String> {
    let debug = format!("{router:?}");
    let mut paths = BTreeSet::new();
    let mut rest = debug.as_str();
    while let Some(at) = rest.find("RouteId(") {
        rest = &rest[at + "RouteId(".len()..];
        if let Some(quoted) = rest.split_once("): \"").map(|(_, after)| after)
            && let Some((path, _)) = quoted.split_once('"')
            && !path.contains("__private__axum")
            && rest.find("): \"").is_some_and(|i| rest[..i].bytes().all(|b| b.is_ascii_digit()))
        {
            paths.insert(path.to_owned());
        }
    }
    paths
}

/// The pages, which a person reads: not part of the API's description.
fn is_page(path: &str) -> bool {
    path == "/" || ["/admin", "/shop/", "/assets/"].iter().any(|prefix| path.starts_with(prefix))
}

/// Every route the application serves is in the description, and every one described is served
/// (the pages aside): the same paths, and no method served that is not described (any other
/// method is a 405).
#[tokio::test]
async fn every_route_is_described_and_served() {
    use payonce::customers::Authenticator;
    use payonce::gateway::Gateway;
    use payonce::idempotency::{Engine, EngineSettings, EventLog};
    use payonce::state::{AppState, Services};
    use tower::ServiceExt;

    // A state that connects to nothing: only routing is looked at (a 405 runs no handler).
    let pool = sqlx::PgPool::connect_lazy("postgres://nobody@127.0.0.1:9/none").unwrap();
    let (events, _writer) = EventLog::spawn(pool.clone());
    let gateway = Gateway::new("sk_test_routes", Some("http://127.0.0.1:9/"), Duration::from_secs(1)).unwrap();
    let state = AppState::new(Services {
        engine: Engine::new(pool.clone(), EngineSettings::default(), events),
        owner: Arc::from("test"),
        metrics: payonce::metrics::install(),
        auth: Arc::new(Authenticator::new(pool.clone())),
        reads: payonce::db::Reads::primary(pool),
        web: payonce::web::WebState::new(Default::default(), gateway.base_url()),
        operations: payonce::operations::registry(&gateway),
        gateway,
        webhook_secret: None,
        // Not in lab mode: the lab's routes are not served, nor described (http::openapi).
        lab: Arc::new(payonce::lab::Lab::new(Default::default())),
    });
    let router = payonce::app::router(state, false);
    let (_, openapi) = payonce::http::api().split_for_parts();
    let doc = payonce::http::openapi::Spec::new(openapi).0;

    let routed = routed_paths(&router);
    assert!(routed.contains("/v1/payments") && routed.contains("/admin/login"), "routes not read: {routed:?}");
    let api: BTreeSet<String> = routed.into_iter().filter(|path| !is_page(path)).collect();
    let described: BTreeSet<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(api, described, "the API's routes and the description's paths differ");

    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path.replace("{id}", "pay_0");
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            if item.get(method.to_ascii_lowercase()).is_some() {
                continue;
            }
            let request =
                axum::http::Request::builder().method(method).uri(&concrete).body(axum::body::Body::empty()).unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is served but not described"
            );
        }
    }
}
