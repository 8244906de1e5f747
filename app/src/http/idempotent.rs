//! Making a handler idempotent: the few lines every idempotent endpoint shares.
//!
//! A handler validates its body into a canonical request, builds the engine's [`Operation`] from
//! it (scope and fingerprint), and calls [`execute`] with its [`Idempotent`] implementation. What
//! comes back is the final answer (new, replayed, or refused by the resource) or the reason
//! there is none yet, already shaped as the API's errors (409 + Retry-After, 422, 503).

use std::sync::Arc;

use axum::response::Response;
use serde::Serialize;
use tracing::Instrument;

use super::AppState;
use super::error::ApiError;
use uuid::Uuid;

use crate::idempotency::{Answer, IdempotencyKey, Idempotent, Operation, SubmitError};

/// The engine's operation for a customer's canonical `request` to `POST route` under a client
/// key: its scope and fingerprint. Built the same way for the API and for the pages that reuse
/// an endpoint (the shop's checkout, the dashboard's refund form), so their keys fingerprint alike.
pub fn operation(
    customer_id: Uuid,
    key: IdempotencyKey,
    route: &'static str,
    request: &impl Serialize,
) -> Result<Operation, ApiError> {
    let request = serde_json::to_value(request).map_err(|err| ApiError::Internal(err.to_string()))?;
    Ok(Operation::new(customer_id, key, "POST", route, request))
}

/// Runs `op` through `operation` to its final answer.
///
/// The work runs in its own task. If the client hangs up, axum drops the handler's future; the
/// task keeps going to its next recovery point instead of stopping at an arbitrary await.
pub async fn execute(state: AppState, operation: Arc<dyn Idempotent>, op: Operation) -> Result<Answer, ApiError> {
    let task = async move {
        match state.engine.submit(operation.as_ref(), &op, &state.owner).await {
            Ok(answer) => Ok(answer),
            // The engine's Retry-After, as its `conflict` event recorded it (a live lease capped
            // at the gateway timeout; a backoff or a spent budget exactly when the key may be taken).
            Err(SubmitError::Busy { retry_after, reason }) => Err(ApiError::InFlight { retry_after, reason }),
            Err(SubmitError::Claim(err)) => Err(err.into()),
            Err(SubmitError::Process(err)) => Err(err.into()),
        }
    };
    tokio::spawn(task.in_current_span())
        .await
        .map_err(|err| ApiError::Internal(format!("idempotent task failed: {err}")))?
}

/// [`execute`], answered: the stored response, marked `Idempotent-Replayed` when it is one.
pub async fn respond(state: AppState, operation: Arc<dyn Idempotent>, op: Operation) -> Result<Response, ApiError> {
    let answer = execute(state, operation, op).await?;
    Ok(answer.stored.into_response(answer.replayed))
}
