//! Where a claimed key is driven to completion: the recovery points of a payment.
//!
//! ```text
//!  started ──(1)──► payment_created ──(2: gateway call, no transaction)──(3)──► finished
//! ```
//!
//! 1. Insert the pending payment, in the very transaction that claims the key: the key is
//!    created at `payment_created`, and claiming costs no commit of its own ([`Idempotent::begin`]).
//! 2. Charge through the gateway with the downstream idempotency key, the lease kept alive by a
//!    heartbeat. Nothing in the database is locked meanwhile.
//! 3. One statement: record the gateway's answer on the payment, store the final response, mark
//!    the key `completed`. The business write and the response commit together, so a replay can
//!    never disagree with the payment.
//!
//! Every statement is fenced by the lease token. A crash anywhere leaves the key at its last
//! committed point; whoever reclaims it (a client retry or the sweeper) calls [`run`] again and
//! continues from there. Between (2) and (3) a crash forgets the gateway's answer, which is why
//! step 2 is itself idempotent: the same downstream key returns the same PaymentIntent.
//!
//! What each gateway [`Outcome`] does (docs/lifecycle.md, "Outcomes"): succeeded (201), declined
//! (402) and pending (202, the payment `processing` or `requires_action`) are stored as the key's
//! answer; refused (payonce's own configuration) and unknown are never stored: the lease is
//! released and the key stays at `payment_created` for the next attempt, within its budget. A
//! key whose budget is spent is not charged again but reconciled ([`super::reconcile`]).

use std::collections::HashMap;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::model::{Payment, PaymentId, PaymentStatus};
use super::request::NewPayment;
use super::{reconcile, store};
use crate::customers::CustomerId;
use crate::failpoint;
use crate::gateway::{self, Charge, Decline, DeclinedBy, Gateway, Outcome};
use crate::idempotency::{
    Begun, BoxFuture, Engine, EventKind, Idempotent, Lease, LookedUp, RecoveryPoint, StoredResponse,
};
use crate::problem::{self, Problem};
use tracing::Instrument;

/// Why a key was not driven to completion this time (the engine's, shared by every operation).
pub use crate::idempotency::ProcessError;

/// The recovery point at which the payment row exists: the gateway may or may not have been
/// called.
pub const PAYMENT_CREATED: RecoveryPoint = RecoveryPoint::named("payment_created");

/// The payment as an idempotent operation ([`Idempotent`]): what the engine needs to drive
/// `POST /v1/payments` keys, for a request, a retry and the sweeper alike.
#[derive(Clone)]
pub struct Payments {
    gateway: Gateway,
}

impl Payments {
    pub fn new(gateway: Gateway) -> Self {
        Self { gateway }
    }
}

impl Idempotent for Payments {
    fn begin<'a>(&'a self, conn: &'a mut PgConnection, lease: &'a mut Lease) -> BoxFuture<'a, sqlx::Result<Begun>> {
        Box::pin(async move {
            let request: NewPayment = lease.request_for_begin()?;
            let Some(payment) = create_payment(conn, lease, &request).await? else {
                return Ok(Begun::Taken);
            };
            lease.carry(payment);
            Ok(Begun::Written)
        })
    }

    fn resume(&self, lease: Lease) -> BoxFuture<'_, Result<StoredResponse, ProcessError>> {
        Box::pin(run(&self.gateway, lease))
    }

    /// Pending payments (`requires_action`, `processing`) whose look-up is due.
    fn look_up_due<'a>(&'a self, engine: &'a Engine, limit: i64) -> BoxFuture<'a, sqlx::Result<LookedUp>> {
        Box::pin(async move {
            let due = super::reconcile::due_pending(engine, limit).await?;
            Ok(LookedUp::each(due, |payment| {
                let (engine, gateway) = (engine.clone(), self.gateway.clone());
                let span = tracing::info_span!("look_up", payment = %payment.id, status = payment.status);
                async move {
                    let looked = super::reconcile::pending(&engine, &gateway, &payment).await?;
                    if let super::reconcile::Looked::Moved(status) = looked {
                        tracing::info!(status = status.as_str(), "a pending payment moved forward");
                    }
                    Ok(matches!(looked, super::reconcile::Looked::Moved(_)))
                }
                .instrument(span)
            })
            .await)
        })
    }
}

/// Drives a claimed key from its recovery point to a stored response. A key whose budget is
/// spent (only the sweeper holds one) is reconciled instead of charged.
pub async fn run(gateway: &Gateway, mut lease: Lease) -> Result<StoredResponse, ProcessError> {
    let point = lease.recovery_point.as_str().to_owned();
    let payment = match point.as_str() {
        point if point == PAYMENT_CREATED.as_str() => match lease.take::<Payment>() {
            // Just claimed (or just begun from `started`, by the engine): the payment was inserted
            // with the key (and committed with it).
            Some(payment) => {
                failpoint::hit("after_claim").await;
                failpoint::hit("after_payment_created").await;
                payment
            }
            None => store::find_by_key(lease.engine().pool(), lease.key_id)
                .await?
                .ok_or_else(|| lease.corrupt("at payment_created without a payment"))?,
        },
        // The engine begins a key at `started` before it resumes it; a finished key is final, and
        // a final key's lease is never handed out.
        other => {
            return Err(lease.corrupt(format!("asked to resume a key at {other}")));
        }
    };
    if lease.exhausted() {
        return reconcile::key(gateway, lease, payment).await;
    }
    let outcome = lease.hold(gateway.charge(charge_for(&payment, &lease))).await?;
    failpoint::hit("after_charge").await;
    conclude(&lease, payment, outcome).await
}

/// Acts on the gateway's answer about a key's payment: stores a final or pending answer, or
/// gives the key back after a refused or unknown one.
pub(super) async fn conclude(
    lease: &Lease,
    mut payment: Payment,
    outcome: Outcome,
) -> Result<StoredResponse, ProcessError> {
    // A charge canceled before it was ever authorized is the gateway's refusal of it.
    let outcome = match outcome {
        Outcome::Canceled { payment_intent } => Outcome::Declined(Decline::canceled(payment_intent)),
        other => other,
    };
    match outcome {
        Outcome::Refused(refusal) => Err(lease.refused(refusal).await),
        Outcome::Unknown(error) => Err(lease.unknown(error).await),
        // Succeeded, declined, pending, authorized: an answer about the payment, stored.
        answered => {
            payment.apply(&answered);
            let decline = match &answered {
                Outcome::Declined(decline) => Some(decline),
                _ => None,
            };
            let response = final_response(&payment, decline);
            finish(lease, &payment, &response).await?;
            tracing::info!(
                key_id = %lease.key_id,
                payment = %payment.id,
                status = payment.status.as_str(),
                attempts = lease.attempts,
                "payment answered"
            );
            Ok(response)
        }
    }
}

/// Recovery point 1: the pending payment exists. Runs in the transaction that claimed the key
/// (or that advanced it from `started`, fenced), so it needs no fence of its own. The payment is
/// named by the request's identity; `None` if a payment of that name exists (an earlier
/// generation of the same request, whose key expired): nothing is written then.
async fn create_payment(conn: &mut PgConnection, lease: &Lease, request: &NewPayment) -> sqlx::Result<Option<Payment>> {
    let id = PaymentId(lease.identity());
    let metadata = serde_json::to_value(&request.metadata).unwrap_or_default();
    let created_at = sqlx::query_scalar!(
        r#"
        with payment as (
            insert into payments (id, customer_id, key_id, amount, currency, payment_method, description, metadata,
                                  capture_method)
            values ($1, $2, $3, $4, $5, $6, $7, $8, $11)
            on conflict (id, customer_id) do nothing
            returning created_at
        ), event as (
            insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
            select $3, $2, 'payment_created', $9, jsonb_build_object('payment', $10::text)
            from payment
        )
        select created_at as "created_at!" from payment
        "#,
        id.0,
        lease.customer_id,
        lease.key_id,
        request.amount,
        request.currency,
        request.payment_method,
        request.description,
        metadata,
        lease.token,
        id.to_string(),
        if request.manual_capture() { "manual" } else { "automatic" },
    )
    .fetch_optional(conn)
    .await?;
    let Some(created_at) = created_at else { return Ok(None) };
    crate::idempotency::events::count_phase(PAYMENT_CREATED.as_str(), 1);
    Ok(Some(Payment::pending(id, lease.customer_id, request, metadata, created_at)))
}

/// The gateway request for a key's payment, with its downstream key: a function of the payment's
/// id, itself the request's identity, so that it survives the database forgetting the key.
pub(super) fn charge_for<'a>(payment: &'a Payment, lease: &Lease) -> Charge<'a> {
    charge_with_key(payment, &lease.client_key, gateway::downstream_key(payment.id.0, lease.key_id))
}

/// The gateway request for a payment: its own fields, the client's metadata, and the audit trail
/// on the PaymentIntent (which payment, for whom, under which client key). The load tests group
/// the gateway's ledger by these to prove nothing was charged twice; reconciliation searches by
/// `payonce_payment`.
pub(crate) fn charge_with_key<'a>(payment: &'a Payment, client_key: &str, downstream_key: String) -> Charge<'a> {
    let mut metadata: HashMap<String, String> = match &payment.metadata {
        Value::Object(map) => map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect(),
        _ => HashMap::new(),
    };
    metadata.insert(gateway::PAYMENT_METADATA.into(), payment.id.to_string());
    metadata.insert("payonce_customer".into(), CustomerId(payment.customer_id).to_string());
    metadata.insert("payonce_idempotency_key".into(), client_key.to_owned());
    Charge {
        amount: payment.amount,
        currency: &payment.currency,
        payment_method: &payment.payment_method,
        description: payment.description.as_deref(),
        metadata,
        idempotency_key: downstream_key,
        manual_capture: payment.manual_capture,
    }
}

/// Recovery point 3: the payment's outcome and the response, committed together.
///
/// The payment moves forward only (a webhook may already have moved it further: its status then
/// stays, and the key still stores the answer the gateway gave to this call, as Stripe replays
/// it). A pending payment is scheduled for reconciliation.
async fn finish(lease: &Lease, payment: &Payment, response: &StoredResponse) -> Result<(), ProcessError> {
    let failure = payment.failure.as_ref();
    let budget = lease.engine().settings().budget;
    let finished = sqlx::query_scalar!(
        r#"
        with finished as (
            select * from idempotency_finish($1, $15, $2, false, $3, $4, $5, jsonb_build_object('payment_status', $6::text))
        ), payment as (
            update payments p
               set status = $6, gateway_payment_intent_id = coalesce($7, p.gateway_payment_intent_id),
                   failure_code = $8, decline_code = $9, failure_message = $10, next_action = $11,
                   amount_capturable = $14,
                   reconcile_at = case when $6 in ('requires_action', 'processing')
                                       then coalesce(p.reconcile_at, now() + payonce_backoff(1, $12, $13))
                                  end,
                   updated_at = now()
              from finished
             where p.key_id = finished.key_id and p.customer_id = finished.customer_id
               and payment_status_rank($6) > payment_status_rank(p.status)
        )
        select count(*) as "finished!" from finished
        "#,
        lease.key_id,
        lease.token,
        response.status.as_u16() as i16,
        response.headers_json(),
        response.body.as_ref(),
        payment.status.as_str(),
        payment.payment_intent,
        failure.map(|f| f.code.as_str()),
        failure.and_then(|f| f.decline_code.as_deref()),
        failure.map(|f| f.message.as_str()),
        payment.next_action,
        budget.backoff.base.as_secs_f64(),
        budget.pending_cap.as_secs_f64(),
        payment.amount_capturable,
        lease.customer_id,
    )
    .fetch_one(lease.engine().pool())
    .await?;
    Ok(lease.finished(finished == 1, false)?)
}

/// Gives a key up for good once the gateway has confirmed there is no charge for it (or it never
/// reached the gateway): the payment (if any) is marked failed, the key `failed` with a stored 502
/// that every retry gets. Nothing was charged, and nothing ever will be under this key.
pub(super) async fn not_charged(
    lease: &Lease,
    payment: Option<&Payment>,
    why: &str,
) -> Result<StoredResponse, ProcessError> {
    let mut problem = Problem::new(
        StatusCode::BAD_GATEWAY,
        "payment-abandoned",
        "Payment abandoned",
        format!(
            "payonce could not complete this payment and stopped trying: {why}, and the gateway confirmed that no charge \
             was made for it. Nothing was charged, and nothing will be under this Idempotency-Key. To pay, send the \
             payment again with a new Idempotency-Key."
        ),
    );
    if let Some(payment) = payment {
        problem = problem.with("payment", payment.id.to_string());
    }
    let response = StoredResponse::new(
        StatusCode::BAD_GATEWAY,
        problem::CONTENT_TYPE,
        payment.map(Payment::location),
        problem.to_json(),
    );
    let failed = sqlx::query_scalar!(
        r#"
        with failed as (
            update idempotency_keys
               set state = 'failed',
                   response_status = $3, response_headers = $4, response_body = $5,
                   locked_until = null, completed_at = now(), updated_at = now()
             where id = $1 and customer_id = $7 and lease_token = $2 and state = 'processing'
            returning id, customer_id, lease_token, recovery_point
        ), payment as (
            update payments p
               set status = 'failed', failure_code = 'not_charged', failure_message = $6, updated_at = now()
              from failed
             where p.key_id = failed.id and p.status = 'pending'
        ), event as (
            insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
            select id, customer_id, 'failed', lease_token,
                   jsonb_build_object('reason', $6::text, 'recovery_point', recovery_point)
            from failed
        )
        select count(*) as "failed!" from failed
        "#,
        lease.key_id,
        lease.token,
        response.status.as_u16() as i16,
        response.headers_json(),
        response.body.as_ref(),
        why,
        lease.customer_id,
    )
    .fetch_one(lease.engine().pool())
    .await?;
    if failed == 1 {
        EventKind::Failed.count(1);
        tracing::warn!(key_id = %lease.key_id, attempts = lease.attempts, why, "gave a key up: the gateway confirmed no charge");
        Ok(response)
    } else {
        Err(lease.lost().into())
    }
}

/// The response every retry of this key will get from now on: the payment (201 once it
/// succeeded, 202 while it is pending), or the 402 problem of its decline.
pub(crate) fn final_response(payment: &Payment, decline: Option<&Decline>) -> StoredResponse {
    let Some(decline) = decline else {
        // Succeeded, or authorized as asked: the payment the client wanted. Pending: 202.
        let status = match payment.status {
            PaymentStatus::Succeeded | PaymentStatus::RequiresCapture => StatusCode::CREATED,
            _ => StatusCode::ACCEPTED,
        };
        let body = serde_json::to_vec(&payment.to_json()).expect("a payment always serialises");
        return StoredResponse::new(status, "application/json", Some(payment.location()), body);
    };
    let (slug, title, detail) = match decline.by {
        DeclinedBy::Issuer => (
            "card-declined",
            "Card declined",
            format!(
                "The card was declined: {} Ask the customer for another payment method; this key will keep returning this \
                 answer.",
                decline.message
            ),
        ),
        DeclinedBy::Gateway => (
            "payment-rejected",
            "Payment rejected by the gateway",
            format!(
                "The gateway refused the payment method: {} Ask the customer for another payment method and pay with a new \
                 Idempotency-Key; this key will keep returning this answer.",
                decline.message
            ),
        ),
    };
    let problem = Problem::new(StatusCode::PAYMENT_REQUIRED, slug, title, detail)
        .with("payment", payment.id.to_string())
        .with("payment_intent", payment.payment_intent.clone())
        .with("code", decline.code.as_str())
        .with("decline_code", decline.decline_code.clone());
    StoredResponse::new(
        StatusCode::PAYMENT_REQUIRED,
        problem::CONTENT_TYPE,
        Some(payment.location()),
        problem.to_json(),
    )
}

/// The same payment without the idempotency layer: no key, no lease, no fence, no stored
/// response, and so none of the guarantees. It exists only so that the benchmark can measure
/// what the layer costs (`payonce serve --bench-routes`, `POST /bench/payments`); never expose it.
pub async fn run_unprotected(
    gateway: &Gateway,
    pool: &sqlx::PgPool,
    customer_id: Uuid,
    request: &NewPayment,
) -> Result<StoredResponse, ProcessError> {
    let id = PaymentId(Uuid::now_v7());
    let metadata = serde_json::to_value(&request.metadata).unwrap_or_default();
    let created_at = sqlx::query_scalar!(
        r#"
        insert into payments (id, customer_id, amount, currency, payment_method, description, metadata)
        values ($1, $2, $3, $4, $5, $6, $7)
        returning created_at
        "#,
        id.0,
        customer_id,
        request.amount,
        request.currency,
        request.payment_method,
        request.description,
        metadata,
    )
    .fetch_one(pool)
    .await?;
    let mut payment = Payment::pending(id, customer_id, request, metadata, created_at);
    let charge = charge_with_key(&payment, "", format!("payonce-bench-{}", Uuid::new_v4().simple()));
    let decline = match gateway.charge(charge).await {
        Outcome::Refused(refusal) => {
            return Err(ProcessError::Refused { refusal, retry_after: Duration::from_secs(1) });
        }
        Outcome::Unknown(error) => return Err(ProcessError::Gateway { error, retry_after: Duration::from_secs(1) }),
        outcome => {
            payment.apply(&outcome);
            match outcome {
                Outcome::Declined(decline) => Some(decline),
                _ => None,
            }
        }
    };
    let failure = payment.failure.as_ref();
    sqlx::query!(
        r#"
        update payments
           set status = $2, gateway_payment_intent_id = $3,
               failure_code = $4, decline_code = $5, failure_message = $6, updated_at = now()
         where id = $1
        "#,
        id.0,
        payment.status.as_str(),
        payment.payment_intent,
        failure.map(|f| f.code.as_str()),
        failure.and_then(|f| f.decline_code.as_deref()),
        failure.map(|f| f.message.as_str()),
    )
    .execute(pool)
    .await?;
    Ok(final_response(&payment, decline.as_ref()))
}
