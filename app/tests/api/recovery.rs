//! Gateway failures, slow workers and leases: nothing is lost, nothing is charged twice.

use std::time::Duration;

use payonce::sweeper::SweeperSettings;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Options, TestApp, assert_problem, new_key, parts, payment};

/// The key's state, recovery point, token, attempts and whether its lease is live.
async fn key_row(app: &TestApp, key: &str) -> (String, String, i64, i32, bool) {
    sqlx::query_as(
        "select state, recovery_point, lease_token, attempts, coalesce(locked_until > now(), false)
         from idempotency_keys where key = $1",
    )
    .bind(key)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Gateway down: 503 + Retry-After, the key released at `payment_created`; the retry with the
/// same key resumes and charges once.
#[tokio::test]
async fn gateway_down_then_retry_charges_once() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"fail_rate": 1.0})).await;

    let response = app.post_payment(&api_key, Some(&key), &payment(300)).send().await.unwrap();
    // No backoff in this test server: the key may be tried again at once, and Retry-After is
    // never zero.
    assert_eq!(response.headers()["retry-after"], "1");
    let problem = assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "gateway-unavailable").await;
    assert_eq!(problem["retry_after"], 1);
    assert_eq!(key_row(&app, &key).await, ("processing".into(), "payment_created".into(), 1, 1, false));
    assert!(app.charges().await.is_empty());

    app.set_faults(json!({})).await;
    let (status, headers, body) =
        parts(app.post_payment(&api_key, Some(&key), &payment(300)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none(), "the retry did the work itself");
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], body["payment_intent"]);
    assert_eq!(key_row(&app, &key).await, ("completed".into(), "finished".into(), 2, 2, false));
    assert_eq!(app.count("payments").await, 1, "the retry reused the payment created by the first attempt");
    let kinds = app.event_kinds(&key).await;
    assert_eq!(kinds, ["claimed", "payment_created", "released", "reclaimed", "completed"]);
}

/// The gateway charged but its response was lost: 503, then the retry gets the same
/// PaymentIntent back from the gateway (same downstream key) and completes with one charge.
#[tokio::test]
async fn charged_but_response_lost_is_recovered_without_a_second_charge() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1})).await;

    let response = app.post_payment(&api_key, Some(&key), &payment(800)).send().await.unwrap();
    assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "gateway-unavailable").await;
    let charged = app.charges_for(&key).await;
    assert_eq!(charged.len(), 1, "the gateway did charge");

    let (status, _, body) = parts(app.post_payment(&api_key, Some(&key), &payment(800)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body["payment_intent"], charged[0]["payment_intent"]);
    assert_eq!(app.charges_for(&key).await.len(), 1);
}

/// The gateway is slower than payonce's deadline (and charges anyway): 503s until the gateway
/// has settled, then one charge and a 201.
#[tokio::test]
async fn gateway_timeout_then_retry_charges_once() {
    let app = TestApp::spawn_with(Options { gateway_timeout: Duration::from_secs(1), ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"timeout_rate": 1.0, "timeout_hold_ms": 1500, "next_calls": 1})).await;

    let response = app.post_payment(&api_key, Some(&key), &payment(800)).send().await.unwrap();
    let problem = assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "gateway-unavailable").await;
    assert!(problem["detail"].as_str().unwrap().contains("did not answer"), "{problem}");

    let mut answers = Vec::new();
    let body = loop {
        let (status, _, body) =
            parts(app.post_payment(&api_key, Some(&key), &payment(800)).send().await.unwrap()).await;
        answers.push(status);
        match status {
            StatusCode::CREATED => break body,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT if answers.len() < 20 => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            other => panic!("unexpected {other} after {answers:?}: {body}"),
        }
    };
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1, "answers: {answers:?}");
    assert_eq!(charges[0]["payment_intent"], body["payment_intent"]);
}

/// A duplicate while the first request is in flight: 409 with a Retry-After from the lease
/// (capped by the gateway timeout); then the first answers 201 and the duplicate's retry is
/// replayed.
#[tokio::test]
async fn duplicate_in_flight_is_409_with_retry_after() {
    let app = TestApp::spawn_with(Options { lease: Duration::from_secs(30), ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"latency_ms": 1500})).await;

    // `send()` owns what it needs: the first request runs on its own while the test goes on.
    let first = tokio::spawn(app.post_payment(&api_key, Some(&key), &payment(100)).send());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let response = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    // The lease has ~30 s left, but the holder answers or gives up within the 10 s gateway timeout.
    assert_eq!(retry_after, 10, "Retry-After is the lease's remaining time, capped by the gateway timeout");
    let problem = assert_problem(response, StatusCode::CONFLICT, "idempotency-key-in-use").await;
    assert_eq!(problem["retry_after"], retry_after);

    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    let replay = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(app.charges_for(&key).await.len(), 1);
    assert!(
        app.event_kinds_once(&key, |kinds| kinds.iter().any(|k| k == "conflict"))
            .await
            .contains(&"conflict".to_owned())
    );
}

/// A worker presumed dead while its gateway call is still running (its lease expired) cannot
/// double charge: the retry reclaims the key with a new token, the old worker's write is fenced
/// off, and both end up with the one PaymentIntent the gateway made.
#[tokio::test]
async fn a_worker_presumed_dead_cannot_double_charge() {
    let app = TestApp::spawn_with(Options { lease: Duration::from_secs(30), ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"latency_ms": 1000})).await;

    let first = tokio::spawn(app.post_payment(&api_key, Some(&key), &payment(100)).send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Pretend the first worker stopped heartbeating long ago.
    sqlx::query("update idempotency_keys set locked_until = now() - interval '1 second' where key = $1")
        .bind(&key)
        .execute(&app.db)
        .await
        .unwrap();
    let second = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    // The gateway is still executing the first call under the same downstream key.
    assert_problem(second, StatusCode::SERVICE_UNAVAILABLE, "gateway-unavailable").await;

    let (status, _, body) = parts(first.await.unwrap().unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], body["payment_intent"]);
    let (state, _, token, _, _) = key_row(&app, &key).await;
    assert_eq!(state, "completed");
    assert!(token >= 3, "reclaimed by the retry, then by the first worker after losing its lease: {token}");
    let kinds = app.event_kinds(&key).await;
    assert!(kinds.contains(&"lease_lost".to_owned()), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| *k == "reclaimed").count(), 2, "{kinds:?}");
}

/// A gateway call longer than the lease keeps its lease by heartbeat: a duplicate arriving after
/// the original lease would have run out is still told "in flight", and the sweeper, passing
/// every 100 ms, never takes the key over.
#[tokio::test]
async fn heartbeat_keeps_a_slow_call_leased() {
    let sweeper = SweeperSettings { interval: Duration::from_millis(100), ..SweeperSettings::default() };
    let app = TestApp::spawn_with(Options { lease: Duration::from_secs(1), sweeper, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"latency_ms": 2500})).await;

    let first = tokio::spawn(app.post_payment(&api_key, Some(&key), &payment(100)).send());
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let duplicate = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    assert_eq!(duplicate.headers()["retry-after"], "1", "the remaining lease: under a second, rounded up");

    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(app.charges_for(&key).await.len(), 1);
    let kinds = app.event_kinds(&key).await;
    assert!(!kinds.contains(&"reclaimed".to_owned()), "{kinds:?}");
}
