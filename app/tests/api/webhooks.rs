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
    // The key its lost answer left may not be taken again for an hour: the sweeper's first pass,
    // late on a busy machine, would otherwise settle the payment before the events arrive (and
    // `succeeded` would rightly change nothing). This test is about the events alone.
    let hour = Duration::from_secs(3600);
    let budget = payonce::idempotency::Budget {
        backoff: payonce::idempotency::Backoff { base: hour, cap: hour },
        ..payonce::idempotency::Budget::default()
    };
    let app = TestApp::spawn_with(Options { webhook_secret: Some(SECRET.into()), budget, ..Default::default() }).await;
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

/// `GET` of the simulator's API (as the gateway reads it).
async fn gateway_get(app: &TestApp, path: &str) -> Value {
    let response = app.client.get(format!("{}{path}", app.sim_url)).bearer_auth(SIM_SECRET_KEY).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    response.json().await.unwrap()
}

/// A Stripe event of `kind` about `object`, created at `created`, caused by a request with
/// `request_key` (if any).
fn event_of(id: &str, kind: &str, object: &Value, created: i64, request_key: Option<&str>) -> String {
    json!({
        "id": id, "object": "event", "api_version": "2026-09-30.endive", "created": created,
        "livemode": false, "pending_webhooks": 1, "type": kind,
        "request": {"id": null, "idempotency_key": request_key},
        "data": {"object": object},
    })
    .to_string()
}

/// `object` with `status` (and `failure_reason`).
fn with_status(object: &Value, status: &str, failure_reason: Option<&str>) -> Value {
    let mut object = object.clone();
    object["status"] = status.into();
    object["failure_reason"] = failure_reason.into();
    object
}

/// A refund the gateway made whose answer was lost: payonce's refund stays `pending`, without the
/// gateway's id, its amount reserved. Returns payonce's refund id, the client key, and the
/// gateway's refund as the gateway has it.
struct LeftPending {
    refund: String,
    key: String,
    body: Value,
    payment: String,
    gateway: Value,
}

async fn refund_left_pending(app: &TestApp, api_key: &str) -> LeftPending {
    let (status, _, paid) =
        parts(app.post_payment(api_key, Some(&new_key()), &payment(10_000)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    let payment = paid["id"].as_str().unwrap().to_owned();
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1, "operations": ["create_refund"]})).await;
    let key = new_key();
    let body = json!({"payment": payment, "amount": 3000});
    let (status, _, answer) = parts(app.post_refund(api_key, Some(&key), &body).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the gateway's answer was lost: {answer}");
    let (id, state, gateway_id): (uuid::Uuid, String, Option<String>) =
        sqlx::query_as("select id, status, gateway_refund_id from refunds").fetch_one(&app.db).await.unwrap();
    assert_eq!((state.as_str(), gateway_id), ("pending", None));
    let listed = gateway_get(app, "v1/refunds").await;
    let gateway = listed["data"][0].clone();
    assert_eq!(gateway["amount"], 3000, "{listed}");
    LeftPending { refund: format!("re_{}", id.simple()), key, body, payment, gateway }
}

/// payonce's refund: (status, gateway refund id, failure code), and the payment's `amount_refunded`.
async fn refund_row(app: &TestApp) -> (String, Option<String>, Option<String>, i64) {
    sqlx::query_as(
        "select r.status, r.gateway_refund_id, r.failure_code, p.amount_refunded
         from refunds r join payments p on p.id = r.payment_id",
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// The inbox: (event id, effect, whether it names a refund), by event id.
async fn inbox(app: &TestApp) -> Vec<(String, String, bool)> {
    sqlx::query_as("select id, effect, refund_id is not null from webhook_events order by id")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// A refund left pending moves to succeeded by its `refund.updated`, learning the gateway's id;
/// the same event again changes nothing; an older `pending` event and a later `refund.failed`
/// never move it back (nor give its amount back). `charge.refunded` is recorded on the refund's
/// timeline and changes no amount. Every event is on the refund key's timeline, and the client's
/// retry then gets the refund, with one gateway refund in all.
#[tokio::test]
async fn refund_events_move_a_pending_refund_once_and_forward_only() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let pending = refund_left_pending(&app, &api_key).await;
    let gateway_id = pending.gateway["id"].as_str().unwrap().to_owned();
    let created = now();

    let updated = event_of("evt_r2_updated", "refund.updated", &pending.gateway, created, None);
    let (status, _, receipt) = parts(deliver(&app, &updated, SECRET, now()).await).await;
    assert_eq!(status, StatusCode::OK, "{receipt}");
    assert_eq!((receipt["duplicate"].as_bool(), receipt["effect"].as_str()), (Some(false), Some("applied")));
    assert_eq!(refund_row(&app).await, ("succeeded".into(), Some(gateway_id.clone()), None, 3000));

    let (_, _, again) = parts(deliver(&app, &updated, SECRET, now()).await).await;
    assert_eq!((again["duplicate"].as_bool(), again["effect"].clone()), (Some(true), Value::Null));

    let older = event_of(
        "evt_r1_created",
        "refund.created",
        &with_status(&pending.gateway, "pending", None),
        created - 5,
        Some("payonce-refund-unused"),
    );
    let failed = event_of(
        "evt_r3_failed",
        "refund.failed",
        &with_status(&pending.gateway, "failed", Some("expired_or_canceled_card")),
        created + 1,
        None,
    );
    let (status, _, receipt) = parts(deliver(&app, &older, SECRET, now()).await).await;
    assert_eq!((status, receipt["effect"].as_str()), (StatusCode::OK, Some("stale")), "{receipt}");
    assert_eq!(refund_row(&app).await, ("succeeded".into(), Some(gateway_id.clone()), None, 3000), "never backwards");

    // charge.refunded, as the refund call caused it: recorded, amounts untouched.
    let downstream = app.ledger.refunds().await[0]["idempotency_key"].as_str().unwrap().to_owned();
    let mut charge = gateway_get(&app, &format!("v1/charges/{}", pending.gateway["charge"].as_str().unwrap())).await;
    charge["amount_refunded"] = 9000.into();
    let charged = event_of("evt_r4_charge", "charge.refunded", &charge, created, Some(&downstream));
    let (_, _, receipt) = parts(deliver(&app, &charged, SECRET, now()).await).await;
    assert_eq!(receipt["effect"], "ignored", "{receipt}");
    assert_eq!(refund_row(&app).await, ("succeeded".into(), Some(gateway_id.clone()), None, 3000));

    assert_eq!(
        inbox(&app).await,
        [
            ("evt_r1_created".into(), "stale".into(), true),
            ("evt_r2_updated".into(), "applied".into(), true),
            ("evt_r4_charge".into(), "ignored".into(), true),
        ]
    );
    let mut seen = webhook_events(&app, &pending.key).await;
    seen.sort();
    let expected: Vec<(String, String)> = [
        ("evt_r1_created", "stale"),
        ("evt_r2_updated", "applied"),
        ("evt_r2_updated", "duplicate"),
        ("evt_r4_charge", "ignored"),
    ]
    .iter()
    .map(|(id, effect)| ((*id).to_owned(), (*effect).to_owned()))
    .collect();
    assert_eq!(seen, expected);

    // The client's retry: the same downstream key, the gateway's same refund, now answered.
    let (status, _, refund) =
        parts(app.post_refund(&api_key, Some(&pending.key), &pending.body).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{refund}");
    assert_eq!((refund["id"].as_str(), refund["status"].as_str()), (Some(pending.refund.as_str()), Some("succeeded")));
    assert_eq!(refund["gateway_refund"], gateway_id.as_str());
    assert_eq!(gateway_get(&app, "v1/refunds").await["data"].as_array().unwrap().len(), 1);
    assert_eq!(refund_row(&app).await.3, 3000);

    // Then it fails at the gateway after all (the card was closed): failed is further on, so the
    // event applies (the next test follows it through the simulator's own control).
    let (_, _, receipt) = parts(deliver(&app, &failed, SECRET, now()).await).await;
    assert_eq!(receipt["effect"], "applied", "{receipt}");
    assert_eq!(refund_row(&app).await.0, "failed");
    let (_, _, receipt) = parts(deliver(&app, &updated_again(&pending.gateway), SECRET, now()).await).await;
    assert_eq!(receipt["effect"], "stale", "a failed refund never succeeds again: {receipt}");
}

/// A `refund.updated` saying succeeded, under a new event id.
fn updated_again(gateway: &Value) -> String {
    event_of("evt_r5_updated", "refund.updated", gateway, now(), None)
}

/// Stripe reports a refund that could not reach the customer after it succeeded (the card was
/// closed): the simulator's control fails a succeeded refund, and its `refund.failed` reaches
/// payonce by itself. The refund is failed, its amount given back to the payment once (a
/// redelivery changes nothing), the whole payment can be refunded again, and the payment's page
/// says the refund was reversed. The gateway's refund ledger no longer holds it.
#[tokio::test]
async fn a_refund_that_fails_after_it_succeeded_gives_its_amount_back_once() {
    let app = TestApp::spawn_with(Options { builtin_simulator: true, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let (_, _, paid) =
        parts(app.post_payment(&api_key, Some(&new_key()), &payment(10_000)).send().await.unwrap()).await;
    let body = json!({"payment": paid["id"], "amount": 4000});
    let (status, _, refund) = parts(app.post_refund(&api_key, Some(&new_key()), &body).send().await.unwrap()).await;
    assert_eq!((status, refund["status"].as_str()), (StatusCode::CREATED, Some("succeeded")), "{refund}");
    let gateway_id = refund["gateway_refund"].as_str().unwrap().to_owned();

    // Every delivery twice over, as an at-least-once gateway may.
    app.set_faults(json!({"webhook_duplicate_rate": 1.0})).await;
    let failed = app.ledger.control(&format!("refunds/{gateway_id}/fail"), json!({})).await;
    assert_eq!(
        (failed["status"].as_str(), failed["failure_reason"].as_str()),
        (Some("failed"), Some("expired_or_canceled_card"))
    );
    let started = std::time::Instant::now();
    while refund_row(&app).await.0 != "failed" {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "refund.failed never applied: {:?}",
            refund_row(&app).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refunded = || async {
        sqlx::query_scalar::<_, i64>("select amount_refunded from payments").fetch_one(&app.db).await.unwrap()
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // the duplicate delivery lands too
    assert_eq!(refunded().await, 0, "its 4000 given back, once");
    assert!(app.ledger.refunds().await.is_empty(), "the money came back: no refund in the gateway's ledger");
    let (applied, duplicates): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where e.detail->>'effect' = 'applied'), count(*) filter (where e.detail->>'effect' = 'duplicate')
         from idempotency_events e where e.kind = 'webhook' and e.detail->>'type' = 'refund.failed'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(applied, 1, "applied once ({duplicates} redeliveries noted)");
    app.set_faults(json!({})).await;

    let full = json!({"payment": paid["id"], "amount": 10_000});
    let (status, _, _) = parts(app.post_refund(&api_key, Some(&new_key()), &full).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "the whole payment is refundable again");
    assert_eq!(app.ledger.refunds().await.len(), 1);

    crate::browser::create_admin(&app).await;
    let client = crate::helpers::browser_client();
    crate::admin::sign_in(&app, &client).await;
    let page = client.get(app.url(&format!("/admin/payments/{}", paid["id"].as_str().unwrap()))).send().await.unwrap();
    let page = page.text().await.unwrap();
    assert!(page.contains("Failed after it had succeeded"), "{page}");
}

/// The gateway's `refund.failed` for a pending refund (the card expired or was cancelled),
/// delivered and applied.
async fn fail_by_webhook(app: &TestApp, pending: &LeftPending) {
    let failed = with_status(&pending.gateway, "failed", Some("expired_or_canceled_card"));
    let body = event_of("evt_failed", "refund.failed", &failed, now(), None);
    let (_, _, receipt) = parts(deliver(app, &body, SECRET, now()).await).await;
    assert_eq!(receipt["effect"], "applied", "{receipt}");
}

/// A pending refund the gateway says failed is failed, with the gateway's reason, and its amount
/// is given back to the payment: it can be refunded again.
#[tokio::test]
async fn a_failed_refund_event_gives_the_reservation_back() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let pending = refund_left_pending(&app, &api_key).await;
    fail_by_webhook(&app, &pending).await;
    let gateway_id = pending.gateway["id"].as_str().map(str::to_owned);
    assert_eq!(
        refund_row(&app).await,
        ("failed".into(), gateway_id.clone(), Some("expired_or_canceled_card".into()), 0)
    );

    // A later `succeeded` does not make a failed refund succeeded either.
    let late = event_of("evt_late", "refund.updated", &with_status(&pending.gateway, "succeeded", None), now(), None);
    let (_, _, receipt) = parts(deliver(&app, &late, SECRET, now()).await).await;
    assert_eq!(receipt["effect"], "stale", "{receipt}");
    assert_eq!(refund_row(&app).await.0, "failed");

    let (_, _, shown) =
        parts(app.get(&api_key, &format!("/v1/refunds/{}", pending.refund)).send().await.unwrap()).await;
    assert_eq!(
        (shown["status"].as_str(), shown["failure"]["code"].as_str()),
        (Some("failed"), Some("expired_or_canceled_card"))
    );
    let (_, _, paid) =
        parts(app.get(&api_key, &format!("/v1/payments/{}", pending.payment)).send().await.unwrap()).await;
    assert_eq!(paid["amount_refunded"], 0);
}

/// The client's retry of a refund whose answer was lost, after `refund.failed` settled it: the
/// gateway replays its answer to the create call (the refund as it was made: succeeded), but the
/// key answers with what the books say, the 502 of a failed refund, and gives nothing back twice.
#[tokio::test]
async fn a_retry_after_a_failed_refund_event_answers_with_the_failure() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let pending = refund_left_pending(&app, &api_key).await;
    fail_by_webhook(&app, &pending).await;

    let retry = || app.post_refund(&api_key, Some(&pending.key), &pending.body).send();
    let (status, _, answer) = parts(retry().await.unwrap()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "the refund failed: {answer}");
    assert_eq!(answer["type"].as_str().map(|t| t.ends_with("/refund-rejected")), Some(true), "{answer}");
    assert_eq!(
        (answer["refund"].as_str(), answer["code"].as_str()),
        (Some(pending.refund.as_str()), Some("expired_or_canceled_card"))
    );
    let gateway_id = pending.gateway["id"].as_str().map(str::to_owned);
    assert_eq!(
        refund_row(&app).await,
        ("failed".into(), gateway_id, Some("expired_or_canceled_card".into()), 0),
        "failed once, its amount given back once"
    );
    let (status, headers, replayed) = parts(retry().await.unwrap()).await;
    assert_eq!(
        (status, headers.get("idempotent-replayed").map(|v| v.to_str().unwrap())),
        (StatusCode::BAD_GATEWAY, Some("true"))
    );
    assert_eq!(replayed, answer);
    assert_eq!(gateway_get(&app, "v1/refunds").await["data"].as_array().unwrap().len(), 1, "one gateway refund");
}

/// Events naming a refund (or a charge) payonce does not have are recorded as unmatched and
/// change nothing; a refund event payonce cannot place by its metadata, id or key is one of them.
#[tokio::test]
async fn events_for_unknown_refunds_are_unmatched() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let pending = refund_left_pending(&app, &api_key).await;
    let mut stranger = with_status(&pending.gateway, "succeeded", None);
    stranger["id"] = "re_not_payonces".into();
    stranger["metadata"] = json!({"payonce_refund": format!("re_{}", uuid::Uuid::now_v7().simple())});
    let refund = event_of(
        "evt_stranger",
        "refund.updated",
        &stranger,
        now(),
        Some("payonce-refund-00000000000000000000000000000000"),
    );
    let mut charge = gateway_get(&app, &format!("v1/charges/{}", pending.gateway["charge"].as_str().unwrap())).await;
    charge["payment_intent"] = "pi_not_payonces".into();
    let charge = event_of("evt_stranger_charge", "charge.refunded", &charge, now(), None);
    for body in [&refund, &charge] {
        let (status, _, receipt) = parts(deliver(&app, body, SECRET, now()).await).await;
        assert_eq!((status, receipt["effect"].as_str()), (StatusCode::OK, Some("unmatched")), "{receipt}");
    }
    assert_eq!(
        inbox(&app).await,
        [("evt_stranger".into(), "unmatched".into(), false), ("evt_stranger_charge".into(), "unmatched".into(), false)]
    );
    assert_eq!(refund_row(&app).await, ("pending".into(), None, None, 3000), "nothing moved");
    assert!(webhook_events(&app, &pending.key).await.is_empty());
}

/// With the built-in simulator, whose webhook endpoint payonce registers at startup, the refund
/// events arrive by themselves: a refund whose answer was lost is settled by its
/// `refund.created`, before any retry; `charge.refunded` and the later `refund.updated` (the
/// acquirer's reference) find nothing more to do.
#[tokio::test]
async fn the_simulators_own_refund_events_settle_a_lost_answer() {
    let app = TestApp::spawn_with(Options { builtin_simulator: true, ..Default::default() }).await;
    app.ledger.set_settings(json!({"processing_ms": 200})).await;
    let api_key = app.customer("acme").await;
    let (status, _, paid) =
        parts(app.post_payment(&api_key, Some(&new_key()), &payment(10_000)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1, "operations": ["create_refund"]})).await;
    let body = json!({"payment": paid["id"], "amount": 3000});
    let response = app.post_refund(&api_key, Some(&new_key()), &body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "the gateway's answer was lost");

    let started = std::time::Instant::now();
    let effects = loop {
        let effects: Vec<(String, String)> =
            sqlx::query_as("select type, effect from webhook_events where refund_id is not null order by type")
                .fetch_all(&app.db)
                .await
                .unwrap();
        if effects.len() == 3 {
            break effects;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the refund's events never all arrived: {effects:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let refunds = app.ledger.refunds().await;
    let gateway_id = refunds.first().and_then(|r| r["refund"].as_str()).map(str::to_owned);
    assert!(gateway_id.is_some(), "{refunds:?}");
    assert_eq!(refund_row(&app).await, ("succeeded".into(), gateway_id, None, 3000));
    let kinds_and_effects: Vec<(&str, &str)> = effects.iter().map(|(k, e)| (k.as_str(), e.as_str())).collect();
    assert_eq!(
        kinds_and_effects,
        [("charge.refunded", "ignored"), ("refund.created", "applied"), ("refund.updated", "ignored")]
    );
}

/// An event dated on no day the inbox keeps (older than the retention: only an event resent by
/// hand, or a nonsense date) is acknowledged, so that Stripe stops sending it, but neither
/// recorded nor applied; one dated within the retention is deduplicated as ever, on its
/// `created` too (the inbox's partition key).
#[tokio::test]
async fn an_event_older_than_the_inbox_keeps_is_acknowledged_unapplied() {
    let app = app().await;
    let body = |id: &str, created: i64| {
        json!({
            "id": id, "object": "event", "api_version": "2026-09-30.endive", "created": created,
            "livemode": false, "pending_webhooks": 1, "type": "payonce.not_a_stripe_event", "request": null,
            "data": {"object": {"id": "cus_1", "object": "customer"}},
        })
        .to_string()
    };
    let (status, _, answer) =
        parts(deliver(&app, &body("evt_ancient", now() - 400 * 86_400), SECRET, now()).await).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!((answer["duplicate"].as_bool(), answer["effect"].is_null()), (Some(false), true), "{answer}");
    assert_eq!(app.count("webhook_events").await, 0);

    let two_days_ago = now() - 2 * 86_400;
    let (_, _, first) = parts(deliver(&app, &body("evt_recent", two_days_ago), SECRET, now()).await).await;
    let (_, _, again) = parts(deliver(&app, &body("evt_recent", two_days_ago), SECRET, now()).await).await;
    assert_eq!((first["duplicate"].as_bool(), again["duplicate"].as_bool()), (Some(false), Some(true)));
    assert_eq!(app.count("webhook_events").await, 1);
}
