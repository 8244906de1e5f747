//! The API contract of `POST /v1/payments`, row by row, plus reads and probes.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, new_key, parts, payment};

/// New key, charge succeeds: 201 with the payment and a Location; the key is completed with the
/// response stored; the gateway holds one charge carrying the audit metadata.
#[tokio::test]
async fn new_key_charges_once_and_answers_201() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let body = json!({"amount": 1250, "currency": "EUR", "payment_method": "pm_card_visa",
                      "description": "order 42", "metadata": {"order": "42"}});

    let (status, headers, payment) = parts(app.post_payment(&api_key, Some(&key), &body).send().await.unwrap()).await;

    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.get("idempotent-replayed").is_none());
    let id = payment["id"].as_str().unwrap();
    assert!(id.starts_with("pay_"));
    assert_eq!(headers["location"], format!("/v1/payments/{id}"));
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["amount"], 1250);
    assert_eq!(payment["currency"], "eur");
    assert_eq!(payment["description"], "order 42");
    assert_eq!(payment["metadata"], json!({"order": "42"}));
    let intent = payment["payment_intent"].as_str().unwrap();
    assert!(intent.starts_with("pi_"));

    let row: (String, String, i16, i64) = sqlx::query_as(
        "select state, recovery_point, response_status, lease_token from idempotency_keys where key = $1",
    )
    .bind(&key)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(row, ("completed".into(), "finished".into(), 201, 1));
    let (status, pi): (String, String) =
        sqlx::query_as("select status, gateway_payment_intent_id from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!((status.as_str(), pi.as_str()), ("succeeded", intent));

    let charges = app.charges().await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], intent);
    assert_eq!(charges[0]["amount"], 1250);
    assert_eq!(charges[0]["metadata"]["payonce_payment"], id);
    assert_eq!(charges[0]["metadata"]["payonce_idempotency_key"], key.as_str());
    assert_eq!(charges[0]["metadata"]["order"], "42");
    assert!(charges[0]["metadata"]["payonce_customer"].as_str().unwrap().starts_with("cus_"));
    assert_eq!(app.event_kinds(&key).await, ["claimed", "payment_created", "completed"]);
}

/// Same key, same payload, completed: the original status, body and content headers, plus
/// `Idempotent-Replayed: true`, and no second charge.
#[tokio::test]
async fn completed_key_replays_faithfully() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();

    let first = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    let (first_status, first_headers) = (first.status(), first.headers().clone());
    let first_body = first.bytes().await.unwrap();
    let again = app.post_payment(&api_key, Some(&key), &payment(500)).send().await.unwrap();
    let (again_status, again_headers) = (again.status(), again.headers().clone());
    let again_body = again.bytes().await.unwrap();

    assert_eq!(first_status, StatusCode::CREATED);
    assert_eq!(again_status, first_status);
    assert_eq!(again_body, first_body, "the replayed body is byte for byte the original");
    assert_eq!(again_headers["content-type"], first_headers["content-type"]);
    assert_eq!(again_headers["location"], first_headers["location"]);
    assert_eq!(again_headers["idempotent-replayed"], "true");
    assert_eq!(app.charges().await.len(), 1);
    assert_eq!(app.count("payments").await, 1);
    assert_eq!(
        app.event_kinds_once(&key, |kinds| kinds.len() >= 4).await,
        ["claimed", "payment_created", "completed", "replayed"]
    );
}

/// A retry that re-serialises the same payload (other key order, other spacing) is a replay.
#[tokio::test]
async fn reserialised_payload_is_a_replay_not_a_mismatch() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let compact = r#"{"amount":700,"currency":"usd","payment_method":"pm_card_visa","metadata":{"a":"1","b":"2"}}"#;
    let sloppy = "{ \"metadata\" : { \"b\": \"2\", \"a\": \"1\" },\n  \"payment_method\": \"pm_card_visa\", \"currency\": \"USD\", \"amount\": 700 }";

    let send = |body: &'static str| {
        app.client
            .post(app.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", &key)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(send(compact).await.unwrap().status(), StatusCode::CREATED);
    let replay = send(sloppy).await.unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(app.charges().await.len(), 1);
}

/// Same key, different payload: 422, and nothing is charged for the second payload.
#[tokio::test]
async fn same_key_other_payload_is_422() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    assert_eq!(
        app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap().status(),
        StatusCode::CREATED
    );

    let response = app.post_payment(&api_key, Some(&key), &payment(101)).send().await.unwrap();

    assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    assert_eq!(app.charges().await.len(), 1);
    assert!(
        app.event_kinds_once(&key, |kinds| kinds.iter().any(|k| k == "mismatch"))
            .await
            .contains(&"mismatch".to_owned())
    );
}

/// Declined cards: a final 402 problem with the decline code, replayed like a success; the
/// payment is recorded as failed and nothing is charged.
#[tokio::test]
async fn declined_card_is_a_final_402_and_replayed() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    for (method, decline_code) in [
        ("pm_card_chargeDeclined", "generic_decline"),
        ("pm_card_chargeDeclinedInsufficientFunds", "insufficient_funds"),
    ] {
        let key = new_key();
        let body = json!({"amount": 900, "currency": "usd", "payment_method": method});

        let response = app.post_payment(&api_key, Some(&key), &body).send().await.unwrap();
        let problem = assert_problem(response, StatusCode::PAYMENT_REQUIRED, "card-declined").await;
        assert_eq!(problem["decline_code"], decline_code);
        assert_eq!(problem["code"], "card_declined");
        assert!(problem["payment"].as_str().unwrap().starts_with("pay_"));

        let replay = app.post_payment(&api_key, Some(&key), &body).send().await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        let replayed = assert_problem(replay, StatusCode::PAYMENT_REQUIRED, "card-declined").await;
        assert_eq!(replayed, problem);

        let (status, code): (String, Option<String>) =
            sqlx::query_as("select status, decline_code from payments where payment_method = $1")
                .bind(method)
                .fetch_one(&app.db)
                .await
                .unwrap();
        assert_eq!((status.as_str(), code.as_deref()), ("failed", Some(decline_code)));
    }
    assert!(app.charges().await.is_empty());
}

/// A PaymentMethod the gateway does not know: a final 402 `payment-rejected`.
#[tokio::test]
async fn unknown_payment_method_is_rejected_finally() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let body = json!({"amount": 900, "currency": "usd", "payment_method": "pm_does_not_exist"});

    let problem = assert_problem(
        app.post_payment(&api_key, Some(&key), &body).send().await.unwrap(),
        StatusCode::PAYMENT_REQUIRED,
        "payment-rejected",
    )
    .await;
    assert_eq!(problem["code"], "resource_missing");
    let replay = app.post_payment(&api_key, Some(&key), &body).send().await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert!(app.charges().await.is_empty());
    let (status, code): (String, Option<String>) =
        sqlx::query_as("select status, failure_code from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!((status.as_str(), code.as_deref()), ("failed", Some("resource_missing")));
}

/// Invalid bodies are 400 (415 for a wrong content type, 413 over 64 KiB), and the key is not
/// consumed: the same key then works with a valid body.
#[tokio::test]
async fn invalid_bodies_are_refused_without_consuming_the_key() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let raw = |content_type: &str, body: String| {
        app.client
            .post(app.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", &key)
            .header("content-type", content_type)
            .body(body)
    };
    let json_cases = [
        ("not json", "{\"amount\": 1,".to_owned()),
        ("wrong type", r#"{"amount": "100", "currency": "usd", "payment_method": "pm_card_visa"}"#.to_owned()),
        ("fraction", r#"{"amount": 1.5, "currency": "usd", "payment_method": "pm_card_visa"}"#.to_owned()),
        (
            "unknown field",
            r#"{"amount": 100, "currency": "usd", "payment_method": "pm_card_visa", "tip": 5}"#.to_owned(),
        ),
        ("missing field", r#"{"amount": 100, "currency": "usd"}"#.to_owned()),
        ("zero amount", r#"{"amount": 0, "currency": "usd", "payment_method": "pm_card_visa"}"#.to_owned()),
        ("negative amount", r#"{"amount": -5, "currency": "usd", "payment_method": "pm_card_visa"}"#.to_owned()),
        ("bad currency", r#"{"amount": 100, "currency": "xxx", "payment_method": "pm_card_visa"}"#.to_owned()),
        ("not a pm", r#"{"amount": 100, "currency": "usd", "payment_method": "card_123"}"#.to_owned()),
        ("array", "[1, 2]".to_owned()),
        ("empty", String::new()),
    ];
    for (case, body) in json_cases {
        let response = raw("application/json", body).send().await.unwrap();
        let problem = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
        assert!(problem["detail"].as_str().unwrap().len() > 20, "{case}: {problem}");
    }
    let problem = assert_problem(
        raw("application/json", r#"{"amount": 0, "currency": "xxx", "payment_method": "pm_card_visa"}"#.into())
            .send()
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "invalid-request",
    )
    .await;
    let fields: Vec<&str> =
        problem["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["amount", "currency"]);

    assert_problem(
        raw("text/plain", payment(100).to_string()).send().await.unwrap(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
    )
    .await;
    let huge =
        json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa", "description": "x".repeat(70_000)});
    assert_problem(
        raw("application/json", huge.to_string()).send().await.unwrap(),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload-too-large",
    )
    .await;

    assert_eq!(app.count("idempotency_keys").await, 0, "no refused request may touch the key");
    assert_eq!(app.count("payments").await, 0);
    assert!(app.charges().await.is_empty());
    let ok = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::CREATED);
    assert_eq!(app.charges_for(&key).await.len(), 1, "the unused key then pays, once");
}

/// No API key, or a wrong one: 401 with `WWW-Authenticate`, before anything else is looked at.
#[tokio::test]
async fn requests_need_a_valid_api_key() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let mut wrong = api_key.clone();
    wrong.replace_range(wrong.len() - 1.., if api_key.ends_with('0') { "1" } else { "0" });

    let anonymous = app.client.post(app.url("/v1/payments")).json(&payment(100)).send().await.unwrap();
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    assert_problem(anonymous, StatusCode::UNAUTHORIZED, "unauthorized").await;
    for bad in [wrong.as_str(), "po_nonsense", ""] {
        let response = app.post_payment(bad, Some(&new_key()), &payment(100)).send().await.unwrap();
        assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    let response = app.get("nope", "/v1/payments").send().await.unwrap();
    assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_eq!(app.count("idempotency_keys").await, 0, "an unauthenticated request claims nothing");
    assert!(app.charges().await.is_empty());
}

/// A payment can be read back, and the list shows the caller's payments newest first, paginated.
#[tokio::test]
async fn payments_can_be_read_and_listed() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let mut ids = Vec::new();
    for amount in [100, 200, 300] {
        let (_, _, body) =
            parts(app.post_payment(&api_key, Some(&new_key()), &payment(amount)).send().await.unwrap()).await;
        ids.push(body["id"].as_str().unwrap().to_owned());
    }

    let (status, _, one) = parts(app.get(&api_key, &format!("/v1/payments/{}", ids[1])).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["amount"], 200);

    let (_, _, page) = parts(app.get(&api_key, "/v1/payments?limit=2").send().await.unwrap()).await;
    let listed: Vec<&str> = page["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(listed, [ids[2].as_str(), ids[1].as_str()]);
    assert_eq!(page["has_more"], true);
    let (_, _, rest) =
        parts(app.get(&api_key, &format!("/v1/payments?limit=2&starting_after={}", ids[1])).send().await.unwrap())
            .await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["data"][0]["id"], ids[0].as_str());
    assert_eq!(rest["has_more"], false);

    for bad in ["/v1/payments/pay_nothere", "/v1/payments/pay_0000000000000000000000000000000f"] {
        assert_problem(app.get(&api_key, bad).send().await.unwrap(), StatusCode::NOT_FOUND, "not-found").await;
    }
    for bad in
        ["/v1/payments?limit=0", "/v1/payments?limit=abc", "/v1/payments?starting_after=x", "/v1/payments?color=red"]
    {
        assert_problem(app.get(&api_key, bad).send().await.unwrap(), StatusCode::BAD_REQUEST, "invalid-request").await;
    }
}

/// Probes, unknown routes and methods.
#[tokio::test]
async fn probes_and_unknown_routes() {
    let app = TestApp::spawn().await;
    let (status, _, body) = parts(app.client.get(app.url("/healthz")).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    // The claim strategy, said loudly (the lab's other strategies must never pass unnoticed), and
    // the pool's use, which the lab's benchmark samples.
    assert_eq!(
        (&body["status"], &body["claim_strategy"], &body["lab"]),
        (&json!("ok"), &json!("on-conflict"), &json!(false)),
        "{body}"
    );
    assert!(["size", "idle", "max"].iter().all(|field| body["pool"][field].is_u64()), "{body}");
    let (status, _, body) = parts(app.client.get(app.url("/readyz")).send().await.unwrap()).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ready"})));
    let response = app.client.get(app.url("/nowhere")).send().await.unwrap();
    assert!(response.headers().contains_key("x-request-id"));
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    assert_problem(
        app.client.delete(app.url("/v1/payments")).send().await.unwrap(),
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
    )
    .await;
}

/// Without a Stripe key the server starts its own simulator and charges through it.
#[tokio::test]
async fn builtin_simulator_is_used_without_a_stripe_key() {
    let app = TestApp::spawn_with(crate::helpers::Options { builtin_simulator: true, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let response = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    let charges = app.charges_for(&key).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["payment_intent"], body["payment_intent"]);
}

/// Graceful shutdown lets a payment that is in flight finish before the server stops.
#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_payments() {
    let mut app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    app.set_faults(json!({"latency_ms": 700})).await;
    let in_flight = tokio::spawn(app.post_payment(&api_key, Some(&key), &payment(100)).send());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    app.stop().await;

    assert_eq!(in_flight.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(app.charges_for(&key).await.len(), 1);
    let state: String = sqlx::query_scalar("select state from idempotency_keys").fetch_one(&app.db).await.unwrap();
    assert_eq!(state, "completed");
}

/// The benchmark's route without the idempotency layer exists only when asked for, and then it
/// charges (once per request: it has no key to deduplicate with).
#[tokio::test]
async fn the_unprotected_bench_route_is_off_by_default() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let response =
        app.client.post(app.url("/bench/payments")).bearer_auth(&api_key).json(&payment(100)).send().await.unwrap();
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;

    let app = TestApp::spawn_with(crate::helpers::Options { bench_routes: true, ..Default::default() }).await;
    let api_key = app.customer("acme").await;
    for _ in 0..2 {
        let response =
            app.client.post(app.url("/bench/payments")).bearer_auth(&api_key).json(&payment(100)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    assert_eq!(app.charges().await.len(), 2, "no idempotency layer: two requests, two charges");
    assert_eq!(app.count("idempotency_keys").await, 0);
}

/// Replays are answered from memory once a process has replayed a key, with the same checks: a
/// different payload is still a 422. Memory never outlives the key: once it has expired and been
/// deleted, the key names a new request.
#[tokio::test]
async fn replays_from_memory_check_the_payload_and_end_with_the_key() {
    let app = TestApp::spawn_with(crate::helpers::Options {
        key_ttl: std::time::Duration::from_secs(2),
        ..Default::default()
    })
    .await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    let (_, _, first) = parts(app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap()).await;
    for _ in 0..3 {
        let replay = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
    }
    let reused = app.post_payment(&api_key, Some(&key), &payment(999)).send().await.unwrap();
    assert_problem(reused, StatusCode::UNPROCESSABLE_ENTITY, "idempotency-key-reused").await;
    let replayed = |kinds: &[String]| kinds.iter().filter(|k| *k == "replayed").count();
    let kinds = app.event_kinds_once(&key, |kinds| replayed(kinds) >= 3).await;
    assert_eq!(replayed(&kinds), 3, "every replay is an event: {kinds:?}");

    // Past its expiry, as the reaper would: delete the key.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    sqlx::query("delete from idempotency_keys").execute(&app.db).await.unwrap();
    let (status, headers, second) =
        parts(app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_ne!(first["id"], second["id"]);
}

/// `GET /metrics` speaks Prometheus and counts the engine's events and the gateway's latency.
#[tokio::test]
async fn metrics_count_events_and_gateway_latency() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = new_key();
    for _ in 0..2 {
        app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    }
    app.post_payment(&api_key, Some(&key), &payment(101)).send().await.unwrap();

    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = response.text().await.unwrap();
    // The recorder is process-wide and other tests run beside this one: look for the series, not
    // for exact counts.
    for kind in ["claimed", "payment_created", "completed", "replayed", "mismatch"] {
        let series = format!("payonce_idempotency_events_total{{kind=\"{kind}\"}} ");
        let count: u64 = text
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .trim()
            .parse()
            .unwrap();
        assert!(count >= 1, "{series}{count}");
    }
    assert!(
        text.contains("payonce_gateway_request_duration_seconds_bucket{call=\"create\",outcome=\"succeeded\""),
        "{text}"
    );
    assert!(text.contains("payonce_sweeps_total"), "{text}");
}
