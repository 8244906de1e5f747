//! The database goes away under traffic and comes back: requests get 503 problems meanwhile (no
//! panic, no hung connection), and afterwards every payment completes exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use payonce::db::local::LocalPostgres;
use reqwest::StatusCode;
use tokio::sync::Mutex;

use crate::helpers::{Options, TestApp, new_key, payment};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_outage_then_every_payment_completes_once() {
    // A PostgreSQL of its own, so stopping it disturbs no other test.
    let dir = std::env::temp_dir().join(format!("payonce-outage-{}", uuid::Uuid::new_v4().simple()));
    let cluster =
        OwnCluster { postgres: Some(LocalPostgres::start(&dir).await.expect("a PostgreSQL for the outage")), dir };
    let postgres = cluster.postgres.as_ref().expect("just started");
    let app = Arc::new(
        TestApp::spawn_with(Options {
            lease: Duration::from_secs(2),
            database_server: Some(postgres.url("postgres")),
            ..Default::default()
        })
        .await,
    );
    let api_key = app.customer("acme").await;
    // Some gateway latency keeps payments in every phase when the database goes away.
    app.set_faults(serde_json::json!({"latency_ms": 20})).await;
    let outage_answers = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));

    // 12 clients paying one payment after another until told to stop; each payment is retried
    // with its key until it gets a 201.
    let clients: Vec<_> = (0..12)
        .map(|_| {
            let (app, api_key, outage_answers, done) =
                (app.clone(), api_key.clone(), outage_answers.clone(), done.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
                let mut keys = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let key = new_key();
                    loop {
                        let response = client
                            .post(app.url("/v1/payments"))
                            .bearer_auth(&api_key)
                            .header("Idempotency-Key", &key)
                            .json(&payment(100))
                            .send()
                            .await
                            .expect("every request gets an answer, even while the database is down");
                        let status = response.status();
                        if status == StatusCode::CREATED {
                            break;
                        }
                        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
                        let body: serde_json::Value = response.json().await.unwrap();
                        outage_answers.lock().await.push((
                            status,
                            content_type,
                            body["type"].as_str().unwrap_or("").to_owned(),
                        ));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    keys.push(key);
                }
                keys
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(300)).await;
    postgres.kill().await.expect("stop PostgreSQL");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ready_while_down = app.client.get(app.url("/readyz")).send().await.unwrap().status();
    postgres.revive().await.expect("start PostgreSQL again");
    tokio::time::sleep(Duration::from_secs(1)).await;
    done.store(true, Ordering::Relaxed);

    let mut keys = Vec::new();
    for client in clients {
        keys.extend(client.await.expect("no client panicked"));
    }
    assert_eq!(ready_while_down, StatusCode::SERVICE_UNAVAILABLE);
    let answers = outage_answers.lock().await;
    assert!(answers.iter().any(|(s, ..)| *s == StatusCode::SERVICE_UNAVAILABLE), "the outage was seen: {answers:?}");
    for (status, content_type, problem) in answers.iter() {
        assert!(
            *status == StatusCode::SERVICE_UNAVAILABLE || *status == StatusCode::CONFLICT,
            "only 503 (database or gateway) and 409 (a lease still held) during and after the outage: {status} {problem}"
        );
        assert_eq!(content_type, "application/problem+json");
    }
    let charges = app.charges().await;
    assert_eq!(charges.len(), keys.len(), "one charge per payment");
    for key in &keys {
        assert_eq!(charges.iter().filter(|c| c["metadata"]["payonce_idempotency_key"] == key.as_str()).count(), 1);
    }
    assert_eq!(app.count("payments").await, keys.len() as i64);
    eprintln!("{} payments, {} non-201 answers during the outage", keys.len(), answers.len());
}

/// The test's own PostgreSQL, stopped and deleted when the test ends, passed or failed.
struct OwnCluster {
    postgres: Option<LocalPostgres>,
    dir: std::path::PathBuf,
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let (postgres, dir) = (self.postgres.take(), self.dir.clone());
        // A thread of its own: Drop cannot await, and the test's runtime may be going away.
        let _ = std::thread::spawn(move || {
            if let Some(postgres) = postgres {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                let _ = runtime.block_on(postgres.stop());
            }
            let _ = std::fs::remove_dir_all(&dir);
            // And the lock file LocalPostgres keeps beside the folder.
            let mut lock = dir.into_os_string();
            lock.push(".lock");
            let _ = std::fs::remove_file(lock);
        })
        .join();
    }
}
