//! Hostile input at the edge: characters PostgreSQL cannot store, bodies that are not a JSON
//! object, content codings, and the problem document on every error the app shapes.

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::browser::{ADMIN, PASSWORD, create_admin};
use crate::helpers::{TestApp, assert_problem, browser_client, field, new_key};

/// A browser signed into the dashboard; returns it and its CSRF token.
async fn operator(app: &TestApp) -> (Client, String) {
    create_admin(app).await;
    let client = browser_client();
    let page = client.get(app.url("/admin/login")).send().await.unwrap().text().await.unwrap();
    let login = client
        .post(app.url("/admin/login"))
        .form(&[("csrf", field(&page, "csrf").as_str()), ("name", ADMIN), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SEE_OTHER);
    let page = client.get(app.url("/admin")).send().await.unwrap().text().await.unwrap();
    (client, field(&page, "csrf"))
}

/// A browser signed into the shop with a customer's API key.
async fn shopper(app: &TestApp, api_key: &str) -> Client {
    let client = browser_client();
    let home = client.get(app.url("/")).send().await.unwrap().text().await.unwrap();
    let signed_in = client
        .post(app.url("/shop/sign-in"))
        .form(&[("csrf", field(&home, "csrf").as_str()), ("api_key", api_key)])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    client
}

/// The fields a 400 problem names in its `errors` member.
fn named_fields(problem: &Value) -> Vec<String> {
    problem["errors"]
        .as_array()
        .map_or_else(Vec::new, |errors| errors.iter().map(|e| e["field"].as_str().unwrap().to_owned()).collect())
}

/// A NUL character (which PostgreSQL cannot store in text or jsonb) anywhere in a payment is a
/// 400 naming the field, before the key is used; so is a lone surrogate, which JSON text cannot
/// carry into a string.
#[tokio::test]
async fn nul_characters_in_a_payment_are_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let base = json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"});
    let with = |member: &str, value: Value| {
        let mut body = base.clone();
        body[member] = value;
        body
    };
    let cases = [
        (with("description", json!("a\u{0}b")), "description"),
        (with("metadata", json!({"order": "4\u{0}2"})), "metadata.order"),
        (with("metadata", json!({"or\u{0}der": "42"})), "metadata.or\u{0}der"),
        (with("payment_method", json!("pm_card\u{0}visa")), "payment_method"),
        (with("currency", json!("us\u{0}")), "currency"),
    ];
    for (body, field) in cases {
        let response = app.post_payment(&api_key, Some(&new_key()), &body).send().await.unwrap();
        let problem = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
        assert_eq!(named_fields(&problem), [field], "{problem}");
    }
    for raw in [
        r#"{"amount": 100, "currency": "usd", "payment_method": "pm_card_visa", "description": "\ud800"}"#,
        r#"{"amount": 100, "currency": "usd", "payment_method": "pm_card_visa", "description": "\udc00x"}"#,
    ] {
        let response = app
            .client
            .post(app.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", new_key())
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
    }
    assert_eq!(app.count("idempotency_keys").await, 0);
    assert!(app.charges().await.is_empty());
}

/// A NUL in the login form, in a dashboard query string, in a shop path or in the shop's sign-in
/// form is a 400 problem naming where it was, not a false "database unreachable" 503.
#[tokio::test]
async fn nul_characters_in_pages_are_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let client = browser_client();
    let page = client.get(app.url("/admin/login")).send().await.unwrap().text().await.unwrap();
    let login = client
        .post(app.url("/admin/login"))
        .form(&[("csrf", field(&page, "csrf").as_str()), ("name", "al\u{0}ice"), ("password", "whatever-it-is")])
        .send()
        .await
        .unwrap();
    let problem = assert_problem(login, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(named_fields(&problem), ["name"]);

    let (operator, _) = operator(&app).await;
    let keys = operator.get(app.url("/admin/keys?q=a%00b")).send().await.unwrap();
    let problem = assert_problem(keys, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(named_fields(&problem), ["q"]);

    let shop = shopper(&app, &api_key).await;
    let attempt = shop.get(app.url("/shop/payments/a%00b")).send().await.unwrap();
    let problem = assert_problem(attempt, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(named_fields(&problem), ["path"]);

    let home = client.get(app.url("/")).send().await.unwrap().text().await.unwrap();
    let sign_in = client
        .post(app.url("/shop/sign-in"))
        .form(&[("csrf", field(&home, "csrf").as_str()), ("api_key", "po_\u{0}")])
        .send()
        .await
        .unwrap();
    let problem = assert_problem(sign_in, StatusCode::BAD_REQUEST, "invalid-request").await;
    assert_eq!(named_fields(&problem), ["api_key"]);
}

/// A data error raised by the database itself (class 22: a value it cannot store or compute) is
/// the request's fault, never reported as an outage: the API and the pages answer 400, not 503
/// and not a 500 that invites a retry.
#[tokio::test]
async fn database_data_errors_are_not_outages() {
    use axum::response::IntoResponse;
    use payonce::http::error::ApiError;
    use payonce::web::page::WebError;

    let app = TestApp::spawn().await;
    for sql in ["select $1::text", "select 1 / 0 where $1::text is not null", "select ('x' || $1)::jsonb"] {
        let err = sqlx::query(sql).bind("a\u{0}b").execute(&app.db).await.expect_err(sql);
        let code = err.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned()).unwrap_or_default();
        assert!(code.starts_with("22"), "{sql}: {code}");
        let api = ApiError::from(err).into_response();
        assert_eq!(api.status(), StatusCode::BAD_REQUEST, "{sql}");
        assert!(api.headers().get("retry-after").is_none());
        let err = sqlx::query(sql).bind("a\u{0}b").execute(&app.db).await.expect_err(sql);
        assert_eq!(WebError::from(err).into_response().status(), StatusCode::BAD_REQUEST, "{sql}");
    }
}

/// A payment body must be a JSON object: an array with the fields in order, or any other JSON
/// value, is a 400 that says so.
#[tokio::test]
async fn a_payment_body_must_be_a_json_object() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    for body in [r#"[100,"usd","pm_card_visa",null,{}]"#, r#"[100,"usd","pm_card_visa"]"#, "null", "100", r#""pay""#] {
        let response = app
            .client
            .post(app.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", new_key())
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let problem = assert_problem(response, StatusCode::BAD_REQUEST, "invalid-request").await;
        assert!(problem["detail"].as_str().unwrap().contains("JSON object"), "{body}: {problem}");
    }
    assert_eq!(app.count("idempotency_keys").await, 0);
    assert!(app.charges().await.is_empty());
}

/// Any Content-Encoding but identity is refused with 415 before anything is charged: payonce
/// does not decompress, and must not read a compressed body as if it were plain.
#[tokio::test]
async fn content_encodings_are_refused() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let body = json!({"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}).to_string();
    for encoding in ["gzip", "br", "deflate, gzip", "x-unknown"] {
        let response = app
            .client
            .post(app.url("/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", new_key())
            .header("content-type", "application/json")
            .header("content-encoding", encoding)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers().get("accept-encoding").map(|v| v.to_str().unwrap()), Some("identity"));
        assert_problem(response, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-content-encoding").await;
    }
    let login = app
        .client
        .post(app.url("/admin/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("content-encoding", "gzip")
        .body("name=a&password=b")
        .send()
        .await
        .unwrap();
    assert_problem(login, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-content-encoding").await;
    assert_eq!(app.count("idempotency_keys").await, 0);
    assert!(app.charges().await.is_empty());
    let identity = app
        .client
        .post(app.url("/v1/payments"))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", new_key())
        .header("content-type", "application/json")
        .header("content-encoding", "identity")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(identity.status(), StatusCode::CREATED);
}

/// Errors produced outside the handlers' own code (the router's fallbacks, axum's extractors on
/// the pages, a path that is not UTF-8) are problem documents too, never bare text.
#[tokio::test]
async fn every_error_the_app_shapes_is_a_problem() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let (operator, csrf) = operator(&app).await;
    assert_problem(app.client.get(app.url("/nowhere")).send().await.unwrap(), StatusCode::NOT_FOUND, "not-found").await;
    let method = app.client.put(app.url("/admin/login")).send().await.unwrap();
    assert_problem(method, StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed").await;
    let path = app.get(&api_key, "/v1/payments/%FF").send().await.unwrap();
    assert_problem(path, StatusCode::BAD_REQUEST, "invalid-request").await;
    let action = operator
        .post(app.url("/admin/keys/not-a-uuid/release"))
        .form(&[("csrf", csrf.as_str()), ("lease_token", "1")])
        .send()
        .await
        .unwrap();
    assert_problem(action, StatusCode::BAD_REQUEST, "invalid-request").await;
    let id = Uuid::now_v7();
    let form = operator
        .post(app.url(&format!("/admin/keys/{id}/release")))
        .form(&[("csrf", csrf.as_str()), ("lease_token", "many")])
        .send()
        .await
        .unwrap();
    // A status payonce has no type of its own for: RFC 9457's `about:blank`, still a problem.
    assert_eq!(form.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(form.headers()["content-type"], "application/problem+json");
    let problem: Value = form.json().await.unwrap();
    assert_eq!((problem["type"].as_str(), problem["status"].as_u64()), (Some("about:blank"), Some(422)), "{problem}");
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("lease_token")), "{problem}");
}
