//! The `/_sim` control routes: faults validation and round trip, the ledger endpoint, reset.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use stripe::ApiErrorsType;

use super::{API_KEY, PAYMENT_FORM, Response, TestSim, stripe_error};
use crate::simulator::{Charge, Faults, FaultsError, Refund};

async fn put_faults(sim: &TestSim, body: &str) -> Response {
    Response::send(sim.request(Method::PUT, "_sim/faults").body(body.to_owned())).await
}

/// Bad JSON, unknown fields and out-of-range values are 400s whose message says what is wrong;
/// the faults in force do not change.
#[tokio::test]
async fn bad_faults_are_rejected_with_a_clear_message() {
    let sim = TestSim::start().await;

    for (body, expected) in [
        ("{not json", "Invalid faults JSON"),
        (r#"{"fail_rat": 1}"#, "unknown field `fail_rat`"),
        (r#"{"latency_ms": -5}"#, "latency_ms"),
        (r#"{"fail_rate": 1.5}"#, "fail_rate must be a probability between 0 and 1"),
        (r#"{"fail_rate": 0.5, "timeout_rate": 0.6}"#, "must be at most 1"),
        (r#"{"next_calls": 0}"#, "next_calls must be at least 1"),
    ] {
        let response = put_faults(&sim, body).await;
        assert_eq!(response.status, 400, "{body}");
        let message = response.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{body}: {message}");
    }
    assert_eq!(sim.sim().faults(), Faults::default());

    let direct = sim.sim().set_faults(Faults { drop_after_charge_rate: -0.1, ..Faults::default() });
    let field = match direct {
        Err(FaultsError::RateOutOfRange { field, .. }) => field,
        other => panic!("expected RateOutOfRange, got {other:?}"),
    };
    assert_eq!(field, "drop_after_charge_rate");
}

/// PUT stores what was sent (defaults filled in, e.g. the 35 s hold) and GET returns it.
#[tokio::test]
async fn faults_round_trip() {
    let sim = TestSim::start().await;

    let response = put_faults(&sim, r#"{"latency_ms": 5, "jitter_ms": 2, "seed": 3}"#).await;

    assert_eq!(response.status, 200);
    assert_eq!(response.body["timeout_hold_ms"], 35_000);
    let expected = Faults { latency_ms: 5, jitter_ms: 2, seed: Some(3), ..Faults::default() };
    assert_eq!(serde_json::from_value::<Faults>(response.body).expect("Faults"), expected);
    let stored = Response::send(sim.request(Method::GET, "_sim/faults")).await.body;
    assert_eq!(serde_json::from_value::<Faults>(stored).expect("Faults"), expected);
}

/// `GET /_sim/charges` is the ledger: the same entries as `Simulator::charges`, in order.
#[tokio::test]
async fn charges_endpoint_lists_the_ledger() {
    let sim = TestSim::start().await;
    for key in ["first", "second"] {
        sim.pay("pm_card_visa", key).await.expect("paid");
    }

    let body = Response::send(sim.request(Method::GET, "_sim/charges")).await.body;
    let charges: Vec<Charge> = serde_json::from_value(body["charges"].clone()).expect("charges");

    assert_eq!(charges, sim.sim().charges());
    let keys: Vec<_> = charges.iter().map(|charge| charge.idempotency_key.as_deref()).collect();
    assert_eq!(keys, [Some("first"), Some("second")]);
}

/// `?from=N` answers only the charges after the first N, with the total and the ledger's id; a
/// reset makes a new ledger, under a new id, so that a reader keeping what it saw starts again.
#[tokio::test]
async fn charges_from_an_offset_name_their_ledger() {
    let sim = TestSim::start().await;
    for key in ["first", "second", "third"] {
        sim.pay("pm_card_visa", key).await.expect("paid");
    }
    let page = |from: &str| sim.request(Method::GET, &format!("_sim/charges?from={from}"));

    let all = Response::send(page("0")).await.body;
    let tail = Response::send(page("2")).await.body;
    let beyond = Response::send(page("7")).await.body;

    for body in [&all, &tail, &beyond] {
        assert_eq!(body["total"], json!(3));
    }
    let keys = |body: &serde_json::Value| -> Vec<String> {
        body["charges"]
            .as_array()
            .expect("charges")
            .iter()
            .map(|c| c["idempotency_key"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(keys(&tail), ["third"]);
    assert!(keys(&beyond).is_empty());
    let ledger = all["ledger"].as_str().expect("the ledger's id").to_owned();
    assert_eq!(tail["ledger"], json!(ledger));

    let bad = Response::send(page("-1")).await;
    assert_eq!(bad.status, 400, "{}", bad.body);

    Response::send(sim.request(Method::POST, "_sim/reset")).await;
    let after = Response::send(page("0")).await.body;
    assert_eq!(after["total"], json!(0));
    assert_ne!(after["ledger"], json!(ledger), "a reset is a new ledger");
}

/// Reset forgets the ledger, objects, saved results and faults: the same key pays anew.
#[tokio::test]
async fn reset_forgets_everything() {
    let sim = TestSim::start().await;
    let before = sim.post_form(Some("order-1"), PAYMENT_FORM).await;
    sim.set_faults(json!({"latency_ms": 1})).await;

    let reset = Response::send(sim.request(Method::POST, "_sim/reset")).await;

    assert_eq!(reset.status, 204);
    assert!(sim.sim().charges().is_empty());
    assert_eq!(sim.sim().faults(), Faults::default());
    let id = before.body["id"].as_str().expect("a PaymentIntent id");
    let lookup = sim.request(Method::GET, &format!("v1/payment_intents/{id}"));
    assert_eq!(Response::send(lookup.bearer_auth(API_KEY)).await.status, 404);
    let after = sim.post_form(Some("order-1"), PAYMENT_FORM).await;
    assert_eq!((after.status, after.replayed), (200, false));
    assert_ne!(after.body["id"], before.body["id"]);
    assert_eq!(sim.sim().charges().len(), 1);
}

/// A reset is a clean cut: a request in flight when it happens executes nothing, is told so
/// (500, retry), and leaves no claim behind.
#[tokio::test]
async fn reset_during_a_request_executes_nothing() {
    let sim = TestSim::start().await;
    sim.set_faults(json!({"latency_ms": 600})).await;
    let reset_meanwhile = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        Response::send(sim.request(Method::POST, "_sim/reset")).await
    };

    let (paid, reset) = tokio::join!(sim.pay("pm_card_visa", "order-1"), reset_meanwhile);

    assert_eq!(reset.status, 204);
    assert_eq!(stripe_error(paid, 500).type_, ApiErrorsType::ApiError);
    assert!(sim.sim().charges().is_empty());
    sim.pay("pm_card_visa", "order-1").await.expect("the key is free");
    assert_eq!(sim.sim().charges().len(), 1);
}

/// `GET /_sim/refunds` is the refund ledger, and `/_sim/charges` shows what each charge had
/// refunded: the two an audit needs to prove "never more refunded than charged".
#[tokio::test]
async fn refunds_endpoint_lists_the_refund_ledger() {
    let sim = TestSim::start().await;
    let paid = sim.post_form(Some("order-1"), PAYMENT_FORM).await;
    let id = paid.body["id"].as_str().expect("a PaymentIntent");
    let refund = sim
        .request(Method::POST, "v1/refunds")
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "refund-1")
        .form(&[("payment_intent", id), ("amount", "200"), ("reason", "requested_by_customer")]);
    assert_eq!(Response::send(refund).await.status, 200);

    let body = Response::send(sim.request(Method::GET, "_sim/refunds")).await.body;
    let refunds: Vec<Refund> = serde_json::from_value(body["refunds"].clone()).expect("refunds");
    assert_eq!(refunds, sim.sim().refunds());
    assert_eq!((refunds[0].amount, refunds[0].reason.as_deref()), (200, Some("requested_by_customer")));
    let charges = Response::send(sim.request(Method::GET, "_sim/charges")).await.body;
    assert_eq!(charges["charges"][0]["amount_refunded"], 200);
}

/// Settings round-trip and are validated like faults; webhook faults are validated too.
#[tokio::test]
async fn settings_and_webhook_faults_are_validated() {
    let sim = TestSim::start().await;

    let set = Response::send(sim.request(Method::PUT, "_sim/settings").body(r#"{"processing_ms": 10}"#)).await;
    assert_eq!(
        (set.status, set.body["processing_ms"].as_u64(), set.body["webhook_max_attempts"].as_u64()),
        (200, Some(10), Some(6))
    );
    for (path, body, expected) in [
        ("_sim/settings", r#"{"webhook_max_attempts": 0}"#, "webhook_max_attempts must be between 1 and 20"),
        ("_sim/settings", r#"{"processing": 1}"#, "unknown field `processing`"),
        ("_sim/faults", r#"{"webhook_drop_rate": 2}"#, "webhook_drop_rate must be a probability"),
        ("_sim/faults", r#"{"operations": []}"#, "operations must not be empty"),
        ("_sim/faults", r#"{"operations": ["capture"]}"#, "unknown variant `capture`"),
    ] {
        let response = Response::send(sim.request(Method::PUT, path).body(body.to_owned())).await;
        assert_eq!(response.status, 400, "{body}");
        let message = response.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{body}: {message}");
    }
    assert_eq!(sim.sim().settings().processing_ms, 10, "a refused value changes nothing");
}
