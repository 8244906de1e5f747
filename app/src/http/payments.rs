//! `/v1/payments`: create (idempotent), show, list.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::extract::{Authenticated, Json, Query};
use crate::idempotency::{Busy, Claim, IdempotencyKey, Operation, StoredResponse};
use crate::lab::Strategy;
use crate::payments::process::{self, ProcessError};
use crate::payments::{self, CreatePayment, NewPayment, PaymentId, store};

pub fn router() -> Router<AppState> {
    Router::new().route(payments::ROUTE, post(create).get(list)).route("/v1/payments/{id}", get(show))
}

/// `POST /v1/payments`.
async fn create(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    key: IdempotencyKey,
    Json(body): Json<CreatePayment>,
) -> Result<Response, ApiError> {
    let request = body.validate().map_err(ApiError::invalid_fields)?;
    let op = operation(customer.id, key, &request)?;
    tracing::debug!(fingerprint = %op.fingerprint.short(), "payment request");
    let answer = execute(state, op).await?;
    Ok(answer.stored.into_response(answer.replayed))
}

/// The idempotent operation of creating `request` for a customer under a client key. The shop's
/// checkout builds its payments here too, so they are fingerprinted exactly like API requests.
pub fn operation(customer_id: Uuid, key: IdempotencyKey, request: &NewPayment) -> Result<Operation, ApiError> {
    let request = serde_json::to_value(request).map_err(|err| ApiError::Internal(err.to_string()))?;
    Ok(Operation::new(customer_id, key, "POST", payments::ROUTE, request))
}

/// The final answer to a payment request.
#[derive(Debug)]
pub struct Answer {
    /// The stored response: a 201 or 202 with the payment, or a final problem (402, 502).
    pub stored: StoredResponse,
    /// Whether it was replayed from an earlier request with the same key.
    pub replayed: bool,
}

/// Runs a payment operation to its final answer, or fails with why it has none yet (in flight,
/// gateway unavailable, …). Used by the API and by the shop's checkout.
///
/// The work runs in its own task. If the client hangs up, axum drops the handler's future; the
/// task keeps going to its next recovery point instead of stopping at an arbitrary await.
pub async fn execute(state: AppState, op: Operation) -> Result<Answer, ApiError> {
    let strategy = state.lab.strategy();
    execute_with(state, strategy, op).await
}

/// [`execute`] under a given claim strategy: `on-conflict` is the engine, any other one the lab's
/// ([`crate::lab`]). The one place the lab meets the payment flow.
pub async fn execute_with(state: AppState, strategy: Strategy, op: Operation) -> Result<Answer, ApiError> {
    let work = async move {
        match strategy {
            Strategy::OnConflict => submit(state, op).await,
            other => {
                let answer = crate::lab::submit(&state.lab, state.engine.pool(), &state.gateway, other, &op).await?;
                Ok(Answer { stored: answer.stored, replayed: answer.replayed })
            }
        }
    };
    tokio::spawn(work.in_current_span())
        .await
        .map_err(|err| ApiError::Internal(format!("payment task failed: {err}")))?
}

/// Claims the key and answers: replay, 409, or drive the work and answer with its result.
async fn submit(state: AppState, op: Operation) -> Result<Answer, ApiError> {
    // Losing the lease mid-way means another worker took over; looking at the key again tells
    // the client what became of it (usually "in flight").
    for _ in 0..3 {
        match state.engine.claim(&op, &state.owner).await? {
            Claim::Completed(stored) => return Ok(Answer { stored, replayed: true }),
            // The engine's Retry-After, as its `conflict` event recorded it: for a live lease, the
            // sooner of its end and the gateway timeout (within which a live holder finishes its
            // call or gives the key back); for a backoff or a spent budget, when it may be taken.
            Claim::InFlight { retry_after, reason } => return Err(ApiError::InFlight { retry_after, reason }),
            Claim::Acquired(lease) => match process::run(&state.gateway, lease).await {
                Ok(stored) => return Ok(Answer { stored, replayed: false }),
                Err(ProcessError::LeaseLost(_)) => continue,
                Err(err) => return Err(err.into()),
            },
        }
    }
    Err(ApiError::InFlight { retry_after: Duration::from_secs(1), reason: Busy::InFlight })
}

/// `GET /v1/payments/{id}`: one of the caller's payments; anyone else's is a 404.
async fn show(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = PaymentId::parse(&id).ok_or(ApiError::NotFound)?;
    let payment = store::find(state.engine.pool(), customer.id, id).await?.ok_or(ApiError::NotFound)?;
    Ok(axum::Json(payment.to_json()).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    limit: Option<u32>,
    starting_after: Option<String>,
}

/// `GET /v1/payments?limit=&starting_after=`: the caller's payments, newest first.
async fn list(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Query(params): Query<ListParams>,
) -> Result<Response, ApiError> {
    let limit = params.limit.unwrap_or(10);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 100"));
    }
    let starting_after = match params.starting_after.as_deref() {
        None => None,
        Some(id) => {
            Some(PaymentId::parse(id).ok_or_else(|| ApiError::invalid("starting_after must be a payment id (pay_…)"))?)
        }
    };
    let (payments, has_more) = store::list(state.engine.pool(), customer.id, limit, starting_after).await?;
    let data: Vec<Value> = payments.iter().map(|p| p.to_json()).collect();
    Ok(axum::Json(json!({"object": "list", "url": payments::ROUTE, "data": data, "has_more": has_more}))
        .into_response())
}
