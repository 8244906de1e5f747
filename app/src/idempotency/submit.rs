//! A request's way to its final answer: [`Engine::submit`] claims the key together with the
//! operation's first write and drives it, or replays, or says why not now. It sits above both
//! the claim and the operation's seam, so that neither imports the other's caller.

use std::time::Duration;

use super::claim::{Busy, Claim, ClaimError, Operation};
use super::operation::{ProcessError, Registered};
use super::{Engine, StoredResponse};

/// The final answer to an idempotent request.
#[derive(Debug)]
pub struct Answer {
    /// The stored response (or, for a rejected request, the answer that was not stored).
    pub stored: StoredResponse,
    /// Whether it was replayed from an earlier request with the same key.
    pub replayed: bool,
}

/// Why a request has no final answer yet.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the idempotency key may not be taken now ({})", .reason.as_str())]
    Busy { retry_after: Duration, reason: Busy },
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error(transparent)]
    Process(#[from] ProcessError),
}

impl Engine {
    /// Runs `request` through `operation` to its final answer: claims the key together with the
    /// operation's first write, then drives it; or replays; or says why not now.
    pub async fn submit(
        &self,
        operation: &Registered,
        request: &Operation,
        owner: &str,
    ) -> Result<Answer, SubmitError> {
        // Losing the lease mid-way means another worker took over; looking at the key again
        // tells the client what became of it (usually "in flight").
        for _ in 0..3 {
            match self.claim_with(request, owner, Some(operation)).await? {
                Claim::Completed(stored) => return Ok(Answer { stored, replayed: true }),
                Claim::Rejected(stored) => return Ok(Answer { stored, replayed: false }),
                Claim::InFlight { retry_after, reason } => return Err(SubmitError::Busy { retry_after, reason }),
                Claim::Acquired(lease) => match self.drive(operation, lease).await {
                    Ok(stored) => return Ok(Answer { stored, replayed: false }),
                    Err(ProcessError::LeaseLost(_)) => continue,
                    Err(err) => return Err(err.into()),
                },
            }
        }
        Err(SubmitError::Busy { retry_after: Duration::from_secs(1), reason: Busy::InFlight })
    }
}
