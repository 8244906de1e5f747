//! `POST /v1/payment_intents/{id}/cancel` (<https://docs.stripe.com/api/payment_intents/cancel>),
//! and an authorization that expires (`POST /_sim/payment_intents/{id}/expire_authorization`,
//! what Stripe does to an uncaptured PaymentIntent after 7 days). Both end in `canceled`; an
//! authorization is released, which moves no money: the ledger is untouched, and (as since
//! 2025-03-31.basil) no Refund is made and the charge is not marked refunded.
//!
//! ```text
//! requires_payment_method, requires_confirmation, requires_action, requires_capture
//!     ─ cancel ─► canceled (cancellation_reason as sent, or null)      payment_intent.canceled
//! requires_capture
//!     ─ expire ─► canceled (cancellation_reason: expired)    charge.expired, payment_intent.canceled
//! processing, succeeded, canceled ─ cancel ─► 400 payment_intent_unexpected_state
//! ```

use serde_json::Value;

use super::Action;
use super::capture::{find, missing};
use super::confirm::render;
use crate::simulator::error::ApiError;
use crate::simulator::events::emit;
use crate::simulator::execution::Ctx;
use crate::simulator::faults::Operation;
use crate::simulator::form::{Form, invalid_enum, is_list_index};
use crate::simulator::objects::{EventRequest, PaymentIntent, Status};
use crate::simulator::response::{SavedResponse, to_value};
use crate::simulator::state::{Account, State};

/// The reasons Stripe accepts on a cancel call.
const REASONS: &[&str] = &["abandoned", "duplicate", "fraudulent", "requested_by_customer"];

/// The validated parameters of a cancel.
#[derive(Clone, Debug)]
pub(super) struct CancelParams {
    cancellation_reason: Option<&'static str>,
    expand_latest_charge: bool,
}

impl Action for CancelParams {
    const ROUTE: &'static str = "/v1/payment_intents/{id}/cancel";
    const OPERATION: Operation = Operation::CancelPaymentIntent;

    fn from_form(form: &Form) -> Result<Self, ApiError> {
        let mut params = Self { cancellation_reason: None, expand_latest_charge: false };
        for param in form.params()? {
            match (param.name, param.inner) {
                ("cancellation_reason", None) if param.value.is_empty() => params.cancellation_reason = None,
                ("cancellation_reason", None) => {
                    let reason = REASONS.iter().find(|reason| **reason == param.value).copied();
                    params.cancellation_reason =
                        Some(reason.ok_or_else(|| invalid_enum(param.key, param.value, &REASONS.join(", ")))?);
                }
                ("expand", inner) if is_list_index(inner) => {
                    params.expand_latest_charge |= param.value == "latest_charge"
                }
                _ => return Err(ApiError::parameter_unknown(param.key, "cancellation_reason and expand")),
            }
        }
        Ok(params)
    }

    /// Cancels PaymentIntent `id`. Refusals are results of execution, saved and replayed for the key.
    fn execute(&self, state: &mut State, ctx: &Ctx, id: &str) -> SavedResponse {
        cancel_in(state, ctx, id, self).unwrap_or_else(|error| error.saved(ctx.request_id()))
    }
}

fn cancel_in(state: &mut State, ctx: &Ctx, id: &str, params: &CancelParams) -> Result<SavedResponse, ApiError> {
    {
        let account: &Account = state.account(&ctx.api_key);
        cancelable(account, find(account, id)?)?;
    }
    let intent = end(state, &ctx.api_key, id, params.cancellation_reason).ok_or_else(|| missing(id))?;
    emit(state, &ctx.api_key, "payment_intent.canceled", to_value(&intent), None, &ctx.request);
    let account = state.account(&ctx.api_key);
    Ok(SavedResponse::ok(&render(account, &intent, params.expand_latest_charge), "canceled"))
}

/// Whether Stripe cancels a PaymentIntent in its status, or its refusal.
fn cancelable(account: &Account, intent: &PaymentIntent) -> Result<(), ApiError> {
    let message = match intent.status {
        Status::RequiresPaymentMethod
        | Status::RequiresConfirmation
        | Status::RequiresAction
        | Status::RequiresCapture => {
            return Ok(());
        }
        // Stripe cancels a processing PaymentIntent only "in rare cases", none of which is a
        // bank debit already submitted to the bank: the simulator's only processing payments.
        Status::Processing => "You cannot cancel this PaymentIntent because it has a status of processing: its \
                               bank debit has been submitted to the bank and can no longer be canceled."
            .to_owned(),
        Status::Succeeded | Status::Canceled => format!(
            "You cannot cancel this PaymentIntent because it has a status of {}. Only a PaymentIntent with one of \
             the following statuses may be canceled: requires_payment_method, requires_capture, \
             requires_confirmation, requires_action, processing.",
            intent.status.as_str()
        ),
    };
    Err(ApiError::invalid_request(message)
        .code("payment_intent_unexpected_state")
        .payment_intent(render(account, intent, false)))
}

/// Cancels PaymentIntent `id` of `api_key`'s account for `reason`; the PaymentIntent as it now is.
fn end(state: &mut State, api_key: &str, id: &str, reason: Option<&'static str>) -> Option<PaymentIntent> {
    let intent = state.account(api_key).payment_intents.get_mut(id)?;
    intent.cancel(reason);
    Some(intent.clone())
}

/// The authorization of PaymentIntent `id` (of any API key) expires, as Stripe lets it after 7
/// days: `canceled` with `cancellation_reason: expired` (the value since 2025-03-31.basil, which
/// replaced `automatic`), `charge.expired` and `payment_intent.canceled`, caused by no request.
/// Answers the PaymentIntent as it now is; 400 if it holds no authorization.
pub(crate) fn expire_authorization(state: &mut State, id: &str) -> Result<Value, ApiError> {
    let api_key = state.owner(|account| account.payment_intents.contains_key(id)).ok_or_else(|| missing(id))?;
    {
        let account: &Account = state.account(&api_key);
        let intent = find(account, id)?;
        if intent.status != Status::RequiresCapture {
            return Err(ApiError::invalid_request(format!(
                "This PaymentIntent holds no authorization to expire: it has a status of {}.",
                intent.status.as_str()
            ))
            .code("payment_intent_unexpected_state"));
        }
    }
    let intent = end(state, &api_key, id, Some("expired")).ok_or_else(|| missing(id))?;
    let asynchronous = EventRequest::default();
    let charge = intent.latest_charge.as_ref().and_then(|charge| state.account(&api_key).charges.get(charge));
    if let Some(charge) = charge.map(to_value) {
        emit(state, &api_key, "charge.expired", charge, None, &asynchronous);
    }
    emit(state, &api_key, "payment_intent.canceled", to_value(&intent), None, &asynchronous);
    Ok(render(state.account(&api_key), &intent, false))
}
