//! Reading payments back.

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use super::model::{Failure, Payment, PaymentId, PaymentStatus};

/// A `payments` row as selected below.
struct Row {
    id: Uuid,
    customer_id: Uuid,
    amount: i64,
    currency: String,
    payment_method: String,
    description: Option<String>,
    metadata: serde_json::Value,
    status: String,
    gateway_payment_intent_id: Option<String>,
    failure_code: Option<String>,
    decline_code: Option<String>,
    failure_message: Option<String>,
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
            created_at: row.created_at,
        })
    }
}

/// The payment created under an idempotency key (for resuming the key's work).
pub async fn find_by_key(pool: &PgPool, key_id: Uuid) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as!(
        Row,
        r#"
        select id, customer_id, amount, currency, payment_method, description, metadata, status,
               gateway_payment_intent_id, failure_code, decline_code, failure_message, created_at
        from payments
        where idempotency_key_id = $1
        "#,
        key_id,
    )
    .fetch_optional(pool)
    .await?
    .map(Payment::try_from)
    .transpose()
}

/// One of a customer's payments. Another customer's payment is simply not found.
pub async fn find(pool: &PgPool, customer_id: Uuid, id: PaymentId) -> sqlx::Result<Option<Payment>> {
    sqlx::query_as!(
        Row,
        r#"
        select id, customer_id, amount, currency, payment_method, description, metadata, status,
               gateway_payment_intent_id, failure_code, decline_code, failure_message, created_at
        from payments
        where id = $1 and customer_id = $2
        "#,
        id.0,
        customer_id,
    )
    .fetch_optional(pool)
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
        select id, customer_id, amount, currency, payment_method, description, metadata, status,
               gateway_payment_intent_id, failure_code, decline_code, failure_message, created_at
        from payments
        where customer_id = $1 and ($2::uuid is null or id < $2)
        order by id desc
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
