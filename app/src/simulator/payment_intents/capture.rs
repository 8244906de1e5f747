//! `POST /v1/payment_intents/{id}/capture`: an authorization (`requires_capture`, from
//! `capture_method=manual`) is captured, all of it or part, as Stripe plays it
//! (<https://docs.stripe.com/api/payment_intents/capture>). Runs under the lock like every write,
//! so the PaymentIntent, the charge, the ledger, the saved result and the events agree.
//!
//! ```text
//! requires_capture ─ capture (amount_to_capture ≤ amount_capturable, default all)
//!                  ─► succeeded: amount_received = captured, the rest released (no Refund, as
//!                     since 2025-03-31.basil); the charge captured; the ledger gets what moved
//! anything else    ─► 400 payment_intent_unexpected_state, the PaymentIntent attached
//! ```

use super::Action;
use super::confirm::render;
use crate::simulator::error::ApiError;
use crate::simulator::events::emit;
use crate::simulator::execution::Ctx;
use crate::simulator::faults::Operation;
use crate::simulator::form::{Form, check_amount, is_list_index, parse_amount};
use crate::simulator::ledger;
use crate::simulator::objects::{PaymentIntent, Status};
use crate::simulator::response::{SavedResponse, to_value};
use crate::simulator::state::{Account, State};

/// The validated parameters of a capture.
#[derive(Clone, Debug)]
pub(super) struct CaptureParams {
    /// Default: all of `amount_capturable`.
    amount_to_capture: Option<i64>,
    /// `expand[]=latest_charge`: render the charge object instead of its id.
    expand_latest_charge: bool,
}

impl Action for CaptureParams {
    const ROUTE: &'static str = "/v1/payment_intents/{id}/capture";
    const OPERATION: Operation = Operation::CapturePaymentIntent;

    fn from_form(form: &Form) -> Result<Self, ApiError> {
        let mut params = Self { amount_to_capture: None, expand_latest_charge: false };
        for param in form.params()? {
            match (param.name, param.inner) {
                ("amount_to_capture", None) => {
                    params.amount_to_capture = Some(parse_amount(param.key, param.value)?);
                }
                ("expand", inner) if is_list_index(inner) => {
                    params.expand_latest_charge |= param.value == "latest_charge"
                }
                _ => return Err(ApiError::parameter_unknown(param.key, "amount_to_capture and expand")),
            }
        }
        Ok(params)
    }

    /// Captures the authorization of PaymentIntent `id`. Refusals are results of execution, saved
    /// and replayed for the key like a capture.
    fn execute(&self, state: &mut State, ctx: &Ctx, id: &str) -> SavedResponse {
        capture_in(state, ctx, id, self).unwrap_or_else(|error| error.saved(ctx.request_id()))
    }
}

fn capture_in(state: &mut State, ctx: &Ctx, id: &str, params: &CaptureParams) -> Result<SavedResponse, ApiError> {
    let amount = {
        let account: &Account = state.account(&ctx.api_key);
        let intent = find(account, id)?;
        capturable(account, intent, params.amount_to_capture)?
    };
    let account = state.account(&ctx.api_key);
    let Some(intent) = account.payment_intents.get_mut(id) else { return Err(missing(id)) };
    intent.capture(amount);
    let intent = intent.clone();
    // An authorization always has its charge; the money moves with it.
    if let Some(charge) = intent.latest_charge.as_ref().and_then(|charge| account.charges.get_mut(charge)) {
        charge.capture(amount);
        let charge = charge.clone();
        state.ledger.record(ledger::Charge::of(&intent, &charge));
        emit(state, &ctx.api_key, "charge.captured", to_value(&charge), None, &ctx.request);
    }
    emit(state, &ctx.api_key, "payment_intent.succeeded", to_value(&intent), None, &ctx.request);
    let account = state.account(&ctx.api_key);
    Ok(SavedResponse::ok(&render(account, &intent, params.expand_latest_charge), "captured"))
}

/// What a capture of `asked` (default: everything capturable) takes, or Stripe's refusal.
fn capturable(account: &Account, intent: &PaymentIntent, asked: Option<i64>) -> Result<i64, ApiError> {
    let refuse = |error: ApiError| error.payment_intent(render(account, intent, false));
    if intent.status != Status::RequiresCapture {
        return Err(refuse(
            ApiError::invalid_request(format!(
                "This PaymentIntent could not be captured because it has a status of {}. Only a PaymentIntent \
                 with one of the following statuses may be captured: requires_capture.",
                intent.status.as_str()
            ))
            .code("payment_intent_unexpected_state"),
        ));
    }
    let amount = asked.unwrap_or(intent.amount_capturable);
    check_amount("amount_to_capture", amount, &intent.currency)?;
    if amount > intent.amount_capturable {
        return Err(refuse(
            ApiError::invalid_request(
                "The payment could not be captured because the requested capture amount is greater than the \
                 amount you can capture for this charge.",
            )
            .code("amount_too_large")
            .param("amount_to_capture"),
        ));
    }
    Ok(amount)
}

/// The PaymentIntent `id` of the caller's account, or Stripe's 404 for an id in the path.
pub(super) fn find<'a>(account: &'a Account, id: &str) -> Result<&'a PaymentIntent, ApiError> {
    account.payment_intents.get(id).ok_or_else(|| missing(id))
}

pub(super) fn missing(id: &str) -> ApiError {
    ApiError::not_found("payment_intent", id, "intent")
}
