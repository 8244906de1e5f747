//! Amounts in each currency's own minor unit, as Stripe defines it (docs/dashboard.md,
//! "Amounts and currencies"): the API refuses what Stripe would refuse, the pages write yen as
//! yen and dinars with three decimals, and the refund form reads what an operator types in the
//! payment's currency. Every test asserts the database and the simulator's ledger.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::admin::{page, sign_in};
use crate::admin_refunds::api_refund;
use crate::browser::create_admin;
use crate::helpers::{TestApp, browser_client, field, parts};

/// A payment of `amount` (minor units) in `currency`, with the test card that succeeds.
fn priced(amount: i64, currency: &str) -> Value {
    json!({"amount": amount, "currency": currency, "payment_method": "pm_card_visa"})
}

/// Pays `amount` of `currency` under `key`; returns the payment's id.
async fn paid_in(app: &TestApp, api_key: &str, key: &str, amount: i64, currency: &str) -> String {
    let (status, _, body) =
        parts(app.post_payment(api_key, Some(key), &priced(amount, currency)).send().await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED, "{amount} {currency}: {body}");
    body["id"].as_str().unwrap().to_owned()
}

/// The refunds table: (amount, currency, status), oldest first.
async fn refund_rows(app: &TestApp) -> Vec<(i64, String, String)> {
    sqlx::query_as("select amount, currency, status from refunds order by created_at, id")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// An amount Stripe would refuse for its currency is a 400 naming `amount` (a three-decimal
/// dinar not ending in 0; króna and Ugandan shillings that are not whole, which Stripe writes
/// with two decimals of `00`), before any key is used or anything reaches the gateway. What
/// Stripe takes is charged as sent: forints with fillér (Stripe's HUF rule is about payouts),
/// yen without a minor unit.
#[tokio::test]
async fn the_api_refuses_amounts_stripe_refuses_for_the_currency() {
    let app = TestApp::spawn().await;
    let acme = app.customer("acme").await;
    for (key, amount, currency, says) in [
        ("kwd-odd", 12_345, "kwd", "multiple of 10"),
        ("bhd-odd", 1, "BHD", "multiple of 10"),
        ("isk-fraction", 550, "isk", "multiple of 100"),
        ("ugx-fraction", 150, "ugx", "multiple of 100"),
    ] {
        let (status, _, body) =
            parts(app.post_payment(&acme, Some(key), &priced(amount, currency)).send().await.unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{amount} {currency}: {body}");
        assert!(body["type"].as_str().unwrap().ends_with("/invalid-request"), "{body}");
        assert_eq!(body["errors"][0]["field"], "amount", "{body}");
        let detail = body["errors"][0]["detail"].as_str().unwrap();
        assert!(detail.contains(says) && detail.contains(&currency.to_ascii_uppercase()), "{detail}");
        assert!(app.database.key_state(key).await.is_none(), "the refused request used no key");
    }
    assert!(app.charges().await.is_empty(), "nothing reached the gateway");

    for (key, amount, currency) in [
        ("kwd", 12_340, "kwd"),
        ("isk", 50_000, "isk"),
        ("ugx", 370_000, "ugx"),
        ("huf", 1045, "huf"),
        ("twd", 80_045, "twd"),
        ("jpy", 100_000, "jpy"),
    ] {
        paid_in(&app, &acme, key, amount, currency).await;
        let charges = app.charges_for(key).await;
        assert_eq!(
            (charges.len(), &charges[0]["amount"], &charges[0]["currency"]),
            (1, &json!(amount), &json!(currency))
        );
    }
    let stored: Vec<(i64, String)> =
        sqlx::query_as("select amount, currency from payments order by created_at").fetch_all(&app.db).await.unwrap();
    assert_eq!(stored.len(), 6);
    assert_eq!(stored[0], (12_340, "kwd".to_owned()));
}

/// A refund Stripe would refuse for the payment's currency (a dinar amount not ending in 0) is a
/// 400 naming `amount`: nothing is reserved, the key is not used, the gateway sees nothing; the
/// same key with an amount Stripe takes then refunds.
#[tokio::test]
async fn the_api_refuses_a_refund_stripe_refuses_for_the_currency() {
    let app = TestApp::spawn().await;
    let acme = app.customer("acme").await;
    let pay = paid_in(&app, &acme, "order-kwd", 12_340, "kwd").await;

    let (status, _, body) =
        parts(app.post_refund(&acme, Some("refund-1"), &json!({"payment": pay, "amount": 1005})).send().await.unwrap())
            .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["errors"][0]["field"], "amount", "{body}");
    assert!(body["errors"][0]["detail"].as_str().unwrap().contains("multiple of 10 for KWD"), "{body}");
    assert!(app.database.key_state("refund-1").await.is_none(), "the key was not used");
    let refunded: i64 = sqlx::query_scalar("select amount_refunded from payments").fetch_one(&app.db).await.unwrap();
    assert_eq!(refunded, 0, "nothing reserved");
    assert!(refund_rows(&app).await.is_empty());
    assert!(app.ledger.refunds().await.is_empty());

    let refund = api_refund(&app, &acme, "refund-1", json!({"payment": pay, "amount": 1000})).await;
    assert_eq!((refund["amount"].as_i64(), refund["currency"].as_str()), (Some(1000), Some("kwd")));
    assert_eq!(refund_rows(&app).await, [(1000, "kwd".to_owned(), "succeeded".to_owned())]);
    let ledger = app.ledger.refunds().await;
    assert_eq!((ledger.len(), &ledger[0]["amount"], &ledger[0]["currency"]), (1, &json!(1000), &json!("kwd")));
}

/// The dashboard and the shop write each amount in its currency's own units, with thousands
/// separators: yen whole, dinars with three decimals, króna whole (Stripe's `50000` is 500 ISK);
/// the refund form proposes what remains the same way.
#[tokio::test]
async fn pages_write_each_currency_in_its_own_units() {
    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let yen = paid_in(&app, &acme, "order-jpy", 100_000, "jpy").await;
    let dinars = paid_in(&app, &acme, "order-kwd", 12_340, "kwd").await;
    let kronur = paid_in(&app, &acme, "order-isk", 50_000, "isk").await;
    api_refund(&app, &acme, "refund-jpy", json!({"payment": yen, "amount": 2500})).await;
    let client = browser_client();
    sign_in(&app, &client).await;

    let body = page(&app, &client, &format!("/admin/payments/{yen}")).await;
    assert!(body.contains("<dd>100,000 JPY</dd>"), "{body}");
    assert!(body.contains(r#"<dd id="amount-refunded">2,500 JPY</dd>"#), "{body}");
    assert!(body.contains(r#"<dd id="amount-remaining">97,500 JPY</dd>"#), "{body}");
    assert_eq!(field(&body, "amount"), "97500", "the form proposes whole yen");
    let body = page(&app, &client, &format!("/admin/payments/{dinars}")).await;
    assert!(body.contains("<dd>12.340 KWD</dd>"), "{body}");
    assert_eq!(field(&body, "amount"), "12.340");
    let body = page(&app, &client, &format!("/admin/payments/{kronur}")).await;
    assert!(body.contains("<dd>500 ISK</dd>"), "{body}");
    assert_eq!(field(&body, "amount"), "500");
    let keys = page(&app, &client, &format!("/admin/keys/{}", crate::admin::key_id(&app, "order-jpy").await)).await;
    assert!(keys.contains("100,000 JPY"), "{keys}");

    // The shop: the customer's payments and a receipt.
    let shopper = browser_client();
    let home = shopper.get(app.url("/")).send().await.unwrap().text().await.unwrap();
    shopper
        .post(app.url("/shop/sign-in"))
        .form(&[("csrf", field(&home, "csrf").as_str()), ("api_key", acme.as_str())])
        .send()
        .await
        .unwrap();
    let home = shopper.get(app.url("/")).send().await.unwrap().text().await.unwrap();
    for shown in ["100,000 JPY", "12.340 KWD", "500 ISK"] {
        assert!(home.contains(shown), "{shown}: {home}");
    }
    let receipt = shopper.get(app.url(&format!("/shop/receipts/{yen}"))).send().await.unwrap().text().await.unwrap();
    assert!(receipt.contains("Paid 100,000 JPY"), "{receipt}");
}

/// In a real browser (headless Chromium), the issue's proof: an operator refunds 500 yen of a
/// 100,000 JPY payment by typing `500` in the refund form, and 1.25 dinars of a 12.340 KWD one by
/// typing `1.25`; the database and the simulator's ledger hold 500 and 1250 (minor units), not
/// 50,000 and 125. An amount Stripe would refuse (1.255 KWD) is refused with a message, and
/// nothing is refunded.
#[tokio::test]
async fn in_a_browser_yen_and_dinars_are_refunded_in_their_own_units() {
    use crate::chromium::Browser;

    /// Opens the payment page's refund form, types `amount` and sends it.
    async fn refund(browser: &Browser, amount: &str) {
        browser.click("#refund-summary").await;
        browser.fill("refund-amount", amount).await;
        browser.click("#refund").await;
    }

    let app = TestApp::spawn().await;
    create_admin(&app).await;
    let acme = app.customer("acme").await;
    let yen = paid_in(&app, &acme, "order-jpy", 100_000, "jpy").await;
    let dinars = paid_in(&app, &acme, "order-kwd", 12_340, "kwd").await;
    let browser = Browser::start().await;
    let path = format!("/admin/payments/{yen}");
    browser.goto(&app.url(&path)).await;
    crate::browser::sign_in(&browser).await;
    browser.wait_for_path(&path).await;
    browser.wait_for_text("100,000 JPY").await;

    refund(&browser, "500").await;
    browser.wait_for_text("Refunded 500 JPY: refund re_").await;
    assert!(browser.text().await.contains("99,500 JPY"), "what remains: {}", browser.text().await);
    assert_eq!(refund_rows(&app).await, [(500, "jpy".to_owned(), "succeeded".to_owned())]);
    let ledger = app.ledger.refunds().await;
    assert_eq!((ledger.len(), &ledger[0]["amount"], &ledger[0]["currency"]), (1, &json!(500), &json!("jpy")));

    let path = format!("/admin/payments/{dinars}");
    browser.goto(&app.url(&path)).await;
    browser.wait_for_text("12.340 KWD").await;
    refund(&browser, "1.255").await;
    browser.wait_for_text("Nothing was refunded").await;
    let said = browser.text().await;
    assert!(said.contains("“1.255” is not an amount Stripe takes: its KWD amounts end in 0"), "{said}");
    assert_eq!(refund_rows(&app).await.len(), 1, "1.255 KWD refunded nothing");

    refund(&browser, "1.25").await;
    browser.wait_for_text("Refunded 1.250 KWD: refund re_").await;
    browser.screenshot("admin-payment-refunded-dinars").await;
    let rows = refund_rows(&app).await;
    assert_eq!(rows[1], (1250, "kwd".to_owned(), "succeeded".to_owned()), "{rows:?}");
    let ledger = app.ledger.refunds().await;
    assert_eq!(ledger.len(), 2);
    assert_eq!((&ledger[1]["amount"], &ledger[1]["currency"]), (&json!(1250), &json!("kwd")));
    let refunded: Vec<i64> = sqlx::query_scalar("select amount_refunded from payments order by created_at")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(refunded, [500, 1250]);
    browser.close().await;
}
