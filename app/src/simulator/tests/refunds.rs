//! Refunds through async-stripe: full, partial, too much, nothing left, a PaymentIntent that has
//! not succeeded, and Stripe's idempotency semantics; the refund ledger and the charge agree.

use reqwest::Method;
use serde_json::json;
use stripe::{ApiErrorsCode, ApiErrorsType, StripeRequest};
use stripe_core::charge::RetrieveCharge;
use stripe_core::payment_intent::CreatePaymentIntent;
use stripe_core::refund::{CreateRefund, ListRefund, RetrieveRefund};
use stripe_types::Currency;
use tokio::sync::Barrier;

use super::{API_KEY, Response, TestSim, idempotent, stripe_error};

/// A refund of `payment_intent`, of `amount` (or all that remains), sent with `key`.
async fn refund(
    sim: &TestSim,
    payment_intent: &str,
    amount: Option<i64>,
    key: &str,
) -> Result<stripe_shared::Refund, stripe::StripeError> {
    let mut request = CreateRefund::new().payment_intent(payment_intent);
    if let Some(amount) = amount {
        request = request.amount(amount);
    }
    request.customize().request_strategy(idempotent(key)).send(&sim.stripe()).await
}

/// A full refund by default; the charge shows it, the ledger has one entry with the key, and
/// a second refund finds nothing left (`charge_already_refunded`).
#[tokio::test]
async fn full_refund_then_nothing_left() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "pay-1").await.expect("paid");

    let refunded = refund(&sim, intent.id.as_str(), None, "refund-1").await.expect("refunded");

    assert!(refunded.id.as_str().starts_with("re_"));
    assert_eq!((refunded.amount, refunded.currency), (1250, Currency::USD));
    assert_eq!(refunded.status.as_deref(), Some("succeeded"));
    let charge_id = intent.latest_charge.as_ref().expect("charged").id();
    let charge = RetrieveCharge::new(charge_id.clone()).send(&sim.stripe()).await.expect("charge");
    assert_eq!((charge.amount_refunded, charge.refunded), (1250, true));
    let ledger = sim.sim().refunds();
    assert_eq!(ledger.len(), 1);
    assert_eq!((ledger[0].amount, ledger[0].idempotency_key.as_deref()), (1250, Some("refund-1")));
    assert_eq!(sim.sim().charges()[0].amount_refunded, 1250);

    let again = stripe_error(refund(&sim, intent.id.as_str(), None, "refund-2").await, 400);
    assert_eq!(again.code, Some(ApiErrorsCode::ChargeAlreadyRefunded));
    assert_eq!(sim.sim().refunds().len(), 1);
}

/// Partial refunds add up to the charge, never past it: more than remains is `amount_too_large`.
#[tokio::test]
async fn partial_refunds_never_exceed_the_charge() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "pay-1").await.expect("paid");
    let id = intent.id.as_str();

    refund(&sim, id, Some(500), "r1").await.expect("first part");
    let too_much = stripe_error(refund(&sim, id, Some(751), "r2").await, 400);
    assert_eq!(too_much.code, Some(ApiErrorsCode::AmountTooLarge));
    assert_eq!(too_much.param.as_deref(), Some("amount"));
    assert!(too_much.message.unwrap_or_default().contains("$7.50"), "names what remains");
    let rest = refund(&sim, id, None, "r3").await.expect("the rest");
    assert_eq!(rest.amount, 750);

    let listed = ListRefund::new().payment_intent(id).send(&sim.stripe()).await.expect("listed");
    assert_eq!(listed.data.iter().map(|refund| refund.amount).collect::<Vec<_>>(), [750, 500], "newest first");
    let retrieved = RetrieveRefund::new(rest.id.clone()).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!(retrieved.amount, 750);
    let total: i64 = sim.sim().refunds().iter().map(|refund| refund.amount).sum();
    assert_eq!(total, 1250);
}

/// A refund Stripe's currency rules refuse is a 400 naming `amount`, as a charge would be: a
/// three-decimal amount not ending in 0, a fraction of a króna (Stripe's own code); nothing
/// enters the ledger, and an amount the currency takes then refunds.
#[tokio::test]
async fn refunds_follow_the_currencys_rules() {
    let sim = TestSim::start().await;
    for (currency, charged, refused, taken) in [("kwd", 12_340, 1005, 1000), ("isk", 50_000, 550, 500)] {
        let request = CreatePaymentIntent::new(charged, currency.parse::<Currency>().expect("infallible"))
            .confirm(true)
            .payment_method("pm_card_visa")
            .automatic_payment_methods(super::no_redirects());
        let intent = super::send(&sim.stripe(), &request, &format!("pay-{currency}")).await.expect("paid");
        let error = stripe_error(refund(&sim, intent.id.as_str(), Some(refused), &format!("r-{currency}")).await, 400);
        assert_eq!((error.type_, error.param.as_deref()), (ApiErrorsType::InvalidRequestError, Some("amount")));
        let message = error.message.unwrap_or_default();
        assert!(message.contains(&currency.to_ascii_uppercase()), "{message}");
        let refunded = refund(&sim, intent.id.as_str(), Some(taken), &format!("r2-{currency}")).await.expect("taken");
        assert_eq!(refunded.amount, taken);
    }
    assert_eq!(sim.sim().refunds().iter().map(|refund| refund.amount).collect::<Vec<_>>(), [1000, 500]);
}

/// Only a succeeded PaymentIntent can be refunded: a processing one, a declined one and an
/// unknown one are 400s, and nothing enters the ledger.
#[tokio::test]
async fn refunding_what_has_not_succeeded_is_refused() {
    let sim = TestSim::start().await;
    sim.set_settings(json!({"processing_ms": 600_000})).await;
    let processing = sim.pay("pm_usBankAccount_success", "ach").await.expect("processing");
    let declined = sim
        .post_form(
            Some("declined"),
            &[
                ("amount", "100"),
                ("currency", "usd"),
                ("confirm", "true"),
                ("payment_method", "pm_card_chargeDeclined"),
                ("payment_method_types[]", "card"),
            ],
        )
        .await;
    let declined_id = declined.body["error"]["payment_intent"]["id"].as_str().expect("the declined PaymentIntent");

    for id in [processing.id.as_str(), declined_id] {
        let error = stripe_error(refund(&sim, id, None, &format!("refund-{id}")).await, 400);
        assert_eq!(error.type_, ApiErrorsType::InvalidRequestError);
        assert_eq!(error.param.as_deref(), Some("payment_intent"), "{id}");
    }
    let missing = stripe_error(refund(&sim, "pi_nope", None, "refund-nope").await, 400);
    assert_eq!(missing.code, Some(ApiErrorsCode::ResourceMissing));
    assert!(sim.sim().refunds().is_empty());
}

/// Refunds are idempotent like creates: the same key and parameters replay the refund (one
/// ledger entry); other parameters are a 400 `idempotency_error`; a refusal is saved too.
#[tokio::test]
async fn refunds_are_idempotent() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "pay-1").await.expect("paid");
    let id = intent.id.as_str();

    let first = refund(&sim, id, Some(300), "refund-key").await.expect("refunded");
    let replay = refund(&sim, id, Some(300), "refund-key").await.expect("replayed");
    assert_eq!(replay.id, first.id);
    let mismatch = stripe_error(refund(&sim, id, Some(400), "refund-key").await, 400);
    assert_eq!(mismatch.type_, ApiErrorsType::IdempotencyError);
    let payment_key = stripe_error(refund(&sim, id, Some(300), "pay-1").await, 400);
    assert_eq!(payment_key.type_, ApiErrorsType::IdempotencyError, "a key used for a payment");

    let raw = Response::send(
        sim.request(Method::POST, "v1/refunds")
            .bearer_auth(API_KEY)
            .header("Idempotency-Key", "refund-key")
            .form(&[("amount", "300"), ("payment_intent", id)]),
    )
    .await;
    assert!(raw.replayed, "Idempotent-Replayed: true");
    let refunds = sim.sim().refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0].refund, first.id.as_str());
}

/// While a refund with a key is executing, the same key is a 409; one refund results.
#[tokio::test]
async fn concurrent_refunds_with_one_key_refund_once() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "pay-1").await.expect("paid");
    sim.set_faults(json!({"latency_ms": 500, "operations": ["create_refund"]})).await;
    let barrier = Barrier::new(2);
    let attempt = || async {
        barrier.wait().await;
        refund(&sim, intent.id.as_str(), Some(100), "double-click").await
    };

    let (a, b) = tokio::join!(attempt(), attempt());

    let conflicted = match (a, b) {
        (Ok(_), Err(error)) | (Err(error), Ok(_)) => Err::<(), _>(error),
        other => panic!("expected one refund and one conflict, got {other:?}"),
    };
    assert_eq!(stripe_error(conflicted, 409).code, Some(ApiErrorsCode::IdempotencyKeyInUse));
    assert_eq!(sim.sim().refunds().len(), 1);
}

/// Many keys refunding 30 % each of one payment at once: exactly three succeed, the rest are
/// `amount_too_large`, and the ledger never exceeds the charge.
#[tokio::test]
async fn racing_refunds_never_refund_more_than_was_charged() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "pay-1").await.expect("paid");
    let barrier = Barrier::new(20);
    let attempts = (0..20).map(|i| {
        let (sim, barrier, id) = (&sim, &barrier, intent.id.as_str());
        async move {
            barrier.wait().await;
            refund(sim, id, Some(375), &format!("key-{i}")).await
        }
    });

    let results = futures_util::future::join_all(attempts).await;

    assert_eq!(results.iter().filter(|result| result.is_ok()).count(), 3);
    let refunds = sim.sim().refunds();
    assert_eq!(refunds.iter().map(|refund| refund.amount).sum::<i64>(), 1125);
    let mut keys: Vec<_> = refunds.iter().map(|refund| refund.idempotency_key.clone()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 3, "one refund per key");
}

/// API faults scoped to refunds strike refunds only: an outage is a 500 that refunds nothing,
/// and the retry with the same key refunds once.
#[tokio::test]
async fn faults_apply_to_refunds() {
    let sim = TestSim::start().await;
    let intent = sim.pay("pm_card_visa", "pay-1").await.expect("paid");
    sim.set_faults(json!({"fail_rate": 1.0, "operations": ["create_refund"]})).await;

    let outage = stripe_error(refund(&sim, intent.id.as_str(), None, "r").await, 500);
    assert_eq!(outage.type_, ApiErrorsType::ApiError);
    assert!(sim.sim().refunds().is_empty());
    assert!(sim.pay("pm_card_visa", "pay-2").await.is_ok(), "payments are out of scope");

    sim.set_faults(json!({})).await;
    refund(&sim, intent.id.as_str(), None, "r").await.expect("refunded");
    assert_eq!(sim.sim().refunds().len(), 1);
}

/// A bank debit's refund is `pending`, out of the ledger, until it settles: after the processing
/// knob it `succeeded` (`refund.updated`, and into the ledger); told to fail instead
/// (`POST /_sim/refunds/{id}/settle`), it is `failed` (`refund.failed`, `failure_reason`
/// `declined`), its amount refundable on the charge again, and it never enters the ledger.
#[tokio::test]
async fn bank_debit_refunds_are_pending_until_they_settle() {
    let sim = TestSim::start().await;
    sim.fast().await;
    let intent = sim.pay("pm_usBankAccount_success", "ach").await.expect("processing");
    let id = intent.id.as_str();
    assert_eq!(sim.wait_for_charges(1).await.len(), 1, "the bank debit settled");

    let first = refund(&sim, id, Some(500), "r1").await.expect("accepted");
    assert_eq!(first.status.as_deref(), Some("pending"));
    assert!(sim.sim().refunds().is_empty(), "no money moved back yet");
    super::wait_for("the refund to settle", || (!sim.sim().refunds().is_empty()).then_some(())).await;
    let retrieved = RetrieveRefund::new(first.id.clone()).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!(retrieved.status.as_deref(), Some("succeeded"));
    assert_eq!(sim.sim().refunds()[0].refund, first.id.as_str());

    sim.set_settings(json!({"processing_ms": 600_000})).await;
    let second = refund(&sim, id, Some(750), "r2").await.expect("accepted");
    assert_eq!(second.status.as_deref(), Some("pending"));
    let failed =
        sim.request(Method::POST, &format!("_sim/refunds/{}/settle", second.id)).json(&json!({"outcome": "fail"}));
    let failed = Response::send(failed).await;
    assert_eq!((failed.status, failed.body["status"].as_str()), (200, Some("failed")), "{:?}", failed.body);
    assert_eq!(failed.body["failure_reason"], "declined");
    let again =
        sim.request(Method::POST, &format!("_sim/refunds/{}/settle", second.id)).json(&json!({"outcome": "succeed"}));
    assert_eq!(Response::send(again).await.status, 400, "a settled refund does not settle again");
    let retrieved = RetrieveRefund::new(second.id.clone()).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!((retrieved.status.as_deref(), retrieved.failure_reason.as_deref()), (Some("failed"), Some("declined")));
    let kinds: Vec<_> = sim.sim().events().into_iter().map(|event| event.kind).collect();
    assert!(kinds.contains(&"refund.updated".to_owned()) && kinds.contains(&"refund.failed".to_owned()), "{kinds:?}");

    let charge_id = intent.latest_charge.as_ref().expect("charged").id().clone();
    let charge = RetrieveCharge::new(charge_id).send(&sim.stripe()).await.expect("the charge");
    assert_eq!(charge.amount_refunded, 500, "the failed refund's amount is refundable again");
    assert_eq!(sim.sim().refunds().len(), 1, "only the refund that succeeded is in the ledger");
    let rest = refund(&sim, id, Some(750), "r3").await.expect("what remains is refundable");
    assert_eq!(rest.status.as_deref(), Some("pending"));
}
