//! Amounts in each currency's own minor unit, as Stripe defines it (docs/dashboard.md,
//! "Amounts and currencies"): the API refuses what Stripe would refuse, the pages write yen as
//! yen and dinars with three decimals, and the refund form reads what an operator types in the
//! payment's currency. Every test asserts the database and the simulator's ledger.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::admin_refunds::api_refund;
use crate::helpers::{TestApp, parts};

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
