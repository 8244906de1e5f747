//! Reading payments back, and moving them forward with what the gateway says after their key
//! answered (a webhook, a reconciliation).

use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::model::{Answered, Failure, Payment, PaymentId, PaymentStatus};
use crate::gateway::Outcome;
use crate::idempotency::{Budget, EventKind};

/// A `payments` row as selected below.
struct Row {
    id: Uuid,
    customer_id: Uuid,
    amount: i64,
    amount_refunded: i64,
    currency: String,
    payment_method: String,
    description: Option<String>,
    metadata: serde_json::Value,
    status: String,
    gateway_payment_intent_id: Option<String>,
    failure_code: Option<String>,
    decline_code: Option<String>,
    failure_message: Option<String>,
    next_action: Option<serde_json::Value>,
    capture_method: String,
    amount_capturable: i64,
    amount_captured: i64,
    created_at: OffsetDateTime,
}

impl TryFrom<Row> for Payment {
    type Error = sqlx::Error;

    fn try_from(row: Row) -> Result<Self, Self::Error> {
        let status = PaymentStatus::parse(&row.status)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown payment status {:?}", row.status).into()))?;
        Ok(Payment {
            id: PaymentId(row.id),
            customer_id: row.customer_id,
            amount: row.amount,
            amount_refunded: row.amount_refunded,
            currency: row.currency,
            payment_method: row.payment_method,
            description: row.description,
            metadata: row.metadata,
            status,
            payment_intent: row.gateway_payment_intent_id,
            failure: row.failure_code.map(|code| Failure {
                code,
                decline_code: row.decline_code,
                message: row.failure_message.unwrap_or_default(),
            }),
            next_action: row.next_action,
            manual_capture: row.capture_method == "manual",
            amount_capturable: row.amount_capturable,
            amount_captured: row.amount_captured,
            created_at: row.created_at,
        })
    }
}

/// The payment created under an idempotency key (for resuming the key's work, and for the
/// dashboard: found by the key's id even after the key was reaped).
pub async fn find_by_key(pool: &PgPool, key_id: Uuid) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as!(
        Row,
        r#"
        select id, customer_id, amount, amount_refunded, currency, payment_method, description, metadata, status,
               gateway_payment_intent_id, failure_code, decline_code, failure_message, next_action, capture_method,
               amount_capturable, amount_captured, created_at
        from payments
        where key_id = $1
        "#,
        key_id,
    )
    .fetch_optional(pool)
    .await?
    .map(Payment::try_from)
    .transpose()
}

/// One of a customer's payments. Another customer's payment is simply not found.
pub async fn find<'e>(
    db: impl sqlx::PgExecutor<'e>,
    customer_id: Uuid,
    id: PaymentId,
) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as!(
        Row,
        r#"
        select id, customer_id, amount, amount_refunded, currency, payment_method, description, metadata, status,
               gateway_payment_intent_id, failure_code, decline_code, failure_message, next_action, capture_method,
               amount_capturable, amount_captured, created_at
        from payments
        where id = $1 and customer_id = $2
        "#,
        id.0,
        customer_id,
    )
    .fetch_optional(db)
    .await?
    .map(Payment::try_from)
    .transpose()
}

/// A page of a customer's payments, newest first, strictly older than `starting_after` when given.
/// Returns up to `limit` payments and whether more exist.
pub async fn list(
    pool: &PgPool,
    customer_id: Uuid,
    limit: u32,
    starting_after: Option<PaymentId>,
) -> sqlx::Result<(Vec<Payment>, bool)> {
    // One extra row tells whether there is a next page.
    let mut rows = sqlx::query_as!(
        Row,
        r#"
        select id, customer_id, amount, amount_refunded, currency, payment_method, description, metadata, status,
               gateway_payment_intent_id, failure_code, decline_code, failure_message, next_action, capture_method,
               amount_capturable, amount_captured, created_at
        from payments
        where customer_id = $1
          and ($2::uuid is null or (created_at, id) < (select created_at, id from payments where id = $2))
        order by created_at desc, id desc
        limit $3
        "#,
        customer_id,
        starting_after.map(|id| id.0),
        i64::from(limit) + 1,
    )
    .fetch_all(pool)
    .await?;
    let has_more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let payments = rows.into_iter().map(Payment::try_from).collect::<sqlx::Result<_>>()?;
    Ok((payments, has_more))
}

/// What [`advance`] did to a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advanced {
    /// Its status before.
    pub from: PaymentStatus,
    /// Its status after: the outcome's if it moved, `from` otherwise.
    pub to: PaymentStatus,
    pub moved: bool,
}

/// Moves payment `id` to what `outcome` (succeeded, declined or pending) says, if that is
/// forward (`payment_status_rank`); never back. A payment that becomes pending is scheduled for
/// reconciliation, one that becomes final is unscheduled. `event_at` is the `created` of the
/// webhook event that said so. The `event`, if one is given (its kind and detail, plus `from`
/// and `to`), goes on the payment's key timeline in the same statement. `None` if there is no
/// such payment (or the outcome says nothing about one: refused, unknown).
pub async fn advance(
    conn: &mut PgConnection,
    id: Uuid,
    outcome: &Outcome,
    event_at: Option<OffsetDateTime>,
    budget: &Budget,
    event: Option<(EventKind, Value)>,
) -> sqlx::Result<Option<Advanced>> {
    let Some(target) = Answered::of(outcome) else { return Ok(None) };
    let (kind, detail) = event.unzip();
    let failure = target.failure.as_ref();
    let row = sqlx::query!(
        r#"
        with before as (
            select id, status, key_id, customer_id from payments where id = $1
        ), moved as (
            update payments p
               set status = $2, gateway_payment_intent_id = coalesce(p.gateway_payment_intent_id, $3),
                   failure_code = $4, decline_code = $5, failure_message = $6, next_action = $7,
                   amount_capturable = $13,
                   -- a capture made outside payonce (the Dashboard) says how much it took; an
                   -- automatic payment's is its amount (the payments_automatic_capture trigger)
                   amount_captured = case when $2 = 'succeeded' and p.capture_method = 'manual' then $14
                                          else p.amount_captured end,
                   reconcile_at = case when $2 in ('requires_action', 'processing')
                                       then coalesce(p.reconcile_at, now() + payonce_backoff(1, $9, $10))
                                  end,
                   gateway_event_at = greatest(p.gateway_event_at, $8),
                   updated_at = now()
              from before
             where p.id = before.id and payment_status_rank($2) > payment_status_rank(p.status)
            returning p.id
        ), event as (
            insert into idempotency_events (key_id, customer_id, kind, detail)
            select key_id, customer_id, $11,
                   $12::jsonb || jsonb_build_object(
                       'from', status, 'to', case when exists (select from moved) then $2 else status end)
            from before
            where key_id is not null and $11::text is not null
        )
        select status, exists (select from moved) as "moved!" from before
        "#,
        id,
        target.status.as_str(),
        target.payment_intent,
        failure.map(|f| f.code.as_str()),
        failure.and_then(|f| f.decline_code.as_deref()),
        failure.map(|f| f.message.as_str()),
        target.next_action,
        event_at,
        budget.backoff.base.as_secs_f64(),
        budget.pending_cap.as_secs_f64(),
        kind.map(EventKind::as_str),
        detail.unwrap_or_default(),
        target.amount_capturable,
        target.amount_received,
    )
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let from = PaymentStatus::parse(&row.status)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown payment status {:?}", row.status).into()))?;
    if let Some(kind) = kind {
        kind.count(1);
    }
    Ok(Some(Advanced { from, to: if row.moved { target.status } else { from }, moved: row.moved }))
}
