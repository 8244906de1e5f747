//! `POST /webhooks/stripe`: Stripe's events in.
//!
//! The route has no authentication but the signature: the `Stripe-Signature` header is checked
//! against the endpoint's secret (`STRIPE_WEBHOOK_SECRET`, or the one the built-in simulator
//! issued at startup) by async-stripe's `Webhook::construct_event`, which also refuses a timestamp
//! more than 300 s off. A missing or bad signature, or a stale one, is a 400 problem and nothing
//! is applied or recorded. A verified event is recorded and applied once
//! ([`crate::payments::webhook`]); any 2xx tells Stripe to stop redelivering it.

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use stripe_webhook::{Webhook, WebhookError};

use super::AppState;
use super::error::ApiError;
use crate::payments::webhook::{self, Delivery, Receipt};

/// Where Stripe delivers events.
pub const ROUTE: &str = "/webhooks/stripe";

/// The largest event accepted. Stripe's events hold one object, unexpanded: a few kilobytes.
pub const BODY_LIMIT: usize = 256 * 1024;

pub fn router() -> Router<AppState> {
    Router::new().route(ROUTE, post(receive)).layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// `POST /webhooks/stripe`.
async fn receive(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|err| match err.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge { limit: BODY_LIMIT },
        _ => ApiError::invalid(err.body_text()),
    })?;
    let secret = state.webhook_secret.as_deref().ok_or(ApiError::WebhooksNotConfigured)?;
    let signature = headers
        .get("stripe-signature")
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| ApiError::WebhookSignature("there is no Stripe-Signature header".into()))?;
    let payload = std::str::from_utf8(&body).map_err(|_| ApiError::WebhookUnreadable)?;
    let verified = Webhook::construct_event(payload, signature, secret.expose());
    // The members passed on as sent (`next_action`) are read from the JSON itself.
    let raw: Value = serde_json::from_str(payload).unwrap_or_default();
    let receipt = match &verified {
        Ok(event) => webhook::receive(&state.engine, Delivery::of(event, &raw)).await?,
        // Signed, but async-stripe cannot read its object: an event payonce does not act on is
        // still acknowledged (or Stripe would redeliver it for days); one it acts on is refused
        // unapplied, and reconciliation catches up meanwhile.
        Err(WebhookError::BadParse(_)) => match Delivery::unread(&raw) {
            Some(delivery) => webhook::receive(&state.engine, delivery).await?,
            None => return Err(ApiError::WebhookUnreadable),
        },
        Err(WebhookError::BadTimestamp(at)) => {
            return Err(ApiError::WebhookSignature(format!(
                "the signature's timestamp ({at}) is more than 300 s away from now: a replayed or delayed delivery"
            )));
        }
        Err(WebhookError::BadKey | WebhookError::BadHeader(_) | WebhookError::BadSignature) => {
            return Err(ApiError::WebhookSignature(
                "the Stripe-Signature header does not sign this body with the endpoint's secret".into(),
            ));
        }
    };
    let (duplicate, effect) = match receipt {
        Receipt::Duplicate => (true, None),
        Receipt::Recorded(effect) => (false, Some(effect.as_str())),
    };
    Ok(axum::Json(json!({"received": true, "duplicate": duplicate, "effect": effect})).into_response())
}
