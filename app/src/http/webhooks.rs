//! `POST /webhooks/stripe`: Stripe's events in.
//!
//! The route has no authentication but the signature: the `Stripe-Signature` header is checked
//! against the endpoint's secret (`STRIPE_WEBHOOK_SECRET`, or the one the built-in simulator
//! issued at startup) by async-stripe's `Webhook::construct_event`, which also refuses a timestamp
//! more than 300 s off. A missing or bad signature, or a stale one, is a 400 problem and nothing
//! is applied or recorded. A verified event is recorded and applied once by the
//! [`INBOX`], which hands it by type to the payments' or the refunds' handler; any 2xx tells
//! Stripe to stop redelivering it.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use stripe_webhook::{Webhook, WebhookError};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::extract::bytes_rejection;
use super::openapi::problems;
use crate::inbox::{Delivery, Effect, Inbox, Receipt};
use crate::payments::webhook::PaymentEvents;
use crate::refunds::webhook::RefundEvents;
use crate::state::AppState;

/// Where Stripe delivers events.
pub const ROUTE: &str = "/webhooks/stripe";

/// Every resource's handler of Stripe's events: the webhook endpoint subscribes to the types
/// they act on.
pub const INBOX: Inbox = Inbox::new(&[&PaymentEvents, &RefundEvents]);

/// The largest event accepted. Stripe's events hold one object, unexpanded: a few kilobytes.
pub const BODY_LIMIT: usize = 256 * 1024;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(receive)).layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// What payonce tells Stripe about an event it received.
#[derive(Serialize, utoipa::ToSchema)]
pub struct WebhookReceipt {
    /// Always `true`: any 2xx stops Stripe's redeliveries.
    pub received: bool,
    /// The event's id was already in the inbox: nothing was done again.
    pub duplicate: bool,
    /// What a new event did (`null` for a duplicate, and for an event dated outside the days the
    /// inbox keeps: acknowledged, not applied; docs/expiry.md).
    pub effect: Option<Effect>,
}

problems!(
    /// What a delivery is refused with.
    ReceiveProblems: WEBHOOK_SIGNATURE_INVALID, WEBHOOK_UNREADABLE, INVALID_REQUEST, REQUEST_TIMEOUT,
        WEBHOOKS_NOT_CONFIGURED, SERVICE_UNAVAILABLE
);

/// Stripe's events in (`payment_intent.*`, `refund.*`, `charge.refunded`), verified by their `Stripe-Signature`.
///
/// Not for API clients: Stripe calls it. An event is applied once, however often it is
/// delivered; anything without a valid signature is refused and changes nothing.
#[utoipa::path(
    post,
    path = "/webhooks/stripe",
    tag = "webhooks",
    operation_id = "receiveStripeEvent",
    params(("Stripe-Signature" = String, Header, description = "Stripe's signature of the body: `t=<unix time>,v1=<HMAC-SHA256>`.")),
    request_body(content = Object, description = "A Stripe event, as Stripe sends it.", content_type = "application/json"),
    responses(
        (status = 200, description = "The event was verified, and recorded and applied once.", body = WebhookReceipt),
        ReceiveProblems,
    )
)]
async fn receive(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|err| bytes_rejection(&err, BODY_LIMIT))?;
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
        Ok(event) => INBOX.receive(&state.engine, Delivery::of(event, &raw)).await?,
        // Signed, but async-stripe cannot read its object: an event payonce does not act on is
        // still acknowledged (or Stripe would redeliver it for days); one it acts on is refused
        // unapplied, and reconciliation catches up meanwhile.
        Err(WebhookError::BadParse(_)) => match Delivery::unread(&raw, &INBOX) {
            Some(delivery) => INBOX.receive(&state.engine, delivery).await?,
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
        // Acknowledged, or Stripe would retry for days an event the inbox cannot take.
        Receipt::OutsideWindow => (false, None),
        Receipt::Recorded(effect) => (false, Some(effect)),
    };
    Ok(axum::Json(WebhookReceipt { received: true, duplicate, effect }).into_response())
}
