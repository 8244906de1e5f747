//! Refunds, the second idempotent operation: the payment's contract row by row, the resource
//! invariant under racing keys (never more refunded than paid), and crashes at each of a
//! refund's recovery points. Every test asserts the database and the gateway's ledger.

use std::sync::Arc;
use std::time::Duration;

use payonce::simulator;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::crash::{KillPoint, kill_during_request};
use crate::helpers::{Ledger, ServerProcess, TestApp, TestDatabase, assert_problem, new_key, parts, payment};

/// A succeeded payment of `amount`; returns its id.
async fn paid(app: &TestApp, api_key: &str, amount: i64) -> String {
    let response = app.post_payment(api_key, Some(&new_key()), &payment(amount)).send().await.unwrap();
    let (status, _, body) = parts(response).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

/// The payment's `amount_refunded` column.
async fn amount_refunded(db: &sqlx::PgPool, payment: &str) -> i64 {
    let id = uuid::Uuid::try_parse(payment.strip_prefix("pay_").unwrap()).unwrap();
    sqlx::query_scalar("select amount_refunded from payments where id = $1").bind(id).fetch_one(db).await.unwrap()
}

/// The whole contract for one refund: 201 + Location, the gateway's refund id, the payment's
/// `amount_refunded`; a replay byte for byte; another payload 422; no key 400; show and list.
#[tokio::test]
async fn a_refund_and_its_replay() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let pay = paid(&app, &api_key, 10_000).await;
    let key = new_key();
    let body = json!({"payment": pay, "amount": 3000, "reason": "requested_by_customer", "metadata": {"order": "7"}});

    let first = app.post_refund(&api_key, Some(&key), &body).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let first_bytes = first.bytes().await.unwrap();
    let refund: Value = serde_json::from_slice(&first_bytes).unwrap();
    assert_eq!(location, format!("/v1/refunds/{}", refund["id"].as_str().unwrap()));
    assert_eq!((refund["status"].as_str(), refund["amount"].as_i64()), (Some("succeeded"), Some(3000)));
    assert_eq!(refund["payment"], pay.as_str());

    // The gateway: one refund, of that amount, under the downstream key, with the audit trail.
    let refunds = app.ledger.refunds().await;
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["refund"], refund["gateway_refund"]);
    assert_eq!(refunds[0]["amount"], 3000);
    assert_eq!(refunds[0]["reason"], "requested_by_customer");
    assert_eq!(refunds[0]["metadata"]["payonce_refund"], refund["id"]);
    assert_eq!(refunds[0]["metadata"]["payonce_idempotency_key"], key.as_str());
    assert_eq!(refunds[0]["metadata"]["order"], "7");
    assert!(refunds[0]["idempotency_key"].as_str().unwrap().starts_with("payonce-refund-"));

    // The database: the refund, the reservation, the key.
    assert_eq!(amount_refunded(&app.db, &pay).await, 3000);
    let (state, point, ..) = app.database.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), point.as_str()), ("completed", "finished"));
    let status: String = sqlx::query_scalar("select status from refunds").fetch_one(&app.db).await.unwrap();
    assert_eq!(status, "succeeded");
    assert_eq!(app.event_kinds(&key).await, ["claimed", "refund_created", "completed"]);

    // The replay: byte for byte, marked, and no second refund.
    let replay = app.post_refund(&api_key, Some(&key), &body).send().await.unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"].to_str().unwrap(), location);
    assert_eq!(replay.bytes().await.unwrap(), first_bytes);
    assert_eq!(app.ledger.refunds().await.len(), 1);

    // The same key with another payload; no key at all.
    let other = app.post_refund(&api_key, Some(&key), &json!({"payment": pay, "amount": 2000})).send().await.unwrap();
    assert_problem(other, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    let keyless = app.post_refund(&api_key, None, &body).send().await.unwrap();
    assert_problem(keyless, StatusCode::BAD_REQUEST, "idempotency-key-missing").await;
    assert_eq!(app.ledger.refunds().await.len(), 1);

    // Show, list, and the payment's JSON.
    let (status, _, shown) = parts(app.get(&api_key, &location).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown, refund);
    let (_, _, list) = parts(app.get(&api_key, &format!("/v1/refunds?payment={pay}")).send().await.unwrap()).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(list["data"][0], refund);
    let (_, _, payment) = parts(app.get(&api_key, &format!("/v1/payments/{pay}")).send().await.unwrap()).await;
    assert_eq!(payment["amount_refunded"], 3000);
}

/// Without an amount, all that remains is refunded; after that nothing remains, and a refund
/// under a new key is refused (409 `refund-exceeds-payment`) without using its key.
#[tokio::test]
async fn all_that_remains_then_nothing() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let pay = paid(&app, &api_key, 5000).await;
    let part = app.post_refund(&api_key, Some(&new_key()), &json!({"payment": pay, "amount": 1500})).send().await;
    assert_eq!(part.unwrap().status(), StatusCode::CREATED);
    let rest = app.post_refund(&api_key, Some(&new_key()), &json!({"payment": pay})).send().await.unwrap();
    let (status, _, rest) = parts(rest).await;
    assert_eq!(status, StatusCode::CREATED, "{rest}");
    assert_eq!(rest["amount"], 3500);
    assert_eq!(amount_refunded(&app.db, &pay).await, 5000);

    let key = new_key();
    let more = app.post_refund(&api_key, Some(&key), &json!({"payment": pay, "amount": 1})).send().await.unwrap();
    let problem = assert_problem(more, StatusCode::CONFLICT, "refund-exceeds-payment").await;
    assert_eq!(problem["remaining"], 0);
    assert!(app.database.key_state(&key).await.is_none(), "the refused request did not use its key");
    let amounts: Vec<i64> = app.ledger.refunds().await.iter().map(|r| r["amount"].as_i64().unwrap()).collect();
    assert_eq!(amounts, [1500, 3500]);
}

/// Another customer's payment is not found (404), exactly like a payment that does not exist;
/// a payment that did not succeed cannot be refunded (409); bad bodies are 400s.
#[tokio::test]
async fn scope_status_and_validation() {
    let app = TestApp::spawn().await;
    let alice = app.customer("alice").await;
    let bob = app.customer("bob").await;
    let pay = paid(&app, &alice, 2000).await;

    let key = new_key();
    let theirs = app.post_refund(&bob, Some(&key), &json!({"payment": pay})).send().await.unwrap();
    assert_problem(theirs, StatusCode::NOT_FOUND, "not-found").await;
    assert!(app.database.key_state(&key).await.is_none());
    let (status, ..) = parts(app.get(&bob, &format!("/v1/refunds?payment={pay}")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    let missing = format!("pay_{}", uuid::Uuid::now_v7().simple());
    let none = app.post_refund(&alice, Some(&new_key()), &json!({"payment": missing})).send().await.unwrap();
    assert_problem(none, StatusCode::NOT_FOUND, "not-found").await;

    let declined = app
        .post_payment(
            &alice,
            Some(&new_key()),
            &json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_chargeDeclined"}),
        )
        .send()
        .await
        .unwrap();
    let (status, _, declined) = parts(declined).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let failed = declined["payment"].as_str().unwrap();
    let refund = app.post_refund(&alice, Some(&new_key()), &json!({"payment": failed})).send().await.unwrap();
    let problem = assert_problem(refund, StatusCode::CONFLICT, "payment-not-refundable").await;
    assert_eq!(problem["payment_status"], "failed");

    for body in
        [json!({"payment": "ch_1"}), json!({"payment": pay, "amount": 0}), json!({"payment": pay, "reason": "x"})]
    {
        let response = app.post_refund(&alice, Some(&new_key()), &body).send().await.unwrap();
        assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
    }
    assert!(app.ledger.refunds().await.is_empty());
    assert_eq!(app.count("refunds").await, 0);
}

/// A duplicate of a refund still in flight gets a 409 with Retry-After, and one refund is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_in_flight_is_a_409() {
    let app = Arc::new(TestApp::spawn().await);
    let api_key = app.customer("acme").await;
    let pay = paid(&app, &api_key, 4000).await;
    app.set_faults(json!({"latency_ms": 500, "operations": ["create_refund"]})).await;
    let key = new_key();
    let body = json!({"payment": pay, "amount": 1000});
    let barrier = Arc::new(Barrier::new(10));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (app, api_key, key, body, barrier) =
                (app.clone(), api_key.clone(), key.clone(), body.clone(), barrier.clone());
            tokio::spawn(async move {
                let request = app.post_refund(&api_key, Some(&key), &body);
                barrier.wait().await;
                let response = request.send().await.unwrap();
                (response.status(), response.headers().get("retry-after").is_some())
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        match task.await.unwrap() {
            (StatusCode::CREATED, _) => created += 1,
            (StatusCode::CONFLICT, true) => {}
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(created >= 1);
    assert_eq!(app.ledger.refunds().await.len(), 1);
    assert_eq!(app.count("refunds").await, 1);
    assert_eq!(amount_refunded(&app.db, &pay).await, 1000);
}

/// The race keys do not stop: 20 different keys refunding 30 % each of one payment at the same
/// instant. Exactly 3 succeed, the 17 others are told it exceeds what remains, and the gateway's
/// ledger agrees: 3 refunds, 90 % refunded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_keys_racing_never_refund_more_than_was_paid() {
    let app = Arc::new(TestApp::spawn().await);
    let api_key = app.customer("acme").await;
    let pay = paid(&app, &api_key, 10_000).await;
    // Gateway latency keeps the winners' refunds in flight while the others arrive.
    app.set_faults(json!({"latency_ms": 200, "operations": ["create_refund"]})).await;
    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (app, api_key, pay, barrier) = (app.clone(), api_key.clone(), pay.clone(), barrier.clone());
            tokio::spawn(async move {
                let key = new_key();
                let request = app.post_refund(&api_key, Some(&key), &json!({"payment": pay, "amount": 3000}));
                barrier.wait().await;
                let (status, _, body) = parts(request.send().await.unwrap()).await;
                (status, body, key)
            })
        })
        .collect();
    let mut succeeded = Vec::new();
    for task in tasks {
        let (status, body, key) = task.await.unwrap();
        match status {
            StatusCode::CREATED => succeeded.push(key),
            StatusCode::CONFLICT => {
                assert_eq!(body["type"], "https://payonce.dev/problems/refund-exceeds-payment", "{body}");
                assert_eq!(body["remaining"], 1000);
            }
            other => panic!("unexpected answer {other}: {body}"),
        }
    }
    assert_eq!(succeeded.len(), 3, "exactly three refunds of 30 % fit in one payment");
    let refunds = app.ledger.refunds().await;
    assert_eq!(refunds.len(), 3);
    assert_eq!(refunds.iter().map(|r| r["amount"].as_i64().unwrap()).sum::<i64>(), 9000);
    for key in &succeeded {
        let count = refunds.iter().filter(|r| r["metadata"]["payonce_idempotency_key"] == key.as_str()).count();
        assert_eq!(count, 1, "one gateway refund per successful key");
    }
    assert_eq!(amount_refunded(&app.db, &pay).await, 9000);
    assert_eq!(app.count("refunds").await, 3);
    assert_eq!(app.count("idempotency_keys where route = '/v1/refunds'").await, 3, "the losers used no key");
}

/// Pays, starts a refund on a server that is killed at `point`, and lets a fresh server finish
/// it alone: one gateway refund, and the client's retry gets the replay.
async fn kill_and_recover(point: KillPoint) {
    let db = TestDatabase::create().await;
    let sim = simulator::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let ledger = Ledger::new(&sim.base_url());
    let timing = [("PAYONCE_LEASE_SECS", "2"), ("PAYONCE_SWEEP_INTERVAL_SECS", "0.5")];
    let mut env = timing.to_vec();
    if let KillPoint::Failpoint(name) = point {
        env.push(("PAYONCE_FAILPOINT", name));
    }
    let mut first = ServerProcess::start(&db.url, &sim.base_url(), &env).await;
    let api_key = db.customer("crash").await;
    let client = reqwest::Client::new();
    let paid = client
        .post(first.url("/v1/payments"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", new_key())
        .json(&payment(4200))
        .send()
        .await
        .unwrap();
    let (status, _, paid) = parts(paid).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    let body = json!({"payment": paid["id"], "amount": 1200});
    if let KillPoint::DuringGatewayCall = point {
        ledger.set_faults(json!({"latency_ms": 1500, "next_calls": 1, "operations": ["create_refund"]})).await;
    }
    let key = new_key();
    let killed_at =
        kill_during_request(&mut first, &db, point, "refund_created", (&api_key, "/v1/refunds", &key, &body)).await;

    let second = ServerProcess::start(&db.url, &sim.base_url(), &timing).await;
    db.wait_until_final(&key, Duration::from_secs(20)).await;
    let (state, recovery_point, token, _) = db.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), recovery_point.as_str()), ("completed", "finished"), "{point:?}");
    assert!(token >= 2, "{point:?}: finished under a new lease");
    let refunds = ledger.refunds().await;
    assert_eq!(refunds.len(), 1, "{point:?}: exactly one gateway refund");
    assert_eq!(refunds[0]["amount"], 1200);
    assert_eq!(db.count("refunds").await, 1);
    assert_eq!(amount_refunded(&db.pool, paid["id"].as_str().unwrap()).await, 1200);

    let retry = client
        .post(second.url("/v1/refunds"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", &key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, headers, refund) = parts(retry).await;
    assert_eq!(status, StatusCode::CREATED, "{point:?}: {refund}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(refund["gateway_refund"], refunds[0]["refund"]);
    assert_eq!(ledger.refunds().await.len(), 1);
    eprintln!("{point:?}: recovered {:?} after the kill", killed_at.elapsed());
}

/// Killed right after the claim and the reservation committed, before the gateway call.
#[tokio::test]
async fn killed_after_the_refund_is_created() {
    kill_and_recover(KillPoint::Failpoint("after_refund_created")).await;
}

/// Killed while the gateway processes the refund (it refunds after the process died).
#[tokio::test]
async fn killed_during_the_refund_call() {
    kill_and_recover(KillPoint::DuringGatewayCall).await;
}

/// Killed after the gateway refunded and before the final commit.
#[tokio::test]
async fn killed_after_the_refund_before_the_final_commit() {
    kill_and_recover(KillPoint::Failpoint("after_refund")).await;
}
