//! The objects the simulator returns, exactly as Stripe's API description defines them, and
//! Stripe-like ids. One builder per object: the routes never spell an object out.
//!
//! Each object carries every property Stripe sends for it, in the version async-stripe pins
//! (the 2026 top-level objects of Stripe's OpenAPI description, the nested ones of 2023): a
//! property Stripe always sends but the simulator never sets (Connect, shipping, reviews,
//! descriptors) is `null` ([`Null`]); one Stripe sends only when it has a value
//! (`refund.failure_reason`, an error's `decline_code`) is left out until it has one; none that
//! Stripe's objects do not have. `app/tests/api/conformance` checks every answer against the
//! description, both ways.

mod charge;
mod event;
mod payment_intent;
mod payment_method;
mod refund;
mod webhook_endpoint;

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub(crate) use charge::{Charge, ChargeStatus};
pub(crate) use event::{Event, EventRequest};
pub(crate) use payment_intent::{AutomaticPaymentMethods, CaptureMethod, Draft, PaymentIntent, Status};
pub(crate) use payment_method::{Brand, Instrument, PaymentMethod};
pub(crate) use refund::{Refund, RefundReason, RefundStatus};
pub(crate) use webhook_endpoint::{DeletedWebhookEndpoint, EndpointDraft, WebhookEndpoint};

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

/// A property Stripe always sends that the simulator never sets: rendered as `null`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Null;

impl Serialize for Null {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_none()
    }
}

/// Stripe's list object: `{"object": "list", "data": […], "has_more": …, "url": "/v1/…"}`.
#[derive(Debug, Serialize)]
pub(crate) struct List<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub has_more: bool,
    pub url: &'static str,
}

impl<T> List<T> {
    pub fn new(data: Vec<T>, has_more: bool, url: &'static str) -> Self {
        Self { object: "list", data, has_more, url }
    }
}

/// Stripe's search result object (`GET /v1/…/search`).
#[derive(Debug, Serialize)]
pub(crate) struct SearchResult<T> {
    pub object: &'static str,
    pub data: Vec<T>,
    pub has_more: bool,
    /// The cursor to pass as `page` for the next page; `null` on the last page.
    pub next_page: Option<String>,
    /// How many objects match in all: sent only when asked for (`expand[]=total_count`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_count: Option<usize>,
    pub url: &'static str,
}

impl<T> SearchResult<T> {
    pub fn new(data: Vec<T>, next_page: Option<String>, total_count: Option<usize>, url: &'static str) -> Self {
        Self { object: "search_result", has_more: next_page.is_some(), data, next_page, total_count, url }
    }
}
