//! Delivery, at least once: each event is POSTed as JSON to every endpoint that wants it, signed
//! with Stripe's scheme, on its own task (never under the state's lock, never in the way of an
//! API call).
//!
//! An attempt that gets no 2xx within `webhook_timeout_ms` (default 5 s) is retried after
//! `webhook_retry_base_ms` × 2^(n−1) (default 1, 2, 4, 8, 16 s: Stripe's three days of retries,
//! compressed), up to `webhook_max_attempts` attempts (default 6); then the delivery is `failed`.
//! Every attempt is recorded (time, status or error, duration) for `GET /_sim/events`. A reset, or
//! deleting the endpoint, stops a delivery between attempts.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::header::{CONTENT_TYPE, USER_AGENT};

use super::log::{Attempt, DeliveryJob, DeliveryState};
use super::signature;
use crate::simulator::state::Simulator;

/// What to do after an attempt.
enum Next {
    Done,
    RetryAfter(Duration),
}

/// Sends one delivery, retrying until it is delivered, has failed for good, or is stopped.
pub(crate) async fn run(sim: Simulator, job: DeliveryJob) {
    run_from(sim, job, 1).await;
}

async fn run_from(sim: Simulator, job: DeliveryJob, first_attempt: u32) {
    let mut attempt = first_attempt;
    while let Next::RetryAfter(wait) = attempt_once(&sim, &job, attempt).await {
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// Releases held deliveries in the order given: each first attempt completes before the next
/// one starts, so the endpoint sees exactly that order; retries then run on their own.
pub(crate) async fn release(sim: Simulator, jobs: Vec<DeliveryJob>) {
    for job in jobs {
        if let Next::RetryAfter(wait) = attempt_once(&sim, &job, 1).await {
            let sim = sim.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                run_from(sim, job, 2).await;
            });
        }
    }
}

/// One attempt: sign, send, record.
async fn attempt_once(sim: &Simulator, job: &DeliveryJob, attempt: u32) -> Next {
    if !job.delay.is_zero() {
        tokio::time::sleep(job.delay).await;
    }
    let settings = {
        let mut state = sim.state();
        if state.epoch != job.epoch {
            return Next::Done;
        }
        let endpoint_exists = state
            .accounts
            .get(&job.api_key)
            .is_some_and(|account| account.webhook_endpoints.iter().any(|endpoint| endpoint.id == job.endpoint_id));
        if !endpoint_exists {
            // Deleted meanwhile: Stripe sends nothing more to it.
            if let Some(delivery) = state.events.delivery_mut(job.at) {
                delivery.state = DeliveryState::Failed;
            }
            return Next::Done;
        }
        state.settings.clone()
    };

    let at_ms = unix_millis();
    let signature = signature::header(&job.secret, at_ms / 1000, &job.payload);
    let started = Instant::now();
    let sent = sim
        .http()
        .post(&job.url)
        .header(CONTENT_TYPE, "application/json; charset=utf-8")
        .header(USER_AGENT, "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
        .header("stripe-signature", signature)
        .timeout(Duration::from_millis(settings.webhook_timeout_ms))
        .body(job.payload.clone())
        .send()
        .await;
    let (status, error) = match sent {
        // Read the answer to its end (within the same timeout): that is when Stripe counts a
        // delivery as answered.
        Ok(response) => {
            let status = response.status().as_u16();
            match response.bytes().await {
                Ok(_) => (Some(status), None),
                Err(error) => (None, Some(describe(&error, &settings))),
            }
        }
        Err(error) => (None, Some(describe(&error, &settings))),
    };
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let delivered = status.is_some_and(|status| (200..300).contains(&status));
    let last = attempt >= settings.webhook_max_attempts;

    let mut state = sim.state();
    if state.epoch != job.epoch {
        return Next::Done;
    }
    // `pending_webhooks` counts endpoints: a duplicate answered after its twin changes nothing.
    let first_for_endpoint = delivered && !state.events.delivered_elsewhere(job.at);
    if let Some(delivery) = state.events.delivery_mut(job.at) {
        delivery.attempts.push(Attempt { at_ms, status, error, duration_ms });
        delivery.state = match (delivered, last) {
            (true, _) => DeliveryState::Delivered,
            (false, true) => DeliveryState::Failed,
            (false, false) => DeliveryState::Pending,
        };
    }
    if delivered {
        if first_for_endpoint
            && let Some(account) = state.accounts.get_mut(&job.api_key)
            && let Some(&position) = account.event_positions.get(&job.event_id)
        {
            let event = &mut account.events[position];
            event.pending_webhooks = (event.pending_webhooks - 1).max(0);
        }
        return Next::Done;
    }
    if last { Next::Done } else { Next::RetryAfter(settings.retry_delay(attempt)) }
}

fn describe(error: &reqwest::Error, settings: &crate::simulator::state::Settings) -> String {
    if error.is_timeout() {
        format!("timed out after {} ms", settings.webhook_timeout_ms)
    } else if error.is_connect() {
        "could not connect".to_owned()
    } else {
        // reqwest's messages name the URL, which the record shows anyway; no secret is in it.
        error.to_string()
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
}
