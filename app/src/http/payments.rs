//! `/v1/payments`: create (idempotent), show, list.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;
use uuid::Uuid;

use super::error::ApiError;
use super::extract::{Authenticated, Json, Query};
use super::{AppState, idempotent};
pub use crate::idempotency::Answer;
use crate::idempotency::{IdempotencyKey, Operation};
use crate::lab::Strategy;
use crate::payments::process::Payments;
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

/// Runs a payment operation to its final answer, or fails with why it has none yet (in flight,
/// gateway unavailable, …). Used by the API and by the shop's checkout.
pub async fn execute(state: AppState, op: Operation) -> Result<Answer, ApiError> {
    let strategy = state.lab.strategy();
    execute_with(state, strategy, op).await
}

/// [`execute`] under a given claim strategy: `on-conflict` is the engine, any other one the lab's
/// ([`crate::lab`]). The one place the lab meets the payment flow.
pub async fn execute_with(state: AppState, strategy: Strategy, op: Operation) -> Result<Answer, ApiError> {
    match strategy {
        Strategy::OnConflict => {
            let payments = Arc::new(Payments::new(state.gateway.clone()));
            idempotent::execute(state, payments, op).await
        }
        other => {
            // In a task of its own, as the engine's path is: a client hanging up does not stop it.
            let work = async move {
                let answer = crate::lab::submit(&state.lab, state.engine.pool(), &state.gateway, other, &op).await?;
                Ok(Answer { stored: answer.stored, replayed: answer.replayed })
            };
            tokio::spawn(work.in_current_span())
                .await
                .map_err(|err| ApiError::Internal(format!("payment task failed: {err}")))?
        }
    }
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
