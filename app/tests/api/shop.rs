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

/// A browser signed into the shop as a new customer.
async fn shopper(app: &TestApp) -> reqwest::Client {
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
    client
}

/// Checks `product` out with the Visa test card, "authorize now, capture when it ships" ticked;
/// returns the receipt's path.
async fn authorize_only(app: &TestApp, client: &reqwest::Client, product: &str) -> String {
    let checkout = client.get(app.url(&format!("/shop/checkout/{product}"))).send().await.unwrap().text().await;
    let checkout = checkout.unwrap();
    assert!(checkout.contains(r#"name="capture" value="manual""#), "the checkout offers the choice: {checkout}");
    let paid = client
        .post(app.url("/shop/checkout"))
        .form(&[
            ("csrf", field(&checkout, "csrf").as_str()),
            ("product", product),
            ("card", "pm_card_visa"),
            ("key", field(&checkout, "key").as_str()),
            ("capture", "manual"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), StatusCode::SEE_OTHER);
    let receipt = paid.headers()[LOCATION].to_str().unwrap().to_owned();
    assert!(receipt.starts_with("/shop/receipts/pay_"), "{receipt}");
    receipt
}

/// A page's text.
async fn page(app: &TestApp, client: &reqwest::Client, path: &str) -> String {
    let response = client.get(app.url(path)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    response.text().await.unwrap()
}

/// The value of the field `name` in the form that posts to `action`.
fn form_field(html: &str, action: &str, name: &str) -> String {
    let marker = format!(r#"action="{action}""#);
    let start = html.find(&marker).unwrap_or_else(|| panic!("no form for {action} in:\n{html}"));
    let form = &html[start..start + html[start..].find("</form>").unwrap()];
    field(form, name)
}

/// Sends the form that posts to `action` on `receipt_page` (its own fields, `amount` replaced
/// when given); returns where it leads.
async fn send_form(
    app: &TestApp,
    client: &reqwest::Client,
    receipt_page: &str,
    action: &str,
    amount: Option<&str>,
) -> String {
    let mut fields =
        vec![("csrf", form_field(receipt_page, action, "csrf")), ("key", form_field(receipt_page, action, "key"))];
    if action.ends_with("/capture") {
        fields.push(("amount", amount.map_or_else(|| form_field(receipt_page, action, "amount"), str::to_owned)));
    }
    let sent = client.post(app.url(action)).form(&fields).send().await.unwrap();
    assert_eq!(sent.status(), StatusCode::SEE_OTHER, "{}", sent.text().await.unwrap());
    sent.headers()[LOCATION].to_str().unwrap().to_owned()
}

/// Authorize now, capture when it ships: the checkout authorizes (no money moves), the receipt
/// says what is held and offers Capture with a key that a reload does not change; Capture
/// double-clicked (the second click while the first is at the gateway, then the browser sending
/// the form once more) captures once: one charge in the ledger, the receipt succeeded.
#[tokio::test]
async fn an_authorize_only_checkout_captured_by_a_double_click_charges_once() {
    let app = TestApp::spawn().await;
    let client = shopper(&app).await;
    let receipt = authorize_only(&app, &client, "mug").await;
    assert!(app.ledger.charges().await.is_empty(), "an authorization moves no money");

    let held = page(&app, &client, &receipt).await;
    assert!(held.contains("Authorized, not yet charged: 12.00 USD held"), "{held}");
    assert!(held.contains(r#"id="payment-status">requires_capture<"#), "{held}");
    let capture = format!("{receipt}/capture");
    let cancel = format!("{receipt}/cancel");
    assert!(held.contains(&format!(r#"action="{cancel}""#)), "a Cancel authorization button: {held}");
    let key = form_field(&held, &capture, "key");
    assert_eq!(form_field(&held, &capture, "amount"), "12.00", "the whole amount, proposed");
    let reloaded = page(&app, &client, &receipt).await;
    assert_eq!(form_field(&reloaded, &capture, "key"), key, "a reload keeps the button's key");
    assert_ne!(form_field(&reloaded, &cancel, "key"), key, "each button has its own");

    // The first click waits at the gateway; the second arrives meanwhile.
    app.set_faults(json!({"latency_ms": 1000, "operations": ["capture_payment_intent"]})).await;
    let first = send_form(&app, &client, &held, &capture, None);
    let second = async {
        let route = "idempotency_keys where route = '/v1/payments/{id}/capture'";
        while app.count(route).await == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let capturing = page(&app, &client, &receipt).await;
        assert!(capturing.contains("being captured"), "{capturing}");
        assert!(!capturing.contains(&format!(r#"action="{capture}""#)), "no button while it runs: {capturing}");
        send_form(&app, &client, &held, &capture, None).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!((first.as_str(), second.as_str()), (receipt.as_str(), receipt.as_str()));
    // The browser sends the form again (a resubmission): the stored answer, nothing more.
    assert_eq!(send_form(&app, &client, &held, &capture, None).await, receipt);

    let charges = app.ledger.charges().await;
    assert_eq!(charges.len(), 1, "one capture: {charges:?}");
    assert_eq!(charges[0]["amount"], 1200);
    assert_eq!(app.count("idempotency_keys where route = '/v1/payments/{id}/capture'").await, 1, "one key");
    let captured = page(&app, &client, &receipt).await;
    assert!(captured.contains(r#"id="payment-status">succeeded<"#), "{captured}");
    assert!(captured.contains("Captured 12.00 USD"), "{captured}");
    assert!(!captured.contains(&format!(r#"action="{capture}""#)), "nothing left to capture: {captured}");
}

/// Cancel authorization releases the hold: no charge, the receipt says canceled; a Capture sent
/// afterwards from the page as it was (another tab) is told in plain words why nothing happened,
/// and captures nothing.
#[tokio::test]
async fn a_canceled_authorization_charges_nothing_and_cannot_be_captured() {
    let app = TestApp::spawn().await;
    let client = shopper(&app).await;
    let receipt = authorize_only(&app, &client, "tee").await;
    let held = page(&app, &client, &receipt).await;

    assert_eq!(send_form(&app, &client, &held, &format!("{receipt}/cancel"), None).await, receipt);
    let canceled = page(&app, &client, &receipt).await;
    assert!(canceled.contains(r#"id="payment-status">canceled<"#), "{canceled}");
    assert!(canceled.contains("You were not charged"), "{canceled}");
    assert!(!canceled.contains(&format!(r#"action="{receipt}/capture""#)), "{canceled}");

    assert_eq!(send_form(&app, &client, &held, &format!("{receipt}/capture"), None).await, receipt);
    let refused = page(&app, &client, &receipt).await;
    assert!(
        refused.contains("Nothing was captured: this authorization was canceled"),
        "the 409 in plain words: {refused}"
    );
    assert!(!refused.contains("payment-not-capturable"), "{refused}");
    assert!(app.ledger.charges().await.is_empty(), "no money moved");
    let home = page(&app, &client, "/").await;
    assert!(home.contains(&format!(r#"<a href="{receipt}">"#)), "the payment links its receipt: {home}");
}

/// Capture part of an authorization with the amount field: that much is charged; more than is
/// held is refused before anything is sent; a second capture (the same button with another
/// amount) and a cancel after the capture are told, in plain words, that it is already captured.
#[tokio::test]
async fn a_partial_capture_and_what_it_closes() {
    let app = TestApp::spawn().await;
    let client = shopper(&app).await;
    let receipt = authorize_only(&app, &client, "tee").await;
    let held = page(&app, &client, &receipt).await;
    let capture = format!("{receipt}/capture");

    assert_eq!(send_form(&app, &client, &held, &capture, Some("25.01")).await, receipt);
    let over = page(&app, &client, &receipt).await;
    assert!(over.contains("Nothing was captured: at most 25.00 USD can be captured"), "{over}");
    assert_eq!(app.count("idempotency_keys where route = '/v1/payments/{id}/capture'").await, 0);

    assert_eq!(send_form(&app, &client, &held, &capture, Some("10.50")).await, receipt);
    let captured = page(&app, &client, &receipt).await;
    assert!(captured.contains("Captured 10.50 USD"), "{captured}");
    assert!(captured.contains(r#"id="payment-status">succeeded<"#), "{captured}");

    assert_eq!(send_form(&app, &client, &held, &capture, Some("25.00")).await, receipt);
    let again = page(&app, &client, &receipt).await;
    assert!(again.contains("Nothing was captured again: this payment was already captured (10.50 USD)"), "{again}");
    assert_eq!(send_form(&app, &client, &held, &format!("{receipt}/cancel"), None).await, receipt);
    let late = page(&app, &client, &receipt).await;
    assert!(late.contains("could not be canceled: it was already captured (10.50 USD)"), "{late}");
    let charges = app.ledger.charges().await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0]["amount"], 1050);
}

/// The gateway does not answer the capture: the receipt says it is under way and shows no
/// buttons (it refreshes itself); the same form sent again once the gateway is back resumes that
/// capture: one charge, the receipt succeeded.
#[tokio::test]
async fn a_capture_the_gateway_did_not_answer_is_finished_once() {
    let app = TestApp::spawn().await;
    let client = shopper(&app).await;
    let receipt = authorize_only(&app, &client, "stickers").await;
    let held = page(&app, &client, &receipt).await;
    let capture = format!("{receipt}/capture");

    app.set_faults(json!({"fail_rate": 1.0, "operations": ["capture_payment_intent"]})).await;
    assert_eq!(send_form(&app, &client, &held, &capture, None).await, receipt);
    let waiting = page(&app, &client, &receipt).await;
    assert!(waiting.contains("did not answer the capture yet"), "{waiting}");
    assert!(waiting.contains("being captured") && waiting.contains(r#"http-equiv="refresh""#), "{waiting}");
    assert!(!waiting.contains(&format!(r#"action="{capture}""#)), "{waiting}");
    assert!(app.ledger.charges().await.is_empty());

    app.set_faults(json!({})).await;
    assert_eq!(send_form(&app, &client, &held, &capture, None).await, receipt);
    let captured = page(&app, &client, &receipt).await;
    assert!(
        captured.contains(r#"id="payment-status">succeeded<"#) && captured.contains("Captured 4.00 USD"),
        "{captured}"
    );
    assert_eq!(app.ledger.charges().await.len(), 1);
}
