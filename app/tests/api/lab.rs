//! The claim-strategy lab (docs/strategies.md): the same-instant storm against each strategy,
//! side by side on one lab server. Three hold (one charge per key in the simulator's ledger);
//! check-then-insert double charges, which is what it is for, and is refused outside the lab.
//! The redis strategy needs the machine's Redis (`REDIS_URL`, default 127.0.0.1:6379).

use std::collections::HashMap;
use std::sync::Arc;

use payonce::lab::{LabSettings, Strategy};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use crate::helpers::{Options, TestApp, new_key, parts, payment};

/// A lab server: every strategy at `/lab/{strategy}/v1/payments`.
pub(crate) async fn lab_app() -> Arc<TestApp> {
    let lab = LabSettings {
        lab: true,
        redis_url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
        ..LabSettings::default()
    };
    Arc::new(TestApp::spawn_with(Options { lab, ..Options::default() }).await)
}

fn lab_path(strategy: Strategy) -> String {
    format!("/lab/{strategy}/v1/payments")
}

/// What a storm saw: the statuses answered, and the charges in the ledger per key.
struct Storm {
    statuses: HashMap<u16, usize>,
    replayed: usize,
    charges: HashMap<String, usize>,
    keys: Vec<String>,
}

impl Storm {
    /// Keys charged more than once.
    fn double_charged(&self) -> Vec<&String> {
        self.keys.iter().filter(|k| self.charges.get(*k).copied().unwrap_or(0) > 1).collect()
    }
}

/// `keys` keys, each sent `duplicates` times, every request released at the same instant by one
/// barrier, against `strategy`, through a gateway that takes 200 ms (the first request of a key
/// is still at the gateway while its duplicates arrive).
async fn storm(app: &TestApp, strategy: Strategy, keys: usize, duplicates: usize) -> Storm {
    let api_key = app.customer(&format!("storm-{strategy}")).await;
    app.set_faults(json!({"latency_ms": 200})).await;
    let keys: Vec<String> = (0..keys).map(|_| new_key()).collect();
    let barrier = Arc::new(Barrier::new(keys.len() * duplicates));
    let tasks: Vec<_> = keys
        .iter()
        .flat_map(|key| std::iter::repeat_n(key.clone(), duplicates))
        .map(|key| {
            let request = app
                .client
                .post(app.url(&lab_path(strategy)))
                .bearer_auth(&api_key)
                .header("Idempotency-Key", &key)
                .json(&payment(4200));
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let response = request.send().await.unwrap();
                let replayed = response.headers().get("idempotent-replayed").is_some();
                (response.status().as_u16(), replayed)
            })
        })
        .collect();
    let mut statuses = HashMap::new();
    let mut replayed = 0;
    for task in tasks {
        let (status, was_replayed) = task.await.unwrap();
        *statuses.entry(status).or_insert(0) += 1;
        replayed += usize::from(was_replayed);
    }
    app.set_faults(json!({})).await;
    let mut charges = HashMap::new();
    for charge in app.charges().await {
        if let Some(key) = charge["metadata"]["payonce_idempotency_key"].as_str() {
            *charges.entry(key.to_owned()).or_insert(0) += 1;
        }
    }
    Storm { statuses, replayed, charges, keys }
}

/// Asserts a safe strategy's storm: one charge per key, one fresh 201 per key, and every other
/// answer a replayed 201 or a 409.
fn assert_held(strategy: Strategy, storm: &Storm) {
    for key in &storm.keys {
        assert_eq!(
            storm.charges.get(key).copied(),
            Some(1),
            "{strategy}: key {key} charged {:?} times",
            storm.charges.get(key)
        );
    }
    let created = storm.statuses.get(&201).copied().unwrap_or(0);
    assert_eq!(created - storm.replayed, storm.keys.len(), "{strategy}: one fresh 201 per key; {:?}", storm.statuses);
    let others: usize = storm.statuses.iter().filter(|(s, _)| **s != 201 && **s != 409).map(|(_, n)| n).sum();
    assert_eq!(others, 0, "{strategy}: only 201 and 409 answers; {:?}", storm.statuses);
}

/// The engine's own claim, through the lab's route: one charge per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_conflict_storm_charges_once_per_key() {
    let app = lab_app().await;
    let storm = storm(&app, Strategy::OnConflict, 5, 8).await;
    assert_held(Strategy::OnConflict, &storm);
}

/// SELECT … FOR UPDATE: one charge per key, and the duplicates wait for the first request (on the
/// unique index: PostgreSQL locks no missing row) and are replayed instead of answered 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn for_update_storm_charges_once_per_key_and_duplicates_wait() {
    let app = lab_app().await;
    let storm = storm(&app, Strategy::ForUpdate, 5, 8).await;
    assert_held(Strategy::ForUpdate, &storm);
    assert_eq!(storm.statuses.get(&409), None, "duplicates block, they are not turned away: {:?}", storm.statuses);
    assert_eq!(storm.replayed, 5 * 7);
}

/// A lease in Redis (SET NX PX, fenced in PostgreSQL): one charge per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_storm_charges_once_per_key() {
    let app = lab_app().await;
    let storm = storm(&app, Strategy::Redis, 5, 8).await;
    assert_held(Strategy::Redis, &storm);
}

/// The naive check-then-insert, in the same storm: the duplicates all check before any of them
/// inserts, and every key is charged more than once. (Its 50 ms gap between check and insert,
/// `PAYONCE_LAB_GAP_MS`, makes the race certain rather than likely.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_then_insert_storm_double_charges() {
    let app = lab_app().await;
    let storm = storm(&app, Strategy::CheckThenInsert, 5, 8).await;
    assert_eq!(storm.double_charged().len(), storm.keys.len(), "every key double charged: {:?}", storm.charges);
    let total: usize = storm.keys.iter().map(|k| storm.charges[k]).sum();
    assert!(total > storm.keys.len() * 2, "{total} charges for {} keys", storm.keys.len());
}

/// The workshop's fix: the unique index check-then-insert lacks. The same storm then charges each
/// key once; the losers' inserts fail and are answered 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_then_insert_with_the_unique_index_charges_once() {
    let app = lab_app().await;
    sqlx::query(
        "create unique index lab_keys_naive_unique on lab_keys (customer_id, key) where strategy = 'check-then-insert'",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let storm = storm(&app, Strategy::CheckThenInsert, 5, 8).await;
    assert_held(Strategy::CheckThenInsert, &storm);
}

/// Each lab strategy keeps the contract of POST /v1/payments: 201, a replay of the same answer,
/// 422 for another payload under the key, and the payment readable at its Location.
#[tokio::test]
async fn every_strategy_keeps_the_contract() {
    let app = lab_app().await;
    let api_key = app.customer("contract").await;
    for strategy in Strategy::ALL {
        let key = new_key();
        let send = |body: Value| {
            app.client
                .post(app.url(&lab_path(strategy)))
                .bearer_auth(&api_key)
                .header("Idempotency-Key", &key)
                .json(&body)
                .send()
        };
        let (status, headers, first) = parts(send(payment(1500)).await.unwrap()).await;
        assert_eq!(status, StatusCode::CREATED, "{strategy}: {first}");
        assert_eq!(first["status"], "succeeded", "{strategy}");
        assert!(headers.get("idempotent-replayed").is_none());
        let (status, headers, again) = parts(send(payment(1500)).await.unwrap()).await;
        assert_eq!(status, StatusCode::CREATED, "{strategy}");
        assert_eq!(headers["idempotent-replayed"], "true", "{strategy}");
        assert_eq!(again, first, "{strategy}: the replay is the first answer");
        let (status, _, problem) = parts(send(payment(1600)).await.unwrap()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{strategy}: {problem}");
        assert_eq!(problem["type"], "https://payonce.dev/problems/idempotency-key-reused");
        let location = headers["location"].to_str().unwrap();
        let (status, _, shown) = parts(app.get(&api_key, location).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{strategy}: {location}");
        assert_eq!(shown["id"], first["id"]);
        assert_eq!(app.charges_for(&key).await.len(), 1, "{strategy}");
    }
    let (status, _, _) = parts(
        app.client
            .post(app.url("/lab/optimistic/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", "k")
            .json(&payment(1))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an unknown strategy");
}

/// /healthz says which strategy runs, and says it loudly for check-then-insert.
#[tokio::test]
async fn healthz_names_the_strategy() {
    let app = TestApp::spawn().await;
    let health: Value = app.client.get(app.url("/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["claim_strategy"], "on-conflict");
    assert_eq!(health["lab"], false);
    assert!(health.get("warning").is_none());
    assert!(health["pool"]["max"].as_u64().is_some());

    let lab = LabSettings { strategy: Strategy::CheckThenInsert, lab: true, ..LabSettings::default() };
    let naive = TestApp::spawn_with(Options { lab, ..Options::default() }).await;
    let health: Value = naive.client.get(naive.url("/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["claim_strategy"], "check-then-insert");
    assert_eq!(health["lab"], true);
    assert!(health["warning"].as_str().unwrap().contains("CHARGES TWICE"), "{health}");
    // The server-wide strategy is the one POST /v1/payments uses.
    let api_key = naive.customer("naive").await;
    let key = new_key();
    let response = naive.post_payment(&api_key, Some(&key), &payment(700)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let rows: i64 =
        sqlx::query_scalar("select count(*) from lab_keys where strategy = 'check-then-insert' and key = $1")
            .bind(&key)
            .fetch_one(&naive.db)
            .await
            .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(naive.count("idempotency_keys").await, 0);
}

/// Outside the lab there is no /lab route.
#[tokio::test]
async fn lab_routes_exist_only_in_lab_mode() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let response = app
        .client
        .post(app.url("/lab/for-update/v1/payments"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", new_key())
        .json(&payment(100))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

/// `PAYONCE_LAB=1` is lab mode, as documented: the binary then serves check-then-insert.
#[tokio::test]
async fn payonce_lab_1_allows_check_then_insert() {
    let database = crate::helpers::TestDatabase::create().await;
    let sim = payonce::simulator::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let env = [("PAYONCE_CLAIM_STRATEGY", "check-then-insert"), ("PAYONCE_LAB", "1")];
    let server = crate::helpers::ServerProcess::start(&database.url, &sim.base_url(), &env).await;
    let health: Value = reqwest::get(server.url("/healthz")).await.unwrap().json().await.unwrap();
    assert_eq!(health["claim_strategy"], "check-then-insert");
    assert_eq!(health["lab"], true);
}

/// Outside the lab only the engine serves. for-update and redis charge once, but a pending
/// payment of theirs is never looked up, a webhook arriving before their commit is unmatched, and
/// an unknown outcome leaves no row for the sweeper; check-then-insert lacks even charging once.
/// Each is refused without --lab, saying what it lacks and how to run it anyway; in the lab,
/// /healthz lists what the running strategy lacks.
#[tokio::test]
async fn only_the_engine_serves_outside_the_lab() {
    for strategy in [Strategy::ForUpdate, Strategy::Redis, Strategy::CheckThenInsert] {
        let lab = LabSettings { strategy, lab: false, ..LabSettings::default() };
        let err = lab.check().unwrap_err();
        assert!(err.contains("--lab") && err.contains("PAYONCE_LAB=1"), "{err}");
        for lack in strategy.lacks() {
            assert!(err.contains(lack), "{strategy}: {err}");
        }
        assert!(LabSettings { strategy, lab: true, ..LabSettings::default() }.check().is_ok());

        // `payonce serve` itself: a clear error on stderr and a non-zero exit, before it opens anything.
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_payonce"))
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PAYONCE_CLAIM_STRATEGY", strategy.as_str())
            .env("PAYONCE_ADDR", "127.0.0.1:0")
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{strategy} served outside the lab");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("PAYONCE_CLAIM_STRATEGY={strategy}")) && stderr.contains("--lab"), "{stderr}");
    }
    assert!(Strategy::OnConflict.lacks().is_empty());
    assert_eq!(Strategy::ForUpdate.lacks().len(), 3);
    assert_eq!(Strategy::CheckThenInsert.lacks().len(), 4);

    let lab = LabSettings { strategy: Strategy::ForUpdate, lab: true, ..LabSettings::default() };
    let app = TestApp::spawn_with(Options { lab, ..Options::default() }).await;
    let health: Value = app.client.get(app.url("/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["claim_strategy"], "for-update");
    assert_eq!(health["lacks"].as_array().map(Vec::len), Some(3), "{health}");
}

/// The dashboard's Lab page in a real browser: an operator runs all four strategies over two
/// servers; the result shows each strategy, check-then-insert's double charges in red with their
/// keys, and a raced key's timeline; the run is listed. Saved (with `PAYONCE_SCREENSHOTS=1`) as
/// `target/browser-artifacts/lab.png` (docs/images/lab.png is that screenshot).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lab_page_runs_a_storm_and_shows_double_charges_in_red() {
    let app = lab_app().await;
    crate::browser::create_admin(&app).await;
    let browser = crate::chromium::Browser::start().await;
    browser.goto(&app.url("/admin/lab")).await;
    browser.wait_for_path("/admin/login").await;
    browser.fill("name", crate::browser::ADMIN).await;
    browser.fill("password", crate::browser::PASSWORD).await;
    browser.click("form.stacked button[type=submit]").await;
    browser.wait_for_path("/admin/lab").await;
    browser.wait_for_text("Claim strategy: on-conflict").await;
    browser.fill("keys", "4").await;
    browser.fill("duplicates", "5").await;
    browser.fill("latency_ms", "200").await;
    browser.click("#run").await;
    let path = browser.wait_for_path("/admin/lab/runs/").await;
    // The page refreshes itself until the run is over.
    browser.wait_for_text("Finished.").await;

    let naive = browser.find("table.lab-summary tr.double[data-strategy='check-then-insert'] td").await;
    assert_eq!(naive.css_value("color").await.unwrap(), "rgba(185, 28, 28, 1)", "double charges are red");
    for safe in ["on-conflict", "for-update", "redis"] {
        let row = browser.find(&format!("table.lab-summary tr[data-strategy='{safe}']")).await;
        assert_eq!(row.attr("class").await.unwrap(), None, "{safe} did not double charge");
    }
    let text = browser.text().await;
    assert!(text.contains("charged more than once!"), "{text}");
    let double_key = browser.find("section.lab-strategy table.doubles tr.double code").await.text().await.unwrap();
    assert!(double_key.contains("check-then-insert"), "{double_key}");
    assert!(app.charges_for(&double_key).await.len() > 1, "the ledger agrees");
    browser.find("table.timeline tr.double").await;
    browser.screenshot("lab").await;

    // Stored, and listed for the class to compare.
    let id = path.rsplit('/').next().unwrap().to_owned();
    browser.goto(&app.url("/admin/lab")).await;
    browser.find(&format!("a[href='/admin/lab/runs/{id}']")).await;
    let (state, result): (String, Value) = sqlx::query_as("select state, result from lab_runs where id = $1::uuid")
        .bind(&id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(state, "finished");
    assert_eq!(result.as_array().unwrap().len(), 4);
    browser.close().await;
}

/// The gateway audit after check-then-insert double charged every key of a storm: each key is
/// listed as charged more than once. Lab payments have no key row, and "paid again after the key
/// expired" needs positive evidence (the earlier payments' keys reaped, with their tombstones),
/// never the mere absence of a key: a double charge is never classified away.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_audit_calls_the_labs_double_charges_double_charges() {
    let app = lab_app().await;
    let storm = storm(&app, Strategy::CheckThenInsert, 5, 8).await;
    assert_eq!(storm.double_charged().len(), 5, "{:?}", storm.charges);
    crate::browser::create_admin(&app).await;
    let client = crate::helpers::browser_client();
    crate::admin::sign_in(&app, &client).await;
    let audit = client.get(app.url("/admin/gateway")).send().await.unwrap().text().await.unwrap();
    assert!(audit.contains("5 keys were charged more than once!"), "{audit}");
    assert!(!audit.contains("Paid again after the key expired"), "{audit}");
    for key in &storm.keys {
        assert!(audit.contains(key.as_str()), "{key} listed as a double charge");
    }
}
