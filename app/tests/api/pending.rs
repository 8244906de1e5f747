//! Pending is not a decline: a PaymentIntent that is `processing` (a bank debit) or
//! `requires_action` (3-D Secure) is answered 202 with its real status, and moves on later, by
//! its webhook or, when every delivery is lost, by reconciliation. Never backwards.

use std::time::{Duration, Instant};

use payonce::idempotency::{Backoff, Budget};
use payonce::sweeper::SweeperSettings;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::admin::sign_in;
use crate::browser::create_admin;
use crate::helpers::{Options, TestApp, browser_client, new_key, parts};

/// The dashboard's page of the (only) key, as a signed-in operator sees it.
async fn key_page(app: &TestApp) -> String {
    create_admin(app).await;
    let client = browser_client();
    sign_in(app, &client).await;
    let id: uuid::Uuid = sqlx::query_scalar("select id from idempotency_keys").fetch_one(&app.db).await.unwrap();
    client.get(app.url(&format!("/admin/keys/{id}"))).send().await.unwrap().text().await.unwrap()
}

/// The built-in simulator (so the server registers its own webhook endpoint at startup), its
/// sweeper passing every 100 ms, and pending payments looked up within 200 ms.
async fn app() -> TestApp {
    app_looking_up_after(Duration::from_millis(50)).await
}

/// The same, with pending payments first looked up `first_look_up` after their answer.
pub(crate) async fn app_looking_up_after(first_look_up: Duration) -> TestApp {
    let budget = Budget {
        backoff: Backoff { base: first_look_up, cap: Duration::from_millis(200).max(first_look_up) },
        pending_cap: Duration::from_millis(200).max(first_look_up),
        ..Budget::default()
    };
    let sweeper = SweeperSettings { interval: Duration::from_millis(100), ..SweeperSettings::default() };
    let app = TestApp::spawn_with(Options { builtin_simulator: true, budget, sweeper, ..Default::default() }).await;
    app.ledger.set_settings(json!({"processing_ms": 500, "webhook_retry_base_ms": 50})).await;
    app
}

fn paying_with(method: &str) -> Value {
    json!({"amount": 2500, "currency": "usd", "payment_method": method})
}

/// The payment's status in the database.
async fn status_of(app: &TestApp) -> String {
    sqlx::query_scalar("select status from payments").fetch_one(&app.db).await.unwrap()
}

/// Waits until the payment is `status`, or panics after 10 s.
async fn wait_for(app: &TestApp, status: &str) {
    let started = Instant::now();
    while status_of(app).await != status {
        assert!(started.elapsed() < Duration::from_secs(10), "payment still {} not {status}", status_of(app).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The kinds of the key's events, with the `method` of reconciliations and the `effect` of
/// webhooks.
async fn timeline(app: &TestApp, key: &str) -> Vec<String> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    sqlx::query_scalar(
        "select e.kind || coalesce(':' || (e.detail->>'method'), '') || coalesce(':' || (e.detail->>'effect'), '')
         from idempotency_events e join idempotency_keys k on k.id = e.key_id where k.key = $1 order by e.id",
    )
    .bind(key)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// Finding 3: a bank debit is `processing`, not declined. The key completes with a stored 202
/// whose body is the payment as `processing`; replays return that 202, as Stripe replays its
/// first answer; the payment itself settles through its webhook, and `GET /v1/payments/{id}`
/// shows it `succeeded`, with one charge.
#[tokio::test]
async fn a_bank_debit_is_pending_and_settles_through_its_webhook() {
    // No look-up within the test: on a busy machine a look-up could settle it before the webhook
    // arrives (the webhook is then rightly ignored), and this test is about the webhook.
    let app = app_looking_up_after(Duration::from_secs(3600)).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let body = paying_with("pm_usBankAccount_success");

    let first = app.post_payment(&api_key, Some(&key), &body).send().await.unwrap();
    let (status, headers) = (first.status(), first.headers().clone());
    let first = first.bytes().await.unwrap();
    let answer: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert_eq!(answer["status"], "processing");
    assert!(answer["payment_intent"].as_str().unwrap().starts_with("pi_"));
    let id = answer["id"].as_str().unwrap();
    assert_eq!(headers["location"], format!("/v1/payments/{id}"));
    let stored: (String, i16) =
        sqlx::query_as("select state, response_status from idempotency_keys").fetch_one(&app.db).await.unwrap();
    assert_eq!(stored, ("completed".into(), 202));
    assert!(app.charges().await.is_empty(), "no money moved yet");

    wait_for(&app, "succeeded").await;
    let (status, _, shown) = parts(app.get(&api_key, &format!("/v1/payments/{id}")).send().await.unwrap()).await;
    assert_eq!((status, shown["status"].as_str()), (StatusCode::OK, Some("succeeded")));
    let replay = app.post_payment(&api_key, Some(&key), &body).send().await.unwrap();
    assert_eq!(
        (replay.status(), &replay.headers()["idempotent-replayed"]),
        (StatusCode::ACCEPTED, &"true".parse().unwrap())
    );
    assert_eq!(replay.bytes().await.unwrap(), first, "the replay is the first answer, byte for byte");
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], answer["payment_intent"]);
    let events = timeline(&app, &key).await;
    assert!(events.contains(&"webhook:applied".to_owned()), "{events:?}");
    let page = key_page(&app).await;
    assert!(page.contains("ev-webhook") && page.contains("payment_intent.succeeded"), "the timeline shows it");
    assert!(page.contains("badge pay-succeeded"), "the payment's current status");
}

/// A bank debit whose account is closed: `processing`, then `failed` by its webhook, with the
/// gateway's failure code; nothing charged.
#[tokio::test]
async fn a_failed_bank_debit_ends_failed() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let response =
        app.post_payment(&api_key, Some(&new_key()), &paying_with("pm_usBankAccount_accountClosed")).send().await;
    assert_eq!(response.unwrap().status(), StatusCode::ACCEPTED);
    wait_for(&app, "failed").await;
    let code: Option<String> =
        sqlx::query_scalar("select failure_code from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(code.as_deref(), Some("account_closed"));
    assert!(app.charges().await.is_empty());
}

/// 3-D Secure: `requires_action` with Stripe's `next_action`, answered 202; once the customer
/// authenticates, the payment succeeds (and one that fails authentication fails).
#[tokio::test]
async fn three_d_secure_is_requires_action_with_stripes_next_action() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    for (outcome, end) in [("succeed", "succeeded"), ("fail", "failed")] {
        sqlx::query("delete from payments").execute(&app.db).await.unwrap();
        let key = new_key();
        let (status, _, answer) = parts(
            app.post_payment(&api_key, Some(&key), &paying_with("pm_card_threeDSecure2Required")).send().await.unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
        assert_eq!(answer["status"], "requires_action");
        assert_eq!(answer["next_action"]["type"], "use_stripe_sdk", "{answer}");
        assert_eq!(status_of(&app).await, "requires_action");
        let next_action: Value =
            sqlx::query_scalar("select next_action from payments").fetch_one(&app.db).await.unwrap();
        assert_eq!(next_action, answer["next_action"]);

        let intent = answer["payment_intent"].as_str().unwrap();
        app.ledger.control(&format!("payment_intents/{intent}/authenticate"), json!({"outcome": outcome})).await;
        wait_for(&app, end).await;
        assert_eq!(app.charges_for(&key).await.len(), usize::from(end == "succeeded"));
        let replay = app.post_payment(&api_key, Some(&key), &paying_with("pm_card_threeDSecure2Required")).send().await;
        assert_eq!(replay.unwrap().status(), StatusCode::ACCEPTED, "the stored answer stays the first one");
    }
}

/// Every webhook delivery is lost: the processing payment still settles, because the sweeper
/// looks it up on its schedule (`reconciled` events, method `retrieve`), and ends `succeeded`.
#[tokio::test]
async fn a_processing_payment_settles_through_reconciliation_when_every_webhook_is_dropped() {
    let app = app().await;
    app.set_faults(json!({"webhook_drop_rate": 1.0})).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let response = app.post_payment(&api_key, Some(&key), &paying_with("pm_usBankAccount_success")).send().await;
    assert_eq!(response.unwrap().status(), StatusCode::ACCEPTED);

    wait_for(&app, "succeeded").await;
    let events = timeline(&app, &key).await;
    assert!(events.contains(&"reconciled:retrieve".to_owned()), "{events:?}");
    assert!(!events.iter().any(|e| e.starts_with("webhook")), "every delivery was dropped: {events:?}");
    let deliveries: Vec<Value> = app
        .ledger
        .events()
        .await
        .iter()
        .flat_map(|e| e["deliveries"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(!deliveries.is_empty() && deliveries.iter().all(|d| d["state"] == "dropped"), "{deliveries:?}");
    assert_eq!(app.charges_for(&key).await.len(), 1);
    let scheduled: Option<bool> =
        sqlx::query_scalar("select reconcile_at is not null from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(scheduled, Some(false), "a final payment is no longer looked up");
    let page = key_page(&app).await;
    assert!(page.contains("ev-reconciled") && page.contains("&#34;method&#34;:&#34;retrieve&#34;"), "{page}");
}

/// The simulator holds every delivery of a bank debit's events and releases them in reverse
/// order: `payment_intent.succeeded` arrives before `payment_intent.processing`. The payment
/// ends `succeeded`; the late event is recorded as stale, never applied.
#[tokio::test]
async fn events_released_in_reverse_order_end_in_the_right_status() {
    // The sweeper's look-ups stay out of this test: only the events may move the payment.
    let app = app_looking_up_after(Duration::from_secs(3600)).await;
    app.set_faults(json!({"webhook_hold": true})).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let (_, _, answer) =
        parts(app.post_payment(&api_key, Some(&key), &paying_with("pm_usBankAccount_success")).send().await.unwrap())
            .await;
    let intent = answer["payment_intent"].as_str().unwrap().to_owned();
    // Wait for the debit to settle at the gateway (its events are held meanwhile).
    let started = Instant::now();
    while !app.ledger.events().await.iter().any(|e| e["type"] == "payment_intent.succeeded") {
        assert!(started.elapsed() < Duration::from_secs(10), "the debit never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let released = app.ledger.control("webhooks/release", json!({"order": "reverse"})).await;
    assert!(released["released"].as_u64().unwrap() >= 2, "{released}");

    wait_for(&app, "succeeded").await;
    let started = Instant::now();
    let inbox = loop {
        let inbox: Vec<(String, String)> =
            sqlx::query_as("select type, effect from webhook_events order by received_at")
                .fetch_all(&app.db)
                .await
                .unwrap();
        if inbox.iter().any(|(kind, _)| kind == "payment_intent.processing") {
            break inbox;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{inbox:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let effect_of = |kind: &str| inbox.iter().find(|(k, _)| k == kind).map(|(_, e)| e.clone());
    assert_eq!(effect_of("payment_intent.succeeded").as_deref(), Some("applied"), "{inbox:?}");
    assert_eq!(effect_of("payment_intent.processing").as_deref(), Some("stale"), "{inbox:?}");
    assert_eq!(status_of(&app).await, "succeeded");
    assert_eq!(app.charges_for(&key).await[0]["payment_intent"], intent.as_str());
}
