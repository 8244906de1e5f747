//! Keys are scoped: per customer, and per operation.

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{TestApp, assert_problem, new_key, parts, payment};

/// The same key from two customers is two payments, and neither can see the other's.
#[tokio::test]
async fn same_key_from_two_customers_is_two_operations() {
    let app = TestApp::spawn().await;
    let alice = app.customer("alice").await;
    let bob = app.customer("bob").await;
    let key = new_key();

    let (a_status, _, a) = parts(app.post_payment(&alice, Some(&key), &payment(100)).send().await.unwrap()).await;
    // Bob uses the same key with another payload: that is not a mismatch, it is his own key.
    let (b_status, b_headers, b) = parts(app.post_payment(&bob, Some(&key), &payment(250)).send().await.unwrap()).await;

    assert_eq!((a_status, b_status), (StatusCode::CREATED, StatusCode::CREATED));
    assert!(b_headers.get("idempotent-replayed").is_none(), "Bob must not get Alice's stored response");
    assert_ne!(a["id"], b["id"]);
    assert_eq!(b["amount"], 250);
    assert_eq!(app.count("payments").await, 2);
    assert_eq!(app.charges_for(&key).await.len(), 2);

    // Bob's retry replays Bob's payment.
    let (_, headers, replay) = parts(app.post_payment(&bob, Some(&key), &payment(250)).send().await.unwrap()).await;
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replay["id"], b["id"]);

    // Neither can read the other's payment.
    let alice_payment = a["id"].as_str().unwrap();
    assert_problem(
        app.get(&bob, &format!("/v1/payments/{alice_payment}")).send().await.unwrap(),
        StatusCode::NOT_FOUND,
        "not-found",
    )
    .await;
    let (_, _, list) = parts(app.get(&bob, "/v1/payments").send().await.unwrap()).await;
    let ids: Vec<&Value> = list["data"].as_array().unwrap().iter().map(|p| &p["id"]).collect();
    assert_eq!(ids, [&b["id"]]);
}

/// A key first used for another operation is refused with 422, even with an identical body.
#[tokio::test]
async fn key_used_on_another_route_is_422() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    // payonce has one idempotent route; a key recorded for another one stands for any future route.
    let customer_id: uuid::Uuid = sqlx::query_scalar("select id from customers").fetch_one(&app.db).await.unwrap();
    sqlx::query(
        "insert into idempotency_keys (id, customer_id, key, method, route, fingerprint, request, state,
             recovery_point, response_status, response_headers, response_body, completed_at, expires_at)
         values ($1, $2, $3, 'POST', '/v1/refunds', sha256('x'), '{}', 'completed',
             'finished', 201, '[]', '', now(), now() + interval '1 day')",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(customer_id)
    .bind(&key)
    .execute(&app.db)
    .await
    .unwrap();

    let response = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    let problem = assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert!(problem["detail"].as_str().unwrap().contains("/v1/refunds"));
    assert!(app.charges().await.is_empty());
}
