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

/// The refund ledger's refunds of one payment, by payonce's refund id.
async fn gateway_refunds_of(app: &TestApp, payment: &Value) -> Vec<Value> {
    app.ledger.refunds().await.into_iter().filter(|r| r["metadata"]["payonce_payment"] == payment["id"]).collect()
}

/// A refund whose answer was lost, then more than a page (100) of later refunds of the same
/// payment. Past the horizon the sweeper may only look the lost one up, in the list of the
/// payment's refunds, newest first: it must read every page (not give the refund up as "never
/// made" because it is not on the first one, which gave its amount back and let another key
/// refund the same money a second time). The refund is found, succeeded, once.
#[tokio::test]
async fn a_refund_past_a_page_of_later_refunds_is_found_not_made_twice() {
    let settings = EngineSettings {
        horizon: Horizon { downstream_key_ttl: Duration::from_secs(1), search_settle: Duration::from_millis(500) },
        ..short()
    };
    let app = TestApp::spawn_with(Options {
        budget: settings.budget,
        horizon: settings.horizon,
        lease: Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    let api_key = app.customer("acme").await;
    let (status, _, paid) =
        parts(app.post_payment(&api_key, Some(&new_key()), &payment(10_000)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);

    let lost = new_key();
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1, "operations": ["create_refund"]})).await;
    let body = json!({"payment": paid["id"], "amount": 1_000});
    let answer = app.post_refund(&api_key, Some(&lost), &body).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE, "refunded at the gateway, answer lost");
    for _ in 0..101 {
        let body = json!({"payment": paid["id"], "amount": 1});
        let later = app.post_refund(&api_key, Some(&new_key()), &body).send().await.unwrap();
        assert_eq!(later.status(), StatusCode::CREATED);
    }

    tokio::time::sleep(Duration::from_secs(2)).await; // past the horizon and the settle delay
    let sweeper = app.database.sweeper(&app.sim_url, "sweeper:test", settings);
    sweep_until_final(&app, &sweeper, &lost, Duration::from_secs(15)).await;
    let seen = reconciliations(&app, &lost).await;
    assert_eq!(seen.last().map(|(m, a, _)| (m.as_str(), a.as_str())), Some(("list", "succeeded")), "{seen:?}");
    let (status, _, refund) = parts(
        app.post_refund(&api_key, Some(&lost), &json!({"payment": paid["id"], "amount": 1_000})).send().await.unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{refund}");
    assert_eq!(refund["status"], "succeeded");

    // What remains is 10 000 - 1 000 - 101: a key asking for more is refused, and the gateway
    // refunded each amount once.
    let greedy = app
        .post_refund(&api_key, Some(&new_key()), &json!({"payment": paid["id"], "amount": 9_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(greedy.status(), StatusCode::CONFLICT);
    let refunds = gateway_refunds_of(&app, &paid).await;
    assert_eq!(refunds.len(), 102);
    assert_eq!(refunds.iter().map(|r| r["amount"].as_i64().unwrap()).sum::<i64>(), 1_101);
    let reserved: i64 = sqlx::query_scalar("select amount_refunded from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(reserved, 1_101);
}

/// A refund call the gateway holds and executes late (after payonce gave up waiting). Past the
/// horizon the sweeper lists the payment's refunds and finds none yet: as for a payment's
/// search, that absence is believed only once the settle delay has passed since the last create
/// call could have been sent. Until then the key stays, and the late refund is found: succeeded,
/// its money counted, never "given back" while it moves.
#[tokio::test]
async fn a_refund_the_gateway_makes_late_is_not_given_up_too_early() {
    let settings = EngineSettings {
        horizon: Horizon { downstream_key_ttl: Duration::from_secs(1), search_settle: Duration::from_secs(4) },
        ..short()
    };
    let app = TestApp::spawn_with(Options {
        budget: settings.budget,
        horizon: settings.horizon,
        lease: Duration::from_secs(1),
        gateway_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    let api_key = app.customer("acme").await;
    let (_, _, paid) = parts(app.post_payment(&api_key, Some(&new_key()), &payment(5_000)).send().await.unwrap()).await;
    let key = new_key();
    app.set_faults(
        json!({"timeout_rate": 1.0, "timeout_hold_ms": 2500, "next_calls": 1, "operations": ["create_refund"]}),
    )
    .await;
    let body = json!({"payment": paid["id"], "amount": 2_000});
    let answer = app.post_refund(&api_key, Some(&key), &body).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE, "payonce stopped waiting; the gateway holds the call");

    tokio::time::sleep(Duration::from_millis(1200)).await; // past the horizon; the call is still held
    assert!(gateway_refunds_of(&app, &paid).await.is_empty(), "not made yet");
    let sweeper = app.database.sweeper_with(&app.sim_url, "sweeper:test", settings, Duration::from_millis(500));
    sweep_until_final(&app, &sweeper, &key, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // the held call has been made by now

    let refunds = gateway_refunds_of(&app, &paid).await;
    assert_eq!(refunds.len(), 1, "the held call was made, once");
    let (status, _, refund) = parts(app.post_refund(&api_key, Some(&key), &body).send().await.unwrap()).await;
    assert_eq!((status, &refund["status"]), (StatusCode::CREATED, &json!("succeeded")), "{refund}");
    let reserved: i64 = sqlx::query_scalar("select amount_refunded from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(reserved, 2_000, "its amount stays reserved: it moved");
    let seen = reconciliations(&app, &key).await;
    assert!(seen.iter().any(|(m, a, _)| m == "list" && a == "none"), "an early empty list, not believed: {seen:?}");
}
