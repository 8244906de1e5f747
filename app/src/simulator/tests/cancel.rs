//! Cancel and expiry through async-stripe: `POST /v1/payment_intents/{id}/cancel` from each
//! state Stripe allows, its refusals, and an authorization that expires
//! (`POST /_sim/payment_intents/{id}/expire_authorization`); idempotency and faults on cancel.

use reqwest::Method;
use serde_json::json;
use stripe::{ApiErrorsCode, StripeError};
use stripe_core::charge::RetrieveCharge;
use stripe_core::payment_intent::{
    CancelPaymentIntentCancellationReason, CreatePaymentIntent, RetrievePaymentIntent, SearchPaymentIntent,
};
use stripe_core::refund::CreateRefund;
use stripe_core::{PaymentIntentCancellationReason, PaymentIntentStatus};
use stripe_types::Currency;

use super::capture::{authorize, cancel, capture, error_of, raw};
use super::{Response, TestSim, events_about, stripe_error};

/// The message of Stripe's refusal to cancel a PaymentIntent in `status`.
fn cannot_cancel(status: &str) -> String {
    format!(
        "You cannot cancel this PaymentIntent because it has a status of {status}. Only a PaymentIntent with one \
         of the following statuses may be canceled: requires_payment_method, requires_capture, \
         requires_confirmation, requires_action, processing."
    )
}

/// Canceling an authorization releases it: `canceled` with the reason and the time, nothing
/// capturable or received, `payment_intent.canceled` under the cancel's key; the charge stays
/// uncaptured and unrefunded (no Refund since 2025-03-31.basil), the ledger empty; a later
/// capture, a second cancel and a refund are refused as Stripe refuses them.
#[tokio::test]
async fn cancel_releases_the_authorization() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = intent.id.as_str();

    let reason = CancelPaymentIntentCancellationReason::RequestedByCustomer;
    let canceled = cancel(&sim, id, Some(reason), "cancel-1").await.expect("canceled");

    assert_eq!(canceled.status, PaymentIntentStatus::Canceled);
    assert_eq!(canceled.cancellation_reason, Some(PaymentIntentCancellationReason::RequestedByCustomer));
    assert!(canceled.canceled_at.is_some_and(|at| at >= canceled.created));
    assert_eq!((canceled.amount_capturable, canceled.amount_received), (0, 0));
    let charge = canceled.latest_charge.as_ref().expect("the authorization's charge").id().clone();
    let charge = RetrieveCharge::new(charge).send(&sim.stripe()).await.expect("the charge");
    assert_eq!(
        (charge.captured, charge.amount_captured, charge.amount_refunded, charge.refunded),
        (false, 0, 0, false)
    );
    assert!(sim.sim().charges().is_empty() && sim.sim().refunds().is_empty(), "no money moved either way");
    let events = events_about(&sim, id).await;
    let (kind, request) = events.last().expect("events");
    assert_eq!((kind.as_str(), &request["idempotency_key"]), ("payment_intent.canceled", &json!("cancel-1")));
    assert_eq!(events.len(), 4, "created, charge.succeeded, amount_capturable_updated, canceled: {events:?}");

    let late = raw(&sim, id, "capture", "capture-1", &[]).await;
    assert_eq!(late.status, 400);
    assert_eq!(
        error_of(&late),
        json!({
            "type": "invalid_request_error",
            "code": "payment_intent_unexpected_state",
            "doc_url": "https://stripe.com/docs/error-codes/payment-intent-unexpected-state",
            "message": "This PaymentIntent could not be captured because it has a status of canceled. Only a \
                        PaymentIntent with one of the following statuses may be captured: requires_capture.",
            "payment_intent": {"id": id, "status": "canceled"},
        })
    );
    let twice = raw(&sim, id, "cancel", "cancel-2", &[]).await;
    assert_eq!(twice.status, 400);
    assert_eq!(
        error_of(&twice),
        json!({
            "type": "invalid_request_error",
            "code": "payment_intent_unexpected_state",
            "doc_url": "https://stripe.com/docs/error-codes/payment-intent-unexpected-state",
            "message": cannot_cancel("canceled"),
            "payment_intent": {"id": id, "status": "canceled"},
        })
    );
    let refund = stripe_error(CreateRefund::new().payment_intent(id).send(&sim.stripe()).await, 400);
    let message = refund.message.unwrap_or_default();
    assert_eq!(message, format!("This PaymentIntent ({id}) does not have a successful charge to refund."));
    let found = SearchPaymentIntent::new("status:'canceled'").send(&sim.stripe()).await.expect("searched");
    assert_eq!(found.data.len(), 1);
    assert!(sim.sim().charges().is_empty());
}

/// Stripe cancels from `requires_payment_method`, `requires_confirmation` and `requires_action`
/// too (without a reason, `cancellation_reason` is `null`); not a `succeeded` PaymentIntent, and
/// (in the simulator) not a bank debit already submitted (`processing`). An unknown id is a 404.
#[tokio::test]
async fn cancel_from_each_state_stripe_allows() {
    let sim = TestSim::start().await;
    sim.set_settings(json!({"processing_ms": 600_000})).await;
    let client = sim.stripe();
    let no_method = CreatePaymentIntent::new(500, Currency::USD).send(&client).await.expect("created");
    let unconfirmed = CreatePaymentIntent::new(500, Currency::USD)
        .payment_method("pm_card_visa")
        .send(&client)
        .await
        .expect("created");
    let three_d_secure = sim.pay("pm_card_threeDSecure2Required", "3ds").await.expect("created");

    for (intent, status) in [
        (&no_method, PaymentIntentStatus::RequiresPaymentMethod),
        (&unconfirmed, PaymentIntentStatus::RequiresConfirmation),
        (&three_d_secure, PaymentIntentStatus::RequiresAction),
    ] {
        assert_eq!(intent.status, status);
        let canceled = cancel(&sim, intent.id.as_str(), None, &format!("cancel-{}", intent.id)).await;
        let canceled = canceled.expect("canceled");
        assert_eq!((canceled.status, canceled.cancellation_reason), (PaymentIntentStatus::Canceled, None));
        assert!(canceled.next_action.is_none());
    }
    let authenticate = format!("_sim/payment_intents/{}/authenticate", three_d_secure.id.as_str());
    let late = Response::send(sim.request(Method::POST, &authenticate).json(&json!({"outcome": "succeed"}))).await;
    assert_eq!(late.status, 400, "a canceled PaymentIntent awaits no authentication");

    let paid = sim.pay("pm_card_visa", "paid").await.expect("paid");
    let refused = raw(&sim, paid.id.as_str(), "cancel", "cancel-paid", &[]).await;
    assert_eq!(
        (refused.status, refused.body["error"]["message"].as_str()),
        (400, Some(cannot_cancel("succeeded").as_str()))
    );
    let processing = sim.pay("pm_usBankAccount_success", "ach").await.expect("processing");
    let refused = stripe_error(cancel(&sim, processing.id.as_str(), None, "cancel-ach").await, 400);
    assert_eq!(refused.code, Some(ApiErrorsCode::PaymentIntentUnexpectedState));
    assert_eq!(refused.payment_intent.map(|intent| intent.status), Some(PaymentIntentStatus::Processing));
    let missing = raw(&sim, "pi_nope", "cancel", "cancel-nope", &[]).await;
    assert_eq!((missing.status, missing.body["error"]["code"].as_str()), (404, Some("resource_missing")));
    let bad = raw(&sim, no_method.id.as_str(), "cancel", "cancel-bad", &[("cancellation_reason", "bored")]).await;
    assert_eq!((bad.status, bad.body["error"]["param"].as_str()), (400, Some("cancellation_reason")));
    assert_eq!(sim.sim().charges().len(), 1, "only the paid one");
}

/// An authorization that expires (Stripe cancels an uncaptured PaymentIntent after 7 days):
/// `POST /_sim/payment_intents/{id}/expire_authorization` makes it `canceled` with
/// `cancellation_reason: expired` (Stripe's value since 2025-03-31.basil), `charge.expired` then
/// `payment_intent.canceled` with no request; a later capture is refused, nothing moved; only
/// an authorization can expire.
#[tokio::test]
async fn an_authorization_expires() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = intent.id.as_str();
    let path = format!("_sim/payment_intents/{id}/expire_authorization");

    let expired = Response::send(sim.request(Method::POST, &path)).await;

    assert_eq!(expired.status, 200, "{}", expired.body);
    assert_eq!(
        (expired.body["status"].as_str(), expired.body["cancellation_reason"].as_str()),
        (Some("canceled"), Some("expired"))
    );
    assert_eq!(expired.body["amount_capturable"], 0);
    let events = events_about(&sim, id).await;
    let last: Vec<_> = events[3..].iter().map(|(kind, request)| (kind.as_str(), request.clone())).collect();
    let no_request = json!({"id": null, "idempotency_key": null});
    assert_eq!(last, [("charge.expired", no_request.clone()), ("payment_intent.canceled", no_request)]);
    let late = stripe_error(capture(&sim, id, None, "capture-1").await, 400);
    assert_eq!(late.code, Some(ApiErrorsCode::PaymentIntentUnexpectedState));
    assert!(late.message.unwrap_or_default().contains("it has a status of canceled"));
    assert!(sim.sim().charges().is_empty());

    let again = Response::send(sim.request(Method::POST, &path)).await;
    assert_eq!((again.status, again.body["error"]["code"].as_str()), (400, Some("payment_intent_unexpected_state")));
    let paid = sim.pay("pm_card_visa", "paid").await.expect("paid");
    let paid_path = format!("_sim/payment_intents/{}/expire_authorization", paid.id.as_str());
    assert_eq!(Response::send(sim.request(Method::POST, &paid_path)).await.status, 400);
    let missing = Response::send(sim.request(Method::POST, "_sim/payment_intents/pi_nope/expire_authorization")).await;
    assert_eq!(missing.status, 404);
}

/// Cancel is idempotent and faulted like the other writes: a replay answers the saved cancel
/// (one event), other parameters with the key are a 400 `idempotency_error`; an outage cancels
/// nothing and its retry cancels; a lost answer has canceled.
#[tokio::test]
async fn cancels_are_idempotent_and_faulted() {
    let sim = TestSim::start().await;
    let first = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = first.id.as_str();

    sim.set_faults(json!({"fail_rate": 1.0, "operations": ["cancel_payment_intent"]})).await;
    let outage = stripe_error(cancel(&sim, id, None, "cancel-1").await, 500);
    assert_eq!(outage.type_, stripe::ApiErrorsType::ApiError);
    let after = RetrievePaymentIntent::new(id).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!(after.status, PaymentIntentStatus::RequiresCapture, "an outage cancels nothing");
    sim.set_faults(json!({})).await;
    let canceled = cancel(&sim, id, None, "cancel-1").await.expect("canceled on the retry");
    let replay = raw(&sim, id, "cancel", "cancel-1", &[]).await;
    assert!(replay.replayed);
    assert_eq!((replay.body["id"].as_str(), replay.body["canceled_at"].as_i64()), (Some(id), canceled.canceled_at));
    let other = raw(&sim, id, "cancel", "cancel-1", &[("cancellation_reason", "duplicate")]).await;
    assert_eq!((other.status, other.body["error"]["type"].as_str()), (400, Some("idempotency_error")));
    let kinds: Vec<_> = events_about(&sim, id).await.into_iter().map(|(kind, _)| kind).collect();
    assert_eq!(kinds.iter().filter(|kind| *kind == "payment_intent.canceled").count(), 1);

    let second = authorize(&sim, "pm_card_visa", "auth-2").await;
    sim.set_faults(json!({"drop_after_charge_rate": 1.0, "operations": ["cancel_payment_intent"]})).await;
    let lost = cancel(&sim, second.id.as_str(), None, "cancel-2").await;
    assert!(matches!(lost, Err(StripeError::ClientError(_))), "{lost:?}");
    sim.set_faults(json!({})).await;
    let retried = cancel(&sim, second.id.as_str(), None, "cancel-2").await.expect("replayed");
    assert_eq!(retried.status, PaymentIntentStatus::Canceled);
}
