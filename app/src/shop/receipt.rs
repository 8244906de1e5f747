//! The receipt, and for an authorization (`"capture": "manual"`) its two buttons: Capture (all of
//! what is held, or the amount typed) and Cancel authorization. Each runs the API's own capture
//! or cancel ([`crate::http::idempotent::execute`] with [`Op::Capture`] or [`Op::Cancel`] and the
//! canonical [`Settle`]) on behalf of the signed-in customer, then goes back to the receipt
//! (post/redirect/get), which shows what the payment now is; what did not happen is said there
//! in plain words (a flash message), never as an error page or a problem document.
//!
//! Each button's idempotency key is *derived* from the payment and the action
//! ([`ButtonKey`]), not generated when the page is rendered as the checkout's is. See
//! [`ButtonKey`] for why.

use askama::Template;
use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::Value;
use tower_sessions::Session;

use super::{SignedIn, catalogue};
use crate::captures::Settle;
use crate::http::error::ApiError;
use crate::http::idempotent::{execute, operation};
use crate::idempotency::{Answer, IdempotencyKey};
use crate::money::Currency;
use crate::operations::Op;
use crate::payments::{Payment, PaymentId, PaymentStatus, store};
use crate::state::AppState;
use crate::web::flash::{self, Flash};
use crate::web::page::{self, WebError};
use crate::web::{money, rfc3339};

/// Whether a payment in `status` has a receipt: paid, authorized (waiting for its capture), or
/// an authorization released. Anything else is still under way or failed, and is followed on the
/// attempt's page or the checkout form instead.
pub(super) fn exists(status: PaymentStatus) -> bool {
    matches!(status, PaymentStatus::Succeeded | PaymentStatus::RequiresCapture | PaymentStatus::Canceled)
}

/// The idempotency key of one Capture or Cancel button: `shop-capture-pay_…-1`.
///
/// Derived from the payment, the action and an attempt number, not generated when the page is
/// rendered, because a settlement happens once per payment, whatever page it is sent from:
/// - a double click sends the same form twice: the same key, so the second is a retry of the
///   first (in flight: it follows the first; after: the stored answer), never a second capture;
/// - the browser sending the form again, Back and Capture again, a reload of the receipt, or the
///   receipt open in two tabs: every one of these renders or sends *this* key again (a key
///   made at render time would differ between two renderings, and the second capture would only
///   be stopped by the payment's own one-settlement rule, with a 409 instead of the answer);
/// - the capture's amount is part of the request, not of the key: the same button sent with
///   another amount is the same key with another body (422), said in plain words.
///
/// The attempt number moves on only after a settlement Stripe confirmed it never made
/// (`settlement-abandoned`, a 502 stored as that key's final answer, which releases the
/// authorization for "a new key"): the receipt then offers the next attempt's key
/// ([`ButtonKey::current`]), so such an authorization can still be captured from the page.
struct ButtonKey;

impl ButtonKey {
    /// How many attempts the receipt looks through before it stops (each one a settlement Stripe
    /// confirmed it never made, which takes a spent budget: a bound, not a limit anyone meets).
    const ATTEMPTS: u32 = 20;

    fn of(op: Op, payment: PaymentId, attempt: u32) -> IdempotencyKey {
        IdempotencyKey::new(format!("shop-{}-{payment}-{attempt}", op.name())).expect("a printable key of ~50 bytes")
    }

    /// The key the receipt offers for `op`, and whether a request under it is under way (its key
    /// claimed, no final answer yet: in flight, or waiting to be resumed by a retry or the
    /// sweeper): the first attempt whose key holds no abandoned settlement.
    async fn current(
        state: &AppState,
        customer: uuid::Uuid,
        op: Op,
        payment: PaymentId,
    ) -> Result<(IdempotencyKey, bool), WebError> {
        let mut attempt = 1;
        loop {
            let key = Self::of(op, payment, attempt);
            match state.engine.stored_response(customer, key.as_str(), op.route()).await? {
                Some(Some(stored)) if stored.status == StatusCode::BAD_GATEWAY && attempt < Self::ATTEMPTS => {
                    attempt += 1
                }
                Some(None) => return Ok((key, true)),
                _ => return Ok((key, false)),
            }
        }
    }

    /// The key sent by a button for `op` on `payment`; anything else was not made by the receipt.
    fn parse(sent: &str, op: Op, payment: PaymentId) -> Option<IdempotencyKey> {
        let attempt = sent.strip_prefix(&format!("shop-{}-{payment}-", op.name()))?;
        let attempt = attempt.parse::<u32>().ok().filter(|n| (1..=Self::ATTEMPTS).contains(n))?;
        // Written back as the receipt writes it (no `+1`, no `01`).
        Some(Self::of(op, payment, attempt))
    }
}

#[derive(Template)]
#[template(path = "shop/receipt.html")]
struct ReceiptPage {
    shopper: String,
    csrf: String,
    id: String,
    description: String,
    /// What was asked: paid at once, or authorized.
    amount: String,
    /// What moved: all of it for a payment captured at once, what the capture took otherwise.
    captured: String,
    /// A capture took less than was authorized.
    partial: bool,
    card: String,
    payment_intent: String,
    created: String,
    status: &'static str,
    /// Authorized now, captured later (`"capture": "manual"`).
    manual: bool,
    flashes: Vec<Flash>,
    /// While authorized: what is held, and the two buttons.
    held: Option<Held>,
}

/// An authorization waiting for its capture, as the receipt shows it.
struct Held {
    /// What may be captured, as money (`12.00 USD`).
    capturable: String,
    /// A capture or a cancel of it is under way (`captured`, `canceled`): the page refreshes
    /// itself and shows no buttons until it is done.
    settling: Option<&'static str>,
    capture_key: String,
    cancel_key: String,
    /// The amount the Capture button proposes (all that is held), as a person writes it
    /// (`12.00`, `1200` yen), and the field's pattern and currency.
    amount: String,
    pattern: String,
    currency: String,
}

/// `GET /shop/receipts/{payment}`: the receipt of a paid, authorized or canceled payment.
pub(super) async fn show(
    State(state): State<AppState>,
    signed_in: SignedIn,
    session: Session,
    Path(payment): Path<String>,
) -> Result<Response, WebError> {
    let id = PaymentId::parse(&payment).ok_or(WebError::NotFound)?;
    let payment = store::find(state.engine.pool(), signed_in.shopper.id, id).await?.ok_or(WebError::NotFound)?;
    if !exists(payment.status) {
        return Err(WebError::NotFound);
    }
    let held = match payment.status {
        PaymentStatus::RequiresCapture => {
            let currency = Currency::of(&payment.currency)
                .ok_or_else(|| WebError::Internal(format!("a payment in {} was stored", payment.currency)))?;
            let customer = signed_in.shopper.id;
            let (capture, capturing) = ButtonKey::current(&state, customer, Op::Capture, id).await?;
            let (cancel, canceling) = ButtonKey::current(&state, customer, Op::Cancel, id).await?;
            Some(Held {
                capturable: money(payment.amount_capturable, &payment.currency),
                settling: if capturing {
                    Some("captured")
                } else if canceling {
                    Some("canceled")
                } else {
                    None
                },
                capture_key: capture.to_string(),
                cancel_key: cancel.to_string(),
                amount: currency.major(payment.amount_capturable),
                pattern: currency.input_pattern(),
                currency: currency.code().to_owned(),
            })
        }
        _ => None,
    };
    let captured = if payment.manual_capture { payment.amount_captured } else { payment.amount };
    let page = ReceiptPage {
        shopper: signed_in.shopper.name.clone(),
        csrf: signed_in.csrf.clone(),
        id: payment.id.to_string(),
        description: payment.description.clone().unwrap_or_default(),
        amount: money(payment.amount, &payment.currency),
        captured: money(captured, &payment.currency),
        partial: captured < payment.amount,
        card: catalogue::card(&payment.payment_method).map_or(payment.payment_method.clone(), |c| c.label.to_owned()),
        payment_intent: payment.payment_intent.clone().unwrap_or_default(),
        created: rfc3339(payment.created_at),
        status: payment.status.as_str(),
        manual: payment.manual_capture,
        flashes: flash::take(&session).await?,
        held,
    };
    page::render(StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub(super) struct SettleForm {
    #[serde(default)]
    key: String,
    /// Capture only: how much, in the currency's major unit.
    #[serde(default)]
    amount: String,
}

/// `POST /shop/receipts/{payment}/capture` and `…/cancel`: settle the authorization through the
/// API's own code path under the button's key, then back to the receipt (303), with a message
/// when nothing happened.
pub(super) async fn settle(
    State(state): State<AppState>,
    signed_in: SignedIn,
    session: Session,
    Path((payment, action)): Path<(String, String)>,
    Form(form): Form<SettleForm>,
) -> Result<Response, WebError> {
    let id = PaymentId::parse(&payment).ok_or(WebError::NotFound)?;
    let op = match action.as_str() {
        "capture" => Op::Capture,
        "cancel" => Op::Cancel,
        _ => return Err(WebError::NotFound),
    };
    let customer = signed_in.shopper.id;
    let payment = store::find(state.engine.pool(), customer, id).await?.ok_or(WebError::NotFound)?;
    let key = ButtonKey::parse(&form.key, op, id)
        .ok_or_else(|| WebError::BadRequest("the receipt's form is damaged; reload the receipt".into()))?;
    let receipt = Redirect::to(&format!("/shop/receipts/{id}")).into_response();
    let amount_to_capture = match op {
        Op::Capture => match capture_amount(&payment, &form.amount) {
            Ok(amount) => Some(amount),
            Err(refusal) => {
                flash::push(&session, refusal).await?;
                return Ok(receipt);
            }
        },
        _ => None,
    };
    // The amount is always sent as typed, never "all" for the full amount: the request must
    // depend on the form alone, so that the form sent again is the same request (a replay),
    // whatever the payment has become meanwhile.
    let request = Settle { payment: id.to_string(), amount_to_capture };
    let operation =
        operation(op, customer, key.clone(), &request).map_err(|err| WebError::Internal(err.to_string()))?;
    let outcome = execute(&state, op, operation).await;
    tracing::info!(payment = %id, key = %key, operation = op.name(), ok = outcome.is_ok(), "shop settlement sent");
    if let Some(message) = message(&state, op, id, customer, outcome).await? {
        flash::push(&session, message).await?;
    }
    Ok(receipt)
}

/// The amount typed in the Capture form, in minor units, or why nothing was sent: not an amount
/// of the payment's currency, or more than is held (refused here, before the key is used).
fn capture_amount(payment: &Payment, typed: &str) -> Result<i64, Flash> {
    let currency = Currency::of(&payment.currency).ok_or_else(|| {
        Flash::error(format!("Nothing was captured: {} is not a currency Stripe supports.", payment.currency))
    })?;
    let amount = currency.parse(typed).map_err(|error| {
        Flash::error(format!("Nothing was captured: “{}” {}.", typed.trim(), currency.explain(&error)))
    })?;
    // Checked only while it is authorized: a form sent again after its capture must reach the
    // engine, which answers it with what that capture did.
    if payment.status == PaymentStatus::RequiresCapture && amount > payment.amount_capturable {
        return Err(Flash::error(format!(
            "Nothing was captured: at most {} can be captured (what is held on the card).",
            money(payment.amount_capturable, &payment.currency)
        )));
    }
    Ok(amount)
}

/// What the receipt says about the answer, beside what the payment now shows: nothing when it did
/// what was asked or is still at it (the receipt says that itself), a message otherwise.
async fn message(
    state: &AppState,
    op: Op,
    id: PaymentId,
    customer: uuid::Uuid,
    outcome: Result<Answer, ApiError>,
) -> Result<Option<Flash>, WebError> {
    let verb = if op == Op::Capture { "capture" } else { "cancel" };
    let answer = match outcome {
        Ok(answer) => answer,
        // The first of a double click holds the key: the receipt shows it under way, then done.
        Err(ApiError::InFlight { .. }) => return Ok(None),
        // The key was used with another amount: the same as a settlement already made.
        Err(ApiError::KeyReused(_)) => return settled(state, op, id, customer).await.map(Some),
        // The claim is committed and the key released for a retry: payonce finishes it (the
        // sweeper), with the same downstream key; the receipt shows it under way meanwhile.
        Err(ApiError::Gateway { .. } | ApiError::GatewayRefused { .. }) => {
            return Ok(Some(Flash::warning(format!(
                "The payment service did not answer the {verb} yet. It is under way and finishes on its own: nothing \
                 happens twice. This page shows it when it is done."
            ))));
        }
        Err(ApiError::DatabaseUnavailable(_)) => {
            return Ok(Some(Flash::error(format!(
                "The shop could not reach its database. Press the button again: it is safe, it is the same {verb}."
            ))));
        }
        Err(err) => return Err(WebError::Internal(err.to_string())),
    };
    if answer.stored.status.is_success() {
        return Ok(None);
    }
    let body: Value = serde_json::from_slice(&answer.stored.body).unwrap_or_default();
    let slug = body["type"].as_str().and_then(|t| t.rsplit('/').next()).unwrap_or_default();
    Ok(Some(match slug {
        // Settled already (by this page, another tab, the API) or expired: say what it is now.
        "payment-not-capturable" => settled(state, op, id, customer).await?,
        "settlement-abandoned" => Flash::warning(format!(
            "The {verb} did not happen: the bank confirmed it never made it, and your card is held as before. Press \
             the button again to try once more."
        )),
        _ => Flash::error(format!(
            "Nothing was done: {}",
            body["detail"].as_str().unwrap_or("the payment service refused the request.")
        )),
    }))
}

/// Why a capture or cancel of `id` did nothing, from what the payment is now (the 409's meaning:
/// one capture or one cancel, once).
async fn settled(state: &AppState, op: Op, id: PaymentId, customer: uuid::Uuid) -> Result<Flash, WebError> {
    let payment = store::find(state.engine.pool(), customer, id).await?.ok_or(WebError::NotFound)?;
    let captured = money(payment.amount_captured, &payment.currency);
    let text = match (op, payment.status) {
        (Op::Capture, PaymentStatus::Succeeded) => {
            format!("Nothing was captured again: this payment was already captured ({captured}). You are charged once.")
        }
        (Op::Capture, PaymentStatus::Canceled) => "Nothing was captured: this authorization was canceled (or it \
                                                   expired), so there is nothing left to capture. You have not been \
                                                   charged."
            .to_owned(),
        (_, PaymentStatus::Succeeded) => format!(
            "The authorization could not be canceled: it was already captured ({captured}). Money that was \
             captured can only be refunded."
        ),
        (_, PaymentStatus::Canceled) => "This authorization was already canceled: you have not been charged.".into(),
        (_, PaymentStatus::RequiresCapture) => "Nothing was done: a capture or a cancel of this authorization is \
                                                already under way. This page shows its outcome."
            .to_owned(),
        (_, status) => format!(
            "Nothing was done: only an authorized payment can be captured or canceled, and this one is {}.",
            status.as_str()
        ),
    };
    Ok(Flash::warning(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A button's key names its payment, action and attempt; a key the receipt did not make for
    /// this very button is refused.
    #[test]
    fn button_keys() {
        let payment = PaymentId::parse("pay_0190a6f4d0c27c4e8a4b6f1e2d3c4b5a").unwrap();
        let other = PaymentId::parse("pay_0190a6f4d0c27c4e8a4b6f1e2d3c4b5b").unwrap();
        let key = ButtonKey::of(Op::Capture, payment, 1);
        assert_eq!(key.as_str(), "shop-capture-pay_0190a6f4d0c27c4e8a4b6f1e2d3c4b5a-1");
        assert_eq!(ButtonKey::parse(key.as_str(), Op::Capture, payment), Some(key.clone()));
        assert_eq!(ButtonKey::parse(key.as_str(), Op::Cancel, payment), None, "another action");
        assert_eq!(ButtonKey::parse(key.as_str(), Op::Capture, other), None, "another payment");
        let attempt = |n: &str| ButtonKey::parse(&format!("shop-capture-{payment}-{n}"), Op::Capture, payment);
        assert_eq!(attempt("2"), Some(ButtonKey::of(Op::Capture, payment, 2)));
        assert_eq!(attempt("0"), None);
        assert_eq!(attempt("21"), None, "past the attempts the receipt offers");
        assert_eq!(attempt("x"), None);
        assert_eq!(attempt(""), None);
    }
}
