//! Authorize now, capture later, through async-stripe: `capture_method=manual`, `POST
//! /v1/payment_intents/{id}/capture` (all, part, Stripe's refusals), what may be refunded after,
//! and Stripe's idempotency and the API faults on the new call. Cancel and expiry are in
//! `cancel.rs`.

use reqwest::Method;
use serde_json::{Value, json};
use stripe::{ApiErrorsCode, StripeError, StripeRequest};
use stripe_core::charge::RetrieveCharge;
use stripe_core::payment_intent::{
    CancelPaymentIntent, CancelPaymentIntentCancellationReason, CapturePaymentIntent, CreatePaymentIntent,
    ListPaymentIntent, SearchPaymentIntent,
};
use stripe_core::refund::{CreateRefund, ListRefund};
use stripe_core::{PaymentIntent, PaymentIntentCaptureMethod, PaymentIntentStatus};
use stripe_types::Currency;

use super::{API_KEY, Response, TestSim, events_about, idempotent, payment, send, stripe_error};

/// The order-1 payment ($12.50) on `payment_method`, authorized only (`capture_method=manual`),
/// sent through async-stripe with `key`.
pub(super) async fn authorize(sim: &TestSim, payment_method: &str, key: &str) -> PaymentIntent {
    send(&sim.stripe(), &manual(payment(payment_method)), key).await.expect("authorized")
}

pub(super) fn manual(request: CreatePaymentIntent) -> CreatePaymentIntent {
    request.capture_method(PaymentIntentCaptureMethod::Manual)
}

/// `POST /v1/payment_intents/{id}/capture` through async-stripe, with `key`.
pub(super) async fn capture(
    sim: &TestSim,
    id: &str,
    amount_to_capture: Option<i64>,
    key: &str,
) -> Result<PaymentIntent, StripeError> {
    let mut request = CapturePaymentIntent::new(id);
    if let Some(amount) = amount_to_capture {
        request = request.amount_to_capture(amount);
    }
    request.customize().request_strategy(idempotent(key)).send(&sim.stripe()).await
}

/// `POST /v1/payment_intents/{id}/cancel` through async-stripe, with `key`.
pub(super) async fn cancel(
    sim: &TestSim,
    id: &str,
    reason: Option<CancelPaymentIntentCancellationReason>,
    key: &str,
) -> Result<PaymentIntent, StripeError> {
    let mut request = CancelPaymentIntent::new(id);
    if let Some(reason) = reason {
        request = request.cancellation_reason(reason);
    }
    request.customize().request_strategy(idempotent(key)).send(&sim.stripe()).await
}

/// A raw `POST /v1/payment_intents/{id}/{action}` (`capture` or `cancel`), to see the whole answer.
pub(super) async fn raw(sim: &TestSim, id: &str, action: &str, key: &str, form: &[(&str, &str)]) -> Response {
    let request = sim
        .request(Method::POST, &format!("v1/payment_intents/{id}/{action}"))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", key)
        .form(form);
    Response::send(request).await
}

/// The `error` of a raw answer, without the members that name the request or the moment
/// (`request_log_url`) and with the PaymentIntent reduced to its id and status.
pub(super) fn error_of(response: &Response) -> Value {
    let mut error = response.body["error"].clone();
    let log = error.as_object_mut().and_then(|error| error.remove("request_log_url"));
    assert!(log.is_some_and(|url| url.as_str().is_some_and(|url| url.contains("/logs/req_"))), "{error}");
    if let Some(intent) = error.get_mut("payment_intent") {
        *intent = json!({"id": intent["id"], "status": intent["status"]});
    }
    error
}

fn charge_of(intent: &PaymentIntent) -> String {
    intent.latest_charge.as_ref().expect("a charge").id().to_string()
}

/// `capture_method=manual` authorizes a card without moving money: `requires_capture` with all
/// of it capturable, a charge that succeeded but is not captured, `charge.succeeded` then
/// `payment_intent.amount_capturable_updated` (Stripe's events for an authorization), and
/// nothing in the ledger. Lists and searches see the new status.
#[tokio::test]
async fn manual_capture_authorizes_without_moving_money() {
    let sim = TestSim::start().await;
    let client = sim.stripe();

    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;

    assert_eq!(intent.status, PaymentIntentStatus::RequiresCapture);
    assert_eq!(intent.capture_method, PaymentIntentCaptureMethod::Manual);
    assert_eq!((intent.amount, intent.amount_capturable, intent.amount_received), (1250, 1250, 0));
    let charge = RetrieveCharge::new(charge_of(&intent)).send(&client).await.expect("the charge");
    assert_eq!((charge.status.as_str(), charge.paid, charge.captured), ("succeeded", true, false));
    assert_eq!((charge.amount, charge.amount_captured, charge.amount_refunded), (1250, 0, 0));
    assert_eq!(charge.outcome.expect("an outcome").type_, "authorized");
    assert!(sim.sim().charges().is_empty(), "an authorization is not money moved");
    let events = events_about(&sim, intent.id.as_str()).await;
    let kinds: Vec<_> = events.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(kinds, ["payment_intent.created", "charge.succeeded", "payment_intent.amount_capturable_updated"]);
    assert!(events.iter().all(|(_, request)| request["idempotency_key"] == "auth-1"));

    let found = SearchPaymentIntent::new("status:'requires_capture'").send(&client).await.expect("searched");
    let found: Vec<_> = found.data.iter().map(|found| found.id.as_str()).collect();
    assert_eq!(found, [intent.id.as_str()]);
    let listed = ListPaymentIntent::new().send(&client).await.expect("listed");
    assert_eq!(listed.data[0].status, PaymentIntentStatus::RequiresCapture);
}

/// A capture with no amount takes everything capturable: `succeeded`, `amount_received` the
/// whole amount, the charge captured, `charge.captured` then `payment_intent.succeeded` under
/// the capture's key; the ledger gets the charge now, once, under the create's key.
#[tokio::test]
async fn capture_takes_everything_by_default_and_charges_once() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_mastercard", "auth-1").await;

    let captured = capture(&sim, intent.id.as_str(), None, "capture-1").await.expect("captured");

    assert_eq!(captured.status, PaymentIntentStatus::Succeeded);
    assert_eq!((captured.amount_capturable, captured.amount_received), (0, 1250));
    let charge = RetrieveCharge::new(charge_of(&captured)).send(&sim.stripe()).await.expect("the charge");
    assert_eq!((charge.captured, charge.amount_captured), (true, 1250));
    let ledger = sim.sim().charges();
    assert_eq!(ledger.len(), 1);
    assert_eq!((ledger[0].charge.as_str(), ledger[0].amount), (charge.id.as_str(), 1250));
    assert_eq!(
        (ledger[0].idempotency_key.as_deref(), ledger[0].payment_method.as_str()),
        (Some("auth-1"), "pm_card_mastercard")
    );
    let events = events_about(&sim, intent.id.as_str()).await;
    let last: Vec<_> =
        events[3..].iter().map(|(kind, request)| (kind.as_str(), request["idempotency_key"].clone())).collect();
    assert_eq!(last, [("charge.captured", json!("capture-1")), ("payment_intent.succeeded", json!("capture-1"))]);
}

/// A partial capture takes what is asked and releases the rest: `amount_received` and the
/// charge's `amount_captured` are what was captured, nothing is refunded for the release (no
/// Refund object, `amount_refunded` 0: Stripe's behaviour since 2025-03-31.basil), the ledger
/// holds the captured amount; and refunds reach only what was captured.
#[tokio::test]
async fn partial_capture_releases_the_rest_and_refunds_only_what_was_captured() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = intent.id.as_str();

    let captured = capture(&sim, id, Some(700), "capture-1").await.expect("captured");

    assert_eq!(captured.status, PaymentIntentStatus::Succeeded);
    assert_eq!((captured.amount_capturable, captured.amount_received), (0, 700));
    let charge = RetrieveCharge::new(charge_of(&captured)).send(&sim.stripe()).await.expect("the charge");
    assert_eq!((charge.amount, charge.amount_captured, charge.amount_refunded, charge.refunded), (1250, 700, 0, false));
    assert_eq!(sim.sim().charges()[0].amount, 700, "the ledger holds the money that moved");
    let refunds = ListRefund::new().payment_intent(id).send(&sim.stripe()).await.expect("listed");
    assert!(refunds.data.is_empty(), "the release is not a refund");

    let refund = |amount: Option<i64>, key: &'static str| {
        let mut request = CreateRefund::new().payment_intent(id);
        if let Some(amount) = amount {
            request = request.amount(amount);
        }
        let client = sim.stripe();
        async move { request.customize().request_strategy(idempotent(key)).send(&client).await }
    };
    let too_much = stripe_error(refund(Some(701), "r1").await, 400);
    assert_eq!(too_much.code, Some(ApiErrorsCode::AmountTooLarge));
    assert!(too_much.message.unwrap_or_default().ends_with("unrefunded amount on charge ($7.00)"));
    let rest = refund(None, "r2").await.expect("refunded");
    assert_eq!(rest.amount, 700, "a refund takes what was captured, by default");
    let charge = RetrieveCharge::new(charge.id.clone()).send(&sim.stripe()).await.expect("the charge");
    assert_eq!((charge.amount_refunded, charge.refunded), (700, true));
    let ledger = sim.sim().charges();
    assert_eq!((ledger[0].amount, ledger[0].amount_refunded), (700, 700));
}

/// Capture's refusals, each as Stripe sends it (400 `invalid_request_error`, its code and
/// `doc_url`, the PaymentIntent as it is): more than is capturable (`amount_too_large`), a
/// PaymentIntent that is not `requires_capture` (captured already, or captured automatically:
/// `payment_intent_unexpected_state`); an unknown one is a 404 `resource_missing`. None of them
/// moves money.
#[tokio::test]
async fn capture_refusals_are_stripes() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = intent.id.as_str();

    let too_much = raw(&sim, id, "capture", "c1", &[("amount_to_capture", "1251")]).await;
    assert_eq!(too_much.status, 400);
    assert_eq!(
        error_of(&too_much),
        json!({
            "type": "invalid_request_error",
            "code": "amount_too_large",
            "doc_url": "https://stripe.com/docs/error-codes/amount-too-large",
            "message": "The payment could not be captured because the requested capture amount is greater than \
                        the amount you can capture for this charge.",
            "param": "amount_to_capture",
            "payment_intent": {"id": id, "status": "requires_capture"},
        })
    );
    capture(&sim, id, Some(1250), "c2").await.expect("captured");
    let again = raw(&sim, id, "capture", "c3", &[]).await;
    assert_eq!(again.status, 400);
    assert_eq!(
        error_of(&again),
        json!({
            "type": "invalid_request_error",
            "code": "payment_intent_unexpected_state",
            "doc_url": "https://stripe.com/docs/error-codes/payment-intent-unexpected-state",
            "message": "This PaymentIntent could not be captured because it has a status of succeeded. Only a \
                        PaymentIntent with one of the following statuses may be captured: requires_capture.",
            "payment_intent": {"id": id, "status": "succeeded"},
        })
    );

    let automatic = sim.pay("pm_card_visa", "pay-2").await.expect("paid");
    let refused = stripe_error(capture(&sim, automatic.id.as_str(), None, "c4").await, 400);
    assert_eq!(refused.code, Some(ApiErrorsCode::PaymentIntentUnexpectedState));
    assert_eq!(refused.payment_intent.map(|intent| intent.status), Some(PaymentIntentStatus::Succeeded));
    let missing = raw(&sim, "pi_nope", "capture", "c5", &[]).await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        error_of(&missing),
        json!({
            "type": "invalid_request_error",
            "code": "resource_missing",
            "doc_url": "https://stripe.com/docs/error-codes/resource-missing",
            "message": "No such payment_intent: 'pi_nope'",
            "param": "intent",
        })
    );
    let charged: Vec<_> = sim.sim().charges().iter().map(|charge| charge.amount).collect();
    assert_eq!(charged, [1250, 1250], "one capture and one automatic payment");
}

/// Bad input is refused before anything executes (and saved for no key): an amount that is not
/// a positive integer, an amount the currency refuses, a parameter outside the subset.
#[tokio::test]
async fn capture_parameters_are_validated() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = intent.id.as_str();

    for (form, param, code) in [
        (&[("amount_to_capture", "0")][..], "amount_to_capture", Some("parameter_invalid_integer")),
        (&[("amount_to_capture", "12.5")][..], "amount_to_capture", Some("parameter_invalid_integer")),
        (&[("statement_descriptor", "X")][..], "statement_descriptor", Some("parameter_unknown")),
    ] {
        let refused = raw(&sim, id, "capture", "k", form).await;
        assert_eq!(refused.status, 400, "{form:?}");
        assert_eq!(refused.body["error"]["param"], param);
        assert_eq!(refused.body["error"]["code"].as_str(), code);
    }
    let kwd = manual(CreatePaymentIntent::new(12_340, "kwd".parse::<Currency>().expect("infallible")))
        .confirm(true)
        .payment_method("pm_card_visa")
        .automatic_payment_methods(super::no_redirects());
    let kwd = send(&sim.stripe(), &kwd, "auth-kwd").await.expect("authorized");
    let refused = raw(&sim, kwd.id.as_str(), "capture", "k2", &[("amount_to_capture", "1005")]).await;
    assert_eq!((refused.status, refused.body["error"]["param"].as_str()), (400, Some("amount_to_capture")));
    let captured = raw(&sim, id, "capture", "k", &[]).await;
    assert_eq!((captured.status, captured.replayed), (200, false), "the refusals saved nothing for the key");
}

/// 3-D Secure with manual capture: once the customer authenticates, the PaymentIntent awaits
/// capture (no money moved) and `payment_intent.amount_capturable_updated` names no request.
#[tokio::test]
async fn an_authenticated_payment_awaits_capture() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_threeDSecure2Required", "auth-3ds").await;
    assert_eq!(intent.status, PaymentIntentStatus::RequiresAction);

    let path = format!("_sim/payment_intents/{}/authenticate", intent.id.as_str());
    let answer = Response::send(sim.request(Method::POST, &path).json(&json!({"outcome": "succeed"}))).await;

    assert_eq!(
        (answer.body["status"].as_str(), answer.body["amount_capturable"].as_i64()),
        (Some("requires_capture"), Some(1250))
    );
    assert!(sim.sim().charges().is_empty());
    let events = events_about(&sim, intent.id.as_str()).await;
    let (kind, request) = events.last().expect("events");
    assert_eq!(
        (kind.as_str(), &request["idempotency_key"]),
        ("payment_intent.amount_capturable_updated", &Value::Null)
    );
    capture(&sim, intent.id.as_str(), None, "capture-3ds").await.expect("captured");
    assert_eq!(sim.sim().charges().len(), 1);
}

/// Manual capture is for cards here: automatic payment methods then offer `card` only, so a
/// bank debit is refused when confirmed; asked for explicitly, it is refused at create.
#[tokio::test]
async fn bank_debits_cannot_be_authorized_for_later() {
    let sim = TestSim::start().await;
    let offered = manual(CreatePaymentIntent::new(500, Currency::USD)).send(&sim.stripe()).await.expect("created");
    assert_eq!(offered.payment_method_types, ["card"]);

    let bank = stripe_error(send(&sim.stripe(), &manual(payment("pm_usBankAccount_success")), "ach").await, 400);
    assert_eq!(bank.code, Some(ApiErrorsCode::PaymentIntentIncompatiblePaymentMethod));
    let form = [
        ("amount", "500"),
        ("currency", "usd"),
        ("capture_method", "manual"),
        ("payment_method_types[0]", "us_bank_account"),
    ];
    let explicit = sim.post_form(None, &form).await;
    assert_eq!((explicit.status, explicit.body["error"]["param"].as_str()), (400, Some("capture_method")));
    assert!(sim.sim().charges().is_empty());
}

/// Only what was captured can be refunded: an authorization, by PaymentIntent or by charge, is
/// refused with Stripe's advice to cancel instead.
#[tokio::test]
async fn an_authorization_is_not_refundable() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let charge = charge_of(&intent);

    for (request, param) in [
        (CreateRefund::new().payment_intent(intent.id.as_str()), "payment_intent"),
        (CreateRefund::new().charge(charge.as_str()), "charge"),
    ] {
        let refused = stripe_error(request.send(&sim.stripe()).await, 400);
        assert_eq!(refused.param.as_deref(), Some(param));
        let message = refused.message.unwrap_or_default();
        assert!(
            message.starts_with(&format!("This uncaptured Charge was created by a PaymentIntent ({}).", intent.id)),
            "{message}"
        );
        assert!(message.contains("You must cancel the PaymentIntent"), "{message}");
    }
    assert!(sim.sim().refunds().is_empty());
}

/// Capture is idempotent like a create: a replay answers the saved capture (money moved once),
/// the key with another amount or on another route is a 400 `idempotency_error`, and a refusal
/// is saved and replayed for its key.
#[tokio::test]
async fn captures_are_idempotent() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = intent.id.as_str();

    let refused = raw(&sim, id, "capture", "too-much", &[("amount_to_capture", "5000")]).await;
    let first = raw(&sim, id, "capture", "capture-1", &[("amount_to_capture", "1000")]).await;
    let replay = raw(&sim, id, "capture", "capture-1", &[("amount_to_capture", "1000")]).await;

    assert_eq!((first.status, first.replayed, replay.status, replay.replayed), (200, false, 200, true));
    assert_eq!(replay.body, first.body, "the saved answer");
    assert_eq!(replay.header("original-request"), first.header("request-id"));
    let again = raw(&sim, id, "capture", "too-much", &[("amount_to_capture", "5000")]).await;
    assert_eq!((again.status, again.replayed), (400, true), "the refusal is replayed, not re-decided");
    assert_eq!(again.body["error"]["code"], refused.body["error"]["code"]);
    let other_amount = stripe_error(capture(&sim, id, Some(900), "capture-1").await, 400);
    assert_eq!(other_amount.type_, stripe::ApiErrorsType::IdempotencyError);
    let other_route = stripe_error(cancel(&sim, id, None, "capture-1").await, 400);
    assert_eq!(other_route.type_, stripe::ApiErrorsType::IdempotencyError);
    let other_intent = authorize(&sim, "pm_card_visa", "auth-2").await;
    let other_id = raw(&sim, other_intent.id.as_str(), "capture", "capture-1", &[("amount_to_capture", "1000")]).await;
    assert_eq!((other_id.status, other_id.body["error"]["type"].as_str()), (400, Some("idempotency_error")));
    let ledger = sim.sim().charges();
    assert_eq!((ledger.len(), ledger[0].amount), (1, 1000));
}

/// The API faults reach captures, scoped by operation: an outage captures nothing and the retry
/// with the key captures once; a lost answer has captured, and its retry replays; a held
/// capture keeps its key in use, then captures although its client left.
#[tokio::test]
async fn faults_apply_to_captures() {
    let sim = TestSim::start().await;
    let intent = authorize(&sim, "pm_card_visa", "auth-1").await;
    let id = intent.id.as_str();

    sim.set_faults(json!({"fail_rate": 1.0, "operations": ["capture_payment_intent"]})).await;
    assert!(authorize(&sim, "pm_card_visa", "auth-2").await.id.as_str().starts_with("pi_"), "creates are out of scope");
    let outage = stripe_error(capture(&sim, id, None, "capture-1").await, 500);
    assert_eq!(outage.type_, stripe::ApiErrorsType::ApiError);
    assert!(sim.sim().charges().is_empty(), "an outage captures nothing");
    sim.set_faults(json!({"drop_after_charge_rate": 1.0, "operations": ["capture_payment_intent"]})).await;
    let lost = capture(&sim, id, None, "capture-1").await;
    assert!(matches!(lost, Err(StripeError::ClientError(_))), "a transport error: {lost:?}");
    assert_eq!(sim.sim().charges().len(), 1, "captured although the answer was lost");
    sim.set_faults(json!({})).await;
    let retry = capture(&sim, id, None, "capture-1").await.expect("replayed");
    assert_eq!(retry.status, PaymentIntentStatus::Succeeded);

    let held = authorize(&sim, "pm_card_visa", "auth-3").await;
    sim.set_faults(json!({"timeout_rate": 1.0, "timeout_hold_ms": 400, "operations": ["capture_payment_intent"]}))
        .await;
    let request = CapturePaymentIntent::new(held.id.as_str());
    let timed_out = request
        .customize()
        .request_strategy(idempotent("capture-3"))
        .timeout(std::time::Duration::from_millis(50))
        .send(&sim.stripe())
        .await;
    assert!(matches!(timed_out, Err(StripeError::Timeout)), "{timed_out:?}");
    let too_soon = capture(&sim, held.id.as_str(), None, "capture-3").await;
    assert_eq!(stripe_error(too_soon, 409).code, Some(ApiErrorsCode::IdempotencyKeyInUse));
    assert_eq!(sim.wait_for_charges(2).await.len(), 2, "the held capture captured after its client left");
}
