//! The shop over plain HTTP: the paths a browser test does not take.

use reqwest::StatusCode;
use reqwest::header::LOCATION;
use serde_json::json;

use crate::helpers::{TestApp, browser_client, field};

/// The gateway is down: the page says so and keeps the same key and card; paying again once it
/// is back resumes the same payment: one charge.
#[tokio::test]
async fn gateway_failure_then_pay_again_charges_once() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    let client = browser_client();
    let home = client.get(app.url("/")).send().await.unwrap().text().await.unwrap();
    let signed_in = client
        .post(app.url("/shop/sign-in"))
        .form(&[("csrf", field(&home, "csrf").as_str()), ("api_key", api_key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    let checkout = client.get(app.url("/shop/checkout/stickers")).send().await.unwrap();
    assert_eq!(checkout.headers()["cache-control"], "private, no-cache");
    let checkout = checkout.text().await.unwrap();
    let (csrf, key) = (field(&checkout, "csrf"), field(&checkout, "key"));

    app.set_faults(json!({"fail_rate": 1.0})).await;
    let pay = |card: &'static str, csrf: String, key: String| {
        client
            .post(app.url("/shop/checkout"))
            .form(&[("csrf", csrf), ("product", "stickers".into()), ("card", card.into()), ("key", key)])
            .send()
    };
    let failed = pay("pm_card_visa", csrf.clone(), key.clone()).await.unwrap();
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let page = failed.text().await.unwrap();
    assert!(page.contains("you will not be charged twice"), "{page}");
    assert_eq!(field(&page, "key"), key, "a retry keeps the key");
    assert_eq!(field(&page, "card"), "pm_card_visa", "and the card, as a hidden field");
    assert!(app.charges_for(&key).await.is_empty());

    app.set_faults(json!({})).await;
    let paid = pay("pm_card_visa", csrf.clone(), key.clone()).await.unwrap();
    assert_eq!(paid.status(), StatusCode::SEE_OTHER);
    let receipt = paid.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(receipt.starts_with("/shop/receipts/pay_"), "{receipt}");
    assert_eq!(app.charges_for(&key).await.len(), 1);

    // The same form once more: the stored answer, the same receipt; another card: refused.
    let again = pay("pm_card_visa", csrf.clone(), key.clone()).await.unwrap();
    assert_eq!(again.headers()[LOCATION], receipt.as_str());
    let other = pay("pm_card_chargeDeclined", csrf.clone(), key.clone()).await.unwrap();
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_ne!(field(&other.text().await.unwrap(), "key"), key, "a fresh form for other details");
    assert_eq!(app.charges_for(&key).await.len(), 1);
    let page = client.get(app.url(&receipt)).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("Paid 4.00 USD") && page.contains("Fencing-token sticker pack"), "{page}");

    // Someone else's receipt, or a forged form key, is refused.
    let other_customer = app.customer("globex").await;
    let stranger = browser_client();
    let home = stranger.get(app.url("/")).send().await.unwrap().text().await.unwrap();
    stranger
        .post(app.url("/shop/sign-in"))
        .form(&[("csrf", field(&home, "csrf").as_str()), ("api_key", other_customer.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.get(app.url(&receipt)).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    let forged = pay("pm_card_visa", csrf, "not-a-uuid".into()).await.unwrap();
    assert_eq!(forged.status(), StatusCode::BAD_REQUEST);
}
