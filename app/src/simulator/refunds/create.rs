//! What `POST /v1/refunds` does, under the lock: find the charge, check what remains (of what was
//! captured: an authorization not captured is canceled, not refunded), refund,
//! record it in the ledger, emit the events. Card refunds succeed at once; the acquirer's
//! reference arrives later (`refund.updated`, after the processing knob), as on Stripe. A bank
//! debit's refund is `pending` (its amount taken from what the charge can still refund) and
//! settles after the processing knob: `succeeded` (`refund.updated`, and only then the ledger),
//! or, when told so ([`settle`], `POST /_sim/refunds/{id}/settle`), `failed` (`refund.failed`,
//! its amount refundable again).

use std::collections::BTreeMap;

use serde_json::json;

use crate::simulator::error::ApiError;
use crate::simulator::events::emit;
use crate::simulator::execution::Ctx;
use crate::simulator::form::check_amount;
use crate::simulator::ledger;
use crate::simulator::objects::{EventRequest, Refund, RefundReason, RefundStatus, Status, random_alphanumeric};
use crate::simulator::response::{SavedResponse, to_value};
use crate::simulator::state::State;

/// What to refund: a PaymentIntent's charge, or a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Target {
    PaymentIntent(String),
    Charge(String),
}

/// The validated parameters of `POST /v1/refunds`.
#[derive(Clone, Debug)]
pub(super) struct RefundParams {
    pub target: Target,
    /// Default: everything that remains.
    pub amount: Option<i64>,
    pub reason: Option<RefundReason>,
    pub metadata: BTreeMap<String, String>,
}

/// The charge a target names, if the PaymentIntent has one (for faults scoped to its payment
/// method and for the refund itself).
pub(super) fn payment_method(state: &State, api_key: &str, target: &Target) -> Option<String> {
    let account = state.accounts.get(api_key)?;
    let charge = match target {
        Target::PaymentIntent(id) => account.charges.get(account.payment_intents.get(id)?.latest_charge.as_ref()?)?,
        Target::Charge(id) => account.charges.get(id)?,
    };
    Some(charge.payment_method.clone())
}

pub(super) fn create(state: &mut State, ctx: &Ctx, params: &RefundParams) -> SavedResponse {
    match refund(state, ctx, params) {
        Ok(refund) => SavedResponse::ok(&refund, "refund_succeeded"),
        // Refusals decided here are results of execution: saved and replayed for the key, as
        // Stripe does (a retry of a refund that found nothing left finds nothing left).
        Err(error) => error.saved(ctx.request_id()),
    }
}

fn refund(state: &mut State, ctx: &Ctx, params: &RefundParams) -> Result<Refund, ApiError> {
    let account = state.account(&ctx.api_key);
    let charge_id = match &params.target {
        Target::PaymentIntent(id) => {
            let intent = account
                .payment_intents
                .get(id)
                .ok_or_else(|| ApiError::resource_missing("payment_intent", id, "payment_intent"))?;
            match (intent.status, &intent.latest_charge) {
                (Status::Succeeded, Some(charge)) => charge.clone(),
                (Status::RequiresCapture, _) => return Err(uncaptured(id).param("payment_intent")),
                _ => return Err(no_successful_charge(id).param("payment_intent")),
            }
        }
        Target::Charge(id) => id.clone(),
    };
    let intent_of = |charge: &str| {
        let intent = account.payment_intents.get(&account.charges.get(charge)?.payment_intent)?;
        Some((intent.id.clone(), intent.status))
    };
    let intent = intent_of(&charge_id);
    let charge = account
        .charges
        .get_mut(&charge_id)
        .ok_or_else(|| ApiError::resource_missing("charge", &charge_id, "charge"))?;
    let remaining = charge.refundable();
    // Only what was captured can be refunded: an authorization is canceled instead, and one
    // that was canceled or expired has nothing to refund.
    if charge.amount_captured == 0 {
        return Err(match intent {
            Some((intent, Status::RequiresCapture)) => uncaptured(&intent),
            Some((intent, Status::Canceled)) => no_successful_charge(&intent),
            _ => {
                ApiError::invalid_request(format!("Charge {charge_id} has not succeeded: there is nothing to refund."))
            }
        }
        .param("charge"));
    }
    if remaining == 0 {
        return Err(ApiError::invalid_request(format!("Charge {charge_id} has already been refunded."))
            .code("charge_already_refunded"));
    }
    let amount = params.amount.unwrap_or(remaining);
    check_amount("amount", amount, &charge.currency)?;
    if amount > remaining {
        return Err(ApiError::invalid_request(format!(
            "Refund amount ({}) is greater than unrefunded amount on charge ({})",
            money(amount, &charge.currency),
            money(remaining, &charge.currency)
        ))
        .code("amount_too_large")
        .param("amount"));
    }

    charge.amount_refunded += amount;
    charge.refunded = charge.amount_refunded == charge.amount_captured;
    let charge = charge.clone();
    let refund = Refund::new(&charge, amount, params.reason, params.metadata.clone());
    let bank_debit = refund.status == RefundStatus::Pending;
    account.refund_order.push(refund.id.clone());
    account.refunds.insert(refund.id.clone(), refund.clone());
    let entry = ledger::Refund {
        refund: refund.id.clone(),
        charge: charge.id.clone(),
        payment_intent: charge.payment_intent.clone(),
        idempotency_key: ctx.idempotency_key.clone(),
        amount,
        currency: refund.currency.clone(),
        reason: refund.reason.map(|reason| reason.as_str().to_owned()),
        metadata: refund.metadata.clone(),
        created: refund.created,
    };
    if bank_debit {
        account.pending_refunds.insert(refund.id.clone(), entry);
    } else {
        state.ledger.record_refund(entry);
    }
    emit(state, &ctx.api_key, "refund.created", to_value(&refund), None, &ctx.request);
    emit(state, &ctx.api_key, "charge.refunded", to_value(&charge), None, &ctx.request);
    let (api_key, id) = (ctx.api_key.clone(), refund.id.clone());
    let processing = state.settings.processing();
    if bank_debit {
        // Settled already (told to fail) is not an error here: the timer finds nothing pending.
        state.later(processing, move |state| drop(settle_in(state, &api_key, &id, true)));
    } else {
        state.later(processing, move |state| reference_arrives(state, &api_key, &id));
    }
    Ok(refund)
}

/// Stripe's refusal to refund an authorization (`requires_capture`): it is canceled instead.
fn uncaptured(payment_intent: &str) -> ApiError {
    ApiError::invalid_request(format!(
        "This uncaptured Charge was created by a PaymentIntent ({payment_intent}). You must cancel the \
         PaymentIntent to reverse the authorization instead of refunding the Charge directly. For more \
         information, see https://stripe.com/docs/payments/payment-intents/creating-payment-intents#separate-auth-capture"
    ))
}

/// Stripe's refusal to refund a PaymentIntent that charged nothing (not confirmed, declined,
/// processing, canceled).
fn no_successful_charge(payment_intent: &str) -> ApiError {
    ApiError::invalid_request(format!(
        "This PaymentIntent ({payment_intent}) does not have a successful charge to refund."
    ))
}

/// Settles a pending (bank debit) refund now: `succeeded` (`refund.updated`, and into the
/// ledger) or `failed` (`refund.failed`, `failure_reason: declined`, its amount refundable on
/// the charge again). Answers the refund as it now is; 400 if it is not pending.
pub(crate) fn settle(state: &mut State, id: &str, succeed: bool) -> Result<Refund, ApiError> {
    let api_key = state
        .owner(|account| account.refunds.contains_key(id))
        .ok_or_else(|| ApiError::not_found("refund", id, "id"))?;
    settle_in(state, &api_key, id, succeed)
}

fn settle_in(state: &mut State, api_key: &str, id: &str, succeed: bool) -> Result<Refund, ApiError> {
    let account = state.account(api_key);
    let refund = account.refunds.get_mut(id).ok_or_else(|| ApiError::not_found("refund", id, "id"))?;
    if refund.status != RefundStatus::Pending {
        let status = to_value(&refund.status);
        let status = status.as_str().unwrap_or_default();
        return Err(ApiError::invalid_request(format!("This refund is not pending: its status is {status}.")));
    }
    let entry = account.pending_refunds.remove(id);
    // What changed, as it was (a property that was absent, as `null`).
    let mut previous = json!({"status": "pending", "pending_reason": refund.pending_reason});
    if succeed {
        previous["destination_details"] = to_value(&refund.destination_details);
        refund.settle(true);
        refund.destination_details.arrive(random_alphanumeric(16));
        let refund = refund.clone();
        if let Some(entry) = entry {
            state.ledger.record_refund(entry);
        }
        emit(state, api_key, "refund.updated", to_value(&refund), Some(previous), &EventRequest::default());
        return Ok(refund);
    }
    previous["failure_reason"] = serde_json::Value::Null;
    refund.settle(false);
    let refund = refund.clone();
    if let Some(charge) = account.charges.get_mut(&refund.charge) {
        charge.amount_refunded -= refund.amount;
        charge.refunded = false;
    }
    emit(state, api_key, "refund.failed", to_value(&refund), Some(previous), &EventRequest::default());
    Ok(refund)
}

/// A succeeded refund fails afterwards, as Stripe reports when the money could not reach the
/// customer (an expired or closed card): `failed` with `failure_reason`, `refund.failed`, its
/// amount refundable on the charge again, and its entry out of the refund ledger (the money came
/// back to the merchant). 400 if the refund has not succeeded.
pub(crate) fn fail_after_success(
    state: &mut State,
    id: &str,
    failure_reason: &'static str,
) -> Result<Refund, ApiError> {
    let api_key = state
        .owner(|account| account.refunds.contains_key(id))
        .ok_or_else(|| ApiError::not_found("refund", id, "id"))?;
    let account = state.account(&api_key);
    let refund = account.refunds.get_mut(id).ok_or_else(|| ApiError::not_found("refund", id, "id"))?;
    if refund.status != RefundStatus::Succeeded {
        let status = to_value(&refund.status);
        let status = status.as_str().unwrap_or_default();
        return Err(ApiError::invalid_request(format!("This refund has not succeeded: its status is {status}.")));
    }
    let previous = json!({"status": "succeeded", "failure_reason": null});
    refund.status = RefundStatus::Failed;
    refund.failure_reason = Some(failure_reason);
    let refund = refund.clone();
    if let Some(charge) = account.charges.get_mut(&refund.charge) {
        charge.amount_refunded -= refund.amount;
        charge.refunded = false;
    }
    state.ledger.reverse_refund(&refund.id);
    emit(state, &api_key, "refund.failed", to_value(&refund), Some(previous), &EventRequest::default());
    Ok(refund)
}

/// The acquirer's reference for the card refund arrives: `refund.updated`.
fn reference_arrives(state: &mut State, api_key: &str, id: &str) {
    let Some(refund) = state.accounts.get_mut(api_key).and_then(|account| account.refunds.get_mut(id)) else {
        return;
    };
    let previous = json!({"destination_details": to_value(&refund.destination_details)});
    refund.destination_details.arrive(random_alphanumeric(23));
    let snapshot = to_value(&*refund);
    emit(state, api_key, "refund.updated", snapshot, Some(previous), &EventRequest::default());
}

/// An amount as Stripe's messages write it: `$12.50` for dollars, in the currency's own units
/// otherwise (`12.50 EUR`, `1,000 JPY`).
fn money(amount: i64, currency: &str) -> String {
    match currency {
        "usd" => format!("${}.{:02}", amount / 100, amount % 100),
        other => crate::money::format(amount, other),
    }
}
