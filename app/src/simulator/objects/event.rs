//! The Event (<https://docs.stripe.com/api/events/object>).

use serde::Serialize;

/// The API request that caused an event: its `Request-Id` and `Idempotency-Key`. Both are `null`
/// for an event caused by something else (a bank debit settling, the customer authenticating).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct EventRequest {
    pub id: Option<String>,
    pub idempotency_key: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct EventData {
    /// The object as it was at the moment of the event.
    pub object: serde_json::Value,
    /// For `*.updated` events, the changed fields' previous values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_attributes: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Event {
    /// `evt_` + 24 alphanumerics.
    pub id: String,
    pub object: &'static str,
    /// The API version `data.object` is rendered in: the one async-stripe pins.
    pub api_version: &'static str,
    pub created: i64,
    pub data: EventData,
    pub livemode: bool,
    /// Endpoints that have not yet answered 2xx for this event.
    pub pending_webhooks: i64,
    pub request: EventRequest,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl Event {
    /// An event of type `kind` about `object` (a snapshot), rendered in `api_version`.
    pub fn new(
        kind: &'static str,
        api_version: &'static str,
        object: serde_json::Value,
        previous_attributes: Option<serde_json::Value>,
        pending_webhooks: usize,
        request: EventRequest,
    ) -> Self {
        Self {
            id: super::new_id("evt"),
            object: "event",
            api_version,
            created: super::now(),
            data: EventData { object, previous_attributes },
            livemode: false,
            pending_webhooks: i64::try_from(pending_webhooks).unwrap_or(i64::MAX),
            request,
            kind,
        }
    }
}
