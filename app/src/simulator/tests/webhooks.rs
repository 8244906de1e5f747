//! Webhooks: endpoints through async-stripe, events through async-stripe, deliveries verified with
//! async-stripe-webhook (the crate payonce verifies with), retries, and the delivery faults.

use reqwest::Method;
use serde_json::{Value, json};
use stripe_core::event::{ListEvent, RetrieveEvent};
use stripe_core::payment_intent::RetrievePaymentIntent;
use stripe_misc::webhook_endpoint::{
    CreateWebhookEndpoint, CreateWebhookEndpointEnabledEvents, DeleteWebhookEndpoint, ListWebhookEndpoint,
    RetrieveWebhookEndpoint,
};
use stripe_webhook::{EventObject, Webhook};

use super::{Hook, Response, TestSim, stripe_error, wait_for};
use crate::simulator::DeliveryState;

/// Creating an endpoint answers its `whsec_` secret, once; retrieve, list and delete follow
/// Stripe's shapes (the deleted object), and a deleted endpoint is gone.
#[tokio::test]
async fn webhook_endpoints_the_stripe_way() {
    let sim = TestSim::start().await;
    let client = sim.stripe();
    let events = vec![CreateWebhookEndpointEnabledEvents::PaymentIntentSucceeded];
    let created = CreateWebhookEndpoint::new(events, "http://127.0.0.1:9/hook")
        .description("payonce")
        .send(&client)
        .await
        .expect("created");
    assert!(created.id.as_str().starts_with("we_"));
    assert!(created.secret.as_deref().is_some_and(|secret| secret.starts_with("whsec_")));
    assert_eq!(
        (created.enabled_events.as_slice(), created.status.as_str()),
        (&["payment_intent.succeeded".to_owned()][..], "enabled")
    );

    let retrieved = RetrieveWebhookEndpoint::new(created.id.clone()).send(&client).await.expect("retrieved");
    assert_eq!(retrieved.url, "http://127.0.0.1:9/hook");
    assert!(retrieved.secret.is_none(), "the secret is shown only at creation");
    let listed = ListWebhookEndpoint::new().send(&client).await.expect("listed");
    assert_eq!(listed.data.len(), 1);
    let deleted = DeleteWebhookEndpoint::new(created.id.clone()).send(&client).await.expect("deleted");
    assert_eq!(deleted.id, created.id);
    let gone = stripe_error(RetrieveWebhookEndpoint::new(created.id.clone()).send(&client).await, 404);
    assert_eq!(gone.code, Some(stripe::ApiErrorsCode::ResourceMissing));

    let bogus = sim
        .request(Method::POST, "v1/webhook_endpoints")
        .bearer_auth(super::API_KEY)
        .form(&[("url", "http://127.0.0.1:9/hook"), ("enabled_events[0]", "payment_intent.bogus")]);
    let bogus = Response::send(bogus).await;
    assert_eq!((bogus.status, bogus.body["error"]["param"].as_str()), (400, Some("enabled_events[0]")));
}

/// A payment's events reach the endpoint signed with Stripe's scheme: async-stripe-webhook
/// verifies each, parses `data.object` as a PaymentIntent, and `request.idempotency_key` is the
/// create call's key. The same events are in `GET /v1/events` and `GET /_sim/events`.
#[tokio::test]
async fn deliveries_are_signed_as_stripe_signs_them() {
    let sim = TestSim::start().await;
    let hook = Hook::start(&[]).await;
    let secret = sim.register(&hook).await;

    let intent = sim.pay("pm_card_visa", "order-1").await.expect("paid");
    let received = hook.wait_for(3).await;

    let mut kinds = Vec::new();
    for delivery in &received {
        let event = Webhook::construct_event(&delivery.body, &delivery.signature, &secret).expect("a valid signature");
        kinds.push(event.type_.as_str().to_owned());
        let request = event.request.expect("caused by a request");
        assert_eq!(request.idempotency_key.as_deref(), Some("order-1"));
        if let EventObject::PaymentIntentSucceeded(succeeded) = event.data.object {
            assert_eq!(succeeded.id, intent.id);
            assert_eq!(succeeded.amount_received, 1250);
        }
    }
    kinds.sort();
    assert_eq!(kinds, ["charge.succeeded", "payment_intent.created", "payment_intent.succeeded"]);
    let forged = Webhook::construct_event(&received[0].body, &received[0].signature, "whsec_someone_else");
    assert!(forged.is_err(), "another secret does not verify");

    let listed = ListEvent::new().type_("payment_intent.succeeded").send(&sim.stripe()).await.expect("listed");
    assert_eq!(listed.data.len(), 1);
    let event = RetrieveEvent::new(listed.data[0].id.clone()).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!(event.type_.as_str(), "payment_intent.succeeded");
    let records = wait_for("deliveries recorded", || {
        let records = sim.sim().events();
        records
            .iter()
            .all(|record| record.deliveries.iter().all(|d| d.state == DeliveryState::Delivered))
            .then_some(records)
    })
    .await;
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|record| record.deliveries[0].attempts[0].status == Some(200)));
    let settled = RetrieveEvent::new(listed.data[0].id.clone()).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!(settled.pending_webhooks, 0, "every endpoint answered 2xx");
}

/// An endpoint added at startup with a chosen secret (`payonce stripe-sim --webhook-url`) gets
/// every event signed with that secret, and it outlives a reset: a server that registered it once
/// keeps receiving events after the dashboard or a workshop resets the simulator.
#[tokio::test]
async fn a_startup_endpoint_signs_with_its_secret_and_survives_a_reset() {
    let sim = TestSim::start().await;
    let hook = Hook::start(&[]).await;
    let secret = "whsec_shared_by_every_server";
    sim.sim().add_webhook_endpoint(super::API_KEY, &hook.url, secret).expect("added");
    assert!(sim.sim().add_webhook_endpoint(super::API_KEY, "not a url", secret).is_err());
    assert!(sim.sim().add_webhook_endpoint(super::API_KEY, &hook.url, "sk_not_a_secret").is_err());

    sim.pay("pm_card_visa", "order-1").await.expect("paid");
    let before = hook.wait_for(3).await;
    let reset = Response::send(sim.request(Method::POST, "_sim/reset")).await;
    assert_eq!(reset.status, 204);
    sim.pay("pm_card_visa", "order-2").await.expect("paid after the reset");
    let received = hook.wait_for(6).await;

    assert_eq!(before.len(), 3);
    for delivery in &received {
        let event = Webhook::construct_event(&delivery.body, &delivery.signature, secret).expect("signed with it");
        assert!(event.request.and_then(|request| request.idempotency_key).is_some());
    }
    let listed = ListWebhookEndpoint::new().send(&sim.stripe()).await.expect("listed");
    assert_eq!(listed.data.len(), 1, "the endpoint is still there");
}

/// An endpoint answering 500 is retried (with backoff) until it answers 2xx; every attempt is
/// recorded with its status.
#[tokio::test]
async fn failed_deliveries_are_retried_until_2xx() {
    let sim = TestSim::start().await;
    sim.fast().await;
    let hook = Hook::start(&[500, 500, 503]).await;
    let all = vec![CreateWebhookEndpointEnabledEvents::PaymentIntentCreated];
    CreateWebhookEndpoint::new(all, hook.url.clone()).send(&sim.stripe()).await.expect("created");

    sim.pay("pm_card_visa", "order-1").await.expect("paid");

    let received = hook.wait_for(4).await;
    assert!(received.iter().all(|delivery| delivery.body == received[0].body), "the same event each time");
    let record = wait_for("the delivery", || {
        let records = sim.sim().events();
        let record = records.into_iter().find(|record| record.kind == "payment_intent.created")?;
        (record.deliveries[0].state == DeliveryState::Delivered).then_some(record)
    })
    .await;
    let statuses: Vec<_> = record.deliveries[0].attempts.iter().map(|attempt| attempt.status).collect();
    assert_eq!(statuses, [Some(500), Some(500), Some(503), Some(200)]);
}

/// An endpoint that never answers 2xx is given up after `webhook_max_attempts`.
#[tokio::test]
async fn deliveries_give_up_after_the_last_attempt() {
    let sim = TestSim::start().await;
    sim.set_settings(json!({"webhook_retry_base_ms": 1, "webhook_max_attempts": 3})).await;
    let hook = Hook::start(&[500; 10]).await;
    let created = vec![CreateWebhookEndpointEnabledEvents::PaymentIntentCreated];
    CreateWebhookEndpoint::new(created, hook.url.clone()).send(&sim.stripe()).await.expect("created");

    sim.pay("pm_card_visa", "order-1").await.expect("paid");

    let record = wait_for("a failed delivery", || {
        let record = sim.sim().events().into_iter().find(|record| record.kind == "payment_intent.created")?;
        (record.deliveries[0].state == DeliveryState::Failed).then_some(record)
    })
    .await;
    assert_eq!(record.deliveries[0].attempts.len(), 3);
    assert_eq!(hook.received().len(), 3);
}

/// `webhook_duplicate_rate: 1` delivers every event exactly twice.
#[tokio::test]
async fn duplicate_fault_delivers_each_event_twice() {
    let sim = TestSim::start().await;
    let hook = Hook::start(&[]).await;
    sim.register(&hook).await;
    sim.set_faults(json!({"webhook_duplicate_rate": 1.0})).await;

    sim.pay("pm_card_visa", "order-1").await.expect("paid");

    let received = hook.wait_for(6).await;
    let mut ids: Vec<_> = received.iter().map(|delivery| event_id(&delivery.body)).collect();
    ids.sort();
    assert_eq!(ids.len(), 6);
    assert!(ids.chunks(2).all(|pair| pair[0] == pair[1]), "each event twice: {ids:?}");
    let records = sim.sim().events();
    assert!(records.iter().all(|record| record.deliveries.len() == 2 && record.deliveries[1].duplicate));
}

/// `webhook_hold` keeps deliveries back; a reverse release sends them newest first, one after
/// another, so the endpoint sees the events in reverse order.
#[tokio::test]
async fn held_deliveries_are_released_in_reverse() {
    let sim = TestSim::start().await;
    let hook = Hook::start(&[]).await;
    sim.register(&hook).await;
    sim.set_faults(json!({"webhook_hold": true})).await;

    sim.pay("pm_card_visa", "order-1").await.expect("paid");
    assert!(hook.received().is_empty(), "nothing is sent while held");
    assert!(sim.sim().events().iter().all(|record| record.deliveries[0].state == DeliveryState::Held));

    let release =
        Response::send(sim.request(Method::POST, "_sim/webhooks/release").json(&json!({"order": "reverse"}))).await;
    assert_eq!(release.body["released"], 3);
    hook.wait_for(3).await;
    assert_eq!(hook.kinds(), ["payment_intent.succeeded", "charge.succeeded", "payment_intent.created"]);
}

/// `webhook_drop_rate: 1` loses every delivery: nothing reaches the endpoint, nothing is retried,
/// the record says `dropped`, and the events are still there for whoever asks Stripe.
#[tokio::test]
async fn dropped_deliveries_are_never_sent() {
    let sim = TestSim::start().await;
    sim.fast().await;
    let hook = Hook::start(&[]).await;
    sim.register(&hook).await;
    sim.set_faults(json!({"webhook_drop_rate": 1.0})).await;

    let intent = sim.pay("pm_usBankAccount_success", "order-1").await.expect("processing");
    wait_for("the debit to settle", || {
        sim.sim().events().iter().any(|record| record.kind == "payment_intent.succeeded").then_some(())
    })
    .await;

    let records = sim.sim().events();
    assert!(records.iter().all(|record| {
        record.deliveries.len() == 1
            && record.deliveries[0].state == DeliveryState::Dropped
            && record.deliveries[0].attempts.is_empty()
    }));
    assert!(hook.received().is_empty());
    let truth = RetrievePaymentIntent::new(intent.id.clone()).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!(truth.status, stripe_core::PaymentIntentStatus::Succeeded, "reconciliation finds the outcome");
    let listed = ListEvent::new().type_("payment_intent.succeeded").send(&sim.stripe()).await.expect("listed");
    assert_eq!(listed.data.len(), 1);
}

/// No lock is held across a delivery: while an endpoint holds a delivery open, API calls
/// (creates, retrieves, another endpoint's registration) complete; the delivery finishes after.
#[tokio::test]
async fn a_slow_endpoint_does_not_slow_api_calls() {
    let sim = TestSim::start().await;
    let hook = Hook::closed().await;
    let secret = sim.register(&hook).await;

    let first = sim.pay("pm_card_visa", "order-1").await.expect("paid");
    hook.wait_for(1).await;
    // The endpoint now holds at least one delivery open, and answers nothing until opened.
    let second = sim.pay("pm_card_mastercard", "order-2").await.expect("paid while a delivery is open");
    let fetched = RetrievePaymentIntent::new(first.id.clone()).send(&sim.stripe()).await.expect("retrieved");
    assert_eq!(fetched.id, first.id);
    assert_ne!(second.id, first.id);
    assert!(sim.sim().events().iter().all(|record| record.deliveries[0].attempts.is_empty()), "still open");

    hook.open();
    let received = hook.wait_for(6).await;
    assert!(
        received.iter().all(|delivery| Webhook::construct_event(&delivery.body, &delivery.signature, &secret).is_ok())
    );
}

fn event_id(body: &str) -> String {
    let event: Value = serde_json::from_str(body).expect("JSON");
    event["id"].as_str().unwrap_or_default().to_owned()
}

/// A refund's events (`refund.created`, `charge.refunded` at once, `refund.updated` when the
/// acquirer's reference arrives) verify and parse as async-stripe's Refund and Charge, and carry
/// the refund call's key (the later update: none).
#[tokio::test]
async fn refund_events_verify_and_parse() {
    let sim = TestSim::start().await;
    sim.fast().await;
    let intent = sim.pay("pm_card_visa", "order-1").await.expect("paid");
    let hook = Hook::start(&[]).await;
    let secret = sim.register(&hook).await;

    let refund = stripe_core::refund::CreateRefund::new().payment_intent(intent.id.as_str()).amount(250);
    let refund = stripe::StripeRequest::customize(&refund)
        .request_strategy(super::idempotent("refund-1"))
        .send(&sim.stripe())
        .await
        .expect("refunded");

    let received = hook.wait_for(3).await;
    let mut seen = Vec::new();
    for delivery in &received {
        let event = Webhook::construct_event(&delivery.body, &delivery.signature, &secret).expect("a valid signature");
        let key = event.request.and_then(|request| request.idempotency_key);
        match event.data.object {
            EventObject::RefundCreated(created) => {
                assert_eq!(created.id, refund.id);
                seen.push(("refund.created", key));
            }
            EventObject::ChargeRefunded(charge) => {
                assert_eq!((charge.amount_refunded, charge.refunded), (250, false));
                seen.push(("charge.refunded", key));
            }
            EventObject::RefundUpdated(updated) => {
                assert!(updated.destination_details.is_some(), "the acquirer's reference");
                seen.push(("refund.updated", key));
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    seen.sort();
    let key = Some("refund-1".to_owned());
    assert_eq!(seen, [("charge.refunded", key.clone()), ("refund.created", key), ("refund.updated", None)]);
}

/// Deleting an endpoint stops its deliveries: a held one released afterwards is never sent.
#[tokio::test]
async fn a_deleted_endpoint_gets_nothing_more() {
    let sim = TestSim::start().await;
    let hook = Hook::start(&[]).await;
    sim.register(&hook).await;
    sim.set_faults(json!({"webhook_hold": true})).await;
    sim.pay("pm_card_visa", "order-1").await.expect("paid");

    let listed = ListWebhookEndpoint::new().send(&sim.stripe()).await.expect("listed");
    DeleteWebhookEndpoint::new(listed.data[0].id.clone()).send(&sim.stripe()).await.expect("deleted");
    let released = Response::send(sim.request(Method::POST, "_sim/webhooks/release")).await;
    assert_eq!(released.body["released"], 3);

    wait_for("the deliveries to stop", || {
        sim.sim().events().iter().all(|record| record.deliveries[0].state == DeliveryState::Failed).then_some(())
    })
    .await;
    assert!(hook.received().is_empty());
}
