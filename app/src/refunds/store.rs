//! Reading refunds back, and moving a pending one forward with what the gateway says after its
//! key answered (a webhook, a reconciliation).

use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;
use uuid::Uuid;

use super::model::{Refund, RefundId, RefundStatus};
use crate::payments::PaymentId;

/// A `refunds` row as selected below.
struct Row {
    id: Uuid,
    customer_id: Uuid,
    payment_id: Uuid,
    amount: i64,
    currency: String,
    reason: Option<String>,
    metadata: serde_json::Value,
    status: String,
    gateway_refund_id: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    created_at: OffsetDateTime,
}

impl TryFrom<Row> for Refund {
    type Error = sqlx::Error;

    fn try_from(row: Row) -> Result<Self, Self::Error> {
        let status = RefundStatus::parse(&row.status)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown refund status {:?}", row.status).into()))?;
        Ok(Refund {
            id: RefundId(row.id),
            customer_id: row.customer_id,
            payment_id: PaymentId(row.payment_id),
            amount: row.amount,
            currency: row.currency,
            reason: row.reason,
            metadata: row.metadata,
            status,
            gateway_refund: row.gateway_refund_id,
            failure: row.failure_code.map(|code| (code, row.failure_message.unwrap_or_default())),
            created_at: row.created_at,
        })
    }
}

/// The refund created under an idempotency key, with its payment's PaymentIntent.
pub async fn find_by_key(pool: &PgPool, key_id: Uuid) -> sqlx::Result<Option<(Refund, Option<String>)>> {
    let Some(row) = sqlx::query!(
        r#"
        select r.id, r.customer_id, r.payment_id, r.amount, r.currency, r.reason, r.metadata, r.status,
               r.gateway_refund_id, r.failure_code, r.failure_message, r.created_at,
               p.gateway_payment_intent_id
        from refunds r join payments p on p.id = r.payment_id
        where r.key_id = $1
        "#,
        key_id,
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let refund = Refund::try_from(Row {
        id: row.id,
        customer_id: row.customer_id,
        payment_id: row.payment_id,
        amount: row.amount,
        currency: row.currency,
        reason: row.reason,
        metadata: row.metadata,
        status: row.status,
        gateway_refund_id: row.gateway_refund_id,
        failure_code: row.failure_code,
        failure_message: row.failure_message,
        created_at: row.created_at,
    })?;
    Ok(Some((refund, row.gateway_payment_intent_id)))
}

/// One of a customer's refunds. Another customer's refund is simply not found.
pub async fn find(pool: &PgPool, customer_id: Uuid, id: RefundId) -> sqlx::Result<Option<Refund>> {
    sqlx::query_as!(
        Row,
        r#"
        select id, customer_id, payment_id, amount, currency, reason, metadata, status,
               gateway_refund_id, failure_code, failure_message, created_at
        from refunds
        where id = $1 and customer_id = $2
        "#,
        id.0,
        customer_id,
    )
    .fetch_optional(pool)
    .await?
    .map(Refund::try_from)
    .transpose()
}

/// A page of a customer's refunds (of one payment, when given), newest first, strictly older
/// than `starting_after` when given. Returns up to `limit` refunds and whether more exist.
pub async fn list(
    pool: &PgPool,
    customer_id: Uuid,
    payment: Option<PaymentId>,
    limit: u32,
    starting_after: Option<RefundId>,
) -> sqlx::Result<(Vec<Refund>, bool)> {
    let mut rows = sqlx::query_as!(
        Row,
        r#"
        select id, customer_id, payment_id, amount, currency, reason, metadata, status,
               gateway_refund_id, failure_code, failure_message, created_at
        from refunds
        where customer_id = $1 and ($2::uuid is null or payment_id = $2)
          and ($3::uuid is null or (created_at, id) < (select created_at, id from refunds where id = $3))
        order by created_at desc, id desc
        limit $4
        "#,
        customer_id,
        payment.map(|id| id.0),
        starting_after.map(|id| id.0),
        i64::from(limit) + 1,
    )
    .fetch_all(pool)
    .await?;
    let has_more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let refunds = rows.into_iter().map(Refund::try_from).collect::<sqlx::Result<_>>()?;
    Ok((refunds, has_more))
}

/// Moves refund `id` forward to `status`, and fills in the gateway's refund id if missing
/// (`status` `None`: only that). Forward is pending → succeeded or failed, and succeeded →
/// failed: a refund can fail after it succeeded (the money could not reach the customer and came
/// back; `reversed_at` says when), never the other way. A refund moving to failed gives its
/// reservation back to the payment in the same statement, so exactly once: failed is final, and
/// the condition on the current status is the forward-only rule itself. A refund that leaves
/// pending is no longer looked up (`reconcile_at` cleared). Returns whether it moved. The one
/// statement the webhook and the sweeper's look-ups share; the caller holds the refund's row lock.
pub async fn advance(
    conn: &mut PgConnection,
    id: Uuid,
    status: Option<RefundStatus>,
    gateway_refund: &str,
    failure: Option<(&str, &str)>,
) -> sqlx::Result<bool> {
    let status = status.map(RefundStatus::as_str);
    let moved = sqlx::query_scalar!(
        r#"
        with moved as (
            update refunds
               set status = coalesce($2, status),
                   gateway_refund_id = coalesce(gateway_refund_id, $3),
                   failure_code = case when $2 = 'failed' then $4 else failure_code end,
                   failure_message = case when $2 = 'failed' then $5 else failure_message end,
                   reconcile_at = case when $2::text is null then reconcile_at end,
                   reversed_at = case when status = 'succeeded' and $2 = 'failed' then now() else reversed_at end,
                   updated_at = now()
             where id = $1 and ($2::text is null or status = 'pending' or (status = 'succeeded' and $2 = 'failed'))
            returning payment_id, amount
        ), payment as (
            update payments p
               set amount_refunded = p.amount_refunded - moved.amount, updated_at = now()
              from moved
             where p.id = moved.payment_id and $2 = 'failed'
        )
        select count(*) > 0 and $2::text is not null as "moved!" from moved
        "#,
        id,
        status,
        gateway_refund,
        failure.map(|(code, _)| code),
        failure.map(|(_, message)| message),
    )
    .fetch_one(conn)
    .await?;
    Ok(moved)
}
