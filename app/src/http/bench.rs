//! `POST /bench/payments`: the payment handler with the idempotency layer bypassed, so the
//! benchmark can show what the layer itself costs. Mounted only with `payonce serve
//! --bench-routes`; it offers none of payonce's guarantees and must never face clients.

use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;

use super::error::ApiError;
use super::extract::{Authenticated, Json};
use crate::payments::CreatePayment;
use crate::payments::process;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/bench/payments", post(create))
}

/// Like `POST /v1/payments`, minus the key: authenticate, validate, insert, charge, update.
async fn create(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Json(body): Json<CreatePayment>,
) -> Result<Response, ApiError> {
    let request = body.validate().map_err(ApiError::invalid_fields)?;
    let stored = process::run_unprotected(&state.gateway, state.engine.pool(), customer.id, &request).await?;
    Ok(stored.into_response(false))
}
