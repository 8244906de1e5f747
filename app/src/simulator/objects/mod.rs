//! The objects the simulator returns, shaped like Stripe's JSON, and Stripe-like ids.
//!
//! async-stripe parses responses strictly: every field its types do not wrap in `Option` must be
//! present (a PaymentIntent's `amount_capturable`, a Charge's `billing_details`, …), or the call
//! fails with a deserialisation error. Each object here carries at least those, plus the fields a
//! developer looks at first, rendered `null` where the simulator has nothing to say.

mod charge;
mod event;
mod payment_intent;
mod refund;
mod webhook_endpoint;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub(crate) use charge::{Charge, ChargeStatus};
pub(crate) use event::{Event, EventData, EventRequest};
pub(crate) use payment_intent::{AutomaticPaymentMethods, PaymentIntent, Status};
pub(crate) use refund::{Refund, RefundReason};
pub(crate) use webhook_endpoint::{DeletedWebhookEndpoint, WebhookEndpoint};

/// A Stripe-like id: `prefix_` + 24 alphanumerics, e.g. `pi_3PqLk2…`.
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_alphanumeric(24))
}

pub(crate) fn random_alphanumeric(len: usize) -> String {
    // Ids only need to be unique, not unguessable: 62^24 makes a collision practically impossible.
    std::iter::repeat_with(fastrand::alphanumeric).take(len).collect()
}

/// Unix seconds, as Stripe's `created` fields.
pub(crate) fn now() -> i64 {
    // A clock before 1970 is a broken machine, not a client error; 0 keeps the simulator serving.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

/// Stripe's list object: `{"object": "list", "data": […], "has_more": …, "url": "/v1/…"}`.
#[derive(Debug, Serialize)]
pub(crate) struct List<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub has_more: bool,
    pub url: &'static str,
}

/// Stripe's search result object (`GET /v1/…/search`).
#[derive(Debug, Serialize)]
pub(crate) struct SearchResult<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub has_more: bool,
    /// The cursor to pass as `page` for the next page; `null` on the last page.
    pub next_page: Option<String>,
    pub url: &'static str,
}
