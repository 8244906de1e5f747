//! The retry budget holds on every path: clients and sweepers reclaim a key only after its
//! backoff and within PAYONCE_MAX_ATTEMPTS, so no client can stop recovery for everyone, and a
//! slow gateway is asked for the truth instead of being given up on.

use std::time::{Duration, Instant};

use payonce::idempotency::{Backoff, Budget, EngineSettings};
use payonce::sweeper::SweeperSettings;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{Options, TestApp, new_key, parts, payment};

/// A budget of `max_attempts`, waiting 50 ms, 50 ms, 100 ms, … up to 200 ms between attempts.
fn quick(max_attempts: i32) -> Budget {
    Budget {
        max_attempts,
        backoff: Backoff { base: Duration::from_millis(50), cap: Duration::from_millis(200) },
        ..Budget::default()
    }
}

/// Finding 1: a client retrying as fast as it can during an outage (1,100 times) neither
/// exhausts the arithmetic of the backoff nor stops the sweeper: afterwards its key and another
/// key whose charge was made but whose answer was lost both settle, with one charge each, and
/// no sweeper query ever fails.
#[tokio::test]
async fn fast_retries_during_an_outage_cannot_stop_recovery() {
    let app = TestApp::spawn_with(Options { budget: quick(12), ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let lost = new_key();
    app.set_faults(json!({"drop_after_charge_rate": 1.0, "next_calls": 1})).await;
    let response = app.post_payment(&api_key, Some(&lost), &payment(100)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.charges_for(&lost).await.len(), 1, "charged, answer lost");

    app.set_faults(json!({"fail_rate": 1.0})).await;
    let hammered = new_key();
    for _ in 0..1100 {
        let response = app.post_payment(&api_key, Some(&hammered), &payment(200)).send().await.unwrap();
        let status = response.status();
        assert!(matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT), "{status}");
    }
    let (_, _, _, attempts) = app.database.key_state(&hammered).await.unwrap();
    app.set_faults(json!({})).await;

    let settings = EngineSettings { budget: quick(12), ..EngineSettings::default() };
    let sweeper = app.database.sweeper(&app.sim_url, "sweeper:test", settings);
    let started = Instant::now();
    loop {
        let report = sweeper.sweep().await;
        assert_eq!(report.errors, 0, "a sweeper query failed (attempts reached {attempts}): {report:?}");
        let lost_state = app.database.key_state(&lost).await.unwrap().0;
        let hammered_state = app.database.key_state(&hammered).await.unwrap().0;
        if lost_state != "processing" && hammered_state != "processing" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never settled: {lost_state}, {hammered_state}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (key, amount) in [(&lost, 100), (&hammered, 200)] {
        assert_eq!(app.database.key_state(key).await.unwrap().0, "completed", "{key}");
        assert_eq!(app.charges_for(key).await.len(), 1, "{key}");
        let (status, headers, body) =
            parts(app.post_payment(&api_key, Some(key), &payment(amount)).send().await.unwrap()).await;
        assert_eq!((status, &headers["idempotent-replayed"]), (StatusCode::CREATED, &"true".parse().unwrap()));
        assert_eq!(body["status"], "succeeded");
    }
    assert!(attempts <= 12, "the client's retries reclaimed the key {attempts} times");
}

/// Finding 2: the gateway holds the first charge 12 s and then charges; the client retries every
/// 0.5 s. The budget runs out long before the gateway answers, and the payment still ends
/// `succeeded`, never `failed`: payonce keeps asking the gateway (the same downstream key) until
/// it answers.
#[tokio::test]
async fn a_slow_charge_is_never_recorded_as_failed() {
    let app = TestApp::spawn_with(Options {
        gateway_timeout: Duration::from_secs(2),
        budget: quick(4),
        sweeper: SweeperSettings { interval: Duration::from_millis(100), ..SweeperSettings::default() },
        ..Default::default()
    })
    .await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"timeout_rate": 1.0, "timeout_hold_ms": 12_000, "next_calls": 1})).await;

    let started = Instant::now();
    let mut answers = Vec::new();
    let body = loop {
        let (status, _, body) =
            parts(app.post_payment(&api_key, Some(&key), &payment(700)).send().await.unwrap()).await;
        answers.push(status.as_u16());
        match status {
            StatusCode::CREATED => break body,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT => {}
            other => panic!("{other} after {answers:?}: {body}"),
        }
        assert!(started.elapsed() < Duration::from_secs(40), "no answer: {answers:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    assert_eq!(body["status"], "succeeded", "{answers:?}");
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], body["payment_intent"]);
    let status: String = sqlx::query_scalar("select status from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(status, "succeeded");
    let kinds = app.event_kinds(&key).await;
    assert!(!kinds.iter().any(|k| k == "failed"), "{kinds:?}");
    assert_eq!(app.database.key_state(&key).await.unwrap().0, "completed");
}

/// Finding 5: a reclaim resumes from the recovery point of the row it updated, not from the one
/// its claim read. The old holder advances the key (`started` → `payment_created`) after the
/// retry's claim has read the row and before its reclaim runs; the retry then charges the
/// payment the old holder created, instead of failing with a spurious lease loss and blocking
/// the key with its own fresh lease.
#[tokio::test]
async fn a_reclaim_resumes_from_the_recovery_point_it_took_over() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    // A key whose holder got as far as the claim, and whose lease ran out long ago.
    app.set_faults(json!({"fail_rate": 1.0, "next_calls": 1})).await;
    let response = app.post_payment(&api_key, Some(&key), &payment(900)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    sqlx::query("delete from payments").execute(&app.db).await.unwrap();
    let (key_id, token): (uuid::Uuid, i64) = sqlx::query_as(
        "update idempotency_keys set recovery_point = 'started', locked_until = now() - interval '1 hour'
         where key = $1 returning id, lease_token",
    )
    .bind(&key)
    .fetch_one(&app.db)
    .await
    .unwrap();

    // The old holder, slow but alive, is about to advance: it holds the row while it does.
    let mut old_holder = app.db.begin().await.unwrap();
    sqlx::query("select 1 from idempotency_keys where id = $1 for update")
        .bind(key_id)
        .execute(&mut *old_holder)
        .await
        .unwrap();
    let retry = tokio::spawn(app.post_payment(&api_key, Some(&key), &payment(900)).send());
    // The retry's claim has read the row (lease lapsed, `started`); its reclaim waits for the row.
    let started = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock' and query like '%reclaimed as%'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the retry never reached its reclaim");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let payment_id = uuid::Uuid::now_v7();
    sqlx::query(
        "with advanced as (
             update idempotency_keys set recovery_point = 'payment_created'
             where id = $1 and lease_token = $2 and recovery_point = 'started'
             returning id, customer_id
         )
         insert into payments (id, customer_id, key_id, amount, currency, payment_method)
         select $3, customer_id, id, 900, 'usd', 'pm_card_visa' from advanced",
    )
    .bind(key_id)
    .bind(token)
    .bind(payment_id)
    .execute(&mut *old_holder)
    .await
    .unwrap();
    old_holder.commit().await.unwrap();

    let (status, _, body) = parts(retry.await.unwrap().unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["id"], format!("pay_{}", payment_id.simple()), "the old holder's payment, resumed");
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], body["payment_intent"]);
    assert_eq!(app.count("payments").await, 1);
    let kinds = app.event_kinds(&key).await;
    assert!(!kinds.iter().any(|k| k == "lease_lost"), "{kinds:?}");
}

/// A retry before the key's backoff has passed is told when to come back (409, Retry-After: the
/// time until the next allowed attempt, never 0) and does not take the key; one after it does.
#[tokio::test]
async fn a_retry_before_the_backoff_is_told_when_to_come_back() {
    let budget =
        Budget { backoff: Backoff { base: Duration::from_secs(2), cap: Duration::from_secs(10) }, ..Budget::default() };
    let app = TestApp::spawn_with(Options { budget, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"fail_rate": 1.0, "next_calls": 1})).await;

    let (status, headers, _) = parts(app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap()).await;
    assert_eq!((status, &headers["retry-after"]), (StatusCode::SERVICE_UNAVAILABLE, &"2".parse().unwrap()));
    let (status, headers, problem) =
        parts(app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["reason"], "backoff");
    let wait: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    assert_eq!(app.database.key_state(&key).await.unwrap().3, 1, "not reclaimed");

    tokio::time::sleep(Duration::from_secs(wait)).await;
    let (status, _, body) = parts(app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(app.database.key_state(&key).await.unwrap().3, 2);
    assert_eq!(app.charges_for(&key).await.len(), 1);
}

/// A downstream key horizon of a day or more is refused at startup, with an error that says why:
/// Stripe forgets idempotency keys after 24 hours, and a create sent later could charge twice.
#[test]
fn a_horizon_of_a_day_or_more_is_refused_at_startup() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_payonce"))
        .arg("serve")
        .env_clear()
        .env("PAYONCE_DOWNSTREAM_KEY_TTL_SECS", "86400")
        .output()
        .expect("run payonce");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("PAYONCE_DOWNSTREAM_KEY_TTL_SECS") && stderr.contains("24 hours"), "{stderr}");
}
