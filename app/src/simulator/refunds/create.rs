//! What `POST /v1/refunds` does, under the lock: find the charge, check what remains, refund,
//! record it in the ledger, emit the events. Card refunds succeed at once; the acquirer's
//! reference arrives later (`refund.updated`, after the processing knob), as on Stripe.

use std::collections::BTreeMap;

use serde_json::json;

use crate::simulator::error::ApiError;
use crate::simulator::events::emit;
use crate::simulator::execution::Ctx;
use crate::simulator::ledger;
use crate::simulator::objects::{EventRequest, Refund, RefundReason, Status, new_id, now, random_alphanumeric};
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
    charge.payment_method.clone()
}

pub(super) fn create(state: &mut State, ctx: &Ctx, params: &RefundParams) -> SavedResponse {
    match refund(state, ctx, params) {
        Ok(refund) => SavedResponse::ok(&refund, "refund_succeeded"),
        // Refusals decided here are results of execution: saved and replayed for the key, as
        // Stripe does (a retry of a refund that found nothing left finds nothing left).
        Err(error) => error.saved(),
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
                _ => {
                    return Err(ApiError::invalid_request(format!(
                        "This PaymentIntent ({id}) does not have a successful charge to refund (its status is {}).",
                        intent.status.as_str()
                    ))
                    .param("payment_intent"));
                }
            }
        }
        Target::Charge(id) => id.clone(),
    };
    let charge = account
        .charges
        .get_mut(&charge_id)
        .ok_or_else(|| ApiError::resource_missing("charge", &charge_id, "charge"))?;
    let remaining = charge.refundable();
    if charge.amount_captured == 0 {
        return Err(ApiError::invalid_request(format!(
            "Charge {charge_id} has not succeeded: there is nothing to refund."
        ))
        .param("charge"));
    }
    if remaining == 0 {
        return Err(ApiError::invalid_request(format!("Charge {charge_id} has already been refunded."))
            .code("charge_already_refunded"));
    }
    let amount = params.amount.unwrap_or(remaining);
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
    let refund = Refund {
        id: new_id("re"),
        object: "refund",
        amount,
        balance_transaction: None,
        charge: charge.id.clone(),
        created: now(),
        currency: charge.currency.clone(),
        destination_details: None,
        metadata: params.metadata.clone(),
        payment_intent: charge.payment_intent.clone(),
        reason: params.reason,
        receipt_number: None,
        source_transfer_reversal: None,
        status: "succeeded",
        transfer_reversal: None,
    };
    account.refund_order.push(refund.id.clone());
    account.refunds.insert(refund.id.clone(), refund.clone());
    state.ledger.record_refund(ledger::Refund {
        refund: refund.id.clone(),
        charge: charge.id.clone(),
        payment_intent: charge.payment_intent.clone(),
        idempotency_key: ctx.idempotency_key.clone(),
        amount,
        currency: refund.currency.clone(),
        reason: refund.reason.map(|reason| to_value(&reason).as_str().unwrap_or_default().to_owned()),
        metadata: refund.metadata.clone(),
        created: refund.created,
    });
    emit(state, &ctx.api_key, "refund.created", to_value(&refund), None, &ctx.request);
    emit(state, &ctx.api_key, "charge.refunded", to_value(&charge), None, &ctx.request);
    let (api_key, id) = (ctx.api_key.clone(), refund.id.clone());
    let processing = state.settings.processing();
    state.later(processing, move |state| reference_arrives(state, &api_key, &id));
    Ok(refund)
}

/// The acquirer's reference for the card refund arrives: `refund.updated`.
fn reference_arrives(state: &mut State, api_key: &str, id: &str) {
    let Some(refund) = state.accounts.get_mut(api_key).and_then(|account| account.refunds.get_mut(id)) else {
        return;
    };
    refund.destination_details = Some(json!({
        "type": "card",
        "card": {
            "reference": random_alphanumeric(23),
            "reference_status": "available",
            "reference_type": "acquirer_reference_number",
            "type": "refund",
        },
    }));
    let snapshot = to_value(&*refund);
    let previous = json!({"destination_details": null});
    emit(state, api_key, "refund.updated", snapshot, Some(previous), &EventRequest::default());
}

/// An amount as Stripe's messages write it: `$12.50` for dollars, `12.50 EUR` otherwise.
fn money(amount: i64, currency: &str) -> String {
    let major = format!("{}.{:02}", amount / 100, amount % 100);
    match currency {
        "usd" => format!("${major}"),
        other => format!("{major} {}", other.to_ascii_uppercase()),
    }
}
