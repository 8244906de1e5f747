//! The sweeper: abandoned keys are finished, hopeless ones given up, expired ones reaped; any
//! number of sweepers and clients may race for a key and exactly one wins.

use std::sync::Arc;
use std::time::Duration;

use payonce::idempotency::Backoff;
use payonce::sweeper::SweeperSettings;
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Barrier;

use crate::helpers::{Options, TestApp, assert_problem, new_key, parts, payment};

/// Sweeper settings for tests: no waiting between attempts.
fn eager(max_attempts: i32) -> SweeperSettings {
    SweeperSettings {
        interval: Duration::from_millis(100),
        max_attempts,
        backoff: Backoff { base: Duration::from_millis(1), cap: Duration::from_millis(1) },
        ..SweeperSettings::default()
    }
}

/// Leaves `key` abandoned at `payment_created`: the gateway fails once, the client gets its 503
/// and never retries.
async fn abandon(app: &TestApp, api_key: &str, key: &str) {
    app.set_faults(json!({"fail_rate": 1.0, "next_calls": 1})).await;
    let response = app.post_payment(api_key, Some(key), &payment(500)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// A key abandoned after a gateway failure is completed by the sweeper alone, and the client's
/// later retry gets the replay.
#[tokio::test]
async fn sweeper_completes_abandoned_work() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    abandon(&app, &api_key, &key).await;

    let report = app.database.sweeper(&app.sim_url, "sweeper:test", eager(5)).sweep().await;

    assert_eq!((report.completed, report.errors), (1, 0), "{report:?}");
    assert_eq!(app.database.key_state(&key).await.unwrap().0, "completed");
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    let (status, headers, body) =
        parts(app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body["payment_intent"], charges[0]["payment_intent"]);
}

/// The sweeper inside `payonce serve` does the same on its own schedule.
#[tokio::test]
async fn the_servers_own_sweeper_completes_abandoned_work() {
    let app = TestApp::spawn_with(Options { sweeper: eager(5), ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    abandon(&app, &api_key, &key).await;

    app.database.wait_until_final(&key, Duration::from_secs(10)).await;
    assert_eq!(app.database.key_state(&key).await.unwrap().0, "completed");
    assert_eq!(app.charges_for(&key).await.len(), 1);
}

/// Three sweepers on one database take each of 30 abandoned keys exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sweepers_never_take_a_key_twice() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let keys: Vec<String> = (0..30).map(|_| new_key()).collect();
    app.set_faults(json!({"fail_rate": 1.0})).await;
    for key in &keys {
        let response = app.post_payment(&api_key, Some(key), &payment(100)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    app.set_faults(json!({"latency_ms": 20})).await;

    let barrier = Arc::new(Barrier::new(3));
    let sweeps: Vec<_> = (0..3)
        .map(|i| {
            let sweeper = app.database.sweeper(&app.sim_url, &format!("sweeper:{i}"), eager(5));
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                sweeper.sweep().await
            })
        })
        .collect();
    let mut completed = 0;
    for sweep in sweeps {
        let report = sweep.await.unwrap();
        assert_eq!((report.lost, report.errors), (0, 0), "{report:?}");
        completed += report.completed;
    }

    assert_eq!(completed, keys.len());
    let charges = app.charges().await;
    assert_eq!(charges.len(), keys.len());
    for key in &keys {
        let kinds = app.event_kinds(key).await;
        assert_eq!(kinds.iter().filter(|k| *k == "reclaimed").count(), 1, "{key}: {kinds:?}");
        assert_eq!(charges.iter().filter(|c| c["metadata"]["payonce_idempotency_key"] == key.as_str()).count(), 1);
    }
}

/// A client retry and the completer reach an expired key at the same instant: one of them wins,
/// the key is charged once, and the loser is told the truth (in flight, or the replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_retry_racing_the_completer_has_one_winner() {
    let app = Arc::new(TestApp::spawn().await);
    let api_key = app.customer("acme").await;
    for _ in 0..10 {
        let key = new_key();
        abandon(&app, &api_key, &key).await;
        let sweeper = app.database.sweeper(&app.sim_url, "sweeper:race", eager(5));
        let barrier = Arc::new(Barrier::new(2));

        let sweep = {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                sweeper.sweep().await
            })
        };
        let retry = {
            let (app, api_key, key) = (app.clone(), api_key.clone(), key.clone());
            tokio::spawn(async move {
                let request = app.post_payment(&api_key, Some(&key), &payment(500));
                barrier.wait().await;
                let response = request.send().await.unwrap();
                (response.status(), response.headers().contains_key("idempotent-replayed"))
            })
        };
        let report = sweep.await.unwrap();
        let (status, replayed) = retry.await.unwrap();

        let client_won = status == StatusCode::CREATED && !replayed;
        let sweeper_won = report.completed == 1;
        assert!(
            client_won ^ sweeper_won,
            "exactly one winner: client {status} (replayed {replayed}), sweeper {report:?}"
        );
        if sweeper_won {
            assert!(status == StatusCode::CONFLICT || (status == StatusCode::CREATED && replayed), "{status}");
        }
        app.database.wait_until_final(&key, Duration::from_secs(5)).await;
        assert_eq!(app.charges_for(&key).await.len(), 1);
        let kinds = app.event_kinds(&key).await;
        assert_eq!(kinds.iter().filter(|k| *k == "reclaimed").count(), 1, "{kinds:?}");
    }
}

/// A key whose gateway never answers is given up after `max_attempts`: `failed`, with a stored
/// 502 that every retry gets, and its payment marked failed. Never `processing` forever.
#[tokio::test]
async fn hopeless_keys_are_given_up_not_left_processing() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"fail_rate": 1.0})).await;
    let first = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);

    let sweeper = app.database.sweeper(&app.sim_url, "sweeper:test", eager(3));
    let mut passes = Vec::new();
    while app.database.key_state(&key).await.unwrap().0 == "processing" {
        assert!(passes.len() < 10, "never given up: {passes:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        passes.push(sweeper.sweep().await);
    }

    assert_eq!(passes.iter().map(|r| r.retried).sum::<usize>(), 2, "attempts 2 and 3 by the sweeper: {passes:?}");
    assert_eq!(passes.last().unwrap().failed, 1);
    let (state, _, _, attempts) = app.database.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), attempts), ("failed", 4));
    let retry = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let problem = assert_problem(retry, StatusCode::BAD_GATEWAY, "payment-abandoned").await;
    assert!(problem["payment"].as_str().unwrap().starts_with("pay_"));
    let status: String = sqlx::query_scalar("select status from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(status, "failed");
    let kinds = app.event_kinds(&key).await;
    let failed = kinds.iter().position(|k| k == "failed").expect("a failed event");
    assert!(
        kinds[failed + 1..].iter().all(|k| k == "replayed"),
        "nothing happens to a failed key but replays: {kinds:?}"
    );
    assert!(app.charges().await.is_empty());
}

/// Final keys are deleted once expired (in small batches); their payments stay; the deletion is
/// an event. A retry after expiry is a new request: that is the published expiry policy.
#[tokio::test]
async fn expired_keys_are_reaped_and_payments_survive() {
    let app = TestApp::spawn_with(Options { key_ttl: Duration::from_secs(1), ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let (_, _, first) = parts(app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap()).await;
    let key_id: uuid::Uuid = sqlx::query_scalar("select id from idempotency_keys").fetch_one(&app.db).await.unwrap();
    let sweeper = app.database.sweeper(&app.sim_url, "sweeper:test", eager(5));
    assert_eq!(sweeper.sweep().await.reaped, 0, "not expired yet");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = sweeper.sweep().await;

    assert_eq!(report.reaped, 1);
    assert_eq!(app.count("idempotency_keys").await, 0);
    let link: Option<uuid::Uuid> =
        sqlx::query_scalar("select idempotency_key_id from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(link, None, "the payment survives, unlinked");
    let expired: i64 =
        sqlx::query_scalar("select count(*) from idempotency_events where key_id = $1 and kind = 'expired'")
            .bind(key_id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(expired, 1);

    let (status, headers, second) =
        parts(app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none(), "after expiry the key names a new request");
    assert_ne!(first["id"], second["id"]);
}
