//! The sweeper: abandoned keys are finished, spent ones reconciled, expired ones reaped; any
//! number of sweepers and clients may race for a key and exactly one wins.

use std::sync::Arc;
use std::time::Duration;

use payonce::idempotency::{Backoff, Budget, EngineSettings};
use payonce::sweeper::SweeperSettings;
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Barrier;

use crate::helpers::{Options, TestApp, assert_problem, new_key, parts, payment};

/// Engine settings for a test's own sweeper: no waiting between attempts.
fn eager(max_attempts: i32) -> EngineSettings {
    EngineSettings {
        budget: Budget {
            max_attempts,
            backoff: Backoff { base: Duration::from_millis(1), cap: Duration::from_millis(1) },
            ..Budget::default()
        },
        ..EngineSettings::default()
    }
}

/// The in-server sweeper, passing every 100 ms.
fn every_100ms() -> SweeperSettings {
    SweeperSettings { interval: Duration::from_millis(100), ..SweeperSettings::default() }
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
    let app = TestApp::spawn_with(Options { sweeper: every_100ms(), ..Default::default() }).await;
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

/// A key whose gateway never answers is not given up by guessing: past `max_attempts` the
/// sweeper stops charging it as a retry and reconciles it instead, asking the gateway again
/// with the same downstream key each pass (no `failed`, no stored answer), and clients are told
/// payonce is confirming the outcome. Once the gateway answers, that answer is the key's.
#[tokio::test]
async fn spent_keys_are_reconciled_not_given_up() {
    let app = TestApp::spawn_with(Options { budget: eager(3).budget, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"fail_rate": 1.0})).await;
    let first = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);

    let sweeper = app.database.sweeper(&app.sim_url, "sweeper:test", eager(3));
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let report = sweeper.sweep().await;
        assert_eq!((report.retried, report.failed, report.errors), (1, 0, 0), "{report:?}");
    }
    let (state, _, _, attempts) = app.database.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), attempts), ("processing", 7), "two retries, then four reconciliations");
    let kinds = app.event_kinds(&key).await;
    assert_eq!(kinds.iter().filter(|k| *k == "reconciled").count(), 4, "{kinds:?}");
    let details: Vec<serde_json::Value> =
        sqlx::query_scalar("select detail from idempotency_events where kind = 'reconciled' order by id")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert!(details.iter().all(|d| d["method"] == "replay" && d["answer"] == "unavailable"), "{details:?}");

    // The client's own budget is spent too: it is told to wait, not sent to the gateway.
    let retry = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    let problem = assert_problem(retry, StatusCode::CONFLICT, "idempotency-key-in-use").await;
    assert_eq!(problem["reason"], "reconciling");
    assert!(problem["detail"].as_str().unwrap().contains("confirming the outcome"), "{problem}");

    app.set_faults(json!({})).await;
    let report = sweeper.sweep().await;
    assert_eq!(report.completed, 1, "{report:?}");
    let (status, headers, body) =
        parts(app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap()).await;
    assert_eq!((status, &headers["idempotent-replayed"]), (StatusCode::CREATED, &"true".parse().unwrap()));
    assert_eq!(app.charges_for(&key).await.len(), 1);
    assert_eq!(app.charges_for(&key).await[0]["payment_intent"], body["payment_intent"]);
    assert!(!app.event_kinds(&key).await.contains(&"failed".to_owned()));
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
    let link: Option<uuid::Uuid> = sqlx::query_scalar(
        "select k.id from payments p left join idempotency_keys k on k.id = p.key_id and k.customer_id = p.customer_id",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(link, None, "the payment survives; its key is gone");
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
