//! Capture and cancel of an authorized payment (`"capture": "manual"`): two idempotent operations
//! on one mechanism, the payment's *settlement*. The engine gives them everything a key needs;
//! this is only what a capture (or a cancel) is.
//!
//! 1. First write, in the claim's transaction (`capture_requested`, `cancel_requested`): under the
//!    payment's row lock, claim its one settlement for this key. However many keys capture or
//!    cancel one payment at once, one wins; the others are refused (409) without using their key.
//! 2. `POST /v1/payment_intents/{id}/capture` (or `/cancel`), its downstream key made of the
//!    request's identity, under the lease.
//! 3. The payment's new state and the stored 200, in one transaction. A refusal (the authorization
//!    expired, or was settled outside payonce) and a spent budget ask what the PaymentIntent is
//!    now; a settlement the gateway never made is given up by the engine's settle rule only.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;

use crate::gateway::{Gateway, Outcome};
use crate::idempotency::{Begun, BoxFuture, Idempotent, Lease, ProcessError, RecoveryPoint, StoredResponse};
use crate::payments::model::{Answered, PaymentStatus};
use crate::payments::{Payment, PaymentId, store};
use crate::problem::{INVALID_REQUEST, NOT_FOUND, PAYMENT_NOT_CAPTURABLE, SETTLEMENT_ABANDONED};

pub const CAPTURE_ROUTE: &str = "/v1/payments/{id}/capture";
pub const CANCEL_ROUTE: &str = "/v1/payments/{id}/cancel";
pub const CAPTURE_REQUESTED: RecoveryPoint = RecoveryPoint::named("capture_requested");
pub const CANCEL_REQUESTED: RecoveryPoint = RecoveryPoint::named("cancel_requested");

/// The canonical request: the payment (from the path), and how much a capture takes (all that is
/// capturable when absent).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settle {
    pub payment: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_to_capture: Option<i64>,
}

/// A capture (`capture`: money moves) or a cancel (the hold is released).
pub struct Settles {
    pub capture: bool,
    pub gateway: Gateway,
}

impl Idempotent for Settles {
    fn route(&self) -> &'static str {
        if self.capture { CAPTURE_ROUTE } else { CANCEL_ROUTE }
    }

    fn first_phase(&self) -> RecoveryPoint {
        if self.capture { CAPTURE_REQUESTED } else { CANCEL_REQUESTED }
    }

    fn begin<'a>(&'a self, conn: &'a mut PgConnection, lease: &'a mut Lease) -> BoxFuture<'a, sqlx::Result<Begun>> {
        Box::pin(async move {
            let request = Settle::deserialize(&lease.request).map_err(|err| sqlx::Error::Decode(err.into()))?;
            let Some(id) = PaymentId::parse(&request.payment) else { return Ok(Begun::Rejected(not_found())) };
            let phase = self.first_phase();
            let row = sqlx::query!(
                r#"
                with target as (
                    select id, status, settlement, amount_capturable from payments
                    where id = $1 and customer_id = $2 for update
                ), claimed as (
                    update payments p set settlement = $3, settled_by = $4
                      from target
                     where p.id = target.id and p.status = 'requires_capture' and p.settlement is null
                       and coalesce($5, p.amount_capturable) <= p.amount_capturable
                    returning p.id
                ), event as (
                    insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                    select $4, $2, $6, $7, jsonb_build_object('payment', $8::text) from claimed
                )
                select status, settlement, amount_capturable, exists (select from claimed) as "claimed!" from target
                "#,
                id.0,
                lease.customer_id,
                if self.capture { "capture" } else { "cancel" },
                lease.key_id,
                request.amount_to_capture,
                phase.as_str(),
                lease.token,
                request.payment,
            )
            .fetch_optional(conn)
            .await?;
            Ok(Begun::Rejected(match row {
                None => not_found(),
                Some(row) if row.claimed => return Ok(Begun::Written),
                Some(row) if row.status == "requires_capture" && row.settlement.is_none() => INVALID_REQUEST.stored(
                    INVALID_REQUEST
                        .problem(format!("amount_to_capture: at most {} can be captured", row.amount_capturable)),
                ),
                Some(row) => not_capturable(&request.payment, &row.status, row.settlement.as_deref()),
            }))
        })
    }

    fn resume(&self, lease: Lease) -> BoxFuture<'_, Result<StoredResponse, ProcessError>> {
        Box::pin(async move {
            let corrupt = |reason: &str| ProcessError::Corrupt { key_id: lease.key_id, reason: reason.to_owned() };
            let request = Settle::deserialize(&lease.request).map_err(|_| corrupt("its request is unreadable"))?;
            let id = PaymentId::parse(&request.payment).ok_or_else(|| corrupt("its payment id is unreadable"))?;
            let payment = store::find(lease.engine().pool(), lease.customer_id, id)
                .await?
                .ok_or_else(|| corrupt("no payment"))?;
            let intent =
                payment.payment_intent.clone().ok_or_else(|| corrupt("an authorization without its PaymentIntent"))?;
            let key =
                format!("payonce-{}-{}", if self.capture { "capture" } else { "cancel" }, lease.identity().simple());
            let asked = match lease.exhausted() {
                true => None,
                false if self.capture => {
                    Some(lease.hold(self.gateway.capture(&intent, request.amount_to_capture, &key)).await?)
                }
                false => Some(lease.hold(self.gateway.cancel(&intent, &key)).await?),
            };
            let outcome = match asked {
                Some(answer) if !matches!(answer, Outcome::Refused(_)) => answer,
                // Refused (not capturable any more), or not to be asked again: what is the PaymentIntent now?
                _ => {
                    let now = lease.hold(self.gateway.retrieve(&intent)).await?;
                    lease
                        .reconciled(json!({"method": "retrieve", "answer": now.label(), "payment_intent": intent}))
                        .await?;
                    now
                }
            };
            match outcome {
                Outcome::Succeeded { .. } | Outcome::Canceled { .. } => {
                    finish(&lease, self.capture, payment, &outcome).await
                }
                Outcome::Authorized { .. } if lease.exhausted() => {
                    lease.believe_absence("retrieve").await?;
                    finish(&lease, self.capture, payment, &outcome).await
                }
                Outcome::Unknown(error) => {
                    let retry_after = lease.give_back(&error.to_string(), None).await?;
                    Err(ProcessError::Gateway { error, retry_after })
                }
                other => Err(ProcessError::Unconfirmed { retry_after: lease.give_back(other.label(), None).await? }),
            }
        })
    }
}

/// The payment as the gateway now says it is, and the key's final answer, in one transaction: 200
/// with the payment once captured or canceled as asked; 409 when it ended otherwise (a capture of
/// an authorization that expired); 502 for a settlement the gateway never made (the payment's
/// settlement is released: it can be captured or canceled again, with a new key).
async fn finish(
    lease: &Lease,
    capture: bool,
    mut payment: Payment,
    outcome: &Outcome,
) -> Result<StoredResponse, ProcessError> {
    let (said, received) = Answered::of(outcome)
        .map_or((PaymentStatus::RequiresCapture, 0), |answered| (answered.status, answered.amount_received));
    let mut tx = lease.engine().pool().begin().await?;
    let row = sqlx::query!(
        r#"
        update payments
           set status = case when status = 'requires_capture' then $2 else status end,
               amount_captured = case when status = 'requires_capture' and $2 = 'succeeded' then $3 else amount_captured end,
               amount_capturable = case when $2 = 'requires_capture' then amount_capturable else 0 end,
               settlement = case when $2 = 'requires_capture' then null else settlement end,
               settled_by = case when $2 = 'requires_capture' then null else settled_by end, updated_at = now()
         where id = $1
        returning status, amount_captured, amount_capturable
        "#,
        payment.id.0,
        said.as_str(),
        received,
    )
    .fetch_one(&mut *tx)
    .await?;
    let wanted = if capture { PaymentStatus::Succeeded } else { PaymentStatus::Canceled };
    payment.status = PaymentStatus::parse(&row.status).unwrap_or(said);
    (payment.amount_captured, payment.amount_capturable) = (row.amount_captured, row.amount_capturable);
    let response = if said == PaymentStatus::RequiresCapture {
        SETTLEMENT_ABANDONED.stored(
            SETTLEMENT_ABANDONED
                .problem("The gateway confirmed it never made it: the authorization is as it was.")
                .with("payment", payment.id.to_string()),
        )
    } else if payment.status == wanted {
        let body = serde_json::to_vec(&payment.to_json()).expect("a payment always serialises");
        StoredResponse::new(StatusCode::OK, "application/json", None, body)
    } else {
        not_capturable(&payment.id.to_string(), payment.status.as_str(), None)
    };
    let failed = said == PaymentStatus::RequiresCapture;
    lease.finish_in(&mut tx, &response, failed, json!({"payment": payment.id.to_string()})).await?;
    tx.commit().await?;
    Ok(response)
}

fn not_found() -> StoredResponse {
    NOT_FOUND.stored(NOT_FOUND.problem("There is no such payment for your API key."))
}

fn not_capturable(payment: &str, status: &str, settlement: Option<&str>) -> StoredResponse {
    let detail = match settlement {
        Some(first) => format!("Its authorization was already claimed by a {first}: one capture or one cancel, once."),
        None => {
            format!("Only an authorized payment (requires_capture) can be captured or canceled; this one is {status}.")
        }
    };
    PAYMENT_NOT_CAPTURABLE
        .stored(PAYMENT_NOT_CAPTURABLE.problem(detail).with("payment", payment).with("payment_status", status))
}
