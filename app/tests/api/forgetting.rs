//! When the database forgets: a restore from a backup taken before some payments (or a failover
//! that lost the last commits) loses their keys and rows. The clients' retries must still charge
//! nothing new: what payonce sends Stripe (the downstream key and every parameter Stripe compares)
//! is derived from what the client sent, so Stripe replays the original PaymentIntent and the
//! payment is rebuilt from it, under its original id (docs/expiry.md, "When the database forgets").
//!
//! The backup is a real copy of the database (`CREATE DATABASE … TEMPLATE`), and the retries go
//! to a new server process started on the restored copy, as after a real restore; the simulator,
//! like Stripe, remembers everything.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{ServerProcess, TestApp, new_key, parts, payment};

/// A payment and its refund, charged after the backup was taken.
struct Made {
    key: String,
    first: Value,
    refund_key: String,
    refund: Value,
}

/// Pays and refunds three times against `app`.
async fn make_payments(app: &TestApp, api_key: &str) -> Vec<Made> {
    let mut made = Vec::new();
    for amount in [1_000, 2_000, 3_000] {
        let key = new_key();
        let (status, _, first) =
            parts(app.post_payment(api_key, Some(&key), &payment(amount)).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::CREATED, "{first}");
        let refund_key = new_key();
        let body = json!({"payment": first["id"], "amount": amount / 4});
        let (status, _, refund) = parts(app.post_refund(api_key, Some(&refund_key), &body).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::CREATED, "{refund}");
        made.push(Made { key, first, refund_key, refund });
    }
    made
}

/// The scenario the issue measured (12 of 12 charged twice): a backup, payments after it, a
/// restore, and every client retrying with the same key and body. One charge and one refund per
/// key in the gateway's ledger, and each retry answered with the original payment's id and
/// PaymentIntent (and the original refund's id): the rows are rebuilt, not made anew.
#[tokio::test]
async fn a_restore_from_a_backup_before_the_payments_charges_nothing_twice() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let backup = app.database.snapshot().await;

    let made = make_payments(&app, &api_key).await;
    let charged = app.charges().await.len();
    assert_eq!(charged, 3);

    // The restore: a new server on the copy taken before the payments, the same gateway.
    let restored = ServerProcess::start(&backup.url, &app.sim_url, &[]).await;
    assert_eq!(backup.count("payments").await, 0, "the backup predates the payments");
    let client = reqwest::Client::new();
    for made in &made {
        let amount = made.first["amount"].as_i64().unwrap();
        let retry = client
            .post(restored.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", &made.key)
            .json(&payment(amount))
            .send()
            .await
            .unwrap();
        let (status, _, again) = parts(retry).await;
        assert_eq!(status, StatusCode::CREATED, "{again}");
        assert_eq!(app.charges_for(&made.key).await.len(), 1, "charged once: {}", made.key);
        assert_eq!(again["payment_intent"], made.first["payment_intent"], "Stripe replayed the original PaymentIntent");
        assert_eq!(again["id"], made.first["id"], "the payment is rebuilt under its original id");

        let body = json!({"payment": made.first["id"], "amount": amount / 4});
        let retry = client
            .post(restored.url("/v1/refunds"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", &made.refund_key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let (status, _, again) = parts(retry).await;
        assert_eq!(status, StatusCode::CREATED, "{again}");
        assert_eq!(again["id"], made.refund["id"], "the refund is rebuilt under its original id");
        let gateway_refunds: Vec<Value> = app
            .ledger
            .refunds()
            .await
            .into_iter()
            .filter(|r| r["metadata"]["payonce_payment"] == made.first["id"])
            .collect();
        assert_eq!(gateway_refunds.len(), 1, "refunded once: {gateway_refunds:?}");
    }
    assert_eq!(app.charges().await.len(), charged, "no new charge anywhere");
    let rebuilt: i64 = sqlx::query_scalar("select count(*) from payments where status = 'succeeded'")
        .fetch_one(&backup.pool)
        .await
        .unwrap();
    assert_eq!(rebuilt, 3, "the restored database holds the three payments again");
    let response = client
        .get(restored.url(&format!("/v1/payments/{}", made[0].first["id"].as_str().unwrap())))
        .bearer_auth(&api_key)
        .send()
        .await
        .unwrap();
    let (status, _, fetched) = parts(response).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fetched["amount_refunded"], made[0].refund["amount"], "the payment's refunds are rebuilt too");
}

/// Forgetting on purpose is still possible: after an operator's *Expire now* (or the key's own
/// expiry), the same request is a new payment: a new generation of the request, with its own
/// downstream key, charged anew, while the first payment stays as it was.
#[tokio::test]
async fn after_a_key_expired_the_same_request_is_a_new_payment() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let (status, _, first) = parts(app.post_payment(&api_key, Some(&key), &payment(1_500)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);

    // The reaper deletes the key (as at its expiry, or after an operator's Expire now).
    sqlx::query("update idempotency_keys set expires_at = now() where key = $1")
        .bind(&key)
        .execute(&app.db)
        .await
        .unwrap();
    let engine = crate::browser::crashing_engine(&app, std::time::Duration::from_secs(30));
    // The server's own sweeper may be reaping it at this very moment (its row lock makes this
    // reap skip the key until its delete commits): whichever is first, the key goes.
    let gone = async {
        while engine.reap_expired(10).await.unwrap() == 0 && app.database.key_state(&key).await.is_some() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), gone).await.expect("the key is gone");
    assert_eq!(app.database.key_state(&key).await, None, "the key is gone");

    // A new server process: the first one's memory of the answer plays no part.
    let server = ServerProcess::start(&app.database.url, &app.sim_url, &[]).await;
    let retry = reqwest::Client::new()
        .post(server.url("/v1/payments"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", &key)
        .json(&payment(1_500))
        .send()
        .await
        .unwrap();
    let (status, headers, second) = parts(retry).await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    assert!(headers.get("idempotent-replayed").is_none(), "a new payment, not a replay");
    assert_ne!(second["id"], first["id"]);
    assert_ne!(second["payment_intent"], first["payment_intent"]);
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 2, "charged again, on purpose");
    assert_ne!(charges[0]["idempotency_key"], charges[1]["idempotency_key"], "under another downstream key");
    assert_eq!(app.count("payments").await, 2, "the first payment stays");
}
