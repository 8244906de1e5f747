//! Stripe's pending outcomes: bank debits that process then settle, 3-D Secure that waits for the
//! customer, and the `return_url` rule. Each path is followed to its final state through
//! async-stripe, with the ledger and the events checked.

use reqwest::Method;
use serde_json::json;
use stripe::ApiErrorsType;
use stripe_core::PaymentIntentStatus;
use stripe_core::charge::RetrieveCharge;
use stripe_core::payment_intent::{CreatePaymentIntent, RetrievePaymentIntent};
use stripe_types::Currency;

use super::{Response, TestSim, events_about, payment, send, stripe_error};

/// The status of a PaymentIntent as `GET /v1/payment_intents/{id}` shows it now.
async fn status_of(sim: &TestSim, id: &str) -> PaymentIntentStatus {
    RetrievePaymentIntent::new(id).send(&sim.stripe()).await.expect("retrieved").status
}

/// Waits until the PaymentIntent reaches `status`.
async fn wait_for_status(sim: &TestSim, id: &str, status: PaymentIntentStatus) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while status_of(sim, id).await != status {
        assert!(std::time::Instant::now() < deadline, "{id} never reached {status:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// `pm_usBankAccount_success`: `processing` at once (no charge in the ledger yet), `succeeded`
/// after the processing time, charged exactly once under the create call's key.
#[tokio::test]
async fn bank_debit_processes_then_succeeds_and_is_charged_once() {
    let sim = TestSim::start().await;
    sim.fast().await;

    let intent = sim.pay("pm_usBankAccount_success", "ach-1").await.expect("created");
    assert_eq!(intent.status, PaymentIntentStatus::Processing);
    assert!(intent.latest_charge.is_some(), "a pending charge");
    assert!(sim.sim().charges().is_empty(), "no money has moved yet");

    wait_for_status(&sim, intent.id.as_str(), PaymentIntentStatus::Succeeded).await;
    let charges = sim.sim().charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].payment_intent, intent.id.as_str());
    assert_eq!(charges[0].idempotency_key.as_deref(), Some("ach-1"));
    let replay = sim.pay("pm_usBankAccount_success", "ach-1").await.expect("replayed");
    assert_eq!(replay.status, PaymentIntentStatus::Processing, "a replay is the saved answer");
    assert_eq!(sim.sim().charges().len(), 1);

    let kinds: Vec<_> = events_about(&sim, intent.id.as_str()).await.into_iter().map(|(kind, _)| kind).collect();
    assert_eq!(
        kinds,
        [
            "payment_intent.created",
            "charge.pending",
            "payment_intent.processing",
            "charge.succeeded",
            "payment_intent.succeeded"
        ]
    );
}

/// `pm_usBankAccount_accountClosed`: `processing`, then `requires_payment_method` with a
/// `last_payment_error`, a `payment_intent.payment_failed` event caused by no request, no charge.
#[tokio::test]
async fn closed_bank_account_processes_then_fails() {
    let sim = TestSim::start().await;
    sim.fast().await;

    let intent = sim.pay("pm_usBankAccount_accountClosed", "ach-2").await.expect("created");
    assert_eq!(intent.status, PaymentIntentStatus::Processing);

    wait_for_status(&sim, intent.id.as_str(), PaymentIntentStatus::RequiresPaymentMethod).await;
    let failed = RetrievePaymentIntent::new(intent.id.clone()).send(&sim.stripe()).await.expect("retrieved");
    let error = failed.last_payment_error.expect("last_payment_error");
    assert_eq!(error.code, Some(stripe::ApiErrorsCode::AccountClosed));
    assert!(failed.payment_method.is_none(), "the payment method is detached");
    assert!(sim.sim().charges().is_empty());

    let events = events_about(&sim, intent.id.as_str()).await;
    let (kind, request) = events.last().expect("events").clone();
    assert_eq!(kind, "payment_intent.payment_failed");
    assert_eq!(request, json!({"id": null, "idempotency_key": null}), "an asynchronous transition");
    assert_eq!(events[0].1["idempotency_key"], "ach-2", "the create call's key");
}

/// `pm_card_threeDSecure2Required`: `requires_action` with Stripe's `use_stripe_sdk` next
/// action; the customer authenticating makes it `succeeded`, charged once.
#[tokio::test]
async fn three_d_secure_waits_for_the_customer_then_succeeds() {
    let sim = TestSim::start().await;

    let intent = sim.pay("pm_card_threeDSecure2Required", "3ds-1").await.expect("created");
    assert_eq!(intent.status, PaymentIntentStatus::RequiresAction);
    let next_action = intent.next_action.as_ref().expect("a next action");
    assert_eq!(next_action.type_, "use_stripe_sdk");
    assert!(sim.sim().charges().is_empty());

    let path = format!("_sim/payment_intents/{}/authenticate", intent.id.as_str());
    let answer = Response::send(sim.request(Method::POST, &path).json(&json!({"outcome": "succeed"}))).await;
    assert_eq!((answer.status, answer.body["status"].as_str()), (200, Some("succeeded")));

    assert_eq!(status_of(&sim, intent.id.as_str()).await, PaymentIntentStatus::Succeeded);
    let charges = sim.sim().charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].idempotency_key.as_deref(), Some("3ds-1"));
    let charge = RetrieveCharge::new(charges[0].charge.as_str()).send(&sim.stripe()).await.expect("the charge");
    let card = charge.payment_method_details.and_then(|details| details.card).expect("a card");
    let three_d_secure = card.three_d_secure.expect("the charge says how the customer authenticated");
    assert_eq!(three_d_secure.result, Some(stripe_shared::ThreeDSecureDetailsChargeResult::Authenticated));
    let again = Response::send(sim.request(Method::POST, &path).json(&json!({"outcome": "succeed"}))).await;
    assert_eq!(again.status, 400, "only a PaymentIntent awaiting authentication can authenticate");
    assert_eq!(sim.sim().charges().len(), 1);
    let kinds: Vec<_> = events_about(&sim, intent.id.as_str()).await.into_iter().map(|(kind, _)| kind).collect();
    assert_eq!(kinds[1..], ["payment_intent.requires_action", "charge.succeeded", "payment_intent.succeeded"]);
}

/// A failed authentication: `requires_payment_method`, Stripe's authentication error, a
/// `payment_intent.payment_failed` event, nothing charged.
#[tokio::test]
async fn three_d_secure_failure_asks_for_another_payment_method() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_threeDSecure2Required", "3ds-2").await.expect("created");

    let path = format!("_sim/payment_intents/{}/authenticate", intent.id.as_str());
    let answer = Response::send(sim.request(Method::POST, &path).json(&json!({"outcome": "fail"}))).await;

    assert_eq!(answer.body["status"], "requires_payment_method");
    assert_eq!(answer.body["last_payment_error"]["code"], "payment_intent_authentication_failure");
    assert_eq!(answer.body["last_payment_error"]["payment_method"]["card"]["last4"], "3220");
    assert_eq!(status_of(&sim, intent.id.as_str()).await, PaymentIntentStatus::RequiresPaymentMethod);
    assert!(sim.sim().charges().is_empty());
    let events = events_about(&sim, intent.id.as_str()).await;
    assert_eq!(events.last().map(|(kind, _)| kind.as_str()), Some("payment_intent.payment_failed"));
    let bad = Response::send(sim.request(Method::POST, &path).json(&json!({"outcome": "maybe"}))).await;
    assert_eq!(bad.status, 400);
}

/// Confirming without `return_url` while redirects are allowed is Stripe's 400 on `return_url`
/// (nothing created, nothing saved); with a `return_url`, 3-D Secure redirects to the
/// simulator's authentication page and back.
#[tokio::test]
async fn confirming_without_return_url_requires_redirects_off() {
    let sim = TestSim::start().await;
    let bare = CreatePaymentIntent::new(1250, Currency::USD).confirm(true).payment_method("pm_card_visa");

    let refused = stripe_error(send(&sim.stripe(), &bare, "k").await, 400);

    assert_eq!(refused.type_, ApiErrorsType::InvalidRequestError);
    assert_eq!(refused.param.as_deref(), Some("return_url"));
    assert!(refused.message.unwrap_or_default().contains("allow_redirects"));
    assert!(sim.sim().charges().is_empty());
    let with_return = bare.clone().return_url("https://shop.example/back");
    assert_eq!(
        send(&sim.stripe(), &with_return, "k").await.expect("the key was not used").status,
        PaymentIntentStatus::Succeeded
    );
    let redirect = CreatePaymentIntent::new(500, Currency::USD)
        .confirm(true)
        .payment_method("pm_card_threeDSecure2Required")
        .return_url("https://shop.example/back");
    let intent = redirect.send(&sim.stripe()).await.expect("created");
    let next_action = intent.next_action.expect("a next action");
    let redirect_to_url = next_action.redirect_to_url.expect("a redirect");
    assert_eq!(redirect_to_url.return_url.as_deref(), Some("https://shop.example/back"));
    assert!(redirect_to_url.url.unwrap_or_default().ends_with("/authenticate"));
    assert_eq!(
        send(&sim.stripe(), &payment("pm_card_visa"), "other").await.expect("allow_redirects=never").status,
        PaymentIntentStatus::Succeeded
    );
}

/// A bank debit cannot be confirmed on a PaymentIntent that accepts only cards (whichever name
/// the list is sent under).
#[tokio::test]
async fn payment_method_types_limit_what_can_confirm() {
    let sim = TestSim::start().await;
    for list in ["payment_method_types[]", "allowed_payment_method_types[0]"] {
        let form = [
            ("amount", "500"),
            ("currency", "usd"),
            ("confirm", "true"),
            ("payment_method", "pm_usBankAccount_success"),
            (list, "card"),
        ];
        let refused = sim.post_form(None, &form).await;
        assert_eq!((refused.status, refused.body["error"]["param"].as_str()), (400, Some("payment_method")), "{list}");
    }
    assert!(sim.sim().charges().is_empty());
}
