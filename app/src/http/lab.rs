//! `POST /lab/{strategy}/v1/payments`: `POST /v1/payments` under a claim strategy chosen per
//! request, so that one server runs all four side by side (docs/strategies.md). Mounted only in
//! lab mode (`payonce serve --lab`); the contract is `POST /v1/payments`'s.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::post;

use super::error::ApiError;
use super::extract::{Authenticated, Json};
use super::idempotent;
use crate::idempotency::{Busy, IdempotencyKey};
use crate::lab::Claims;
use crate::lab::{LabError, Strategy};
use crate::operations::Op;
use crate::payments::CreatePayment;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/lab/{strategy}/v1/payments", post(create))
}

/// `POST /lab/{strategy}/v1/payments`. An unknown strategy is a 404, like any unknown URL.
async fn create(
    State(state): State<AppState>,
    Path(strategy): Path<String>,
    Authenticated(customer): Authenticated,
    key: IdempotencyKey,
    Json(body): Json<CreatePayment>,
) -> Result<Response, ApiError> {
    let strategy = Strategy::parse(&strategy).ok_or(ApiError::NotFound)?;
    let request = body.validate().map_err(ApiError::invalid_fields)?;
    let request = idempotent::operation(Op::Payment, customer.id, key, &request)?;
    let answer = idempotent::execute_with(&state, Claims::of(strategy), Op::Payment, request).await?;
    Ok(answer.stored.into_response(answer.replayed))
}

impl From<LabError> for ApiError {
    fn from(err: LabError) -> Self {
        match err {
            // A lab strategy's 409 has the engine's shape; "fenced" is an in-flight key too.
            LabError::Busy { retry_after, .. } => Self::InFlight { retry_after, reason: Busy::InFlight },
            LabError::PayloadMismatch => Self::KeyReused(err.to_string()),
            LabError::Process(err) => err.into(),
            LabError::Database(err) => err.into(),
            LabError::Redis(err) => {
                Self::LockServiceUnavailable { detail: err.to_string(), retry_after: Duration::from_secs(1) }
            }
            LabError::Corrupt(_) => Self::Internal(err.to_string()),
        }
    }
}
