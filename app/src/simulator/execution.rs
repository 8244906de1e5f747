//! How a call executes: the one pipeline every idempotent write (a PaymentIntent, a refund, a
//! webhook endpoint) and every faulted read goes through.
//!
//! ```text
//! write: authenticate ─► validate ─► idempotency ─┬─ saved, same params ─► replay (latency only)
//!          (401)          (400)                   ├─ in flight ─► 409, other params ─► 400
//!          (by the route)                         └─ claimed ─► draw faults ─► execution task:
//!                                                      delay ─► fail (500, release) | hold ─►
//!                                                      execute + save + ledger + events,
//!                                                      atomically ─► answer | lose the response
//! read:  draw faults ─► delay ─► fail | hold ─► read the state ─► answer | lose the response
//! ```
//!
//! Nothing before the claim is saved; everything after it is, except an injected outage.

use std::time::Duration;

use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::faults::{Action, Operation, Plan};
use super::http::Caller;
use super::idempotency::{Begin, Fingerprint};
use super::jobs;
use super::objects::EventRequest;
use super::response::{Outcome, SavedResponse};
use super::state::{Simulator, State};

/// What an execution knows about its request: who called, with which key, in which generation.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub api_key: String,
    pub idempotency_key: Option<String>,
    /// The `request` of the events this call causes.
    pub request: EventRequest,
    pub epoch: u64,
}

impl Ctx {
    /// The `Request-Id` of the request executing.
    pub fn request_id(&self) -> &str {
        self.request.id.as_deref().unwrap_or_default()
    }
}

/// Runs an idempotent write: the idempotency decision and the fault draw, then `execute` on its
/// own task (so that once it has begun, it finishes even if the client hangs up: that is exactly
/// the case idempotency is for), under the lock, with the result saved for the key.
///
/// `operation` names the call for the faults (`None`: faults never touch it); `payment_method`
/// names the payment method the call is about, for faults scoped to one.
pub(crate) async fn write(
    sim: Simulator,
    caller: Caller,
    operation: Option<Operation>,
    fingerprint: Fingerprint,
    payment_method: impl FnOnce(&State) -> Option<String>,
    execute: impl FnOnce(&mut State, &Ctx) -> SavedResponse + Send + 'static,
) -> Result<Response, ApiError> {
    let Caller { api_key, idempotency_key, request_id } = caller;
    let decision = {
        let mut state = sim.state();
        let payment_method = payment_method(&state);
        let payment_method = payment_method.as_deref();
        let begin = match &idempotency_key {
            Some(key) => state.account(&api_key).keys.begin(key, fingerprint),
            None => Begin::Execute,
        };
        match begin {
            // The decision and the draw share one critical section: two racing requests cannot
            // both claim a key, and `next_calls` counts each execution exactly once.
            Begin::Execute => {
                let plan = operation
                    .map_or_else(Plan::none, |operation| state.faults.plan_execution(operation, payment_method));
                Ok((plan, state.epoch))
            }
            Begin::Replay(saved) => {
                let delay =
                    operation.map_or(Duration::ZERO, |operation| state.faults.replay_delay(operation, payment_method));
                Err(Ok((saved, delay)))
            }
            Begin::InUse => Err(Err(ApiError::idempotency_key_in_use())),
            Begin::Mismatch => Err(Err(ApiError::idempotency_mismatch())),
        }
    };
    let (plan, epoch) = match decision {
        Ok(execute) => execute,
        Err(Ok((saved, delay))) => {
            tokio::time::sleep(delay).await;
            return Ok(saved.respond(true));
        }
        Err(Err(error)) => return Err(error),
    };

    // Reaching execution means the key, if there is one, is now claimed by this request.
    let claim = idempotency_key.clone().map(|key| Claim {
        sim: sim.clone(),
        api_key: api_key.clone(),
        key,
        epoch,
        saved: false,
    });
    let request = EventRequest { id: Some(request_id), idempotency_key };
    let ctx = Ctx { api_key, idempotency_key: request.idempotency_key.clone(), request, epoch };
    let task = tokio::spawn(run(sim, plan, claim, ctx, execute));
    match task.await {
        Ok(response) => Ok(response),
        Err(join_error) => {
            // The claim was dropped with the task, so the key is free for a retry.
            tracing::error!(error = %join_error, "stripe simulator execution task failed");
            Err(ApiError::internal("An unexpected error occurred in the simulator."))
        }
    }
}

async fn run(
    sim: Simulator,
    plan: Plan,
    mut claim: Option<Claim>,
    ctx: Ctx,
    execute: impl FnOnce(&mut State, &Ctx) -> SavedResponse,
) -> Response {
    if let Some(outage) = suffer(plan).await {
        // Nothing executed, nothing saved: dropping the claim frees the key.
        drop(claim);
        return outage;
    }
    let saved = jobs::transact(&sim, |state| {
        if state.epoch != ctx.epoch {
            return None;
        }
        let mut saved = execute(state, &ctx);
        if let Some(claim) = claim.as_mut() {
            saved.original_request = ctx.request.id.clone();
            state.account(&ctx.api_key).keys.save(&claim.key, saved.clone());
            claim.saved = true;
        }
        Some(saved)
    });
    // The lock is released here, before `claim` can be dropped (dropping an unsaved claim takes
    // the lock to release the key).
    drop(claim);
    answer(plan, saved)
}

/// Runs a read under the API faults: `read` sees the state as it is when the delay or hold
/// ends. `payment_method` names the object's payment method, for faults scoped to one.
pub(crate) async fn read(
    sim: &Simulator,
    payment_method: impl FnOnce(&State) -> Option<String>,
    read: impl FnOnce(&State) -> Result<SavedResponse, ApiError>,
) -> Result<Response, ApiError> {
    let plan = {
        let mut state = sim.state();
        let payment_method = payment_method(&state);
        state.faults.plan_execution(Operation::Read, payment_method.as_deref())
    };
    if let Some(outage) = suffer(plan).await {
        return Ok(outage);
    }
    let saved = read(&sim.state())?;
    Ok(answer(plan, Some(saved)))
}

/// Waits the drawn delay, then either answers an injected outage (`Some`) or lets the call go
/// on (`None`), after a hold if one was drawn.
async fn suffer(plan: Plan) -> Option<Response> {
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    match plan.action {
        Action::Fail => {
            let mut response = ApiError::internal(
                "An unknown error occurred. (Injected by the payonce simulator's fail_rate: \
                 nothing was executed or saved, so a retry with the same Idempotency-Key \
                 executes.)",
            )
            .into_response();
            response.extensions_mut().insert(Outcome("fault_fail"));
            Some(response)
        }
        Action::Hold(hold) => {
            tokio::time::sleep(hold).await;
            None
        }
        Action::Execute | Action::LoseResponse => None,
    }
}

/// Answers with the result, or loses it (`drop_after_charge_rate`); `None` means a reset
/// happened meanwhile.
fn answer(plan: Plan, saved: Option<SavedResponse>) -> Response {
    let Some(saved) = saved else {
        return ApiError::internal("The simulator was reset while this request was in flight; nothing was executed.")
            .into_response();
    };
    if plan.action == Action::LoseResponse { saved.lose() } else { saved.respond(false) }
}

/// A held claim on (API key, `Idempotency-Key`), made in state generation `epoch`.
///
/// Dropping a claim that was not saved releases the key. That is what guarantees a key is never
/// left "in use" forever: whether the request hit an injected outage, its task panicked, or the
/// simulator was reset, the claim goes out of scope and the key is free again. A claim from
/// before a reset releases nothing: the store it claimed in is gone.
///
/// Never drop an unsaved claim while holding the simulator's lock: releasing takes the lock.
#[derive(Debug)]
struct Claim {
    sim: Simulator,
    api_key: String,
    key: String,
    epoch: u64,
    saved: bool,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.saved {
            let mut state = self.sim.state();
            if state.epoch == self.epoch
                && let Some(account) = state.accounts.get_mut(&self.api_key)
            {
                account.keys.release(&self.key);
            }
        }
    }
}
