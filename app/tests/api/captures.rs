//! Authorize now, capture later: `"capture": "manual"`, then `POST /v1/payments/{id}/capture` or
//! `/cancel`, two more idempotent operations with the payment's contract (replay, 409, 422,
//! crash resumption, unknown outcomes resolved by asking), Stripe's refusals, the webhooks, and
//! the invariant no key gives: however many keys settle one authorization at once, at most one
//! capture or one cancel. Every test asserts the database and the gateway's ledger.

use std::sync::Arc;
use std::time::Duration;

use payonce::simulator;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::crash::{KillPoint, kill_during_request};
use crate::helpers::{Ledger, ServerProcess, TestApp, TestDatabase, assert_problem, new_key, parts, payment};

/// An authorized payment of `amount` (`"capture": "manual"`); returns its body.
async fn authorized(app: &TestApp, api_key: &str, amount: i64) -> Value {
    let mut body = payment(amount);
    body["capture"] = "manual".into();
    let (status, _, paid) = parts(app.post_payment(api_key, Some(&new_key()), &body).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    paid
}

/// `POST /v1/payments/{payment}/{action}` under `key`.
fn settle(
    app: &TestApp,
    api_key: &str,
    key: &str,
    payment: &str,
    action: &str,
    body: &Value,
) -> reqwest::RequestBuilder {
    app.client
        .post(app.url(&format!("/v1/payments/{payment}/{action}")))
        .bearer_auth(api_key)
        .header("Idempotency-Key", key)
        .json(body)
}

/// The payment's (status, amount_capturable, amount_captured, settlement) in the database.
async fn row(db: &sqlx::PgPool, payment: &str) -> (String, i64, i64, Option<String>) {
    let id = uuid::Uuid::try_parse(payment.strip_prefix("pay_").unwrap()).unwrap();
    sqlx::query_as("select status, amount_capturable, amount_captured, settlement from payments where id = $1")
        .bind(id)
        .fetch_one(db)
        .await
        .unwrap()
}

/// The authorization moves no money; its capture does, once: 200 with the payment, a replay byte
/// for byte, another amount under the same key 422, the ledger's one charge of what was captured,
/// and refunds of what was captured only.
#[tokio::test]
async fn an_authorization_its_capture_and_the_replay() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let paid = authorized(&app, &api_key, 10_000).await;
    let pay = paid["id"].as_str().unwrap();
    assert_eq!((paid["status"].as_str(), paid["capture"].as_str()), (Some("requires_capture"), Some("manual")));
    assert_eq!((paid["amount_capturable"].as_i64(), paid["amount_captured"].as_i64()), (Some(10_000), Some(0)));
    assert!(app.ledger.charges().await.is_empty(), "an authorization moves no money");
    // Nothing captured, nothing to refund.
    let refund = json!({"payment": pay, "amount": 100});
    let early = app.post_refund(&api_key, Some(&new_key()), &refund).send().await.unwrap();
    assert_problem(early, StatusCode::CONFLICT, "payment-not-refundable").await;

    let key = new_key();
    let first =
        settle(&app, &api_key, &key, pay, "capture", &json!({"amount_to_capture": 6_000})).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let bytes = first.bytes().await.unwrap();
    let captured: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(captured["status"], "succeeded");
    assert_eq!((captured["amount_captured"].as_i64(), captured["amount_capturable"].as_i64()), (Some(6_000), Some(0)));
    assert_eq!(row(&app.db, pay).await, ("succeeded".into(), 0, 6_000, Some("capture".into())));
    assert_eq!(app.event_kinds(&key).await, ["claimed", "capture_requested", "completed"]);

    let charges = app.ledger.charges().await;
    assert_eq!(charges.len(), 1, "one capture, one movement of money");
    assert_eq!((charges[0]["amount"].as_i64(), &charges[0]["payment_intent"]), (Some(6_000), &paid["payment_intent"]));

    let replay =
        settle(&app, &api_key, &key, pay, "capture", &json!({"amount_to_capture": 6_000})).send().await.unwrap();
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), bytes);
    let other =
        settle(&app, &api_key, &key, pay, "capture", &json!({"amount_to_capture": 5_000})).send().await.unwrap();
    assert_problem(other, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert_eq!(app.ledger.charges().await.len(), 1);

    // A second capture under another key: the authorization is settled.
    let again = settle(&app, &api_key, &new_key(), pay, "capture", &json!({})).send().await.unwrap();
    let problem = assert_problem(again, StatusCode::CONFLICT, "payment-not-capturable").await;
    assert_eq!(problem["payment_status"], "succeeded", "{problem}");
    // Refunds: at most what was captured (6 000 of the 10 000 authorized).
    let over = app.post_refund(&api_key, Some(&new_key()), &json!({"payment": pay, "amount": 6_001})).send().await;
    assert_problem(over.unwrap(), StatusCode::CONFLICT, "refund-exceeds-payment").await;
    let all = app.post_refund(&api_key, Some(&new_key()), &json!({"payment": pay, "amount": 6_000})).send().await;
    assert_eq!(all.unwrap().status(), StatusCode::CREATED);
    assert_eq!(app.ledger.refunds().await.len(), 1);
}

/// A cancel releases the hold: 200 canceled, no money moved; a capture after it is 409 and is
/// never sent; so is a cancel of a payment that was never an authorization.
#[tokio::test]
async fn a_cancel_and_what_it_closes() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let pay = authorized(&app, &api_key, 4_000).await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let (status, _, canceled) =
        parts(settle(&app, &api_key, &key, &pay, "cancel", &json!({})).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{canceled}");
    assert_eq!((canceled["status"].as_str(), canceled["amount_capturable"].as_i64()), (Some("canceled"), Some(0)));
    assert_eq!(row(&app.db, &pay).await, ("canceled".into(), 0, 0, Some("cancel".into())));
    assert_eq!(app.event_kinds(&key).await, ["claimed", "cancel_requested", "completed"]);

    let capture = settle(&app, &api_key, &new_key(), &pay, "capture", &json!({})).send().await.unwrap();
    let problem = assert_problem(capture, StatusCode::CONFLICT, "payment-not-capturable").await;
    assert_eq!(problem["payment_status"], "canceled");
    assert!(app.ledger.charges().await.is_empty(), "no money moved");
    let refund = app.post_refund(&api_key, Some(&new_key()), &json!({"payment": pay, "amount": 1})).send().await;
    assert_problem(refund.unwrap(), StatusCode::CONFLICT, "payment-not-refundable").await;

    // An automatic payment was never an authorization; an unknown one is not found.
    let (_, _, automatic) =
        parts(app.post_payment(&api_key, Some(&new_key()), &payment(500)).send().await.unwrap()).await;
    let cancel = settle(&app, &api_key, &new_key(), automatic["id"].as_str().unwrap(), "cancel", &json!({}));
    assert_problem(cancel.send().await.unwrap(), StatusCode::CONFLICT, "payment-not-capturable").await;
    let unknown = settle(&app, &api_key, &new_key(), "pay_0190a6f4d0c27c4e8a4b6f1e2d3c4b5a", "capture", &json!({}));
    assert_problem(unknown.send().await.unwrap(), StatusCode::NOT_FOUND, "not-found").await;
    assert_eq!(app.ledger.charges().await.len(), 1, "the automatic payment's, only");
}

/// More than was authorized is a 400 that uses no key: the same key then captures what may be.
#[tokio::test]
async fn over_capture_is_refused_before_the_gateway() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let pay = authorized(&app, &api_key, 3_000).await["id"].as_str().unwrap().to_owned();
    let key = new_key();
    let over = settle(&app, &api_key, &key, &pay, "capture", &json!({"amount_to_capture": 3_001})).send().await;
    let problem = assert_problem(over.unwrap(), StatusCode::BAD_REQUEST, "invalid-request").await;
    assert!(problem["detail"].as_str().unwrap().contains("at most 3000"), "{problem}");
    let zero = settle(&app, &api_key, &key, &pay, "capture", &json!({"amount_to_capture": 0})).send().await;
    assert_problem(zero.unwrap(), StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(app.count("idempotency_keys where route like '%capture'").await, 0, "the key was not used");
    let exact = settle(&app, &api_key, &key, &pay, "capture", &json!({"amount_to_capture": 3_000})).send().await;
    assert_eq!(exact.unwrap().status(), StatusCode::OK);
    assert_eq!(app.ledger.charges().await.len(), 1);
}

/// Twenty keys at the same instant, ten capturing and ten cancelling one authorization, the
/// gateway slow: one wins (decided by PostgreSQL under the payment's row lock), nineteen get 409
/// without using their key, and the gateway saw one settlement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_keys_racing_settle_an_authorization_once() {
    let app = Arc::new(TestApp::spawn().await);
    let api_key = app.customer("acme").await;
    let pay = authorized(&app, &api_key, 8_000).await["id"].as_str().unwrap().to_owned();
    app.set_faults(json!({"latency_ms": 200, "operations": ["capture_payment_intent", "cancel_payment_intent"]})).await;
    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (app, api_key, pay, barrier) = (app.clone(), api_key.clone(), pay.clone(), barrier.clone());
            tokio::spawn(async move {
                let action = if i % 2 == 0 { "capture" } else { "cancel" };
                let request = settle(&app, &api_key, &new_key(), &pay, action, &json!({}));
                barrier.wait().await;
                let (status, _, body) = parts(request.send().await.unwrap()).await;
                (action, status, body)
            })
        })
        .collect();
    let mut won = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (action, StatusCode::OK, body) => won.push((action, body["status"].as_str().unwrap().to_owned())),
            (_, StatusCode::CONFLICT, body) => {
                assert_eq!(body["type"], "https://payonce.dev/problems/payment-not-capturable", "{body}")
            }
            (_, status, body) => panic!("unexpected answer {status}: {body}"),
        }
    }
    assert_eq!(won.len(), 1, "one settlement: {won:?}");
    let (action, status) = &won[0];
    let (db_status, _, captured, settlement) = row(&app.db, &pay).await;
    assert_eq!((db_status.as_str(), settlement.as_deref()), (status.as_str(), Some(*action)));
    let charges = app.ledger.charges().await;
    match *action {
        "capture" => assert_eq!((charges.len(), captured), (1, 8_000)),
        _ => assert_eq!((charges.len(), captured), (0, 0)),
    }
    let used = app.count("idempotency_keys where route like '/v1/payments/{id}/%'").await;
    assert_eq!(used, 1, "the losers used no key");
}

/// An authorization that expired at the gateway (Stripe cancels it after about seven days):
/// the capture is refused there, payonce asks what the PaymentIntent is, records it canceled and
/// answers 409 as a final answer; the client's retry gets the same.
#[tokio::test]
async fn a_capture_of_an_expired_authorization() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let paid = authorized(&app, &api_key, 2_500).await;
    let (pay, intent) = (paid["id"].as_str().unwrap(), paid["payment_intent"].as_str().unwrap());
    app.ledger.control(&format!("payment_intents/{intent}/expire_authorization"), json!({})).await;

    let key = new_key();
    let response = settle(&app, &api_key, &key, pay, "capture", &json!({})).send().await.unwrap();
    let problem = assert_problem(response, StatusCode::CONFLICT, "payment-not-capturable").await;
    assert_eq!(problem["payment_status"], "canceled", "{problem}");
    assert_eq!(row(&app.db, pay).await.0, "canceled");
    assert!(app.event_kinds(&key).await.contains(&"reconciled".to_owned()), "it asked the gateway");
    let replay = settle(&app, &api_key, &key, pay, "capture", &json!({})).send().await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_problem(replay, StatusCode::CONFLICT, "payment-not-capturable").await;
    assert!(app.ledger.charges().await.is_empty());
}

/// Unknown is not failure: the capture's answer is lost after the gateway captured. The client
/// gets 503 + Retry-After, the key keeps its settlement, and the retry (the same downstream key)
/// gets the gateway's saved capture: one movement of money, 200.
#[tokio::test]
async fn a_lost_capture_answer_is_asked_again_not_repeated() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let pay = authorized(&app, &api_key, 7_000).await["id"].as_str().unwrap().to_owned();
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1, "operations": ["capture_payment_intent"]}))
        .await;
    let key = new_key();
    let lost = settle(&app, &api_key, &key, &pay, "capture", &json!({})).send().await.unwrap();
    assert_eq!(lost.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(lost.headers().contains_key("retry-after"));
    assert_eq!(app.ledger.charges().await.len(), 1, "the gateway captured");
    assert_eq!(row(&app.db, &pay).await, ("requires_capture".into(), 7_000, 0, Some("capture".into())));
    // Meanwhile nobody else may settle it.
    let cancel = settle(&app, &api_key, &new_key(), &pay, "cancel", &json!({})).send().await.unwrap();
    assert_problem(cancel, StatusCode::CONFLICT, "payment-not-capturable").await;

    let retry = settle(&app, &api_key, &key, &pay, "capture", &json!({})).send().await.unwrap();
    let (status, _, body) = parts(retry).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("succeeded")), "{body}");
    assert_eq!(app.ledger.charges().await.len(), 1, "asked again, not captured again");
    assert_eq!(row(&app.db, &pay).await, ("succeeded".into(), 0, 7_000, Some("capture".into())));
}

/// A capture made outside payonce (Stripe's Dashboard) reaches payonce by webhook: the payment
/// is succeeded with what was captured, and a capture through payonce is then 409.
#[tokio::test]
async fn a_capture_made_at_the_gateway_arrives_by_webhook() {
    let app = TestApp::spawn_with(crate::helpers::Options { builtin_simulator: true, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let paid = authorized(&app, &api_key, 5_000).await;
    let (pay, intent) = (paid["id"].as_str().unwrap(), paid["payment_intent"].as_str().unwrap());
    let captured = app
        .client
        .post(format!("{}v1/payment_intents/{intent}/capture", app.sim_url))
        // The built-in simulator's objects belong to the key payonce charges with.
        .bearer_auth("sk_test_payonce_simulator")
        .form(&[("amount_to_capture", "1200")])
        .send()
        .await
        .unwrap();
    let (status, _, intent_now) = parts(captured).await;
    assert_eq!(status, StatusCode::OK, "{intent_now}");
    let started = std::time::Instant::now();
    while row(&app.db, pay).await.0 != "succeeded" {
        assert!(started.elapsed() < Duration::from_secs(10), "no webhook applied: {:?}", row(&app.db, pay).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(row(&app.db, pay).await, ("succeeded".into(), 0, 1_200, None));
    let capture = settle(&app, &api_key, &new_key(), pay, "capture", &json!({})).send().await.unwrap();
    assert_problem(capture, StatusCode::CONFLICT, "payment-not-capturable").await;
    let refund = app.post_refund(&api_key, Some(&new_key()), &json!({"payment": pay, "amount": 1_201})).send().await;
    assert_problem(refund.unwrap(), StatusCode::CONFLICT, "refund-exceeds-payment").await;
}

/// A server killed with SIGKILL while the gateway captures; a fresh one finishes the capture
/// alone (the sweeper resumes the key at `capture_requested`): one movement of money, and the
/// client's retry gets the replay.
#[tokio::test]
async fn killed_during_the_capture_call() {
    let db = TestDatabase::create().await;
    let sim = simulator::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let ledger = Ledger::new(&sim.base_url());
    let timing = [("PAYONCE_LEASE_SECS", "2"), ("PAYONCE_SWEEP_INTERVAL_SECS", "0.5")];
    let mut first = ServerProcess::start(&db.url, &sim.base_url(), &timing).await;
    let api_key = db.customer("crash").await;
    let client = reqwest::Client::new();
    let mut body = payment(4_200);
    body["capture"] = "manual".into();
    let paid = client
        .post(first.url("/v1/payments"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", new_key())
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, _, paid) = parts(paid).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    let pay = paid["id"].as_str().unwrap();
    ledger.set_faults(json!({"latency_ms": 1500, "next_calls": 1, "operations": ["capture_payment_intent"]})).await;
    let key = new_key();
    let path = format!("/v1/payments/{pay}/capture");
    let capture = json!({"amount_to_capture": 4_000});
    kill_during_request(
        &mut first,
        &db,
        KillPoint::DuringGatewayCall,
        "capture_requested",
        (&api_key, &path, &key, &capture),
    )
    .await;

    let second = ServerProcess::start(&db.url, &sim.base_url(), &timing).await;
    db.wait_until_final(&key, Duration::from_secs(20)).await;
    let (state, point, token, _) = db.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), point.as_str()), ("completed", "finished"));
    assert!(token >= 2, "finished under a new lease");
    let charges = ledger.charges().await;
    assert_eq!(charges.len(), 1, "exactly one capture");
    assert_eq!(charges[0]["amount"], 4_000);
    assert_eq!(row(&db.pool, pay).await, ("succeeded".into(), 0, 4_000, Some("capture".into())));

    let retry =
        client.post(second.url(&path)).bearer_auth(&api_key).header("Idempotency-Key", &key).json(&capture).send();
    let (status, headers, body) = parts(retry.await.unwrap()).await;
    assert_eq!((status, body["amount_captured"].as_i64()), (StatusCode::OK, Some(4_000)), "{body}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(ledger.charges().await.len(), 1);
}

/// The dashboard tells an authorization's truth: the payment page says what was captured of it
/// and offers to refund only that; a capture key's page shows the payment it settled.
#[tokio::test]
async fn the_dashboard_shows_what_was_captured() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let pay = authorized(&app, &api_key, 10_000).await["id"].as_str().unwrap().to_owned();
    crate::browser::create_admin(&app).await;
    let client = crate::helpers::browser_client();
    crate::admin::sign_in(&app, &client).await;
    let page = |path: String| {
        let client = client.clone();
        let url = app.url(&path);
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let held = page(format!("/admin/payments/{pay}")).await;
    assert!(held.contains("Authorized, not captured: 100.00 USD held"), "{held}");
    assert!(held.contains("nothing was captured, so nothing can be refunded"), "{held}");

    let key = new_key();
    let captured = settle(&app, &api_key, &key, &pay, "capture", &json!({"amount_to_capture": 6_000})).send().await;
    assert_eq!(captured.unwrap().status(), StatusCode::OK);
    let shown = page(format!("/admin/payments/{pay}")).await;
    assert!(shown.contains("60.00 USD of 100.00 USD authorized"), "{shown}");
    let remaining = shown.split("id=\"amount-remaining\">").nth(1).unwrap();
    assert!(remaining.starts_with("60.00 USD<"), "refundable is what was captured: {remaining:.40}");
    let key_id: uuid::Uuid = sqlx::query_scalar("select settled_by from payments").fetch_one(&app.db).await.unwrap();
    let key_page = page(format!("/admin/keys/{key_id}")).await;
    assert!(key_page.contains("The payment it settles") && key_page.contains(&pay), "{key_page}");
    assert!(key_page.contains("60.00 USD (of 100.00 USD authorized)"), "{key_page}");
    assert!(key_page.contains("capture_requested"), "its timeline: {key_page}");
}
