//! Where a claimed key is driven to completion: the recovery points of a payment.
//!
//! ```text
//!  started ──(1)──► payment_created ──(2: gateway call, no transaction)──(3)──► finished
//! ```
//!
//! 1. One statement: insert the pending payment and advance the key to `payment_created`.
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
//! The outcome policy (docs/lifecycle.md): success, a decline and a gateway refusal are final and
//! stored; a timeout, a transport error or a gateway 5xx/429/409 is *unknown* and is never stored:
//! the lease is released and the key stays at `payment_created` for the next attempt.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::model::{Payment, PaymentId};
use super::request::NewPayment;
use super::store;
use crate::customers::CustomerId;
use crate::failpoint;
use crate::gateway::{self, Charge, ChargeOutcome, Gateway, GatewayError};
use crate::http::problem::{self, Problem};
use crate::idempotency::{EventKind, Lease, LeaseLost, RecoveryPoint, StoredResponse};

/// Why a key was not driven to completion this time.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Another worker took the key over; it will finish the work.
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
    /// The gateway gave no final answer. The lease was released so a retry can resume at once.
    #[error(transparent)]
    Gateway(GatewayError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The stored state cannot be continued by this code.
    #[error("idempotency key {key_id}: {reason}")]
    Corrupt { key_id: Uuid, reason: String },
}

/// Drives a claimed key from its recovery point to a final, stored response.
pub async fn run(gateway: &Gateway, lease: Lease) -> Result<StoredResponse, ProcessError> {
    let request = NewPayment::deserialize(&lease.request)
        .map_err(|err| corrupt(&lease, format!("stored request unreadable: {err}")))?;
    let mut payment = match lease.recovery_point {
        RecoveryPoint::Started => {
            failpoint::hit("after_claim").await;
            let payment = create_payment(&lease, &request).await?;
            failpoint::hit("after_payment_created").await;
            payment
        }
        RecoveryPoint::PaymentCreated => store::find_by_key(lease.engine().pool(), lease.key_id)
            .await?
            .ok_or_else(|| corrupt(&lease, "at payment_created without a payment".into()))?,
        // A finished key is final, and a final key's lease is never handed out.
        RecoveryPoint::Finished => {
            return Err(corrupt(&lease, "asked to resume a finished key".into()));
        }
    };
    let outcome = charge(gateway, &lease, &payment).await?;
    failpoint::hit("after_charge").await;
    payment.apply(&outcome);
    let response = final_response(&payment, &outcome);
    finish(&lease, &payment, &response).await?;
    tracing::info!(
        key_id = %lease.key_id,
        payment = %payment.id,
        status = payment.status.as_str(),
        attempts = lease.attempts,
        "payment completed"
    );
    Ok(response)
}

/// Recovery point 1: the pending payment exists.
async fn create_payment(lease: &Lease, request: &NewPayment) -> Result<Payment, ProcessError> {
    let id = PaymentId(Uuid::now_v7());
    let metadata = serde_json::to_value(&request.metadata).unwrap_or_default();
    let created_at = sqlx::query_scalar!(
        r#"
        with advanced as (
            update idempotency_keys
               set recovery_point = 'payment_created', updated_at = now()
             where id = $1 and lease_token = $2 and state = 'processing' and recovery_point = 'started'
            returning id, customer_id, lease_token
        ), payment as (
            insert into payments
                (id, customer_id, idempotency_key_id, amount, currency, payment_method, description, metadata)
            select $3, customer_id, id, $4, $5, $6, $7, $8
            from advanced
            returning created_at
        ), event as (
            insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
            select id, customer_id, 'payment_created', lease_token, jsonb_build_object('payment', $9::text)
            from advanced
        )
        select created_at from payment
        "#,
        lease.key_id,
        lease.token,
        id.0,
        request.amount,
        request.currency,
        request.payment_method,
        request.description,
        metadata,
        id.to_string(),
    )
    .fetch_optional(lease.engine().pool())
    .await?
    .ok_or_else(|| lease.lost())?;
    EventKind::PaymentCreated.count(1);
    Ok(Payment::pending(id, lease.customer_id, request, metadata, created_at))
}

/// Step 2: the gateway call, under the lease's heartbeat.
async fn charge(gateway: &Gateway, lease: &Lease, payment: &Payment) -> Result<ChargeOutcome, ProcessError> {
    let charge = charge_for(payment, &lease.client_key, gateway::downstream_key(lease.key_id));
    match lease.hold(gateway.charge(charge)).await? {
        Ok(outcome) => Ok(outcome),
        Err(err) => {
            tracing::warn!(key_id = %lease.key_id, error = %err, "no final answer from the gateway; releasing the key");
            if let Err(release_err) = lease.release(&err.to_string()).await {
                // The lease will simply run out; the next attempt waits for that.
                tracing::warn!(key_id = %lease.key_id, error = %release_err, "could not release the key");
            }
            Err(ProcessError::Gateway(err))
        }
    }
}

/// The gateway request for a payment: its own fields, the client's metadata, and the audit trail
/// on the PaymentIntent (which payment, for whom, under which client key). The load tests group
/// the gateway's ledger by these to prove nothing was charged twice.
fn charge_for<'a>(payment: &'a Payment, client_key: &str, downstream_key: String) -> Charge<'a> {
    let mut metadata: HashMap<String, String> = match &payment.metadata {
        Value::Object(map) => map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect(),
        _ => HashMap::new(),
    };
    metadata.insert("payonce_payment".into(), payment.id.to_string());
    metadata.insert("payonce_customer".into(), CustomerId(payment.customer_id).to_string());
    metadata.insert("payonce_idempotency_key".into(), client_key.to_owned());
    Charge {
        amount: payment.amount,
        currency: &payment.currency,
        payment_method: &payment.payment_method,
        description: payment.description.as_deref(),
        metadata,
        idempotency_key: downstream_key,
    }
}

/// Recovery point 3: the payment's outcome and the final response, committed together.
async fn finish(lease: &Lease, payment: &Payment, response: &StoredResponse) -> Result<(), ProcessError> {
    let failure = payment.failure.as_ref();
    let finished = sqlx::query_scalar!(
        r#"
        with finished as (
            update idempotency_keys
               set state = 'completed', recovery_point = 'finished',
                   response_status = $3, response_headers = $4, response_body = $5,
                   locked_until = null, completed_at = now(), updated_at = now()
             where id = $1 and lease_token = $2 and state = 'processing' and recovery_point = 'payment_created'
            returning id, customer_id, lease_token
        ), payment as (
            update payments p
               set status = $6, gateway_payment_intent_id = $7,
                   failure_code = $8, decline_code = $9, failure_message = $10, updated_at = now()
              from finished
             where p.idempotency_key_id = finished.id
        ), event as (
            insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
            select id, customer_id, 'completed', lease_token,
                   jsonb_build_object('status', $3::int2, 'payment_status', $6::text)
            from finished
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
    )
    .fetch_one(lease.engine().pool())
    .await?;
    if finished == 1 {
        EventKind::Completed.count(1);
        Ok(())
    } else {
        Err(lease.lost().into())
    }
}

/// Gives a key up for good, when its holders never got a final answer from the gateway: the
/// payment (if any) is marked failed, the key `failed` with a stored 502 that every retry gets.
/// Whether the gateway charged stays unknown; `docs/operations.md` says how an operator settles it.
pub async fn give_up(lease: &Lease, reason: &str) -> Result<StoredResponse, ProcessError> {
    let payment = store::find_by_key(lease.engine().pool(), lease.key_id).await?;
    let attempts = lease.attempts - 1;
    let mut problem = Problem::new(
        StatusCode::BAD_GATEWAY,
        "payment-abandoned",
        "Payment abandoned",
        format!(
            "payonce got no final answer from the payment gateway after {attempts} attempts ({reason}) and stopped \
             trying. The payment is marked failed; if the gateway did charge, an operator reconciles it. Check the \
             payment before paying again with a new Idempotency-Key."
        ),
    );
    if let Some(payment) = &payment {
        problem = problem.with("payment", payment.id.to_string());
    }
    let response = StoredResponse::new(
        StatusCode::BAD_GATEWAY,
        problem::CONTENT_TYPE,
        payment.as_ref().map(Payment::location),
        problem.to_json(),
    );
    let failed = sqlx::query_scalar!(
        r#"
        with failed as (
            update idempotency_keys
               set state = 'failed',
                   response_status = $3, response_headers = $4, response_body = $5,
                   locked_until = null, completed_at = now(), updated_at = now()
             where id = $1 and lease_token = $2 and state = 'processing'
            returning id, customer_id, lease_token, recovery_point
        ), payment as (
            update payments p
               set status = 'failed', failure_code = 'abandoned', failure_message = $6, updated_at = now()
              from failed
             where p.idempotency_key_id = failed.id and p.status = 'pending'
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
        reason,
    )
    .fetch_one(lease.engine().pool())
    .await?;
    if failed == 1 {
        EventKind::Failed.count(1);
        tracing::error!(key_id = %lease.key_id, attempts, reason, "gave up on a key; an operator should reconcile it");
        Ok(response)
    } else {
        Err(lease.lost().into())
    }
}

/// The response every retry of this key will get from now on.
fn final_response(payment: &Payment, outcome: &ChargeOutcome) -> StoredResponse {
    let (slug, title, detail, code, decline_code) = match outcome {
        ChargeOutcome::Succeeded { .. } => {
            let body = serde_json::to_vec(&payment.to_json()).expect("a payment always serialises");
            return StoredResponse::new(StatusCode::CREATED, "application/json", Some(payment.location()), body);
        }
        ChargeOutcome::Declined { code, decline_code, message, .. } => (
            "card-declined",
            "Card declined",
            format!(
                "The card was declined: {message} Ask the customer for another payment method; this key will keep returning this answer."
            ),
            code,
            decline_code.as_deref(),
        ),
        ChargeOutcome::Rejected { code, message, .. } => (
            "payment-rejected",
            "Payment rejected by the gateway",
            format!(
                "The gateway refused the payment: {message} Correct the request and send it with a new Idempotency-Key."
            ),
            code,
            None,
        ),
    };
    let problem = Problem::new(StatusCode::PAYMENT_REQUIRED, slug, title, detail)
        .with("payment", payment.id.to_string())
        .with("payment_intent", payment.payment_intent.clone())
        .with("code", code.as_str())
        .with("decline_code", decline_code);
    StoredResponse::new(
        StatusCode::PAYMENT_REQUIRED,
        problem::CONTENT_TYPE,
        Some(payment.location()),
        problem.to_json(),
    )
}

fn corrupt(lease: &Lease, reason: String) -> ProcessError {
    ProcessError::Corrupt { key_id: lease.key_id, reason }
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
    let charge = charge_for(&payment, "", format!("payonce-bench-{}", Uuid::new_v4().simple()));
    let outcome = gateway.charge(charge).await.map_err(ProcessError::Gateway)?;
    payment.apply(&outcome);
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
    Ok(final_response(&payment, &outcome))
}
