//! Events: what happened, when, and which request caused it; each one recorded, and queued for
//! delivery to every endpoint that wants it.
//!
//! An event's `data.object` is the object's snapshot at that moment; its `request` names the API
//! request that caused it (`Request-Id` and `Idempotency-Key`), or is `{id: null,
//! idempotency_key: null}` for an asynchronous transition (a bank debit settling, the customer
//! authenticating), as on Stripe. `pending_webhooks` counts the endpoints still to answer 2xx.

pub(crate) mod routes;

use serde_json::Value;

use super::objects::{Event, EventRequest};
use super::response::to_json;
use super::state::{Job, State};
use super::webhooks::log::{Delivery, DeliveryAt, DeliveryJob, DeliveryState, EventRecord};

/// The API version events are rendered in: the one async-stripe (and so payonce) pins.
pub(crate) fn api_version() -> &'static str {
    stripe_shared::version::VERSION.as_str()
}

/// Records an event of type `kind` about `object` for `api_key`'s account, and queues its
/// deliveries (drawing the webhook faults for each endpoint). Runs under the lock; the
/// deliveries start when the caller's `jobs::transact` releases it.
pub(crate) fn emit(
    state: &mut State,
    api_key: &str,
    kind: &'static str,
    object: Value,
    previous_attributes: Option<Value>,
    request: &EventRequest,
) {
    let endpoints: Vec<_> = state
        .account(api_key)
        .webhook_endpoints
        .iter()
        .filter(|endpoint| endpoint.wants(kind))
        .map(|endpoint| (endpoint.id.clone(), endpoint.url.clone(), endpoint.secret.clone().unwrap_or_default()))
        .collect();
    let plans: Vec<_> = endpoints.iter().map(|_| state.faults.plan_delivery()).collect();
    let pending_webhooks = plans.iter().filter(|plan| !plan.dropped).count();

    let event = Event::new(kind, api_version(), object, previous_attributes, pending_webhooks, request.clone());
    let id = event.id.clone();
    let payload = to_json(&event);

    let position = state.events.records().len();
    let mut deliveries = Vec::new();
    let mut jobs = Vec::new();
    for ((endpoint_id, url, secret), plan) in endpoints.into_iter().zip(plans) {
        let copies = match (plan.dropped, plan.duplicated) {
            (true, _) => 0,
            (false, true) => 2,
            (false, false) => 1,
        };
        if plan.dropped {
            let state = DeliveryState::Dropped;
            deliveries.push(Delivery {
                endpoint: endpoint_id.clone(),
                url: url.clone(),
                duplicate: false,
                state,
                attempts: vec![],
            });
        }
        for copy in 0..copies {
            let at = DeliveryAt { event: position, delivery: deliveries.len() };
            let delivery_state = if plan.hold { DeliveryState::Held } else { DeliveryState::Pending };
            deliveries.push(Delivery {
                endpoint: endpoint_id.clone(),
                url: url.clone(),
                duplicate: copy == 1,
                state: delivery_state,
                attempts: vec![],
            });
            let job = DeliveryJob {
                at,
                api_key: api_key.to_owned(),
                event_id: id.clone(),
                endpoint_id: endpoint_id.clone(),
                url: url.clone(),
                secret: secret.clone(),
                payload: payload.clone(),
                delay: plan.delay,
                epoch: state.epoch,
            };
            jobs.push((plan.hold, job));
        }
    }
    state.events.push(EventRecord {
        id: id.clone(),
        kind: kind.to_owned(),
        created: event.created,
        request: request.into(),
        deliveries,
    });
    let account = state.account(api_key);
    account.event_positions.insert(id, account.events.len());
    account.events.push(event);
    for (hold, job) in jobs {
        if hold {
            state.held.push(job);
        } else {
            state.outbox.push(Job::Deliver(job));
        }
    }
}
