//! Webhooks in: delivered at least once, applied once. Events are signed here with Stripe's
//! scheme (async-stripe's own test header) around PaymentIntents the simulator really made.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use stripe_webhook::Webhook;
use tokio::sync::Barrier;

use crate::helpers::{Options, SIM_SECRET_KEY, TestApp, assert_problem, new_key, parts, payment};

const SECRET: &str = "whsec_payonce_test_secret";

/// A server that accepts events signed with [`SECRET`].
async fn app() -> TestApp {
    TestApp::spawn_with(Options { webhook_secret: Some(SECRET.into()), ..Default::default() }).await
}

/// A payment charged at the gateway whose answer was lost: the key stays processing, the
/// payment `pending`. Returns the PaymentIntent as the gateway has it.
async fn charged_but_unanswered(app: &TestApp, api_key: &str, key: &str) -> Value {
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1})).await;
    let response = app.post_payment(api_key, Some(key), &payment(1500)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let charges = app.charges_for(key).await;
    let intent = charges[0]["payment_intent"].as_str().unwrap();
    app.client
        .get(format!("{}v1/payment_intents/{intent}", app.sim_url))
        .bearer_auth(SIM_SECRET_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A Stripe event of `kind` about `intent` (with `status`), created at `created`.
fn event(id: &str, kind: &str, intent: &Value, status: &str, created: i64) -> String {
    let mut object = intent.clone();
    object["status"] = status.into();
    json!({
        "id": id, "object": "event", "api_version": "2026-09-30.endive", "created": created,
        "livemode": false, "pending_webhooks": 1, "type": kind,
        "request": {"id": null, "idempotency_key": null},
        "data": {"object": object},
    })
    .to_string()
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Delivers `body` signed with `secret` at `timestamp`.
async fn deliver(app: &TestApp, body: &str, secret: &str, timestamp: i64) -> reqwest::Response {
    let signature = Webhook::generate_test_header(body, secret, Some(timestamp));
    app.client
        .post(app.url("/webhooks/stripe"))
        .header("stripe-signature", signature)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

async fn payment_status(app: &TestApp) -> String {
    sqlx::query_scalar("select status from payments").fetch_one(&app.db).await.unwrap()
}

/// The `webhook` events on a key's timeline: (event id, effect).
async fn webhook_events(app: &TestApp, key: &str) -> Vec<(String, String)> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    sqlx::query_as(
        "select e.detail->>'event', e.detail->>'effect' from idempotency_events e
         join idempotency_keys k on k.id = e.key_id where k.key = $1 and e.kind = 'webhook' order by e.id",
    )
    .bind(key)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// A forged signature (another secret, a changed body, none at all) and a stale one (more than
/// 300 s old) are 400 problems: nothing applied, nothing recorded.
#[tokio::test]
async fn forged_and_stale_signatures_are_refused() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let intent = charged_but_unanswered(&app, &api_key, &key).await;
    let body = event("evt_forged", "payment_intent.succeeded", &intent, "succeeded", now());

    let forged = deliver(&app, &body, "whsec_someone_else", now()).await;
    assert_problem(forged, StatusCode::BAD_REQUEST, "webhook-signature-invalid").await;
    let stale = deliver(&app, &body, SECRET, now() - 400).await;
    let problem = assert_problem(stale, StatusCode::BAD_REQUEST, "webhook-signature-invalid").await;
    assert!(problem["detail"].as_str().unwrap().contains("300 s"), "{problem}");
    let signature = Webhook::generate_test_header(&body, SECRET, Some(now()));
    let tampered = body.replace("\"amount\":1500", "\"amount\":1");
    assert_ne!(tampered, body);
    for (signature, body) in [(Some(signature), tampered), (None, body.clone())] {
        let mut request = app.client.post(app.url("/webhooks/stripe")).body(body);
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        assert_problem(request.send().await.unwrap(), StatusCode::BAD_REQUEST, "webhook-signature-invalid").await;
    }

    assert_eq!(app.count("webhook_events").await, 0, "nothing recorded as applied");
    assert_eq!(payment_status(&app).await, "pending", "nothing applied");
    assert!(webhook_events(&app, &key).await.is_empty());

    let genuine = deliver(&app, &body, SECRET, now()).await;
    assert_eq!(genuine.status(), StatusCode::OK);
    assert_eq!(payment_status(&app).await, "succeeded");
}

/// The same event delivered five times at once: one effect. The payment moves once, the inbox
/// holds one row, and the timeline shows the one applied delivery and four duplicates. The key
/// itself then settles with the gateway's answer, with one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_event_five_times_has_one_effect() {
    let app = Arc::new(app().await);
    let api_key = app.customer("acme").await;
    let key = new_key();
    let intent = charged_but_unanswered(&app, &api_key, &key).await;
    let body = Arc::new(event("evt_five_times", "payment_intent.succeeded", &intent, "succeeded", now()));

    let barrier = Arc::new(Barrier::new(5));
    let deliveries: Vec<_> = (0..5)
        .map(|_| {
            let (app, body, barrier) = (app.clone(), body.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                parts(deliver(&app, &body, SECRET, now()).await).await
            })
        })
        .collect();
    let mut duplicates = 0;
    for delivery in deliveries {
        let (status, _, body) = delivery.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        duplicates += usize::from(body["duplicate"] == true);
    }

    assert_eq!(duplicates, 4);
    assert_eq!(app.count("webhook_events").await, 1);
    assert_eq!(payment_status(&app).await, "succeeded");
    let seen = webhook_events(&app, &key).await;
    let effects: Vec<&str> = seen.iter().map(|(_, effect)| effect.as_str()).collect();
    assert_eq!(effects.iter().filter(|e| **e == "applied").count(), 1, "{seen:?}");
    assert_eq!(effects.iter().filter(|e| **e == "duplicate").count(), 4, "{seen:?}");

    let (status, _, body) = parts(app.post_payment(&api_key, Some(&key), &payment(1500)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["payment_intent"], intent["id"]);
    assert_eq!(app.charges_for(&key).await.len(), 1);
}

/// Events delivered in reverse order never move a payment backwards: `succeeded` arrives
/// first, then the older `processing`. The payment stays `succeeded`; the late event is stale,
/// recorded, and schedules a look-up of the PaymentIntent.
#[tokio::test]
async fn events_in_reverse_order_never_move_backwards() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let intent = charged_but_unanswered(&app, &api_key, &key).await;
    let created = now();
    let processing = event("evt_1_processing", "payment_intent.processing", &intent, "processing", created - 2);
    let succeeded = event("evt_2_succeeded", "payment_intent.succeeded", &intent, "succeeded", created);

    for body in [&succeeded, &processing] {
        assert_eq!(deliver(&app, body, SECRET, now()).await.status(), StatusCode::OK);
    }

    assert_eq!(payment_status(&app).await, "succeeded");
    let inbox: Vec<(String, String)> =
        sqlx::query_as("select id, effect from webhook_events order by id").fetch_all(&app.db).await.unwrap();
    assert_eq!(inbox, [("evt_1_processing".into(), "stale".into()), ("evt_2_succeeded".into(), "applied".into())]);
    let scheduled: bool =
        sqlx::query_scalar("select reconcile_at <= now() from payments").fetch_one(&app.db).await.unwrap();
    assert!(scheduled, "the stale event asked for a look-up");
    let seen = webhook_events(&app, &key).await;
    assert_eq!(seen, [("evt_2_succeeded".into(), "applied".into()), ("evt_1_processing".into(), "stale".into())]);
    // The database refuses a backwards move from any writer.
    let backwards = sqlx::query("update payments set status = 'processing'").execute(&app.db).await;
    assert!(backwards.unwrap_err().to_string().contains("may not move from succeeded to processing"));
}

/// An event payonce does not act on is acknowledged and recorded, and changes nothing: a type
/// async-stripe does not know, and a known type whose object it cannot read.
#[tokio::test]
async fn events_payonce_does_not_act_on_are_acknowledged_and_ignored() {
    let app = app().await;
    for (id, kind) in [("evt_unknown", "payonce.not_a_stripe_event"), ("evt_unreadable", "customer.created")] {
        let body = json!({
            "id": id, "object": "event", "api_version": "2026-09-30.endive", "created": now(),
            "livemode": false, "pending_webhooks": 1, "type": kind, "request": null,
            "data": {"object": {"id": "cus_1", "object": "customer"}},
        })
        .to_string();
        let (status, _, answer) = parts(deliver(&app, &body, SECRET, now()).await).await;
        assert_eq!(status, StatusCode::OK, "{kind}: {answer}");
        assert_eq!(answer["effect"], "ignored");
    }
    let inbox: Vec<(String, String)> =
        sqlx::query_as("select type, effect from webhook_events order by id").fetch_all(&app.db).await.unwrap();
    assert_eq!(
        inbox,
        [("payonce.not_a_stripe_event".into(), "ignored".into()), ("customer.created".into(), "ignored".into())]
    );
    // A PaymentIntent event async-stripe cannot read is refused unapplied: Stripe redelivers it.
    let body = json!({
        "id": "evt_broken", "object": "event", "created": now(), "livemode": false, "pending_webhooks": 1,
        "type": "payment_intent.succeeded", "data": {"object": {"id": "pi_1"}},
    })
    .to_string();
    assert_problem(deliver(&app, &body, SECRET, now()).await, StatusCode::BAD_REQUEST, "webhook-unreadable").await;
    assert_eq!(app.count("webhook_events").await, 2);
}
