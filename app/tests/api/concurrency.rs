//! Many requests at the same instant.

use std::sync::Arc;

use reqwest::StatusCode;
use tokio::sync::Barrier;

use crate::helpers::{TestApp, new_key, payment};

/// 50 requests with one key, released together by a barrier: exactly one charge and one payment;
/// every answer is a 201, a replayed 201 or a 409 with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_simultaneous_duplicates_charge_once() {
    let app = Arc::new(TestApp::spawn().await);
    let api_key = app.customer("acme").await;
    let key = new_key();
    // A little gateway latency keeps the first request in flight while the others arrive.
    app.set_faults(serde_json::json!({"latency_ms": 200})).await;
    let barrier = Arc::new(Barrier::new(50));

    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (app, api_key, key, barrier) = (app.clone(), api_key.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                let request = app.post_payment(&api_key, Some(&key), &payment(4200));
                barrier.wait().await;
                let response = request.send().await.unwrap();
                let replayed = response.headers().get("idempotent-replayed").is_some();
                let retry_after = response.headers().get("retry-after").cloned();
                (response.status(), replayed, retry_after)
            })
        })
        .collect();

    let mut created = 0;
    let mut in_flight = 0;
    let mut replayed = 0;
    for task in tasks {
        match task.await.unwrap() {
            (StatusCode::CREATED, false, _) => created += 1,
            (StatusCode::CREATED, true, _) => replayed += 1,
            (StatusCode::CONFLICT, _, Some(retry_after)) => {
                assert!(retry_after.to_str().unwrap().parse::<u64>().unwrap() >= 1);
                in_flight += 1;
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(created, 1, "exactly one request did the work ({in_flight} in flight, {replayed} replayed)");
    assert_eq!(created + in_flight + replayed, 50);
    assert_eq!(app.charges_for(&key).await.len(), 1);
    assert_eq!(app.count("payments").await, 1);
}

/// Many different keys at once, each sent twice: one charge per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_keys_at_once_charge_once_each() {
    let app = Arc::new(TestApp::spawn().await);
    let api_key = app.customer("acme").await;
    let keys: Vec<String> = (0..40).map(|_| new_key()).collect();
    let barrier = Arc::new(Barrier::new(keys.len() * 2));

    let tasks: Vec<_> = keys
        .iter()
        .flat_map(|key| [key.clone(), key.clone()])
        .map(|key| {
            let (app, api_key, barrier) = (app.clone(), api_key.clone(), barrier.clone());
            tokio::spawn(async move {
                let request = app.post_payment(&api_key, Some(&key), &payment(100));
                barrier.wait().await;
                request.send().await.unwrap().status()
            })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap();
        assert!(status == StatusCode::CREATED || status == StatusCode::CONFLICT, "{status}");
    }

    let charges = app.charges().await;
    assert_eq!(charges.len(), keys.len());
    for key in &keys {
        assert_eq!(charges.iter().filter(|c| c["metadata"]["payonce_idempotency_key"] == key.as_str()).count(), 1);
    }
    assert_eq!(app.count("payments").await, keys.len() as i64);
}
