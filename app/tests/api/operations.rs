//! The registry of operations (`app/src/operations.rs`) is the one list: what the API describes
//! as idempotent, what the handlers scope their keys to, and every recovery point and event kind
//! that reaches the database are all checked against it, so that nothing (the engine's code, a
//! database constraint) keeps a second list to edit.

use std::collections::BTreeSet;

use payonce::idempotency::{EventKind, RecoveryPoint};
use payonce::operations::Op;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, new_key, parts, payment};

/// Every operation the API describes as idempotent (it takes an `Idempotency-Key`) is in the
/// registry, under the same method and route, and every registered one is described: the
/// description adds the key to the registry's operations (`http::openapi::finish`), so this
/// fails on a route that describes a key of its own without being registered; and each success
/// answer of a registered operation says it may be a replay.
#[tokio::test]
async fn the_described_idempotent_routes_are_the_registry() {
    let app = TestApp::spawn().await;
    let doc: Value = app.client.get(app.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    let mut described = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let takes_key = operation["parameters"]
                .as_array()
                .is_some_and(|params| params.iter().any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header"));
            if takes_key {
                described.insert((method.to_ascii_uppercase(), path.clone()));
                for (status, response) in operation["responses"].as_object().unwrap() {
                    let replayed = &response["headers"]["Idempotent-Replayed"];
                    assert!(!status.starts_with('2') || replayed.is_object(), "{method} {path} {status}");
                }
            }
        }
    }
    let registered: BTreeSet<(String, String)> =
        Op::ALL.iter().map(|op| (op.method().to_owned(), op.route().to_owned())).collect();
    assert_eq!(described, registered);
}

/// Each registered operation is served by a handler that scopes its keys to the registry's
/// route (the key row records it), and every recovery point and event kind its keys reach in the
/// database is the engine's own or a phase the registry declares.
#[tokio::test]
async fn every_operation_keeps_to_what_the_registry_declares() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let (status, _, paid) =
        parts(app.post_payment(&api_key, Some(&new_key()), &payment(5_000)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    let refund = json!({"payment": paid["id"], "amount": 1_000});
    let (status, ..) = parts(app.post_refund(&api_key, Some(&new_key()), &refund).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    for action in ["capture", "cancel"] {
        let mut manual = payment(2_000);
        manual["capture"] = "manual".into();
        let (_, _, held) = parts(app.post_payment(&api_key, Some(&new_key()), &manual).send().await.unwrap()).await;
        let path = format!("/v1/payments/{}/{action}", held["id"].as_str().unwrap());
        let request = app.client.post(app.url(&path)).bearer_auth(&api_key).header("Idempotency-Key", new_key());
        let (status, _, body) = parts(request.json(&json!({})).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{action}: {body}");
    }

    let routes: BTreeSet<String> = sqlx::query_scalar("select distinct route from idempotency_keys")
        .fetch_all(&app.db)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let registered: BTreeSet<String> = Op::ALL.iter().map(|op| op.route().to_owned()).collect();
    assert_eq!(routes, registered, "each operation's handler claimed a key on its registered route");

    let phases: Vec<&str> = Op::ALL.iter().flat_map(|op| op.phases()).map(RecoveryPoint::as_str).collect();
    let mut points: BTreeSet<&str> = phases.iter().copied().collect();
    points.extend([RecoveryPoint::STARTED.as_str(), RecoveryPoint::FINISHED.as_str()]);
    let mut kinds: BTreeSet<&str> = EventKind::ALL.iter().map(|kind| kind.as_str()).collect();
    kinds.extend(phases.iter().copied());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await; // batched observations
    let stored_points: Vec<String> =
        sqlx::query_scalar("select distinct recovery_point from idempotency_keys").fetch_all(&app.db).await.unwrap();
    let stored_kinds: Vec<String> =
        sqlx::query_scalar("select distinct kind from idempotency_events").fetch_all(&app.db).await.unwrap();
    for point in &stored_points {
        assert!(points.contains(point.as_str()), "recovery point {point} is declared nowhere");
    }
    for kind in &stored_kinds {
        assert!(kinds.contains(kind.as_str()), "event kind {kind} is declared nowhere");
    }
    for phase in &phases {
        assert!(stored_kinds.iter().any(|kind| kind == phase), "no {phase} event was written: {stored_kinds:?}");
    }
    // No phase is named like an engine event or point, nor like another operation's.
    let unique: BTreeSet<&str> = phases.iter().copied().collect();
    assert_eq!(unique.len(), phases.len(), "two operations share a phase name");
    for phase in &phases {
        assert!(!EventKind::ALL.iter().any(|kind| kind.as_str() == *phase), "{phase} is also an engine event");
    }
}
