//! What the three lab strategies share once they believe they hold a key: the `lab_keys` row,
//! replaying it, the gateway call, and the statement that stores the payment with its answer.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{LabAnswer, LabError};
use crate::gateway::{Decline, Gateway, Outcome};
use crate::idempotency::{Operation, StoredResponse};
use crate::payments::process::{self, ProcessError};
use crate::payments::{NewPayment, Payment, PaymentId};

/// How long a client is told to wait when the gateway gave no answer under a lab strategy.
const GATEWAY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A `lab_keys` row, as the strategies read it.
pub(super) struct KeyRow {
    pub id: Uuid,
    pub fingerprint: Vec<u8>,
    pub state: String,
    pub fence: i64,
    pub response_status: Option<i16>,
    pub response_headers: Option<Value>,
    pub response_body: Option<Vec<u8>>,
}

impl KeyRow {
    /// Fingerprint first (another payload under the key is a 422 whatever its state), then the
    /// state: a completed row is replayed; `None` means the row is still processing.
    pub fn replay(self, op: &Operation) -> Result<Option<LabAnswer>, LabError> {
        if self.fingerprint != op.fingerprint.as_bytes() {
            return Err(LabError::PayloadMismatch);
        }
        if self.state != "completed" {
            return Ok(None);
        }
        let stored =
            StoredResponse::from_columns(self.response_status, self.response_headers.as_ref(), self.response_body)
                .ok_or_else(|| LabError::Corrupt(format!("lab key {} holds no readable response", self.id)))?;
        Ok(Some(LabAnswer { stored, replayed: true }))
    }
}

/// The request stored in an operation.
pub(super) fn request(op: &Operation) -> Result<NewPayment, LabError> {
    NewPayment::deserialize(&op.request).map_err(|err| LabError::Corrupt(format!("request unreadable: {err}")))
}

/// A payment charged through the gateway, with the response that answers it.
pub(super) struct Charged {
    pub payment: Payment,
    pub response: StoredResponse,
}

/// Charges `request` as payment `payment_id` with `downstream_key`. Refused and unknown answers
/// are errors (503), exactly as the engine answers them; nothing is stored for them.
pub(super) async fn charge(
    gateway: &Gateway,
    op: &Operation,
    request: &NewPayment,
    payment_id: Uuid,
    downstream_key: String,
) -> Result<Charged, LabError> {
    let metadata = serde_json::to_value(&request.metadata).unwrap_or_default();
    let mut payment = Payment::pending(PaymentId(payment_id), op.customer_id, request, metadata, now_to_micros());
    let outcome = gateway.charge(process::charge_with_key(&payment, op.key.as_str(), downstream_key)).await;
    let decline: Option<Decline> = match outcome {
        Outcome::Refused(refusal) => {
            return Err(ProcessError::Refused { refusal, retry_after: GATEWAY_RETRY_AFTER }.into());
        }
        Outcome::Unknown(error) => {
            return Err(ProcessError::Gateway { error, retry_after: GATEWAY_RETRY_AFTER }.into());
        }
        outcome => {
            payment.apply(&outcome);
            match outcome {
                Outcome::Declined(decline) => Some(decline),
                _ => None,
            }
        }
    };
    let response = process::final_response(&payment, decline.as_ref());
    Ok(Charged { payment, response })
}

/// Stores the payment and completes the key in one statement, if the key is still `key_id`'s,
/// processing, and fenced at `fence` (for-update and check-then-insert write 0). `false`: the
/// row was no longer ours to complete.
pub(super) async fn complete<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    key_id: Uuid,
    fence: i64,
    charged: &Charged,
) -> Result<bool, LabError> {
    let (payment, response) = (&charged.payment, &charged.response);
    let failure = payment.failure.as_ref();
    let stored = sqlx::query_scalar!(
        r#"
        with done as (
            update lab_keys
               set state = 'completed', payment_id = $3, response_status = $4, response_headers = $5,
                   response_body = $6, completed_at = now()
             where id = $1 and fence = $2 and state = 'processing'
            returning customer_id
        ), payment as (
            insert into payments
                (id, customer_id, amount, currency, payment_method, description, metadata, status,
                 gateway_payment_intent_id, failure_code, decline_code, failure_message, next_action, created_at)
            select $3, customer_id, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18
            from done
            returning id
        )
        select count(*) as "stored!" from payment
        "#,
        key_id,
        fence,
        payment.id.0,
        response.status.as_u16() as i16,
        response.headers_json(),
        response.body.as_ref(),
        payment.amount,
        payment.currency,
        payment.payment_method,
        payment.description,
        payment.metadata,
        payment.status.as_str(),
        payment.payment_intent,
        failure.map(|f| f.code.as_str()),
        failure.and_then(|f| f.decline_code.as_deref()),
        failure.map(|f| f.message.as_str()),
        payment.next_action,
        payment.created_at,
    )
    .fetch_one(executor)
    .await?;
    Ok(stored == 1)
}

/// Now, at the database's precision, so that the answer and `GET /v1/payments/{id}` agree.
fn now_to_micros() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(now.nanosecond() / 1000 * 1000).unwrap_or(now)
}

/// Whether a database error is a unique violation (SQLSTATE 23505).
pub(super) fn is_unique_violation(err: &LabError) -> bool {
    matches!(err, LabError::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505"))
}
