//! `GET /v1/charges/{id}`: a PaymentIntent's charge, with its `amount_refunded`/`refunded`.

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;

use super::error::ApiError;
use super::execution;
use super::http::api_key;
use super::response::SavedResponse;
use super::state::{Simulator, State as SimState};

pub(crate) fn router() -> Router<Simulator> {
    Router::new().route("/v1/charges/{id}", get(retrieve))
}

async fn retrieve(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let Path(id) = path?;
    let payment_method =
        |state: &SimState| Some(state.accounts.get(&api_key)?.charges.get(&id)?.payment_method.clone());
    let read = |state: &SimState| {
        let charge = state.accounts.get(&api_key).and_then(|account| account.charges.get(&id));
        let charge = charge.ok_or_else(|| ApiError::not_found("charge", &id, "id"))?;
        Ok(SavedResponse::ok(charge, "charge"))
    };
    execution::read(&sim, payment_method, read).await
}
