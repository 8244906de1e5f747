//! The database's own limits, as set on every pooled connection: a statement or a lock wait
//! that runs too long is a quick 503, and the isolation level is READ COMMITTED whatever the
//! database's default.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Barrier;

use crate::connections::Served;
use crate::helpers::{TestDatabase, assert_problem, new_key, payment};

/// Holds `lock table idempotency_keys` while 30 payments arrive at once: each is answered 503
/// `service-unavailable` with Retry-After by the database's own timeout (none waits for the
/// lock, so the pool is not drained and /readyz stays honest); once the lock is gone the same
/// keys pay, once each.
async fn a_long_lock_is_a_quick_503(env: &[(&str, &str)]) {
    let served = Served::start(env, None).await;
    let api_key = served.database.customer("acme").await;
    let mut lock = served.database.pool.begin().await.unwrap();
    sqlx::query("lock table idempotency_keys in access exclusive mode").execute(&mut *lock).await.unwrap();

    // The deadline only stops a test that would hang: the server answers within its timeouts.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let keys: Vec<String> = (0..30).map(|_| new_key()).collect();
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let request = client
                .post(served.server.url("/v1/payments"))
                .bearer_auth(&api_key)
                .header("Idempotency-Key", key)
                .json(&payment(100));
            tokio::spawn(async move { request.send().await })
        })
        .collect();
    for task in tasks {
        let response = task.await.unwrap().expect("answered while the lock is still held");
        assert!(response.headers().get("retry-after").is_some());
        let problem = assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "service-unavailable").await;
        assert!(problem["detail"].as_str().unwrap().contains("in time"), "{problem}");
    }
    let ready = client.get(served.server.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK, "the database answers: the server is ready");

    lock.rollback().await.unwrap();
    for key in &keys {
        let response = client
            .post(served.server.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", key)
            .json(&payment(100))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(served.ledger.charges_for(key).await.len(), 1);
    }
}

/// A lock wait longer than `lock_timeout` (1 s here; the statement timeout is 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_wait_past_the_lock_timeout_is_503() {
    a_long_lock_is_a_quick_503(&[("PAYONCE_DB_STATEMENT_TIMEOUT_SECS", "2"), ("PAYONCE_DB_LOCK_TIMEOUT_SECS", "1")])
        .await;
}

/// A statement longer than `statement_timeout` (2 s here, with no lock timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_past_the_statement_timeout_is_503() {
    a_long_lock_is_a_quick_503(&[("PAYONCE_DB_STATEMENT_TIMEOUT_SECS", "2"), ("PAYONCE_DB_LOCK_TIMEOUT_SECS", "0")])
        .await;
}

/// On a database whose default isolation is REPEATABLE READ, 20 simultaneous requests with one
/// key and two payloads get only 201, 409 or 422 (never a 500 from a serialization failure):
/// payonce pins READ COMMITTED, which its claim is designed for. One charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicting_claims_on_a_repeatable_read_database_are_never_500() {
    let database = TestDatabase::create().await;
    let name: String = sqlx::query_scalar("select current_database()").fetch_one(&database.pool).await.unwrap();
    sqlx::query(&format!("alter database {name} set default_transaction_isolation = 'repeatable read'"))
        .execute(&database.pool)
        .await
        .unwrap();
    let served = Served::start_on(database, &[], None).await;
    let api_key = served.database.customer("acme").await;
    served.ledger.set_faults(json!({"latency_ms": 200})).await;
    let key = new_key();
    let client = reqwest::Client::new();
    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let request = client
                .post(served.server.url("/v1/payments"))
                .bearer_auth(&api_key)
                .header("Idempotency-Key", &key)
                .json(&payment(if i % 2 == 0 { 100 } else { 200 }));
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let response = request.send().await.unwrap();
                (response.status(), response.text().await.unwrap())
            })
        })
        .collect();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert!(
            matches!(status, StatusCode::CREATED | StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY),
            "{status}: {body}"
        );
    }
    assert_eq!(served.ledger.charges_for(&key).await.len(), 1);
    assert_eq!(served.database.count("payments").await, 1);
}

/// The database fails after the claim, in the middle of the work (here it refuses the payment's
/// final write, after the charge): the client gets its 5xx, and the key is given back at once
/// instead of staying in flight until its 60 s lease runs out. So the client's immediate retry
/// resumes it (the gateway replays the charge under the same downstream key: one charge) where
/// it used to meet 409 `in_flight`.
#[tokio::test]
async fn a_database_error_mid_way_gives_the_key_back_at_once() {
    let app = crate::helpers::TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    for statement in [
        "create function refuse_for_the_test() returns trigger language plpgsql as \
         $$ begin raise exception 'refused by the test'; end $$",
        "create trigger refuse before update on payments for each row execute function refuse_for_the_test()",
    ] {
        sqlx::query(statement).execute(&app.db).await.unwrap();
    }
    let key = new_key();
    let failed = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert!(failed.status().is_server_error(), "the final write failed: {}", failed.status());
    assert_eq!(app.charges_for(&key).await.len(), 1, "the gateway charged before the write failed");
    sqlx::query("drop trigger refuse on payments").execute(&app.db).await.unwrap();

    let retry = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED, "resumed at once: {}", retry.text().await.unwrap());
    assert_eq!(app.charges_for(&key).await.len(), 1, "one charge: the retry got the gateway's replay");
    let key_row = app.database.key_state(&key).await.unwrap();
    assert_eq!((key_row.0.as_str(), key_row.1.as_str(), key_row.3), ("completed", "finished", 2), "{key_row:?}");
    let statuses: Vec<String> = sqlx::query_scalar("select status from payments").fetch_all(&app.db).await.unwrap();
    assert_eq!(statuses, ["succeeded"], "one payment, completed by the retry");
    let kinds = app.event_kinds(&key).await;
    assert!(kinds.contains(&"released".to_owned()) && kinds.contains(&"reclaimed".to_owned()), "{kinds:?}");
}
