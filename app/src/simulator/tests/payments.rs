//! Payments through the real async-stripe client: success, declines, bad input, auth, scoping.

use std::net::{Ipv4Addr, SocketAddr};

use reqwest::Method;
use stripe::{ApiErrorsCode, ApiErrorsType};
use stripe_core::PaymentIntentStatus;
use stripe_core::charge::RetrieveCharge;
use stripe_core::payment_intent::{CreatePaymentIntent, ListPaymentIntent, RetrievePaymentIntent};
use stripe_types::{Currency, RangeQueryTs};

use super::{API_KEY, Response, TestSim, payment, send, stripe_error};
use crate::simulator::start;

/// A confirmed Visa payment succeeds, and the ledger holds exactly that one charge.
#[tokio::test]
async fn confirmed_payment_succeeds_and_is_charged_once() {
    let sim = TestSim::start().await;
    let client = sim.stripe();

    let intent = sim.pay("pm_card_visa", "order-1-attempt").await.expect("paid");

    assert_eq!(intent.status, PaymentIntentStatus::Succeeded);
    assert_eq!((intent.amount, intent.amount_received), (1250, 1250));
    assert_eq!(intent.currency, Currency::USD);
    assert!(intent.id.as_str().starts_with("pi_") && intent.id.as_str().len() == 27);
    assert!(!intent.livemode);
    assert_eq!(intent.metadata["order_id"], "order-1");
    let client_secret = intent.client_secret.clone().expect("a client secret");
    assert!(client_secret.starts_with(&format!("{}_secret_", intent.id.as_str())));
    let latest_charge = intent.latest_charge.as_ref().expect("a charge").id().to_string();

    let charges = sim.sim().charges();
    assert_eq!(charges.len(), 1);
    let charge = &charges[0];
    assert_eq!(charge.payment_intent, intent.id.as_str());
    assert_eq!(charge.charge, latest_charge);
    assert_eq!(charge.idempotency_key.as_deref(), Some("order-1-attempt"));
    assert_eq!((charge.amount, charge.currency.as_str()), (1250, "usd"));
    assert_eq!(charge.payment_method, "pm_card_visa");
    assert_eq!(charge.metadata["order_id"], "order-1");

    let fetched = RetrievePaymentIntent::new(intent.id.clone()).send(&client).await;
    let fetched = fetched.expect("found");
    assert_eq!((fetched.id, fetched.status), (intent.id, PaymentIntentStatus::Succeeded));
}

/// Without `confirm`, a PaymentIntent waits for confirmation (or a payment method) and nothing
/// is charged.
#[tokio::test]
async fn unconfirmed_payment_intents_are_not_charged() {
    let sim = TestSim::start().await;
    let client = sim.stripe();

    let with_method = CreatePaymentIntent::new(500, Currency::EUR).payment_method("pm_card_amex");
    let intent = with_method.send(&client).await.expect("created");
    assert_eq!(intent.status, PaymentIntentStatus::RequiresConfirmation);
    assert_eq!(intent.amount_received, 0);
    assert!(intent.latest_charge.is_none());

    let intent = CreatePaymentIntent::new(500, Currency::EUR).send(&client).await;
    assert_eq!(intent.expect("created").status, PaymentIntentStatus::RequiresPaymentMethod);

    assert!(sim.sim().charges().is_empty());
}

/// Stripe's decline test cards give a 402 `card_error` carrying the decline code and the
/// PaymentIntent, left in `requires_payment_method` with its `last_payment_error`.
#[tokio::test]
async fn declines_are_402_card_errors_with_the_payment_intent() {
    let sim = TestSim::start().await;

    let declined = sim.pay("pm_card_chargeDeclinedInsufficientFunds", "k1").await;
    let error = stripe_error(declined, 402);
    assert_eq!(error.type_, ApiErrorsType::CardError);
    assert_eq!(error.code, Some(ApiErrorsCode::CardDeclined));
    assert_eq!(error.decline_code.as_deref(), Some("insufficient_funds"));
    let intent = error.payment_intent.expect("the PaymentIntent is attached");
    assert_eq!(intent.status, PaymentIntentStatus::RequiresPaymentMethod);
    let last_error = intent.last_payment_error.expect("last_payment_error is set");
    assert_eq!(last_error.decline_code.as_deref(), Some("insufficient_funds"));
    assert_eq!(last_error.charge, error.charge);

    let expired = sim.pay("pm_card_chargeDeclinedExpiredCard", "k2").await;
    assert_eq!(stripe_error(expired, 402).code, Some(ApiErrorsCode::ExpiredCard));
    let generic = sim.pay("pm_card_chargeDeclined", "k3").await;
    assert_eq!(stripe_error(generic, 402).decline_code.as_deref(), Some("generic_decline"));

    assert!(sim.sim().charges().is_empty(), "a decline is not a charge");
}

/// A decline carries what Stripe's does: its `doc_url`, the request's `request_log_url`, the
/// declined PaymentMethod (the test card's brand and last digits), the charge; and the charge
/// says why (`outcome`) and what was charged (`payment_method_details`). Radar blocks the
/// fraudulent test card before the network; a lost card is not to be tried again.
#[tokio::test]
async fn a_decline_carries_its_payment_method_charge_and_outcome() {
    let sim = TestSim::start().await;
    let client = sim.stripe();

    let error = stripe_error(sim.pay("pm_card_chargeDeclinedInsufficientFunds", "k1").await, 402);
    assert_eq!(error.doc_url.as_deref(), Some("https://stripe.com/docs/error-codes/card-declined"));
    assert!(error.request_log_url.as_deref().is_some_and(|url| url.contains("/logs/req_")), "{error:?}");
    let method = error.payment_method.expect("the declined PaymentMethod");
    assert_eq!(method.id.as_str(), "pm_card_chargeDeclinedInsufficientFunds");
    let card = method.card.expect("a card");
    assert_eq!((card.brand.as_str(), card.last4.as_str(), card.funding.as_str()), ("visa", "9995", "credit"));
    let charge = RetrieveCharge::new(error.charge.expect("the failed charge")).send(&client).await.expect("charge");
    let outcome = charge.outcome.expect("an outcome");
    assert_eq!((outcome.type_.as_str(), outcome.reason.as_deref()), ("issuer_declined", Some("insufficient_funds")));
    assert_eq!(outcome.network_status.as_deref(), Some("declined_by_network"));
    let details = charge.payment_method_details.expect("what was charged");
    assert_eq!(details.card.expect("a card").last4.as_deref(), Some("9995"));

    let blocked = stripe_error(sim.pay("pm_card_chargeDeclinedFraudulent", "k2").await, 402);
    let charge = RetrieveCharge::new(blocked.charge.expect("a charge")).send(&client).await.expect("charge");
    let outcome = charge.outcome.expect("an outcome");
    assert_eq!((outcome.type_.as_str(), outcome.risk_level.as_deref()), ("blocked", Some("highest")));
    let lost = stripe_error(sim.pay("pm_card_chargeDeclinedLostCard", "k3").await, 402);
    assert_eq!(lost.advice_code.as_deref(), Some("do_not_try_again"));

    let paid = sim.pay("pm_card_amex", "k4").await.expect("paid");
    let charge = RetrieveCharge::new(paid.latest_charge.expect("a charge").id().clone()).send(&client).await;
    let charge = charge.expect("charge");
    assert_eq!(charge.outcome.expect("an outcome").type_, "authorized");
    let card = charge.payment_method_details.and_then(|details| details.card).expect("a card");
    assert_eq!((card.brand.as_deref(), card.last4.as_deref()), (Some("amex"), Some("0005")));
}

/// `GET /v1/payment_intents`: newest first, a page at a time, filtered by creation time.
#[tokio::test]
async fn payment_intents_are_listed_newest_first() {
    let sim = TestSim::start().await;
    let client = sim.stripe();
    let mut ids = Vec::new();
    for key in ["a", "b", "c"] {
        ids.push(sim.pay("pm_card_visa", key).await.expect("paid").id);
    }

    let first = ListPaymentIntent::new().limit(2).send(&client).await.expect("listed");
    let shown: Vec<_> = first.data.iter().map(|intent| intent.id.clone()).collect();
    assert_eq!(shown, [ids[2].clone(), ids[1].clone()]);
    assert!(first.has_more);
    assert_eq!(first.url, "/v1/payment_intents");
    let rest = ListPaymentIntent::new().starting_after(ids[1].as_str()).send(&client).await.expect("listed");
    assert_eq!(rest.data.iter().map(|intent| intent.id.clone()).collect::<Vec<_>>(), [ids[0].clone()]);
    assert!(!rest.has_more);
    let created = first.data[0].created;
    let later = ListPaymentIntent::new().created(RangeQueryTs::gt(created)).send(&client).await.expect("listed");
    assert!(later.data.is_empty(), "nothing was created after the newest");
    let since = ListPaymentIntent::new().created(RangeQueryTs::gte(created - 60)).send(&client).await;
    assert_eq!(since.expect("listed").data.len(), 3);
    let customers = ListPaymentIntent::new().customer("cus_1").send(&client).await.expect("listed");
    assert!(customers.data.is_empty(), "the simulator has no customers");
    let other = ListPaymentIntent::new().send(&sim.stripe_with_key("sk_test_other")).await.expect("listed");
    assert!(other.data.is_empty(), "lists are scoped to the API key");
}

/// An id that is not one of Stripe's test payment methods does not exist.
#[tokio::test]
async fn unknown_payment_method_is_resource_missing() {
    let sim = TestSim::start().await;

    let error = stripe_error(send(&sim.stripe(), &payment("pm_card_bogus"), "k").await, 400);

    assert_eq!(error.type_, ApiErrorsType::InvalidRequestError);
    assert_eq!(error.code, Some(ApiErrorsCode::ResourceMissing));
    assert_eq!(error.message.as_deref(), Some("No such PaymentMethod: 'pm_card_bogus'"));
    assert_eq!(error.param.as_deref(), Some("payment_method"));
    assert!(sim.sim().charges().is_empty());
}

/// Parameters outside the simulated subset, missing ones, and bodies that are not forms are 400s
/// naming the problem, never ignored.
#[tokio::test]
async fn unknown_parameters_and_json_bodies_are_rejected() {
    let sim = TestSim::start().await;

    let form = [("amount", "100"), ("currency", "usd"), ("customer", "cus_1")];
    let unknown = sim.post_form(None, &form).await;
    assert_eq!(unknown.status, 400);
    assert_eq!(unknown.body["error"]["type"], "invalid_request_error");
    assert_eq!(unknown.body["error"]["code"], "parameter_unknown");
    assert_eq!(unknown.body["error"]["param"], "customer");

    let missing = sim.post_form(None, &[("currency", "usd")]).await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.body["error"]["code"], "parameter_missing");

    let json = serde_json::json!({"amount": 100, "currency": "usd"});
    let request = sim.request(Method::POST, "v1/payment_intents").bearer_auth(API_KEY);
    let json = Response::send(request.json(&json)).await;
    assert_eq!(json.status, 400);
    assert_eq!(json.body["error"]["type"], "invalid_request_error");
    assert!(sim.sim().charges().is_empty());
}

/// No key, or a key that is not a secret/restricted key, is a Stripe-style 401; HTTP Basic
/// with the key as user name (`curl -u sk_test_…:`) is accepted.
#[tokio::test]
async fn authentication() {
    let sim = TestSim::start().await;
    let create = || sim.request(Method::POST, "v1/payment_intents").form(&[("amount", "100"), ("currency", "usd")]);

    let anonymous = Response::send(create()).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.body["error"]["type"], "invalid_request_error");

    let publishable = sim.stripe_with_key("pk_test_123");
    let error = stripe_error(send(&publishable, &payment("pm_card_visa"), "k").await, 401);
    assert_eq!(error.type_, ApiErrorsType::InvalidRequestError);
    let message = error.message.unwrap_or_default();
    assert!(message.starts_with("Invalid API Key provided"), "{message}");

    let basic = Response::send(create().basic_auth("sk_test_curl", Some(""))).await;
    assert_eq!(basic.status, 200);
    assert_eq!(basic.body["status"], "requires_payment_method");
}

/// Objects and idempotency keys belong to one API key: another key neither sees the
/// PaymentIntent nor shares the Idempotency-Key.
#[tokio::test]
async fn objects_and_keys_are_scoped_per_api_key() {
    let sim = TestSim::start().await;
    let alice = sim.stripe_with_key("sk_test_alice");
    let bob = sim.stripe_with_key("sk_test_bob");

    let alices = send(&alice, &payment("pm_card_visa"), "shared-key").await.expect("paid");
    let bobs = send(&bob, &payment("pm_card_visa"), "shared-key").await.expect("paid");
    assert_ne!(alices.id, bobs.id, "the same Idempotency-Key under two API keys is two payments");
    assert_eq!(sim.sim().charges().len(), 2);

    let hidden = RetrievePaymentIntent::new(alices.id.clone()).send(&bob).await;
    assert_eq!(stripe_error(hidden, 404).code, Some(ApiErrorsCode::ResourceMissing));
}

/// URLs outside the subset get Stripe's 404 envelope, not an empty or plain-text response.
#[tokio::test]
async fn unknown_urls_are_stripe_404s() {
    let sim = TestSim::start().await;
    for (method, path) in [(Method::GET, "v1/customers"), (Method::DELETE, "v1/payment_intents")] {
        let response = Response::send(sim.request(method, path).bearer_auth(API_KEY)).await;
        assert_eq!(response.status, 404, "{path}");
        assert_eq!(response.body["error"]["type"], "invalid_request_error");
    }
}

/// `base_url` is what async-stripe needs (loopback for a wildcard bind, trailing slash), and
/// after `shutdown` nothing listens any more.
#[tokio::test]
async fn base_url_and_graceful_shutdown() {
    let running = start(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))).await.expect("bind");
    let port = running.addr().port();
    assert_eq!(running.base_url(), format!("http://127.0.0.1:{port}/"));

    running.shutdown().await;

    let refused = reqwest::get(format!("http://127.0.0.1:{port}/_sim/faults")).await;
    assert!(refused.is_err(), "the port is closed after shutdown");
}
