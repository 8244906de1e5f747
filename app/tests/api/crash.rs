//! Crash tests: real `payonce serve` processes, killed with SIGKILL at every phase of a payment,
//! and a fresh process that must finish the work alone: exactly one charge, and the client's
//! retry gets the replay.

use std::time::{Duration, Instant};

use payonce::simulator;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Ledger, ServerProcess, TestDatabase, new_key, parts, payment};

/// Lease and sweep interval of the processes: short, so recovery is quick to watch.
const LEASE_SECS: &str = "2";
const SWEEP_INTERVAL_SECS: &str = "0.5";

/// Where the first process dies.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KillPoint {
    /// At a failpoint (see `payonce::failpoint`).
    Failpoint(&'static str),
    /// While the gateway holds the operation's call (the caller sets the simulator's latency),
    /// before it answers: the gateway does the work after the process died.
    DuringGatewayCall,
}

/// Sends `body` to `path` under `key` on `first`, kills `first` at `point` (its failpoint line,
/// or once the key has reached `first_phase` and the gateway call has had time to start), and
/// checks that the client saw its connection die and that the key was left unfinished. Returns
/// when the process was killed. Shared by the payments' and the refunds' crash tests.
pub(crate) async fn kill_during_request(
    first: &mut ServerProcess,
    db: &TestDatabase,
    point: KillPoint,
    first_phase: &str,
    (api_key, path, key, body): (&str, &str, &str, &Value),
) -> Instant {
    let request = reqwest::Client::new().post(first.url(path)).bearer_auth(api_key).header("Idempotency-Key", key);
    let request = tokio::spawn(request.json(body).send());
    match point {
        KillPoint::Failpoint(name) => {
            first.wait_for_line(&format!("failpoint {name} reached"), Duration::from_secs(10)).await
        }
        KillPoint::DuringGatewayCall => {
            // The first phase committed, so the gateway call is about to start; give it time to.
            while db.key_state(key).await.is_none_or(|(_, point, ..)| point != first_phase) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    first.kill();
    let killed_at = Instant::now();
    assert!(request.await.unwrap().is_err(), "the client saw its connection die");
    let (state, ..) = db.key_state(key).await.expect("the key was claimed before the crash");
    assert_eq!(state, "processing", "{point:?}: the crash left the key unfinished");
    killed_at
}

/// Starts a server, sends one payment, kills the server at `point`, starts another one and checks
/// that it finishes the payment by itself. Returns how long recovery took after the kill.
async fn kill_and_recover(point: KillPoint) -> Duration {
    let db = TestDatabase::create().await;
    let sim = simulator::start("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let ledger = Ledger::new(&sim.base_url());
    let key = new_key();
    let timing = [("PAYONCE_LEASE_SECS", LEASE_SECS), ("PAYONCE_SWEEP_INTERVAL_SECS", SWEEP_INTERVAL_SECS)];

    let mut first = match point {
        KillPoint::Failpoint(name) => {
            ServerProcess::start(&db.url, &sim.base_url(), &[timing[0], timing[1], ("PAYONCE_FAILPOINT", name)]).await
        }
        KillPoint::DuringGatewayCall => {
            ledger.set_faults(json!({"latency_ms": 1500, "next_calls": 1})).await;
            ServerProcess::start(&db.url, &sim.base_url(), &timing).await
        }
    };
    let api_key = db.customer("crash").await;
    let body = payment(4200);
    let killed_at =
        kill_during_request(&mut first, &db, point, "payment_created", (&api_key, "/v1/payments", &key, &body)).await;

    let second = ServerProcess::start(&db.url, &sim.base_url(), &timing).await;
    db.wait_until_final(&key, Duration::from_secs(20)).await;
    let recovered_in = killed_at.elapsed();

    let (state, recovery_point, token, _) = db.key_state(&key).await.unwrap();
    assert_eq!((state.as_str(), recovery_point.as_str()), ("completed", "finished"), "{point:?}");
    assert!(token >= 2, "{point:?}: finished under a new lease, not the dead one's");
    let charges = ledger.charges_for(&key).await;
    assert_eq!(charges.len(), 1, "{point:?}: exactly one charge");
    assert_eq!(db.count("payments").await, 1);

    let retry = reqwest::Client::new()
        .post(second.url("/v1/payments"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", &key)
        .json(&payment(4200))
        .send()
        .await
        .unwrap();
    let (status, headers, body) = parts(retry).await;
    assert_eq!(status, StatusCode::CREATED, "{point:?}: {body}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(body["payment_intent"], charges[0]["payment_intent"]);
    assert_eq!(ledger.charges().await.len(), 1);
    eprintln!("{point:?}: recovered {recovered_in:?} after the kill");
    recovered_in
}

/// Killed right after claiming the key (recovery point `started`).
#[tokio::test]
async fn killed_after_the_claim() {
    kill_and_recover(KillPoint::Failpoint("after_claim")).await;
}

/// Killed before the charge call (`payment_created` committed).
#[tokio::test]
async fn killed_before_the_charge_call() {
    kill_and_recover(KillPoint::Failpoint("after_payment_created")).await;
}

/// Killed while the gateway is processing the charge (it charges after the process died).
#[tokio::test]
async fn killed_during_the_charge_call() {
    kill_and_recover(KillPoint::DuringGatewayCall).await;
}

/// Killed after the gateway charged and before the final commit.
#[tokio::test]
async fn killed_after_the_charge_before_the_final_commit() {
    kill_and_recover(KillPoint::Failpoint("after_charge")).await;
}

/// A longer soak: many trials with random kill points. Run it by hand:
/// `cargo test -p payonce --test api crash::soak -- --ignored --nocapture`
/// (`PAYONCE_SOAK_TRIALS`, default 40).
#[tokio::test]
#[ignore = "a soak of many crashes; run by hand (see docs/operations.md)"]
async fn soak() {
    let trials: usize = std::env::var("PAYONCE_SOAK_TRIALS").ok().and_then(|n| n.parse().ok()).unwrap_or(40);
    let points = [
        KillPoint::Failpoint("after_claim"),
        KillPoint::Failpoint("after_payment_created"),
        KillPoint::DuringGatewayCall,
        KillPoint::Failpoint("after_charge"),
    ];
    let mut times: Vec<(usize, Duration)> = Vec::new();
    for trial in 0..trials {
        let which = (uuid::Uuid::new_v4().as_u128() % points.len() as u128) as usize;
        times.push((which, kill_and_recover(points[which]).await));
        eprintln!("trial {}/{trials} done", trial + 1);
    }
    for (i, point) in points.iter().enumerate() {
        let mut mine: Vec<Duration> = times.iter().filter(|(w, _)| *w == i).map(|(_, t)| *t).collect();
        mine.sort();
        if let (Some(min), Some(max)) = (mine.first(), mine.last()) {
            eprintln!(
                "{point:?}: {} trials, recovery min {min:?} median {:?} max {max:?}",
                mine.len(),
                mine[mine.len() / 2]
            );
        }
    }
}
