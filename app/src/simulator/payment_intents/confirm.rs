//! What creating (and confirming) a PaymentIntent does, and how a pending one moves on later: a
//! bank debit settling, a customer authenticating. All of it runs under the lock, so the objects,
//! the ledger, the saved result and the events always agree.
//!
//! ```text
//! card that succeeds     ─► succeeded (charge in the ledger)
//!   capture_method=manual ─► requires_capture (an authorization: no ledger entry until a
//!                            capture, see capture.rs)
//! card that declines     ─► requires_payment_method, 402 card_error
//! 3-D Secure card        ─► requires_action ─ authenticate: succeed ─► succeeded (ledger)
//!                                                                      or requires_capture
//!                                                          fail ─► requires_payment_method
//! US bank account        ─► processing ─ after `processing_ms` ─► succeeded (ledger)
//!                                                              or requires_payment_method
//! ```

use serde_json::{Value, json};

use super::params::CreateParams;
use crate::simulator::error::{ApiError, ErrorObject, ErrorType};
use crate::simulator::events::emit;
use crate::simulator::execution::Ctx;
use crate::simulator::ledger;
use crate::simulator::objects::{
    CaptureMethod, Charge, ChargeStatus, EventRequest, PaymentIntent, PaymentMethod, Status, new_id,
};
use crate::simulator::payment_methods::{self, CardBehaviour, Decline, TestPaymentMethod};
use crate::simulator::response::{SavedResponse, to_value};
use crate::simulator::state::{Account, State};

/// Creates the PaymentIntent and, if asked, confirms it. `base_url` is where the simulator is
/// reached (`http://host:port`), for the 3-D Secure page a `next_action` points at.
pub(super) fn create(state: &mut State, ctx: &Ctx, params: &CreateParams, base_url: &str) -> SavedResponse {
    // Looking up the payment method is part of execution on Stripe, so "No such PaymentMethod"
    // is saved and replayed like any other result of the call.
    let method = match params.payment_method.as_deref() {
        None => None,
        Some(id) => match payment_methods::lookup(id) {
            Some(method) => Some((id, method)),
            None => return ApiError::resource_missing("PaymentMethod", id, "payment_method").saved(ctx.request_id()),
        },
    };
    if let Some((_, method)) = method
        && params.confirm
        && !params.payment_method_types.iter().any(|kind| kind == method.instrument.kind())
    {
        let kind = method.instrument.kind();
        return ApiError::invalid_request(format!(
            "The PaymentMethod provided ({kind}) is not allowed for this PaymentIntent. Please attach a \
             PaymentMethod of one of the following types: {}. Alternatively update the allowed \
             payment_method_types for this PaymentIntent to include \"{kind}\".",
            params.payment_method_types.join(", "),
        ))
        .code("payment_intent_incompatible_payment_method")
        .param("payment_method")
        .saved(ctx.request_id());
    }

    let mut intent = PaymentIntent::new(params.draft(ctx.idempotency_key.clone()));
    let id = intent.id.clone();
    emit(state, &ctx.api_key, "payment_intent.created", to_value(&intent), None, &ctx.request);
    let declined = match method {
        Some((payment_method, method)) if params.confirm => {
            intent.confirmed_with = Some(payment_method.to_owned());
            confirm(state, ctx, &mut intent, payment_method, method, params, base_url)
        }
        _ => None,
    };
    let account = state.account(&ctx.api_key);
    account.payment_intent_order.push(id.clone());
    account.payment_intents.insert(id.clone(), intent);
    let account = state.account(&ctx.api_key);
    let rendered = render(account, &account.payment_intents[&id], params.expand_latest_charge);
    match declined {
        Some(error) => {
            ApiError::card_error(ErrorObject { payment_intent: Some(rendered), ..error }).saved(ctx.request_id())
        }
        None => {
            let status = account.payment_intents[&id].status;
            SavedResponse::ok(&rendered, status.as_str())
        }
    }
}

/// Confirms a new PaymentIntent; `Some(error)` for a decline (the caller answers 402).
fn confirm(
    state: &mut State,
    ctx: &Ctx,
    intent: &mut PaymentIntent,
    payment_method: &str,
    method: TestPaymentMethod,
    params: &CreateParams,
    base_url: &str,
) -> Option<ErrorObject> {
    let instrument = method.instrument;
    match method.behaviour {
        CardBehaviour::Succeeds => {
            let charge = Charge::new(intent, payment_method, instrument, ChargeStatus::Pending, false);
            card_authorized(state, &ctx.api_key, intent, charge, &ctx.request);
            None
        }
        CardBehaviour::Declines(decline) => {
            let mut charge = Charge::new(intent, payment_method, instrument, ChargeStatus::Failed, false);
            charge.fail(decline.code, decline.decline_code, decline.message);
            let error = decline_error(decline, &charge);
            charge_failed(state, &ctx.api_key, intent, charge, error.clone(), &ctx.request);
            Some(error)
        }
        CardBehaviour::RequiresAuthentication => {
            intent.status = Status::RequiresAction;
            intent.next_action = Some(next_action(intent, params.return_url.as_deref(), base_url));
            emit(state, &ctx.api_key, "payment_intent.requires_action", to_value(&*intent), None, &ctx.request);
            None
        }
        CardBehaviour::BankDebit(failure) => {
            let charge = Charge::new(intent, payment_method, instrument, ChargeStatus::Pending, false);
            intent.status = Status::Processing;
            intent.latest_charge = Some(charge.id.clone());
            emit(state, &ctx.api_key, "charge.pending", to_value(&charge), None, &ctx.request);
            emit(state, &ctx.api_key, "payment_intent.processing", to_value(&*intent), None, &ctx.request);
            state.account(&ctx.api_key).charges.insert(charge.id.clone(), charge);
            let (api_key, id) = (ctx.api_key.clone(), intent.id.clone());
            let processing = state.settings.processing();
            state.later(processing, move |state| settle(state, &api_key, &id, failure));
            None
        }
    }
}

/// A bank debit's outcome arrives: `failure` is `None` for a debit that went through.
fn settle(state: &mut State, api_key: &str, id: &str, failure: Option<Decline>) {
    let Some(mut intent) = take_intent(state, api_key, id, Status::Processing) else {
        return;
    };
    let charge = intent.latest_charge.as_ref().and_then(|charge| state.account(api_key).charges.remove(charge));
    if let Some(mut charge) = charge {
        let asynchronous = EventRequest::default();
        match failure {
            None => {
                charge.succeed();
                charge_succeeded(state, api_key, &mut intent, charge, &asynchronous);
            }
            Some(failure) => {
                charge.fail(failure.code, failure.decline_code, failure.message);
                let error = decline_error(failure, &charge);
                charge_failed(state, api_key, &mut intent, charge, error, &asynchronous);
            }
        }
    }
    state.account(api_key).payment_intents.insert(intent.id.clone(), intent);
}

/// The customer's answer to 3-D Secure (`POST /_sim/payment_intents/{id}/authenticate`), for a
/// PaymentIntent of any API key. Returns the PaymentIntent as it now is.
pub(crate) fn authenticate(state: &mut State, id: &str, succeed: bool) -> Result<Value, ApiError> {
    let api_key = state
        .owner(|account| account.payment_intents.contains_key(id))
        .ok_or_else(|| ApiError::not_found("payment_intent", id, "intent"))?;
    let status = state.account(&api_key).payment_intents[id].status;
    let mut intent = take_intent(state, &api_key, id, Status::RequiresAction).ok_or_else(|| {
        ApiError::invalid_request(format!(
            "This PaymentIntent is not awaiting authentication: its status is {}.",
            status.as_str()
        ))
        .code("payment_intent_unexpected_state")
    })?;
    let asynchronous = EventRequest::default();
    let payment_method = intent.confirmed_with.clone().unwrap_or_default();
    // Only a test card that asks for 3-D Secure gets here.
    let instrument = payment_methods::lookup(&payment_method).expect("a known test payment method").instrument;
    if succeed {
        let charge = Charge::new(&intent, &payment_method, instrument, ChargeStatus::Pending, true);
        card_authorized(state, &api_key, &mut intent, charge, &asynchronous);
    } else {
        // Authentication fails before any charge is attempted.
        let message = "The provided PaymentMethod has failed authentication. You can provide \
                       payment_method_data or a new PaymentMethod to attempt to fulfill this \
                       PaymentIntent again.";
        let error = ErrorObject {
            payment_method: Some(to_value(&PaymentMethod::new(&payment_method, instrument, intent.created))),
            ..ErrorObject::new(ErrorType::InvalidRequest, message).with_code("payment_intent_authentication_failure")
        };
        intent.fail(None, error);
        emit(state, &api_key, "payment_intent.payment_failed", to_value(&intent), None, &asynchronous);
    }
    let account = state.account(&api_key);
    account.payment_intents.insert(intent.id.clone(), intent);
    Ok(render(account, &account.payment_intents[id], false))
}

/// Takes the PaymentIntent out of its account if it is in `status` (to change it and put it back).
fn take_intent(state: &mut State, api_key: &str, id: &str, status: Status) -> Option<PaymentIntent> {
    let account = state.accounts.get_mut(api_key)?;
    if account.payment_intents.get(id)?.status != status {
        return None;
    }
    account.payment_intents.remove(id)
}

/// The issuer authorized the card: captured at once (money moved), or, with
/// `capture_method=manual`, held for a later capture.
fn card_authorized(
    state: &mut State,
    api_key: &str,
    intent: &mut PaymentIntent,
    mut charge: Charge,
    request: &EventRequest,
) {
    if intent.capture_method != CaptureMethod::Manual {
        charge.succeed();
        return charge_succeeded(state, api_key, intent, charge, request);
    }
    // Stripe's events for an authorization: the charge succeeded (uncaptured), and the
    // PaymentIntent has an amount to capture. No money moved: nothing enters the ledger.
    charge.authorize();
    intent.authorize(&charge.id);
    emit(state, api_key, "charge.succeeded", to_value(&charge), None, request);
    emit(state, api_key, "payment_intent.amount_capturable_updated", to_value(&*intent), None, request);
    state.account(api_key).charges.insert(charge.id.clone(), charge);
}

/// Money moved: the charge succeeds, enters the ledger (once: the PaymentIntent leaves the state
/// it was charged from), and the events say so.
fn charge_succeeded(
    state: &mut State,
    api_key: &str,
    intent: &mut PaymentIntent,
    charge: Charge,
    request: &EventRequest,
) {
    intent.succeed(&charge.id);
    state.ledger.record(ledger::Charge::of(intent, &charge));
    emit(state, api_key, "charge.succeeded", to_value(&charge), None, request);
    emit(state, api_key, "payment_intent.succeeded", to_value(&*intent), None, request);
    state.account(api_key).charges.insert(charge.id.clone(), charge);
}

/// The attempt failed: a failed charge (Stripe records one; it is not in the ledger of charges).
fn charge_failed(
    state: &mut State,
    api_key: &str,
    intent: &mut PaymentIntent,
    charge: Charge,
    error: ErrorObject,
    request: &EventRequest,
) {
    intent.fail(Some(&charge.id), error);
    emit(state, api_key, "charge.failed", to_value(&charge), None, request);
    emit(state, api_key, "payment_intent.payment_failed", to_value(&*intent), None, request);
    state.account(api_key).charges.insert(charge.id.clone(), charge);
}

/// The card error (or the bank's return) of a failed charge: Stripe's codes, the charge, and
/// the PaymentMethod that failed.
fn decline_error(decline: Decline, charge: &Charge) -> ErrorObject {
    let payment_method = PaymentMethod::new(&charge.payment_method, charge.instrument, charge.created);
    ErrorObject {
        advice_code: charge.outcome.advice_code,
        charge: Some(charge.id.clone()),
        decline_code: Some(decline.decline_code),
        // Stripe points an expired card at the field the customer has to fix.
        param: (decline.code == "expired_card").then(|| "exp_month".to_owned()),
        payment_method: Some(to_value(&payment_method)),
        ..ErrorObject::new(ErrorType::Card, decline.message).with_code(decline.code)
    }
}

/// Stripe's `next_action` for 3-D Secure: a redirect when there is somewhere to return to,
/// else the Stripe.js flow. Both point at the simulator's authentication control.
fn next_action(intent: &PaymentIntent, return_url: Option<&str>, base_url: &str) -> Value {
    let url = format!("{base_url}/_sim/payment_intents/{}/authenticate", intent.id);
    match return_url {
        Some(return_url) => json!({
            "type": "redirect_to_url",
            "redirect_to_url": {"return_url": return_url, "url": url},
        }),
        None => json!({
            "type": "use_stripe_sdk",
            "use_stripe_sdk": {"type": "three_d_secure_redirect", "source": new_id("src"), "stripe_js": url},
        }),
    }
}

/// The PaymentIntent's JSON, with `latest_charge` expanded to the charge object if asked.
pub(crate) fn render(account: &Account, intent: &PaymentIntent, expand_latest_charge: bool) -> Value {
    let mut value = to_value(intent);
    if expand_latest_charge && let Some(charge) = intent.latest_charge.as_ref().and_then(|id| account.charges.get(id)) {
        value["latest_charge"] = to_value(charge);
    }
    value
}
