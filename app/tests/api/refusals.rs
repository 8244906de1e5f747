//! payonce's own mistakes (a wrong base URL, a wrong secret key) are never stored as the
//! customer's outcome: the key stays resumable, and once the configuration is fixed the same
//! key charges once.

use std::time::{Duration, Instant};

use payonce::simulator;
use reqwest::StatusCode;

use crate::admin::sign_in;
use crate::browser::create_admin;
use crate::helpers::{
    Ledger, Options, ServerProcess, TestApp, TestDatabase, assert_problem, browser_client, new_key, parts, payment,
};

/// Finding 4: with STRIPE_API_BASE ending in `/v1`, the gateway answers "Unrecognized request
/// URL" (404). That is payonce's configuration: 503, nothing stored, the key not burnt; after a
/// restart with the right URL the same key charges once.
#[tokio::test]
async fn a_misconfigured_base_url_burns_no_key() {
    let db = TestDatabase::create().await;
    let sim = simulator::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let ledger = Ledger::new(&sim.base_url());
    let wrong = format!("{}v1", sim.base_url());
    let server = ServerProcess::start(&db.url, &wrong, &[]).await;
    let api_key = db.customer("acme").await;
    let key = new_key();
    let client = reqwest::Client::new();
    let pay = |server: &ServerProcess| {
        client
            .post(server.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", &key)
            .json(&payment(500))
    };

    let (status, headers, problem) = parts(pay(&server).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
    assert_eq!(problem["type"], "https://payonce.dev/problems/gateway-refused");
    assert!(headers.contains_key("retry-after"));
    let (state, recovery_point, ..) = db.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), recovery_point.as_str()), ("processing", "payment_created"), "not burnt");
    let stored: Option<i16> =
        sqlx::query_scalar("select response_status from idempotency_keys").fetch_one(&db.pool).await.unwrap();
    assert_eq!(stored, None, "nothing stored as the customer's outcome");
    let payment_status: String = sqlx::query_scalar("select status from payments").fetch_one(&db.pool).await.unwrap();
    assert_eq!(payment_status, "pending");
    assert!(ledger.charges().await.is_empty());
    drop(server);

    let server = ServerProcess::start(&db.url, &sim.base_url(), &[]).await;
    let started = Instant::now();
    let body = loop {
        let (status, headers, body) = parts(pay(&server).send().await.unwrap()).await;
        match status {
            StatusCode::CREATED => break body,
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => {
                let wait: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            other => panic!("{other}: {body}"),
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the fixed server never charged");
    };
    let charges = ledger.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], body["payment_intent"]);
    assert_eq!(db.count("payments").await, 1, "the same payment, resumed");
}

/// A wrong secret key (401) is payonce's fault too: 503 `gateway-refused` with Retry-After,
/// nothing stored, a `refused` event with the gateway's message, the refusal metric, and a
/// banner on every dashboard page (read from the database, so every server shows it).
#[tokio::test]
async fn a_wrong_secret_key_is_reported_to_operators_not_stored() {
    let app =
        TestApp::spawn_with(Options { stripe_secret_key: "pk_test_not_a_secret_key", ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();

    let response = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert!(response.headers().contains_key("retry-after"));
    let problem = assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "gateway-refused").await;
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("payonce's own configuration") && detail.contains("same key"), "{problem}");
    assert!(!detail.contains("pk_test"), "the gateway's message stays with the operators: {problem}");
    let (state, recovery_point, ..) = app.database.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), recovery_point.as_str()), ("processing", "payment_created"));
    assert!(app.charges().await.is_empty());
    let refused: serde_json::Value = sqlx::query_scalar("select detail from idempotency_events where kind = 'refused'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!((refused["reason"].as_str(), refused["status"].as_i64()), (Some("authentication"), Some(401)));
    assert!(refused["message"].as_str().unwrap().starts_with("Invalid API Key provided"), "{refused}");

    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("payonce_gateway_refusals_total{reason=\"authentication\"}"), "{metrics}");

    create_admin(&app).await;
    let client = browser_client();
    sign_in(&app, &client).await;
    for page in ["/admin", "/admin/keys"] {
        let html = client.get(app.url(page)).send().await.unwrap().text().await.unwrap();
        assert!(html.contains("id=\"refusal-banner\""), "{page}: no banner");
        assert!(html.contains("Invalid API Key provided"), "{page}: the gateway's message");
    }
}

/// Finding 7: since API version 2023-08-16, Stripe refuses a confirmation with neither
/// `payment_method_types` nor `automatic_payment_methods[allow_redirects]=never` unless it has a
/// `return_url` (the simulator models the rule). payonce turns redirects off on every create, so
/// a card payment charges, and its PaymentIntent says so.
#[tokio::test]
async fn every_create_turns_redirect_payment_methods_off() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let (status, _, body) = parts(app.post_payment(&api_key, Some(&key), &payment(800)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let intent: serde_json::Value = app
        .client
        .get(format!("{}v1/payment_intents/{}", app.sim_url, body["payment_intent"].as_str().unwrap()))
        .bearer_auth(crate::helpers::SIM_SECRET_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(intent["automatic_payment_methods"], serde_json::json!({"enabled": true, "allow_redirects": "never"}));
    assert_eq!(app.charges_for(&key).await.len(), 1);
}
