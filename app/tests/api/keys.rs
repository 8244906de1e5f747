//! The `Idempotency-Key` header: required, one field, a Structured Field String or a bare token.

use reqwest::StatusCode;

use crate::helpers::{TestApp, assert_problem, payment};

/// No key: 400 `idempotency-key-missing`, nothing written.
#[tokio::test]
async fn missing_key_is_400() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let response = app.post_payment(&api_key, None, &payment(100)).send().await.unwrap();
    assert_problem(response, StatusCode::BAD_REQUEST, "idempotency-key-missing").await;
    assert_eq!(app.count("idempotency_keys").await, 0);
    assert!(app.charges().await.is_empty());
}

/// Malformed keys: empty, too long, non-printable, several fields, broken sf-strings.
#[tokio::test]
async fn malformed_keys_are_400() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let too_long = "k".repeat(256);
    let cases: [(&str, &[u8]); 7] = [
        ("empty", b""),
        ("empty sf-string", b"\"\""),
        ("too long", too_long.as_bytes()),
        ("control character", b"ab\tc"),
        ("non-ASCII", "cl\u{e9}".as_bytes()),
        ("unterminated", b"\"abc"),
        ("bad escape", b"\"a\\nb\""),
    ];
    for (case, value) in cases {
        let response = app
            .post_payment(&api_key, None, &payment(100))
            .header("Idempotency-Key", reqwest::header::HeaderValue::from_bytes(value).unwrap())
            .send()
            .await
            .unwrap();
        let problem = assert_problem(response, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
        assert!(problem["detail"].as_str().unwrap().contains("Idempotency-Key"), "{case}: {problem}");
    }
    let twice =
        app.post_payment(&api_key, Some("a"), &payment(100)).header("Idempotency-Key", "b").send().await.unwrap();
    assert_problem(twice, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
    let listed = app.post_payment(&api_key, Some("\"a\", \"b\""), &payment(100)).send().await.unwrap();
    assert_problem(listed, StatusCode::BAD_REQUEST, "idempotency-key-invalid").await;
    assert_eq!(app.count("idempotency_keys").await, 0);
}

/// `"abc"` and `abc` are the same key: the second is a replay of the first.
#[tokio::test]
async fn quoted_and_bare_forms_are_the_same_key() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let key = format!("order-{}", uuid::Uuid::now_v7());
    let quoted = format!("\"{key}\"");
    let first = app.post_payment(&api_key, Some(&quoted), &payment(100)).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let second = app.post_payment(&api_key, Some(&key), &payment(100)).send().await.unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(second.headers()["idempotent-replayed"], "true");
    let stored: String = sqlx::query_scalar("select key from idempotency_keys").fetch_one(&app.db).await.unwrap();
    assert_eq!(stored, key, "the decoded key is stored, without quotes");
    // An escaped quote inside an sf-string is part of the key.
    let escaped = app.post_payment(&api_key, Some(r#""say \"hi\"""#), &payment(100)).send().await.unwrap();
    assert_eq!(escaped.status(), StatusCode::CREATED);
    let keys: Vec<String> =
        sqlx::query_scalar("select key from idempotency_keys order by created_at").fetch_all(&app.db).await.unwrap();
    assert_eq!(keys[1], r#"say "hi""#);
    assert_eq!(app.charges_for(&key).await.len(), 1, "quoted and bare: one key, one charge");
    assert_eq!(app.charges_for(r#"say "hi""#).await.len(), 1);
}
