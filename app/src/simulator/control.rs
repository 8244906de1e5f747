//! The control routes under `/_sim`, and their Rust equivalents on [`Simulator`]. They exist
//! only on the simulator's own router and need no API key (the simulator is a test tool).
//!
//! ```text
//! GET  /_sim/charges    {"ledger": id, "total": n, "charges": [Charge, …]}  every successful
//!                       charge, in order; `?from=N`: only those after the first N (`total`
//!                       counts them all), for a reader that keeps what it has seen (the
//!                       dashboard's audit) and knows by `ledger` when a reset or a restart
//!                       made it a new ledger
//! GET  /_sim/refunds    {"refunds": [Refund, …]}  every successful refund, in order
//! GET  /_sim/events     {"events": [EventRecord, …]}  every event, its deliveries and attempts
//! GET  /_sim/faults     the current Faults (with the remaining next_calls)
//! PUT  /_sim/faults     replace the Faults (JSON); 400 with a message if invalid
//! GET  /_sim/settings   the current Settings (processing time, delivery policy)
//! PUT  /_sim/settings   replace the Settings (JSON); 400 with a message if invalid
//! POST /_sim/reset      forget everything but webhook endpoints: ledger, objects, events, saved
//!                       results, faults, settings
//! POST /_sim/payment_intents/{id}/authenticate  {"outcome": "succeed"|"fail"}: the customer
//!                       answers 3-D Secure
//! POST /_sim/payment_intents/{id}/expire_authorization  an authorization (`requires_capture`)
//!                       expires, as Stripe lets it after 7 days: `canceled`, reason `expired`
//! POST /_sim/refunds/{id}/settle  {"outcome": "succeed"|"fail"}: a pending (bank debit) refund
//!                       settles now
//! POST /_sim/refunds/{id}/fail  {"failure_reason"?: …}: a succeeded refund fails afterwards
//!                       (the card expired or was closed), `refund.failed`; it leaves the ledger
//! POST /_sim/webhooks/release  {"order": "reverse"|"shuffle"|"fifo"}: send the held deliveries
//! ```

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::faults::{Faults, FaultsError};
use super::jobs;
use super::ledger::{Charge, Refund};
use super::payment_intents;
use super::refunds;
use super::response::SavedResponse;
use super::state::{Settings, SettingsError, Simulator, State as SimState};
use super::webhooks::delivery;
use super::webhooks::log::{DeliveryState, EventRecord};

pub(crate) fn router() -> Router<Simulator> {
    Router::new()
        .route("/_sim/charges", get(charges))
        .route("/_sim/refunds", get(refunds))
        .route("/_sim/events", get(events))
        .route("/_sim/faults", get(faults).put(set_faults))
        .route("/_sim/settings", get(settings).put(set_settings))
        .route("/_sim/reset", post(reset))
        .route("/_sim/payment_intents/{id}/authenticate", post(authenticate))
        .route("/_sim/payment_intents/{id}/expire_authorization", post(expire_authorization))
        .route("/_sim/refunds/{id}/settle", post(settle_refund))
        .route("/_sim/refunds/{id}/fail", post(fail_refund))
        .route("/_sim/webhooks/release", post(release))
}

impl Simulator {
    /// A snapshot of the ledger: every successful charge, in the order they were made.
    pub fn charges(&self) -> Vec<Charge> {
        self.charges_from(0).2
    }

    /// The ledger's id, how many charges it holds, and those after the first `from`.
    pub fn charges_from(&self, from: usize) -> (String, usize, Vec<Charge>) {
        let state = self.state();
        let charges = state.ledger.charges();
        (state.ledger.id(), charges.len(), charges.get(from..).unwrap_or_default().to_vec())
    }

    /// Every successful refund, in the order they were made.
    pub fn refunds(&self) -> Vec<Refund> {
        self.state().ledger.refunds().to_vec()
    }

    /// Every event, with its deliveries and their attempts.
    pub fn events(&self) -> Vec<EventRecord> {
        self.state().events.records().to_vec()
    }

    /// The faults in force (with `next_calls` showing how many calls remain).
    pub fn faults(&self) -> Faults {
        self.state().faults.faults().clone()
    }

    /// Replaces the faults after validating them; on error the current faults stay.
    pub fn set_faults(&self, faults: Faults) -> Result<(), FaultsError> {
        self.state().faults.set(faults)
    }

    /// The knobs in force.
    pub fn settings(&self) -> Settings {
        self.state().settings.clone()
    }

    /// Replaces the settings after validating them; on error the current settings stay.
    pub fn set_settings(&self, settings: Settings) -> Result<(), SettingsError> {
        settings.validate()?;
        self.state().settings = settings;
        Ok(())
    }

    /// Forgets everything but the webhook endpoints: ledger, objects, events, saved results,
    /// claims, held deliveries, faults and settings. Requests in flight are answered with a 500
    /// and execute nothing; timers and deliveries in flight stop (see `State::epoch`).
    ///
    /// Webhook endpoints are configuration, not test data: a server registers its endpoint once,
    /// at startup (`payonce serve`, `payonce stripe-sim --webhook-url`), and would miss every
    /// later event if a reset (the dashboard's, a workshop's) dropped it.
    pub fn reset(&self) {
        let mut state = self.state();
        let endpoints: Vec<_> = state
            .accounts
            .iter_mut()
            .map(|(api_key, account)| (api_key.clone(), std::mem::take(&mut account.webhook_endpoints)))
            .filter(|(_, endpoints)| !endpoints.is_empty())
            .collect();
        *state = SimState { epoch: state.epoch + 1, ..SimState::default() };
        for (api_key, endpoints) in endpoints {
            state.account(&api_key).webhook_endpoints = endpoints;
        }
    }
}

#[derive(Serialize)]
struct Charges {
    ledger: String,
    total: usize,
    charges: Vec<Charge>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChargesQuery {
    #[serde(default)]
    from: usize,
}

async fn charges(
    State(sim): State<Simulator>,
    query: Result<Query<ChargesQuery>, QueryRejection>,
) -> Result<Json<Charges>, ApiError> {
    let Query(ChargesQuery { from }) =
        query.map_err(|rejection| ApiError::invalid_request(format!("Invalid query: {}", rejection.body_text())))?;
    let (ledger, total, charges) = sim.charges_from(from);
    Ok(Json(Charges { ledger, total, charges }))
}

#[derive(Serialize)]
struct Refunds {
    refunds: Vec<Refund>,
}

async fn refunds(State(sim): State<Simulator>) -> Json<Refunds> {
    Json(Refunds { refunds: sim.refunds() })
}

#[derive(Serialize)]
struct Events {
    events: Vec<EventRecord>,
}

async fn events(State(sim): State<Simulator>) -> Json<Events> {
    Json(Events { events: sim.events() })
}

async fn faults(State(sim): State<Simulator>) -> Json<Faults> {
    Json(sim.faults())
}

/// Bodies are parsed here rather than by axum's `Json` extractor so that every problem (no
/// `Content-Type`, bad JSON, an unknown field, a rate of 1.5) is one 400 with one message
/// format, the same error envelope as the Stripe routes.
fn parse_json<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>, what: &str) -> Result<T, ApiError> {
    let body = body?;
    // `Json::from_bytes` names the offending field ("latency_ms: invalid value: integer `-5`,
    // expected u64") and, unlike the extractor, does not insist on a `Content-Type`.
    let Json(value) = Json::<T>::from_bytes(&body)
        .map_err(|rejection| ApiError::invalid_request(format!("Invalid {what} JSON: {}", rejection.body_text())))?;
    Ok(value)
}

async fn set_faults(
    State(sim): State<Simulator>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Faults>, ApiError> {
    let faults = parse_json(body, "faults")?;
    sim.set_faults(faults).map_err(|error| ApiError::invalid_request(format!("Invalid faults: {error}")))?;
    Ok(Json(sim.faults()))
}

async fn settings(State(sim): State<Simulator>) -> Json<Settings> {
    Json(sim.settings())
}

async fn set_settings(
    State(sim): State<Simulator>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Settings>, ApiError> {
    let settings = parse_json(body, "settings")?;
    sim.set_settings(settings).map_err(|error| ApiError::invalid_request(format!("Invalid settings: {error}")))?;
    Ok(Json(sim.settings()))
}

async fn reset(State(sim): State<Simulator>) -> StatusCode {
    sim.reset();
    StatusCode::NO_CONTENT
}

/// The body of a control call that ends something pending as the outside world decides:
/// `{"outcome": "succeed" | "fail"}` (the customer's 3-D Secure, the bank's settlement).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    outcome: DecisionOutcome,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum DecisionOutcome {
    Succeed,
    Fail,
}

/// Whether the decision in `body` (named `what` in its errors) is to succeed.
fn succeeds(body: Result<Bytes, BytesRejection>, what: &str) -> Result<bool, ApiError> {
    let Decision { outcome } = parse_json(body, what)?;
    Ok(matches!(outcome, DecisionOutcome::Succeed))
}

/// The customer completes (or fails) 3-D Secure; answers the PaymentIntent as it now is.
async fn authenticate(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let succeed = succeeds(body, "authentication")?;
    let intent = jobs::transact(&sim, |state| payment_intents::authenticate(state, &id, succeed))?;
    Ok(SavedResponse::ok(&intent, "authenticated").respond(false))
}

/// The authorization of a PaymentIntent expires now; answers the PaymentIntent as it now is.
async fn expire_authorization(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let intent = jobs::transact(&sim, |state| payment_intents::expire_authorization(state, &id))?;
    Ok(SavedResponse::ok(&intent, "expired").respond(false))
}

/// A pending (bank debit) refund settles now, as the bank says; answers the refund as it now is.
async fn settle_refund(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let succeed = succeeds(body, "settlement")?;
    let refund = jobs::transact(&sim, |state| refunds::settle(state, &id, succeed))?;
    Ok(SavedResponse::ok(&refund, "settled").respond(false))
}

/// Why a succeeded refund failed afterwards: one of Stripe's `failure_reason` values for a refund
/// that could not reach the customer.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Reversal {
    #[serde(default = "Reversal::default_reason")]
    failure_reason: ReversalReason,
}

impl Reversal {
    fn default_reason() -> ReversalReason {
        ReversalReason::ExpiredOrCanceledCard
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ReversalReason {
    ExpiredOrCanceledCard,
    LostOrStolenCard,
    Unknown,
}

impl ReversalReason {
    fn as_str(&self) -> &'static str {
        match self {
            Self::ExpiredOrCanceledCard => "expired_or_canceled_card",
            Self::LostOrStolenCard => "lost_or_stolen_card",
            Self::Unknown => "unknown",
        }
    }
}

/// A succeeded refund fails afterwards; answers the refund as it now is.
async fn fail_refund(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path?;
    let Reversal { failure_reason } = match &body {
        Ok(bytes) if bytes.is_empty() => Reversal { failure_reason: Reversal::default_reason() },
        _ => parse_json(body, "reversal")?,
    };
    let refund = jobs::transact(&sim, |state| refunds::fail_after_success(state, &id, failure_reason.as_str()))?;
    Ok(SavedResponse::ok(&refund, "failed").respond(false))
}

#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Release {
    order: ReleaseOrder,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ReleaseOrder {
    /// Newest first: the order that most often breaks a state machine.
    #[default]
    Reverse,
    /// Seeded by the faults' `seed`.
    Shuffle,
    /// The order the events happened in.
    Fifo,
}

#[derive(Serialize)]
struct Released {
    released: usize,
}

/// Sends every held delivery, one after another in the order asked (an empty body: reverse).
async fn release(
    State(sim): State<Simulator>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Released>, ApiError> {
    let body = body?;
    let Release { order } = if body.is_empty() { Release::default() } else { parse_json(Ok(body), "release")? };
    let jobs = {
        let mut state = sim.state();
        let mut jobs = std::mem::take(&mut state.held);
        match order {
            ReleaseOrder::Reverse => jobs.reverse(),
            ReleaseOrder::Shuffle => state.faults.shuffle(&mut jobs),
            ReleaseOrder::Fifo => {}
        }
        for job in &jobs {
            if let Some(delivery) = state.events.delivery_mut(job.at) {
                delivery.state = DeliveryState::Pending;
            }
        }
        jobs
    };
    let released = jobs.len();
    tokio::spawn(delivery::release(sim, jobs));
    Ok(Json(Released { released }))
}
