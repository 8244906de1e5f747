//! The refund as an idempotent operation: its phases, and the gateway call between them.
//!
//! ```text
//!  claim + (1) ──► refund_created ──(2: gateway call, no transaction)──(3)──► finished
//! ```
//!
//! 1. [`Refunds::begin`], in the claim's transaction: lock the payment's row, check it is this
//!    customer's, succeeded, and has the amount left; raise its `amount_refunded` by the refund's
//!    amount (the *reservation*) and insert the pending refund and its `refund_created` event
//!    (which names the operator, `detail.by`, for a refund made from the dashboard). One commit
//!    for the key and the refund; the row lock lasts as long as that transaction, never across the gateway call. A
//!    payment that is not there (or another customer's), not succeeded, or without enough left
//!    rolls the claim back: the answer (404, 409) is not stored and the key stays unused.
//! 2. `POST /v1/refunds` at the gateway with the downstream key [`gateway::refund_key`], under a
//!    heartbeat.
//! 3. One transaction: the refund's outcome (a failed refund gives its reservation back) and the
//!    key's final response ([`Lease::finish_in`]), built from the row: a refund a webhook settled
//!    first is answered as it settled, not as the gateway's replayed create answer says. A
//!    refund left pending is scheduled for look-ups ([`super::reconcile`]) until it settles.
//!
//! Outcomes as for payments: succeeded and pending are answered 201 with the refund; declined
//! (the gateway will not refund) is a final 502 `refund-rejected` with the reservation returned;
//! refused and unknown release the key for a retry within its budget. A key whose budget is
//! spent is reconciled: replayed with the same downstream key inside the horizon, looked up
//! among the PaymentIntent's refunds (by payonce's metadata) after it, and given up (502
//! `refund-abandoned`, the reservation returned) only when the gateway has no such refund.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::{Value, json};
use sqlx::PgConnection;

use super::model::{Refund, RefundId, RefundStatus};
use super::request::NewRefund;
use super::store;
use crate::customers::CustomerId;
use crate::failpoint;
use crate::gateway::{self, Gateway, RefundCall, RefundOutcome};
use crate::idempotency::{
    Begun, BoxFuture, Engine, Idempotent, Lease, LookedUp, ProcessError, RecoveryPoint, StoredResponse,
};
use crate::money::Currency;
use crate::payments::PaymentId;
use crate::problem::{self, FieldError, Problem};
use tracing::Instrument;

/// The recovery point at which the refund row exists and its amount is reserved on the payment:
/// the gateway may or may not have been called.
pub const REFUND_CREATED: RecoveryPoint = RecoveryPoint::named("refund_created");

/// The refund as an idempotent operation ([`Idempotent`]).
#[derive(Clone)]
pub struct Refunds {
    gateway: Gateway,
}

impl Refunds {
    pub fn new(gateway: Gateway) -> Self {
        Self { gateway }
    }
}

/// What the first write hands to the rest of the work: the refund and the PaymentIntent to refund.
struct Created {
    refund: Refund,
    payment_intent: Option<String>,
}

impl Idempotent for Refunds {
    fn begin<'a>(&'a self, conn: &'a mut PgConnection, lease: &'a mut Lease) -> BoxFuture<'a, sqlx::Result<Begun>> {
        Box::pin(async move {
            let request: NewRefund = lease.request_for_begin()?;
            match reserve(conn, lease, &request).await? {
                Ok(Some(created)) => {
                    lease.carry(created);
                    Ok(Begun::Written)
                }
                Ok(None) => Ok(Begun::Taken),
                Err(rejected) => Ok(Begun::Rejected(rejected)),
            }
        })
    }

    fn resume(&self, lease: Lease) -> BoxFuture<'_, Result<StoredResponse, ProcessError>> {
        Box::pin(run(&self.gateway, lease))
    }

    /// Refunds the gateway answered `pending` whose look-up is due.
    fn look_up_due<'a>(&'a self, engine: &'a Engine, limit: i64) -> BoxFuture<'a, sqlx::Result<LookedUp>> {
        Box::pin(async move {
            let due = super::reconcile::due_pending(engine, limit).await?;
            Ok(LookedUp::each(due, |refund| {
                let (engine, gateway) = (engine.clone(), self.gateway.clone());
                let span = tracing::info_span!("look_up_refund", refund = %refund.id, status = refund.status);
                async move {
                    let looked = super::reconcile::pending(&engine, &gateway, &refund).await?;
                    if let super::reconcile::Looked::Moved(status) = looked {
                        tracing::info!(status = status.as_str(), "a pending refund settled");
                    }
                    Ok(matches!(looked, super::reconcile::Looked::Moved(_)))
                }
                .instrument(span)
            })
            .await)
        })
    }
}

/// Drives a claimed refund key from its recovery point to a stored response.
async fn run(gateway: &Gateway, mut lease: Lease) -> Result<StoredResponse, ProcessError> {
    let point = lease.recovery_point.as_str().to_owned();
    let created = match point.as_str() {
        point if point == REFUND_CREATED.as_str() => lease.take::<Created>(),
        other => return Err(lease.corrupt(format!("asked to resume a key at {other}"))),
    };
    let Created { refund, payment_intent } = match created {
        Some(created) => created,
        None => {
            let (refund, payment_intent) = store::find_by_key(lease.engine().pool(), lease.key_id)
                .await?
                .ok_or_else(|| lease.corrupt("at refund_created without a refund"))?;
            Created { refund, payment_intent }
        }
    };
    failpoint::hit("after_refund_created").await;
    let Some(payment_intent) = payment_intent else {
        // A succeeded payment always has its PaymentIntent (the answer that made it succeed named it).
        return Err(lease.corrupt("the refunded payment has no PaymentIntent"));
    };
    if lease.exhausted() {
        return reconcile(gateway, lease, refund, &payment_intent).await;
    }
    let outcome = lease.hold(gateway.refund(call_for(&refund, &payment_intent, &lease))).await?;
    failpoint::hit("after_refund").await;
    conclude(&lease, refund, outcome).await
}

/// Recovery point 1, inside the claim's transaction: the reservation and the pending refund, or
/// the answer that refuses them (not stored); `Ok(None)` when the refund's name is taken.
async fn reserve(
    conn: &mut PgConnection,
    lease: &Lease,
    request: &NewRefund,
) -> sqlx::Result<Result<Option<Created>, StoredResponse>> {
    let Some(payment) = request.payment_id() else {
        return Ok(Err(crate::payments::no_such_payment()));
    };
    // The row lock orders refunds of one payment; it is held until this transaction commits,
    // a few statements later, and never across a gateway call.
    // The refund is named by the request's identity: if a refund of that name exists (an earlier
    // generation of the same request, whose key expired), nothing is reserved or written.
    let id = RefundId(lease.identity());
    let Some(row) = sqlx::query!(
        r#"
        select status, amount_captured, amount_refunded, currency, gateway_payment_intent_id,
               exists (select from refunds where id = $3) as "taken!"
        from payments
        where id = $1 and customer_id = $2
        for update
        "#,
        payment.0,
        lease.customer_id,
        id.0,
    )
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(Err(crate::payments::no_such_payment()));
    };
    if row.taken {
        return Ok(Ok(None));
    }
    if row.status != "succeeded" {
        return Ok(Err(not_refundable(payment, &row.status)));
    }
    // An amount Stripe refuses for the payment's currency (a dinar amount not ending in 0) is a
    // 400 naming it, like every other invalid field: the currency is the payment's, known here.
    if let (Some(amount), Some(currency)) = (request.amount, Currency::of(&row.currency))
        && let Err(why) = currency.check(amount)
    {
        return Ok(Err(problem::INVALID_REQUEST.stored(problem::invalid_fields(&[FieldError::new("amount", why)]))));
    }
    // Only the money that moved comes back: all of an automatic payment, what a capture took.
    let remaining = row.amount_captured - row.amount_refunded;
    let amount = request.amount.unwrap_or(remaining);
    if remaining == 0 || amount > remaining {
        return Ok(Err(exceeds(payment, amount, remaining, row.amount_captured, &row.currency)));
    }
    let metadata = serde_json::to_value(&request.metadata).unwrap_or_default();
    // The conditional update is the invariant itself: even a caller that skipped the check
    // above could not reserve more than remains (nor could the check constraint let it).
    let created_at = sqlx::query_scalar!(
        r#"
        with reserved as (
            update payments
               set amount_refunded = amount_refunded + $4, updated_at = now()
             where id = $3 and amount_refunded + $4 <= amount_captured
            returning id, currency
        ), refund as (
            insert into refunds (id, customer_id, payment_id, key_id, amount, currency, reason, metadata)
            select $1, $2, reserved.id, $5, $4, reserved.currency, $6, $7
            from reserved
            returning created_at
        ), event as (
            insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
            select $5, $2, 'refund_created', $8,
                   jsonb_strip_nulls(jsonb_build_object('refund', $9::text, 'payment', $10::text, 'amount', $4::int8,
                                                        'by', $11::text))
            from reserved
        )
        select created_at from refund
        "#,
        id.0,
        lease.customer_id,
        payment.0,
        amount,
        lease.key_id,
        request.reason,
        metadata,
        lease.token,
        id.to_string(),
        payment.to_string(),
        request.by,
    )
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| sqlx::Error::Protocol("the payment's row changed under its lock".into()))?;
    crate::idempotency::events::count_phase(REFUND_CREATED.as_str(), 1);
    let refund = Refund {
        id,
        customer_id: lease.customer_id,
        payment_id: payment,
        amount,
        currency: row.currency,
        reason: request.reason.clone(),
        metadata,
        status: RefundStatus::Pending,
        gateway_refund: None,
        failure: None,
        created_at,
    };
    Ok(Ok(Some(Created { refund, payment_intent: row.gateway_payment_intent_id })))
}

/// The gateway request for a key's refund, with its downstream key and payonce's audit trail
/// (which refund, of which payment, for whom, under which client key): the load tests audit the
/// gateway's ledger by these, and reconciliation finds the refund by `payonce_refund`.
fn call_for<'a>(refund: &'a Refund, payment_intent: &'a str, lease: &Lease) -> RefundCall<'a> {
    let mut metadata: HashMap<String, String> = match &refund.metadata {
        Value::Object(map) => map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect(),
        _ => HashMap::new(),
    };
    metadata.insert(gateway::REFUND_METADATA.into(), refund.id.to_string());
    metadata.insert(gateway::PAYMENT_METADATA.into(), refund.payment_id.to_string());
    metadata.insert("payonce_customer".into(), CustomerId(refund.customer_id).to_string());
    metadata.insert("payonce_idempotency_key".into(), lease.client_key.clone());
    RefundCall {
        payment_intent,
        amount: refund.amount,
        reason: refund.reason.as_deref(),
        metadata,
        idempotency_key: gateway::refund_key(refund.id.0, lease.key_id),
    }
}

/// Acts on the gateway's answer about a key's refund.
async fn conclude(lease: &Lease, mut refund: Refund, outcome: RefundOutcome) -> Result<StoredResponse, ProcessError> {
    match outcome {
        RefundOutcome::Succeeded { refund: gateway_refund } => {
            refund.status = RefundStatus::Succeeded;
            refund.gateway_refund = Some(gateway_refund);
            finish(lease, refund).await
        }
        RefundOutcome::Pending { refund: gateway_refund } => {
            refund.status = RefundStatus::Pending;
            refund.gateway_refund = Some(gateway_refund);
            finish(lease, refund).await
        }
        RefundOutcome::Declined { refund: gateway_refund, code, message } => {
            refund.status = RefundStatus::Failed;
            refund.gateway_refund = gateway_refund;
            refund.failure = Some((code, message));
            finish(lease, refund).await
        }
        RefundOutcome::Refused(refusal) => Err(lease.refused(refusal).await),
        RefundOutcome::Unknown(error) => Err(lease.unknown(error).await),
    }
}

/// Recovery point 3: the refund's outcome and the key's response, in one transaction. A failed
/// refund gives its reservation back to the payment in the same transaction.
///
/// The refund only moves forward, and the key answers with what its row says. A webhook may have
/// settled the refund while its key was unanswered (the gateway's answer was lost, then
/// `refund.updated` or `refund.failed` arrived): the gateway's replayed answer to the create call
/// still says what the refund was when it was made, and storing that would tell the client
/// "succeeded" about a refund the books say failed (or "pending" about one that is done). A refund
/// given up as never made ([`ABANDONED`]) stores the key as `failed` rather than answered.
async fn finish(lease: &Lease, mut refund: Refund) -> Result<StoredResponse, ProcessError> {
    let budget = lease.engine().settings().budget;
    let mut tx = lease.engine().pool().begin().await?;
    let (failure_code, failure_message) = refund.failure.clone().unzip();
    // Left pending with the gateway's id, it is looked up on the pending payments' schedule
    // (`refunds::reconcile`) in case no webhook ever tells; final, it is not.
    let settled = sqlx::query_scalar!(
        r#"
        with refund as (
            update refunds
               set status = $2, gateway_refund_id = coalesce($3, gateway_refund_id),
                   failure_code = $4, failure_message = $5,
                   reconcile_at = case when $2 = 'pending' and coalesce($3, gateway_refund_id) is not null
                                       then coalesce(reconcile_at, now() + payonce_backoff(1, $6, $7))
                                  end,
                   updated_at = now()
             where key_id = $1 and status = 'pending'
            returning payment_id, amount
        ), payment as (
            update payments p
               set amount_refunded = p.amount_refunded - refund.amount, updated_at = now()
              from refund
             where p.id = refund.payment_id and $2 = 'failed'
        )
        select count(*) as "settled!" from refund
        "#,
        lease.key_id,
        refund.status.as_str(),
        refund.gateway_refund,
        failure_code,
        failure_message,
        budget.backoff.base.as_secs_f64(),
        budget.pending_cap.as_secs_f64(),
    )
    .fetch_one(&mut *tx)
    .await?;
    if settled == 0 {
        // No longer pending: a webhook got there first. Its state is the answer.
        let row = sqlx::query!(
            "select status, gateway_refund_id, failure_code, failure_message from refunds where key_id = $1",
            lease.key_id,
        )
        .fetch_one(&mut *tx)
        .await?;
        let status = RefundStatus::parse(&row.status)
            .ok_or_else(|| lease.corrupt(format!("refund status {} unknown", row.status)))?;
        if status != refund.status {
            tracing::info!(
                key_id = %lease.key_id,
                refund = %refund.id,
                gateway = refund.status.as_str(),
                settled = status.as_str(),
                "the refund was settled by a webhook first; answering with its settled state"
            );
        }
        refund.status = status;
        refund.gateway_refund = row.gateway_refund_id.or(refund.gateway_refund);
        refund.failure = row.failure_code.zip(row.failure_message);
    }
    let response = answer(&refund);
    let abandoned = refund.failure.as_ref().is_some_and(|(code, _)| code == ABANDONED);
    let detail = json!({"refund": refund.id.to_string(), "refund_status": refund.status.as_str()});
    lease.finish_in(&mut tx, &response, abandoned, detail).await?;
    tx.commit().await?;
    match &refund.failure {
        Some((code, _)) => tracing::warn!(key_id = %lease.key_id, refund = %refund.id, code, "the refund failed"),
        None => {
            tracing::info!(key_id = %lease.key_id, refund = %refund.id, status = refund.status.as_str(), "refund answered")
        }
    }
    Ok(response)
}

/// The key's final answer about its refund: 201 with the refund while it is pending or once it
/// succeeded; a 502 problem once it failed (`refund-rejected` by the gateway, or
/// `refund-abandoned` when the gateway confirmed it never made it).
fn answer(refund: &Refund) -> StoredResponse {
    let Some((code, message)) = refund.failure.as_ref().filter(|_| refund.status == RefundStatus::Failed) else {
        let body = serde_json::to_vec(&refund.to_json()).expect("a refund always serialises");
        return StoredResponse::new(StatusCode::CREATED, "application/json", Some(refund.location()), body);
    };
    let problem = if code == ABANDONED {
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "refund-abandoned",
            "Refund abandoned",
            "payonce could not complete this refund and stopped trying, and the gateway confirmed that it never made \
             it. Nothing was refunded under this Idempotency-Key, and its amount is available to refund again: send \
             the refund with a new Idempotency-Key.",
        )
    } else {
        Problem::new(
            StatusCode::BAD_GATEWAY,
            "refund-rejected",
            "Refund rejected by the gateway",
            format!(
                "The gateway would not refund this payment: {message} Nothing was refunded under this \
                 Idempotency-Key, and its amount is available to refund again; this key will keep returning this \
                 answer."
            ),
        )
        .with("code", code.as_str())
    };
    let problem = problem.with("refund", refund.id.to_string()).with("payment", refund.payment_id.to_string());
    StoredResponse::new(StatusCode::BAD_GATEWAY, problem::CONTENT_TYPE, Some(refund.location()), problem.to_json())
}

/// The failure code of a refund given up because the gateway confirmed it never made it.
const ABANDONED: &str = "not_refunded";

/// Reconciles a refund key whose budget is spent: replay with the same downstream key inside
/// the horizon (the gateway answers from what it saved, or makes the refund the customer asked
/// for), look it up among the PaymentIntent's refunds after it.
async fn reconcile(
    gateway: &Gateway,
    lease: Lease,
    mut refund: Refund,
    payment_intent: &str,
) -> Result<StoredResponse, ProcessError> {
    let (method, outcome) = if lease.within_horizon() {
        ("replay", lease.hold(gateway.refund(call_for(&refund, payment_intent, &lease))).await?)
    } else {
        match lease.hold(gateway.find_refund(payment_intent, &refund.id.to_string())).await? {
            Some(outcome) => ("list", outcome),
            None => {
                // Every page was read; still, a call the gateway held may execute late: the same
                // settle rule as a payment's search decides when "none" is believed.
                lease.believe_absence("list").await?;
                refund.status = RefundStatus::Failed;
                refund.failure = Some((ABANDONED.into(), "the gateway has no such refund".into()));
                return finish(&lease, refund).await;
            }
        }
    };
    lease.reconciled(json!({"method": method, "answer": outcome.label(), "refund": outcome.refund()})).await?;
    conclude(&lease, refund, outcome).await
}

fn not_refundable(payment: PaymentId, status: &str) -> StoredResponse {
    let problem = Problem::new(
        StatusCode::CONFLICT,
        "payment-not-refundable",
        "Payment not refundable",
        format!(
            "Only a succeeded payment can be refunded; this one is {status}. Nothing was refunded and the \
             Idempotency-Key was not used."
        ),
    )
    .with("payment", payment.to_string())
    .with("payment_status", status);
    StoredResponse::new(StatusCode::CONFLICT, problem::CONTENT_TYPE, None, problem.to_json())
}

fn exceeds(payment: PaymentId, amount: i64, remaining: i64, paid: i64, currency: &str) -> StoredResponse {
    let problem = Problem::new(
        StatusCode::CONFLICT,
        "refund-exceeds-payment",
        "Refund exceeds what remains of the payment",
        if remaining == 0 {
            "This payment is already refunded in full (or its refunds in progress take all of it). Nothing was \
             refunded and the Idempotency-Key was not used."
                .to_owned()
        } else {
            format!(
                "A refund of {} is more than the {} that remains of this payment (its other refunds, including those \
                 in progress, take the rest). Nothing was refunded and the Idempotency-Key was not used.",
                crate::money::format(amount, currency),
                crate::money::format(remaining, currency)
            )
        },
    )
    .with("payment", payment.to_string())
    .with("amount", paid)
    .with("remaining", remaining);
    StoredResponse::new(StatusCode::CONFLICT, problem::CONTENT_TYPE, None, problem.to_json())
}
