//! Past the downstream key's horizon payonce sends no create call: it searches the gateway by
//! its own metadata, and only an empty search, believed after the settle delay, gives a key up.

use std::time::{Duration, Instant};

use payonce::idempotency::{Backoff, Budget, EngineSettings, Horizon};
use payonce::sweeper::Sweeper;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Options, TestApp, assert_problem, new_key, parts, payment};

/// A horizon of 2 s and a settle delay of 1 s; a budget of 2 attempts, 20 ms apart.
fn short() -> EngineSettings {
    EngineSettings {
        budget: Budget {
            max_attempts: 2,
            backoff: Backoff { base: Duration::from_millis(20), cap: Duration::from_millis(20) },
            ..Budget::default()
        },
        horizon: Horizon { downstream_key_ttl: Duration::from_secs(2), search_settle: Duration::from_secs(1) },
        ..EngineSettings::default()
    }
}

async fn app() -> TestApp {
    let settings = short();
    TestApp::spawn_with(Options { budget: settings.budget, horizon: settings.horizon, ..Default::default() }).await
}

/// Sweeps until the key is final, or panics after `deadline`.
async fn sweep_until_final(app: &TestApp, sweeper: &Sweeper, key: &str, deadline: Duration) {
    let started = Instant::now();
    while app.database.key_state(key).await.unwrap().0 == "processing" {
        assert!(started.elapsed() < deadline, "still processing after {deadline:?}");
        let report = sweeper.sweep().await;
        assert_eq!(report.errors, 0, "{report:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The key's reconciliations: (method, answer, seconds after the key's creation).
async fn reconciliations(app: &TestApp, key: &str) -> Vec<(String, String, f64)> {
    sqlx::query_as(
        "select e.detail->>'method', e.detail->>'answer', extract(epoch from e.created_at - k.created_at)::float8
         from idempotency_events e join idempotency_keys k on k.id = e.key_id
         where k.key = $1 and e.kind = 'reconciled' order by e.id",
    )
    .bind(key)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// The gateway never saw the payment (every create failed before executing). Inside the horizon
/// the sweeper replays the create; past it, it only searches; the empty search is believed once
/// the settle delay has passed, and only then is the key given up: `failed`, with a stored 502
/// that says, truthfully, that the gateway confirmed no charge.
#[tokio::test]
async fn an_empty_search_after_the_settle_delay_confirms_no_charge() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"fail_rate": 1.0, "operations": ["create_payment_intent"]})).await;
    let first = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);

    let sweeper = app.database.sweeper(&app.sim_url, "sweeper:test", short());
    sweep_until_final(&app, &sweeper, &key, Duration::from_secs(10)).await;

    let seen = reconciliations(&app, &key).await;
    let horizon = short().horizon.downstream_key_ttl.as_secs_f64();
    assert!(seen.iter().any(|(method, ..)| method == "replay"), "{seen:?}");
    for (method, answer, at) in &seen {
        if *at >= horizon + 0.1 {
            assert_eq!((method.as_str(), answer.as_str()), ("search", "none"), "no create past the horizon: {seen:?}");
        }
    }
    let believed: Vec<Value> = sqlx::query_scalar(
        "select detail->'believed' from idempotency_events where kind = 'reconciled' and detail->>'method' = 'search' order by id",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(believed.last(), Some(&json!(true)), "{believed:?}");
    assert!(believed.len() >= 2 && believed[0] == json!(false), "a search too early was not believed: {believed:?}");

    let retry = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let problem = assert_problem(retry, StatusCode::BAD_GATEWAY, "payment-abandoned").await;
    assert!(problem["detail"].as_str().unwrap().contains("confirmed that no charge was made"), "{problem}");
    let (status, code): (String, Option<String>) =
        sqlx::query_as("select status, failure_code from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!((status.as_str(), code.as_deref()), ("failed", Some("not_charged")));
    assert!(app.charges().await.is_empty());
}

/// The gateway charged but every answer was lost, and its PaymentIntent id is unknown (no
/// webhook). Past the horizon the search by metadata finds it, and the key gets the gateway's
/// answer: 201, one charge.
#[tokio::test]
async fn past_the_horizon_the_search_finds_the_charge() {
    let app = app().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1})).await;
    let first = app.post_payment(&api_key, Some(&key), &payment(700)).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    let charged = app.charges_for(&key).await;
    assert_eq!(charged.len(), 1, "charged, answer lost");
    // Every replay of the create takes longer than payonce waits (replays are never failed, but
    // they are slowed): until the horizon, asking with the same key gets no answer.
    app.set_faults(json!({"latency_ms": 3000, "operations": ["create_payment_intent"]})).await;

    let sweeper = app.database.sweeper_with(&app.sim_url, "sweeper:test", short(), Duration::from_secs(1));
    sweep_until_final(&app, &sweeper, &key, Duration::from_secs(15)).await;

    let seen = reconciliations(&app, &key).await;
    assert_eq!(seen.last().map(|(m, a, _)| (m.as_str(), a.as_str())), Some(("search", "succeeded")), "{seen:?}");
    let (status, headers, body) =
        parts(app.post_payment(&api_key, Some(&key), &payment(700)).send().await.unwrap()).await;
    assert_eq!((status, &headers["idempotent-replayed"]), (StatusCode::CREATED, &"true".parse().unwrap()));
    assert_eq!(body["payment_intent"], charged[0]["payment_intent"]);
    assert_eq!(app.charges_for(&key).await.len(), 1);
}
