//! `/admin/payments/{id}`: one payment, its refunds, and the operator's refund form.
//!
//! The form refunds through the API's own code path ([`crate::http::idempotent::operation`] and
//! [`crate::http::idempotent::execute`]: the engine's claim, fingerprint, lease and replay, and the
//! payment's reservation at the first write) on behalf of the payment's customer, under an
//! Idempotency-Key the server generated when it rendered the page (a UUID v7 in a hidden field),
//! as the shop's checkout does. So the same rendered form sent twice (a double click, Back and
//! Refund again) is one request: one refund, and the second submit is told what the first did.
//! The refund's first write names the operator on its key's timeline (`refund_created`,
//! `detail.by = "operator:<name>"`), in the statement that reserves the amount.
//!
//! Back must return to the very page (and key) the form was sent from. So the page is sent
//! `Cache-Control: private, no-cache` (not `no-store`, which would render it again with a new
//! key), and a submitted form ends on `?form=<its key>`, another URL, whose rendering never
//! replaces the page in the browser's cache.

use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::queries::{self, PaymentDetail};
use super::{Chrome, Operator};
use crate::customers::CustomerId;
use crate::http::error::ApiError;
use crate::http::idempotent::{execute, operation};
use crate::idempotency::{Answer, Busy, IdempotencyKey, Operation};
use crate::money::Currency;
use crate::operations::Op;
use crate::payments::PaymentId;
use crate::refunds::request::REASONS;
use crate::refunds::{CreateRefund, ROUTE, RefundId};
use crate::state::AppState;
use crate::web::flash::Flash;
use crate::web::page::{self, WebError};
use crate::web::{money, rfc3339};

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/admin/payments/{id}", get(show)).route("/admin/payments/{id}/refunds", post(refund))
}

#[derive(Template)]
#[template(path = "admin/payment_page.html")]
struct PaymentPage {
    chrome: Chrome,
    id: String,
    customer: String,
    customer_id: String,
    amount: String,
    status: String,
    payment_method: String,
    payment_intent: String,
    description: String,
    failure: String,
    created: String,
    /// The key that made it, linked; empty for a payment without one (the lab's).
    key_id: String,
    client_key: String,
    /// For an authorization (`"capture": "manual"`): what was captured of it, what it still
    /// holds, or that it was cancelled; empty for an automatic payment.
    captured: String,
    /// Its capture or cancel (`capture`, `cancel`), and that key, if one was asked.
    settlement: String,
    settled_by: String,
    /// Refunded and confirmed, refunds still pending, and what is left to refund.
    refunded: String,
    pending: String,
    remaining: String,
    refunds: Vec<RefundLine>,
    form: Option<RefundForm>,
    /// Why there is no form, when there is none.
    no_form: String,
}

struct RefundLine {
    id: String,
    amount: String,
    reason: String,
    status: String,
    gateway_refund: String,
    failure: String,
    created: String,
    created_iso: String,
    key_id: String,
    client_key: String,
    by: String,
    /// For a pending refund, when the gateway is next asked about it ([`lookup_note`]).
    lookup: String,
    /// Made by the form this page's result is about (`?form=`).
    this_form: bool,
}

/// The refund form as rendered: its own key, and the amount it proposes.
struct RefundForm {
    key: String,
    /// What remains, in the currency's major unit as a person writes it (`12.50`, `97500` yen,
    /// `12.340` dinars).
    amount: String,
    currency: String,
    /// The amount field's HTML `pattern`: as many decimals as the currency has.
    pattern: String,
    reasons: &'static [&'static str],
}

#[derive(Deserialize, Default)]
struct PageQuery {
    /// The key of the form whose result this page shows.
    #[serde(default)]
    form: String,
}

/// `GET /admin/payments/{id}` (`pay_…`).
async fn show(
    State(state): State<AppState>,
    operator: Operator,
    Path(id): Path<String>,
    Query(query): Query<PageQuery>,
) -> Result<Response, WebError> {
    let id = PaymentId::parse(&id).ok_or(WebError::NotFound)?;
    // A view; the refund form it offers posts to the primary, where the payment's own row
    // decides what may still be refunded ([`crate::db::Reads`]).
    let pool = state.reads.pool();
    let p = queries::payment(pool, id.0).await?.ok_or(WebError::NotFound)?;
    let refunds = queries::refunds_of(pool, id.0).await?;
    let pending: i64 = refunds.iter().filter(|r| r.status == "pending").map(|r| r.amount).sum();
    // Refunds give back money that moved: all of an automatic payment, what a capture took.
    let remaining = p.amount_captured - p.amount_refunded;
    let (form, no_form) = match (p.status.as_str(), remaining, Currency::of(&p.currency)) {
        ("succeeded", remaining, Some(currency)) if remaining > 0 => (
            Some(RefundForm {
                key: Uuid::now_v7().to_string(),
                amount: currency.major(remaining),
                currency: currency.code().to_owned(),
                pattern: currency.input_pattern(),
                reasons: &REASONS,
            }),
            String::new(),
        ),
        ("succeeded", remaining, None) if remaining > 0 => {
            (None, format!("Its currency, {}, is not one Stripe supports.", p.currency.to_ascii_uppercase()))
        }
        ("succeeded", _, _) => {
            (None, "Nothing remains to refund: its refunds (pending ones included) take all of it.".into())
        }
        ("requires_capture", _, _) => (
            None,
            "An authorization: nothing was captured, so nothing can be refunded. Capture or cancel it first.".into(),
        ),
        (status, _, _) => (None, format!("Only a succeeded payment can be refunded; this one is {status}.")),
    };
    let refunds = refunds
        .into_iter()
        .map(|r| RefundLine {
            lookup: lookup_note(&r.status, r.next_lookup_secs, r.reconcile_attempts),
            id: RefundId(r.id).to_string(),
            amount: money(r.amount, &r.currency),
            reason: r.reason.unwrap_or_default(),
            status: r.status,
            gateway_refund: r.gateway_refund_id.unwrap_or_default(),
            failure: match (r.reversed_at, r.failure_message) {
                (Some(at), message) => format!(
                    "Failed after it had succeeded (reversed {}): the money came back, and {} is refundable again.{}",
                    crate::web::clock(at),
                    money(r.amount, &r.currency),
                    message.map(|m| format!(" {m}")).unwrap_or_default()
                ),
                (None, message) => message.unwrap_or_default(),
            },
            created: crate::web::clock(r.created_at),
            created_iso: rfc3339(r.created_at),
            key_id: r.key_id.to_string(),
            this_form: !query.form.is_empty() && r.client_key.as_deref() == Some(query.form.as_str()),
            client_key: r.client_key.unwrap_or_default(),
            by: r.by.unwrap_or_default(),
        })
        .collect();
    let page = PaymentPage {
        id: id.to_string(),
        customer: p.customer_name.clone(),
        customer_id: CustomerId(p.customer_id).to_string(),
        amount: money(p.amount, &p.currency),
        status: p.status.clone(),
        payment_method: p.payment_method.clone(),
        payment_intent: p.payment_intent.clone().unwrap_or_default(),
        description: p.description.clone().unwrap_or_default(),
        failure: p.failure_message.clone().unwrap_or_default(),
        created: rfc3339(p.created_at),
        key_id: p.key_id.map(|k| k.to_string()).unwrap_or_default(),
        client_key: p.client_key.clone().unwrap_or_default(),
        captured: match (p.capture_method.as_str(), p.status.as_str()) {
            ("automatic", _) => String::new(),
            (_, "requires_capture") => format!(
                "Authorized, not captured: {} held{}",
                money(p.amount_capturable, &p.currency),
                if p.settlement.is_some() { " (its settlement is in progress)" } else { "" }
            ),
            (_, "succeeded") => format!(
                "{} of {} authorized (the rest was released)",
                money(p.amount_captured, &p.currency),
                money(p.amount, &p.currency)
            ),
            (_, "canceled") => "Nothing: the authorization was cancelled (or expired) and its hold released".into(),
            (_, status) => format!("Nothing ({status})"),
        },
        settlement: p.settlement.clone().unwrap_or_default(),
        settled_by: p.settled_by.map(|k| k.to_string()).unwrap_or_default(),
        refunded: money(p.amount_refunded - pending, &p.currency),
        pending: if pending > 0 { money(pending, &p.currency) } else { String::new() },
        remaining: money(remaining, &p.currency),
        refunds,
        form,
        no_form,
        chrome: operator.chrome(&state, "keys").await?,
    };
    let mut response = page::render(StatusCode::OK, &page)?;
    // Not `no-store` (the default of these pages): Back must show this very page, with its form's
    // key, so that sending the form from it again is a retry and not a second refund.
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
    Ok(response)
}

/// What happens next to a pending refund, for the operator: when the sweeper asks the gateway
/// again (refunds/reconcile.rs), or why it does not yet. Empty for a final refund.
fn lookup_note(status: &str, next_lookup_secs: Option<f64>, attempts: i32) -> String {
    if status != "pending" {
        return String::new();
    }
    let asked = match attempts {
        0 => "not asked yet".to_owned(),
        1 => "asked once so far".to_owned(),
        n => format!("asked {n} times so far"),
    };
    match next_lookup_secs {
        Some(secs) if secs > 0.0 => format!("next look-up at the gateway in {} s ({asked})", secs.ceil() as i64),
        Some(_) => format!("look-up due: on the sweeper's next pass ({asked})"),
        None => "no look-up scheduled yet: its key's work has not brought back the gateway's refund id".to_owned(),
    }
}

#[derive(Deserialize)]
struct RefundFormData {
    #[serde(default)]
    key: String,
    #[serde(default)]
    amount: String,
    #[serde(default)]
    reason: String,
}

/// `POST /admin/payments/{id}/refunds`: refund, through the API's own code path, under the form's
/// key, on behalf of the payment's customer. Every outcome is a message on the payment's page.
async fn refund(
    State(state): State<AppState>,
    operator: Operator,
    Path(id): Path<String>,
    Form(form): Form<RefundFormData>,
) -> Result<Response, WebError> {
    let id = PaymentId::parse(&id).ok_or(WebError::NotFound)?;
    let payment = queries::payment(state.engine.pool(), id.0).await?.ok_or(WebError::NotFound)?;
    // The key comes from our own form; anything but a UUID was not made by it.
    let key = Uuid::try_parse(&form.key)
        .ok()
        .and_then(|uuid| IdempotencyKey::new(uuid.to_string()).ok())
        .ok_or_else(|| WebError::BadRequest("the refund form is damaged; reload the payment's page".into()))?;
    let result = format!("/admin/payments/{id}?form={key}");
    let message = match refund_request(&payment, &form, &operator.name) {
        Err(message) => message,
        Ok(request) => {
            let asked = request.amount.unwrap_or_default();
            let op = operation(Op::Refund, payment.customer_id, key.clone(), &request)
                .map_err(|err| WebError::Internal(err.to_string()))?;
            let outcome = submit(&state, op).await?;
            tracing::info!(
                payment = %id, key = %key, by = %operator.name, ok = outcome.is_ok(),
                "operator refund submitted"
            );
            outcome_message(outcome, asked, &payment.currency)?
        }
    };
    operator.flash(message).await?;
    Ok(Redirect::to(&result).into_response())
}

/// How long a send of the form waits for an earlier send of the same form (the first of a double
/// click) to finish, so that it can say what that one did: the browser shows the page of the
/// last click only.
const WAIT_FOR_EARLIER: Duration = Duration::from_secs(5);

/// Runs the refund through the engine. When an earlier send of the same form holds the key (a
/// live lease: the first click is at the gateway), waits for its stored answer and asks again,
/// which replays it; past [`WAIT_FOR_EARLIER`], says it is under way.
async fn submit(state: &AppState, op: Operation) -> Result<Result<Answer, ApiError>, WebError> {
    let outcome = execute(state, Op::Refund, op.clone()).await;
    if !matches!(outcome, Err(ApiError::InFlight { reason: Busy::InFlight, .. })) {
        return Ok(outcome);
    }
    let deadline = Instant::now() + WAIT_FOR_EARLIER;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stored = state.engine.stored_response(op.customer_id, op.key.as_str(), ROUTE).await?;
        if matches!(stored, Some(Some(_))) {
            return Ok(execute(state, Op::Refund, op).await);
        }
    }
    Ok(outcome)
}

/// The refund the form asks for, validated as the API validates it, and made in the operator's
/// name; or the message saying why nothing was sent.
fn refund_request(
    payment: &PaymentDetail,
    form: &RefundFormData,
    operator: &str,
) -> Result<crate::refunds::NewRefund, Flash> {
    let currency = Currency::of(&payment.currency).ok_or_else(|| {
        Flash::error(format!("Nothing was refunded: {} is not a currency Stripe supports.", payment.currency))
    })?;
    // Read in the payment's own units (500 is 500 yen, 1.25 is 1.250 dinars), refusing what
    // Stripe would refuse for the currency before anything is sent.
    let amount = currency.parse(&form.amount).map_err(|error| {
        Flash::error(format!("Nothing was refunded: “{}” {}.", form.amount.trim(), currency.explain(&error)))
    })?;
    let reason = Some(form.reason.trim().to_owned()).filter(|reason| !reason.is_empty());
    let body =
        CreateRefund { payment: PaymentId(payment.id).to_string(), amount: Some(amount), reason, metadata: None };
    let mut request = body.validate().map_err(|errors| {
        let detail = errors.iter().map(|e| format!("{}: {}", e.field, e.detail)).collect::<Vec<_>>().join("; ");
        Flash::error(format!("Nothing was refunded: {detail}."))
    })?;
    request.by = Some(format!("operator:{operator}"));
    Ok(request)
}

/// What to tell the operator about the engine's answer to the form.
fn outcome_message(outcome: Result<Answer, ApiError>, asked: i64, currency: &str) -> Result<Flash, WebError> {
    let answer = match outcome {
        Ok(answer) => answer,
        // The first of a double click (or an earlier send of this form) holds the key.
        Err(ApiError::InFlight { .. }) => {
            return Ok(Flash::warning(
                "This form's refund is already under way (the form was sent twice): it is listed below, pending \
                 until the gateway answers. Nothing is refunded twice; reload this page for its outcome.",
            ));
        }
        Err(ApiError::KeyReused(_)) => {
            return Ok(Flash::warning(
                "Nothing was done: this form was already sent with other details (another amount or reason), and \
                 its refund is listed below. To refund more, use the fresh form below.",
            ));
        }
        // The claim and the reservation are committed; the key is released for a retry.
        Err(ApiError::Gateway { .. } | ApiError::GatewayRefused { .. }) => {
            return Ok(Flash::warning(
                "The gateway did not answer the refund yet. It is reserved on the payment (listed below as pending) \
                 and payonce finishes it on its own, with the same downstream key: do not refund it again.",
            ));
        }
        Err(ApiError::DatabaseUnavailable(_)) => {
            return Ok(Flash::error(
                "The database could not be reached, so the refund may not have been recorded. Check the refunds \
                 below before refunding again.",
            ));
        }
        Err(err) => return Err(WebError::Internal(err.to_string())),
    };
    let body: Value = serde_json::from_slice(&answer.stored.body).unwrap_or_default();
    let again = if answer.replayed { "This form was already sent, and this is its answer: " } else { "" };
    if answer.stored.status == StatusCode::CREATED {
        let amount = money(body["amount"].as_i64().unwrap_or_default(), body["currency"].as_str().unwrap_or(currency));
        let (id, status) = (body["id"].as_str().unwrap_or_default(), body["status"].as_str().unwrap_or_default());
        let gateway = body["gateway_refund"].as_str().map(|g| format!(", gateway refund {g}")).unwrap_or_default();
        return Ok(Flash::success(if answer.replayed {
            format!(
                "This form was already sent: it refunded {amount} (refund {id}, {status}{gateway}). Nothing was \
                 refunded again."
            )
        } else {
            format!("Refunded {amount}: refund {id}, {status}{gateway}.")
        }));
    }
    // A problem: refused by the payment (not stored: the key stays unused) or a final failure.
    let slug = body["type"].as_str().and_then(|t| t.rsplit('/').next()).unwrap_or_default();
    let detail = body["detail"].as_str().unwrap_or("The refund could not be made.");
    let text = match slug {
        "refund-exceeds-payment" => match body["remaining"].as_i64().unwrap_or_default() {
            0 => "Nothing was refunded: this payment is already refunded in full (its pending refunds included)."
                .to_owned(),
            remaining => format!(
                "Nothing was refunded: {} is more than the {} that remains of this payment (its other refunds, \
                 pending ones included, take the rest).",
                money(asked, currency),
                money(remaining, currency)
            ),
        },
        "payment-not-refundable" => format!(
            "Nothing was refunded: only a succeeded payment can be refunded; this one is {}.",
            body["payment_status"].as_str().unwrap_or("not succeeded")
        ),
        _ => format!("{again}{}: {detail}", body["title"].as_str().unwrap_or("The refund failed")),
    };
    Ok(Flash::error(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pending refund says when the gateway is asked next, or why not yet; a final one nothing.
    #[test]
    fn lookups() {
        assert_eq!(lookup_note("pending", Some(4.2), 0), "next look-up at the gateway in 5 s (not asked yet)");
        assert_eq!(lookup_note("pending", Some(60.0), 1), "next look-up at the gateway in 60 s (asked once so far)");
        assert_eq!(
            lookup_note("pending", Some(-3.0), 7),
            "look-up due: on the sweeper's next pass (asked 7 times so far)"
        );
        assert!(lookup_note("pending", None, 0).starts_with("no look-up scheduled"));
        assert_eq!(lookup_note("succeeded", Some(4.0), 2), "");
        assert_eq!(lookup_note("failed", None, 2), "");
    }
}
