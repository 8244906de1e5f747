//! `/v1/refunds`: create (idempotent), show, list. The create handler is the whole of what an
//! endpoint needs to be idempotent: validate, build the [`Operation`], [`idempotent::respond`].

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::extract::{Authenticated, Json, Query};
use super::{AppState, idempotent};
use crate::idempotency::{IdempotencyKey, Operation};
use crate::payments::PaymentId;
use crate::refunds::{self, CreateRefund, RefundId, Refunds, store};

pub fn router() -> Router<AppState> {
    Router::new().route(refunds::ROUTE, post(create).get(list)).route("/v1/refunds/{id}", get(show))
}

/// `POST /v1/refunds`.
async fn create(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    key: IdempotencyKey,
    Json(body): Json<CreateRefund>,
) -> Result<Response, ApiError> {
    let request = body.validate().map_err(ApiError::invalid_fields)?;
    let request = serde_json::to_value(&request).map_err(|err| ApiError::Internal(err.to_string()))?;
    let op = Operation::new(customer.id, key, "POST", refunds::ROUTE, request);
    let operation = Arc::new(Refunds::new(state.gateway.clone()));
    idempotent::respond(state, operation, op).await
}

/// `GET /v1/refunds/{id}`: one of the caller's refunds; anyone else's is a 404.
async fn show(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = RefundId::parse(&id).ok_or(ApiError::NotFound)?;
    let refund = store::find(state.engine.pool(), customer.id, id).await?.ok_or(ApiError::NotFound)?;
    Ok(axum::Json(refund.to_json()).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    payment: Option<String>,
    limit: Option<u32>,
    starting_after: Option<String>,
}

/// `GET /v1/refunds?payment=&limit=&starting_after=`: the caller's refunds (of one payment),
/// newest first.
async fn list(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Query(params): Query<ListParams>,
) -> Result<Response, ApiError> {
    let limit = params.limit.unwrap_or(10);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 100"));
    }
    let payment = match params.payment.as_deref() {
        None => None,
        Some(id) => {
            Some(PaymentId::parse(id).ok_or_else(|| ApiError::invalid("payment must be a payment id (pay_…)"))?)
        }
    };
    let starting_after = match params.starting_after.as_deref() {
        None => None,
        Some(id) => {
            Some(RefundId::parse(id).ok_or_else(|| ApiError::invalid("starting_after must be a refund id (re_…)"))?)
        }
    };
    let (refunds, has_more) = store::list(state.engine.pool(), customer.id, payment, limit, starting_after).await?;
    let data: Vec<Value> = refunds.iter().map(|r| r.to_json()).collect();
    Ok(axum::Json(json!({"object": "list", "url": refunds::ROUTE, "data": data, "has_more": has_more})).into_response())
}
