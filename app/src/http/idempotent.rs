//! Making a handler idempotent: the few lines every idempotent endpoint shares.
//!
//! A handler validates its body into a canonical request and calls [`respond`] with its
//! operation's entry in the registry ([`Op`]): the registry says the route (so the key's scope
//! is the one the registry declares, whatever path the handler was mounted on) and holds the
//! [`Idempotent`] that drives it (built once at startup, in the state). What comes back is the
//! final answer (new, replayed, or refused by the resource) or the reason there is none yet,
//! already shaped as the API's errors (409 + Retry-After, 422, 503).
//!
//! Who claims the key was chosen once, at startup ([`Claims`]): the engine, or on a lab server
//! that runs another claim strategy, that strategy for the payments (docs/strategies.md).

use axum::response::Response;
use serde::Serialize;
use tracing::Instrument;
use uuid::Uuid;

use super::error::ApiError;
use crate::idempotency::{Answer, IdempotencyKey, Operation, SubmitError};
use crate::lab::Claims;
use crate::operations::Op;
use crate::state::AppState;

/// The engine's canonical request for `op`: `request` serialised, scoped to the registry's
/// route and fingerprinted.
pub fn operation(
    op: Op,
    customer_id: Uuid,
    key: IdempotencyKey,
    request: &impl Serialize,
) -> Result<Operation, ApiError> {
    let request = serde_json::to_value(request).map_err(|err| ApiError::Internal(err.to_string()))?;
    Ok(Operation::new(customer_id, key, op.method(), op.route(), request))
}

/// Runs `request` of `op` to its final answer, claimed as the server was configured to.
pub async fn execute(state: &AppState, op: Op, request: Operation) -> Result<Answer, ApiError> {
    execute_with(state, state.claims(op), op, request).await
}

/// Runs `request` of `op` to its final answer with `claims` (the lab runs every strategy side by
/// side through here). In a task of its own: a client hanging up does not stop the work. A
/// replay the engine answers from memory has no work to protect, and is answered here.
pub async fn execute_with(state: &AppState, claims: Claims, op: Op, request: Operation) -> Result<Answer, ApiError> {
    if claims == Claims::Engine
        && let Some(stored) = state.engine.replay_from_memory(&request)?
    {
        return Ok(Answer { stored, replayed: true });
    }
    let state = state.clone();
    let task = async move {
        match claims {
            Claims::Engine => {
                let Some(driver) = state.operations.get(op.route()) else {
                    return Err(ApiError::Internal(format!("no operation is registered for {}", op.route())));
                };
                match state.engine.submit(driver, &request, &state.owner).await {
                    Ok(answer) => Ok(answer),
                    // The engine's Retry-After, as its `conflict` event recorded it (a live lease capped
                    // at the gateway timeout; a backoff or a spent budget exactly when the key may be taken).
                    Err(SubmitError::Busy { retry_after, reason }) => Err(ApiError::InFlight { retry_after, reason }),
                    Err(SubmitError::Claim(err)) => Err(err.into()),
                    Err(SubmitError::Process(err)) => Err(err.into()),
                }
            }
            Claims::Lab(strategy) => {
                let answer =
                    crate::lab::submit(&state.lab, state.engine.pool(), &state.gateway, strategy, &request).await?;
                Ok(Answer { stored: answer.stored, replayed: answer.replayed })
            }
        }
    };
    tokio::spawn(task.in_current_span())
        .await
        .map_err(|err| ApiError::Internal(format!("idempotent task failed: {err}")))?
}

/// The whole of an idempotent handler once its body is valid: `request` of `op` for
/// `customer_id` under `key`, run to its final answer, as the response (replays marked).
pub async fn respond(
    state: &AppState,
    op: Op,
    customer_id: Uuid,
    key: IdempotencyKey,
    request: &impl Serialize,
) -> Result<Response, ApiError> {
    let answer = execute(state, op, operation(op, customer_id, key, request)?).await?;
    Ok(answer.stored.into_response(answer.replayed))
}
