//! The record of every event and its deliveries (`GET /_sim/events`), and what a delivery task
//! needs to send one. Data only: `delivery` does the sending.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use serde::{Deserialize, Serialize};

use crate::simulator::objects::EventRequest;

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Being sent, or waiting for its next retry.
    Pending,
    /// Waiting for `POST /_sim/webhooks/release` (the `webhook_hold` fault).
    Held,
    /// The endpoint answered 2xx.
    Delivered,
    /// Every attempt failed; it is never sent again.
    Failed,
    /// Lost (the `webhook_drop_rate` fault): never sent, never retried.
    Dropped,
}

/// One HTTP attempt at a delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// When it was sent, in Unix milliseconds.
    pub at_ms: i64,
    /// The endpoint's HTTP status, if it answered.
    pub status: Option<u16>,
    /// Why there was no answer (timeout, connection refused, …), if there was none.
    pub error: Option<String>,
    /// From sending the request to the end of the answer (or the error).
    pub duration_ms: u64,
}

/// One event sent to one endpoint (a duplicated event has two).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// `we_…`
    pub endpoint: String,
    pub url: String,
    /// The second delivery of a duplicated event (`webhook_duplicate_rate`).
    pub duplicate: bool,
    pub state: DeliveryState,
    pub attempts: Vec<Attempt>,
}

/// An event as `GET /_sim/events` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    /// `evt_…`
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub created: i64,
    /// The request that caused it (both `null` for an asynchronous transition).
    pub request: RecordRequest,
    pub deliveries: Vec<Delivery>,
}

/// [`EventRequest`] in the public record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordRequest {
    pub id: Option<String>,
    pub idempotency_key: Option<String>,
}

impl From<&EventRequest> for RecordRequest {
    fn from(request: &EventRequest) -> Self {
        Self { id: request.id.clone(), idempotency_key: request.idempotency_key.clone() }
    }
}

/// Every event, in creation order, across API keys.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    records: Vec<EventRecord>,
    positions: HashMap<String, usize>,
}

impl EventLog {
    pub fn push(&mut self, record: EventRecord) -> usize {
        let position = self.records.len();
        self.positions.insert(record.id.clone(), position);
        self.records.push(record);
        position
    }

    pub fn records(&self) -> &[EventRecord] {
        &self.records
    }

    pub fn delivery_mut(&mut self, at: DeliveryAt) -> Option<&mut Delivery> {
        self.records.get_mut(at.event)?.deliveries.get_mut(at.delivery)
    }

    /// Whether another delivery of the same event to the same endpoint (a duplicate) has
    /// already been answered 2xx.
    pub fn delivered_elsewhere(&self, at: DeliveryAt) -> bool {
        let Some(record) = self.records.get(at.event) else {
            return false;
        };
        let Some(this) = record.deliveries.get(at.delivery) else {
            return false;
        };
        record.deliveries.iter().enumerate().any(|(index, other)| {
            index != at.delivery && other.endpoint == this.endpoint && other.state == DeliveryState::Delivered
        })
    }
}

/// Where a delivery's record is in the [`EventLog`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeliveryAt {
    pub event: usize,
    pub delivery: usize,
}

/// Everything a delivery task needs, taken out of the state so that sending needs no lock.
#[derive(Clone, Debug)]
pub(crate) struct DeliveryJob {
    pub at: DeliveryAt,
    /// The account the event belongs to (to count `pending_webhooks` down). Never logged.
    pub api_key: String,
    pub event_id: String,
    /// `we_…`: deleting the endpoint stops the delivery.
    pub endpoint_id: String,
    pub url: String,
    /// The endpoint's `whsec_…` secret.
    pub secret: String,
    /// The event's JSON, exactly as signed and sent.
    pub payload: Bytes,
    /// Wait before each attempt (`webhook_delay_ms`).
    pub delay: Duration,
    /// The state generation the event belongs to: a reset stops the delivery.
    pub epoch: u64,
}
