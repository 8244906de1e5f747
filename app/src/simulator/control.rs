//! The control routes under `/_sim`: read the ledger, set faults, reset. They exist only on the
//! simulator's own router and need no API key (the simulator is a test tool).
//!
//! ```text
//! GET  /_sim/charges   {"charges": [Charge, …]}  every successful charge, in order
//! GET  /_sim/faults    the current Faults (with the remaining next_calls)
//! PUT  /_sim/faults    replace the Faults (JSON); 400 with a message if invalid
//! POST /_sim/reset     forget everything: ledger, objects, saved results, faults
//! ```

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

use super::error::ApiError;
use super::{Charge, Faults, Simulator};

pub(super) fn router() -> Router<Simulator> {
    Router::new()
        .route("/_sim/charges", get(charges))
        .route("/_sim/faults", get(faults).put(set_faults))
        .route("/_sim/reset", post(reset))
}

#[derive(Serialize)]
struct Charges {
    charges: Vec<Charge>,
}

async fn charges(State(sim): State<Simulator>) -> Json<Charges> {
    Json(Charges { charges: sim.charges() })
}

async fn faults(State(sim): State<Simulator>) -> Json<Faults> {
    Json(sim.faults())
}

/// The body is parsed here rather than by axum's `Json` extractor so that every problem (no
/// `Content-Type`, bad JSON, an unknown field, a rate of 1.5) is one 400 with one message
/// format, the same error envelope as the Stripe routes.
async fn set_faults(
    State(sim): State<Simulator>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Faults>, ApiError> {
    let body = body?;
    // `Json::from_bytes` names the offending field ("latency_ms: invalid value: integer `-5`,
    // expected u64") and, unlike the extractor, does not insist on a `Content-Type`.
    let Json(faults) = Json::<Faults>::from_bytes(&body)
        .map_err(|rejection| ApiError::invalid_request(format!("Invalid faults JSON: {}", rejection.body_text())))?;
    sim.set_faults(faults).map_err(|error| ApiError::invalid_request(format!("Invalid faults: {error}")))?;
    Ok(Json(sim.faults()))
}

async fn reset(State(sim): State<Simulator>) -> StatusCode {
    sim.reset();
    StatusCode::NO_CONTENT
}
