//! Fault injection through the control API, observed through async-stripe: outages, lost
//! responses, timeouts that still charge, replays under faults, and scoping.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use stripe::{ApiErrorsCode, ApiErrorsType, StripeError, StripeRequest};

use super::{PAYMENT_FORM, Response, TestSim, idempotent, payment, send, stripe_error};
use crate::simulator::Faults;

/// An injected outage answers 500 (retry: true) without executing or saving; once the outage
/// is over, the same key executes and charges exactly once.
#[tokio::test]
async fn outage_answers_500_without_charging_and_the_retry_charges_once() {
    let sim = TestSim::start().await;
    sim.set_faults(json!({"fail_rate": 1.0})).await;

    let raw = sim.post_form(Some("order-1"), PAYMENT_FORM).await;
    assert_eq!(raw.status, 500);
    assert_eq!(raw.body["error"]["type"], "api_error");
    assert_eq!(raw.should_retry.as_deref(), Some("true"));
    let failed = sim.pay("pm_card_visa", "order-1").await;
    assert_eq!(stripe_error(failed, 500).type_, ApiErrorsType::ApiError);
    assert!(sim.sim().charges().is_empty(), "an outage charges nothing");

    sim.set_faults(json!({})).await;
    let intent = sim.pay("pm_card_visa", "order-1").await.expect("paid");
    let replay = sim.pay("pm_card_visa", "order-1").await.expect("replayed");

    assert_eq!(replay.id, intent.id);
    let charges = sim.sim().charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].payment_intent, intent.id.as_str());
}

/// A response lost after the charge reaches async-stripe as a transport error, not a Stripe
/// error; the charge is in the ledger, and the retry with the same key replays it.
#[tokio::test]
async fn lost_response_is_a_transport_error_but_the_charge_is_saved() {
    let sim = TestSim::start().await;
    sim.set_faults(json!({"drop_after_charge_rate": 1.0})).await;

    let lost = sim.pay("pm_card_visa", "order-1").await;

    assert!(matches!(lost, Err(StripeError::ClientError(_))), "a transport error: {lost:?}");
    let charges = sim.sim().charges();
    assert_eq!(charges.len(), 1, "charged although the client never heard");
    assert_eq!(charges[0].idempotency_key.as_deref(), Some("order-1"));

    sim.set_faults(json!({})).await;
    let retry = sim.pay("pm_card_visa", "order-1").await.expect("replayed");
    assert_eq!(retry.id.as_str(), charges[0].payment_intent);
    assert_eq!(sim.sim().charges().len(), 1);
}

/// A held request outlives the client's timeout, still charges when the hold ends (even though
/// the client hung up), keeps its key in use meanwhile, and the retry replays its result.
#[tokio::test]
async fn timed_out_request_still_charges_and_the_retry_replays() {
    let sim = TestSim::start().await;
    sim.set_faults(json!({"timeout_rate": 1.0, "timeout_hold_ms": 600})).await;
    let client = sim.stripe();
    let request = payment("pm_card_visa");

    let timed_out = request
        .customize()
        .request_strategy(idempotent("order-1"))
        .timeout(Duration::from_millis(50))
        .send(&client)
        .await;
    assert!(matches!(timed_out, Err(StripeError::Timeout)), "{timed_out:?}");

    let too_soon = send(&client, &request, "order-1").await;
    assert_eq!(stripe_error(too_soon, 409).code, Some(ApiErrorsCode::IdempotencyKeyInUse));

    let charges = sim.wait_for_charges(1).await;
    assert_eq!(charges.len(), 1, "the held request charged after its client left");
    let retry = send(&client, &request, "order-1").await.expect("replayed");
    assert_eq!(retry.id.as_str(), charges[0].payment_intent);
    assert_eq!(sim.sim().charges().len(), 1);
}

/// Replays execute nothing, so failure, hold and drop faults do not touch them, and they do not
/// use up `next_calls`.
#[tokio::test]
async fn replays_are_not_failed_held_or_dropped() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "order-1").await.expect("paid");

    for faults in [
        json!({"fail_rate": 1.0, "next_calls": 1}),
        json!({"timeout_rate": 1.0, "timeout_hold_ms": 60000, "next_calls": 1}),
        json!({"drop_after_charge_rate": 1.0, "next_calls": 1}),
    ] {
        sim.set_faults(faults).await;
        let replay = sim.pay("pm_card_visa", "order-1").await;
        assert_eq!(replay.expect("the saved result").id, intent.id);
        assert_eq!(sim.sim().faults().next_calls, Some(1), "a replay is not counted");
    }
    assert_eq!(sim.sim().charges().len(), 1);
}

/// `payment_method` scopes faults to calls with that payment method.
#[tokio::test]
async fn faults_scoped_to_a_payment_method() {
    let sim = TestSim::start().await;
    sim.set_faults(json!({"fail_rate": 1.0, "payment_method": "pm_card_mastercard"})).await;

    let visa = sim.pay("pm_card_visa", "visa").await;
    let mastercard = sim.pay("pm_card_mastercard", "mastercard").await;

    assert!(visa.is_ok(), "out of scope: {visa:?}");
    assert_eq!(stripe_error(mastercard, 500).type_, ApiErrorsType::ApiError);
    let charges = sim.sim().charges();
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0].payment_method, "pm_card_visa");
}

/// `next_calls` applies the faults to the next N executions, counts down visibly, then clears
/// every fault.
#[tokio::test]
async fn next_calls_limits_faults_then_clears_them() {
    let sim = TestSim::start().await;
    sim.set_faults(json!({"fail_rate": 1.0, "next_calls": 2})).await;
    let remaining = || async {
        let faults = Response::send(sim.request(Method::GET, "_sim/faults")).await.body;
        serde_json::from_value::<Faults>(faults).expect("Faults JSON").next_calls
    };

    assert_eq!(remaining().await, Some(2));
    stripe_error(sim.pay("pm_card_visa", "a").await, 500);
    assert_eq!(remaining().await, Some(1));
    stripe_error(sim.pay("pm_card_visa", "b").await, 500);
    assert_eq!(sim.sim().faults(), Faults::default(), "all faults cleared");
    sim.pay("pm_card_visa", "c").await.expect("no fault left");
    assert_eq!(sim.sim().charges().len(), 1);
}

/// Faults scoped to reads strike retrieves (a 500 that changes nothing) and leave creates alone;
/// faults scoped to creates leave reads working, so reconciliation can ask during an outage.
#[tokio::test]
async fn faults_scoped_to_operations() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "order-1").await.expect("paid");
    let client = sim.stripe();
    let request = stripe_core::payment_intent::RetrievePaymentIntent::new(intent.id.clone());
    let retrieve = || request.send(&client);

    sim.set_faults(json!({"fail_rate": 1.0, "operations": ["read"]})).await;
    assert_eq!(stripe_error(retrieve().await, 500).type_, ApiErrorsType::ApiError);
    assert!(sim.pay("pm_card_visa", "order-2").await.is_ok(), "creates are out of scope");

    sim.set_faults(json!({"fail_rate": 1.0, "operations": ["create_payment_intent"]})).await;
    assert_eq!(retrieve().await.expect("reads are out of scope").id, intent.id);
    stripe_error(sim.pay("pm_card_visa", "order-3").await, 500);
    assert_eq!(sim.sim().charges().len(), 2);
}
