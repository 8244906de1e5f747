//! Stripe's idempotency semantics: replays, saved declines, mismatches, validation errors that
//! are not saved, and concurrent requests with one key.

use stripe::{ApiErrorsCode, ApiErrorsType};
use tokio::sync::Barrier;

use super::{PAYMENT_FORM, TestSim, stripe_error};

/// A retry with the same key and parameters gets the saved PaymentIntent back, marked
/// `Idempotent-Replayed: true`, and the customer is charged once.
#[tokio::test]
async fn replay_returns_the_saved_payment_intent_without_charging_again() {
    let sim = TestSim::start().await;

    let first = sim.pay("pm_card_visa", "order-1").await.expect("paid");
    let second = sim.pay("pm_card_visa", "order-1").await.expect("replayed");
    assert_eq!(second.id, first.id);
    let charge_id =
        |intent: &stripe_core::PaymentIntent| intent.latest_charge.as_ref().map(|charge| charge.id().to_string());
    assert_eq!(charge_id(&second), charge_id(&first));

    // The same parameters in another order are the same request.
    let raw = sim.post_form(Some("order-1"), PAYMENT_FORM).await;
    assert_eq!(raw.status, 200);
    assert!(raw.replayed, "Idempotent-Replayed: true");
    assert_eq!(raw.body["id"], first.id.as_str());

    assert_eq!(sim.sim().charges().len(), 1);
}

/// Every answer names its request (`Request-Id`) and API version (`Stripe-Version`: the
/// request's, else the one async-stripe pins); a POST's echoes its `Idempotency-Key`; a saved
/// result names the request that executed (`Original-Request`), on the first answer and on
/// every replay, as Stripe's do.
#[tokio::test]
async fn answers_carry_stripes_headers() {
    let sim = TestSim::start().await;

    let first = sim.post_form(Some("order-1"), PAYMENT_FORM).await;
    let replay = sim.post_form(Some("order-1"), PAYMENT_FORM).await;

    let request_id = first.header("request-id").to_owned();
    assert!(request_id.starts_with("req_"), "{request_id}");
    assert_eq!(first.header("stripe-version"), stripe_shared::version::VERSION.as_str());
    assert_eq!((first.header("idempotency-key"), first.header("original-request")), ("order-1", request_id.as_str()));
    assert!(replay.replayed);
    assert_ne!(replay.header("request-id"), request_id, "each request has its own id");
    assert_eq!(replay.header("original-request"), request_id, "the replay names the request that executed");

    let older = sim
        .request(reqwest::Method::GET, "v1/events")
        .bearer_auth(super::API_KEY)
        .header("Stripe-Version", "2023-08-16");
    let older = super::Response::send(older).await;
    assert_eq!((older.status, older.header("stripe-version")), (200, "2023-08-16"));
    assert_eq!(older.header("idempotency-key"), "", "only a POST's key is echoed");
    let unsaved = sim.post_form(Some("invalid"), &[("amount", "1")]).await;
    assert_eq!((unsaved.status, unsaved.header("idempotency-key")), (400, "invalid"));
    assert_eq!(unsaved.header("original-request"), "", "a refusal before execution is not saved for the key");
}

/// A decline is a result of execution: it is saved and replayed, not retried against the card.
#[tokio::test]
async fn declines_are_saved_and_replayed() {
    let sim = TestSim::start().await;
    let form = [
        ("amount", "1250"),
        ("currency", "usd"),
        ("confirm", "true"),
        ("payment_method", "pm_card_chargeDeclinedFraudulent"),
        ("payment_method_types[]", "card"),
    ];

    let first = sim.post_form(Some("declined"), &form).await;
    let second = sim.post_form(Some("declined"), &form).await;

    assert_eq!((first.status, first.replayed), (402, false));
    assert_eq!(first.body["error"]["decline_code"], "fraudulent");
    assert_eq!((second.status, second.replayed), (402, true));
    assert_eq!(second.body, first.body, "the saved body, byte for byte");
    assert!(sim.sim().charges().is_empty());
}

/// Reusing a key with other parameters is a 400 `idempotency_error`, and charges nothing more.
#[tokio::test]
async fn same_key_other_parameters_is_an_idempotency_error() {
    let sim = TestSim::start().await;
    sim.pay("pm_card_visa", "order-1").await.expect("paid");

    let other_card = sim.pay("pm_card_mastercard", "order-1").await;

    let error = stripe_error(other_card, 400);
    assert_eq!(error.type_, ApiErrorsType::IdempotencyError);
    let message = error.message.unwrap_or_default();
    assert!(message.contains("same parameters"), "{message}");
    assert_eq!(sim.sim().charges().len(), 1);
}

/// A request that fails validation never started executing, so nothing is saved: the fixed
/// request with the same key executes normally.
#[tokio::test]
async fn validation_errors_are_not_saved() {
    let sim = TestSim::start().await;

    let invalid = sim.post_form(Some("k"), &[("amount", "12.50"), ("currency", "usd")]).await;
    assert_eq!(invalid.status, 400);
    assert_eq!(invalid.body["error"]["code"], "parameter_invalid_integer");

    let fixed = sim.post_form(Some("k"), PAYMENT_FORM).await;
    assert_eq!((fixed.status, fixed.replayed), (200, false));
    assert_eq!(fixed.body["status"], "succeeded");
    assert_eq!(sim.sim().charges().len(), 1);
}

/// Two requests with one key at the same instant: one executes, the other gets 409
/// `idempotency_key_in_use`; one charge. (Latency keeps the first in flight.)
#[tokio::test]
async fn concurrent_requests_with_one_key_charge_once() {
    let sim = TestSim::start().await;
    sim.set_faults(serde_json::json!({"latency_ms": 500})).await;
    let barrier = Barrier::new(2);
    // Both attempts run concurrently on this task; the barrier releases them together.
    let attempt = || async {
        barrier.wait().await;
        sim.pay("pm_card_visa", "double-click").await
    };

    let (a, b) = tokio::join!(attempt(), attempt());

    let (succeeded, conflicted) = match (a, b) {
        (Ok(intent), Err(error)) | (Err(error), Ok(intent)) => (intent, Err::<(), _>(error)),
        other => panic!("expected one success and one conflict, got {other:?}"),
    };
    let error = stripe_error(conflicted, 409);
    assert_eq!(error.type_, ApiErrorsType::IdempotencyError);
    assert_eq!(error.code, Some(ApiErrorsCode::IdempotencyKeyInUse));
    let charges = sim.sim().charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].payment_intent, succeeded.id.as_str());

    let retry = sim.pay("pm_card_visa", "double-click").await.expect("replayed");
    assert_eq!(retry.id, succeeded.id);
}
