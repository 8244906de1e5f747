//! Capture and cancel of an authorized payment (`"capture": "manual"`): two idempotent operations
//! on one mechanism, the payment's *settlement*, written against the engine's seam alone
//! (`docs/architecture.md` works the capture through). The engine gives each key the rest.
//!
//! 1. First write, in the claim's transaction (`capture_requested`, `cancel_requested`): under the
//!    payment's row lock, claim its one settlement for this key. However many keys capture or
//!    cancel one payment at once, one wins; the others are refused (409) without using their key.
//! 2. Stripe's capture (or cancel), under a downstream key made of the request's identity.
//! 3. The payment as Stripe now has it, and the key's answer, in one transaction. A refusal (the
//!    authorization expired, or was settled outside payonce) or a spent budget asks what the
//!    PaymentIntent is instead; a settlement Stripe never made releases the payment for another.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;

use crate::gateway::{Gateway, Outcome};
use crate::idempotency::{Begun, BoxFuture, Idempotent, Lease, ProcessError, RecoveryPoint, StoredResponse};
use crate::payments::model::PaymentStatus as Status;
use crate::payments::{PaymentId, no_such_payment, store};
use crate::problem::{FieldError, INVALID_REQUEST, PAYMENT_NOT_CAPTURABLE, SETTLEMENT_ABANDONED, invalid_fields};

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

/// A capture (`capture`: the money moves) or a cancel (the hold is released).
pub struct Settles {
    pub capture: bool,
    pub gateway: Gateway,
}

impl Settles {
    fn kind(&self) -> &'static str {
        if self.capture { "capture" } else { "cancel" }
    }
}

impl Idempotent for Settles {
    fn begin<'a>(&'a self, conn: &'a mut PgConnection, lease: &'a mut Lease) -> BoxFuture<'a, sqlx::Result<Begun>> {
        Box::pin(async move {
            let request: Settle = lease.request_for_begin()?;
            let Some(id) = PaymentId::parse(&request.payment) else { return Ok(Begun::Rejected(no_such_payment())) };
            let row = sqlx::query!(
                r#"
                with target as (
                    select id, status, settlement, amount_capturable from payments
                    where id = $1 and customer_id = $2 for update
                ), claimed as (
                    update payments p set settlement = $3, settled_by = $4 from target
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
                self.kind(),
                lease.key_id,
                request.amount_to_capture,
                lease.recovery_point.as_str(),
                lease.token,
                request.payment,
            )
            .fetch_optional(conn)
            .await?;
            Ok(match row {
                None => Begun::Rejected(no_such_payment()),
                Some(row) if row.claimed => Begun::Written,
                Some(row) if row.status == "requires_capture" && row.settlement.is_none() => {
                    let most = format!("at most {} can be captured", row.amount_capturable);
                    Begun::Rejected(
                        INVALID_REQUEST.stored(invalid_fields(&[FieldError::new("amount_to_capture", most)])),
                    )
                }
                Some(row) => Begun::Rejected(not_capturable(&request.payment, &row.status, row.settlement.as_deref())),
            })
        })
    }

    fn resume(&self, lease: Lease) -> BoxFuture<'_, Result<StoredResponse, ProcessError>> {
        Box::pin(async move {
            let request: Settle = lease.request_as()?;
            let id = PaymentId::parse(&request.payment).ok_or_else(|| lease.corrupt("its payment id is unreadable"))?;
            let payment = store::find(lease.engine().pool(), lease.customer_id, id).await?;
            let intent =
                payment.and_then(|p| p.payment_intent).ok_or_else(|| lease.corrupt("no authorized payment"))?;
            let key = format!("payonce-{}-{}", self.kind(), lease.identity().simple());
            let asked = if lease.exhausted() {
                None
            } else if self.capture {
                Some(lease.hold(self.gateway.capture(&intent, request.amount_to_capture, &key)).await?)
            } else {
                Some(lease.hold(self.gateway.cancel(&intent, &key)).await?)
            };
            let outcome = match asked {
                Some(answer) if !matches!(answer, Outcome::Refused(_)) => answer,
                // Refused (not capturable any more), or not to be asked again: what is it now?
                _ => {
                    let now = lease.hold(self.gateway.retrieve(&intent)).await?;
                    let detail = json!({"method": "retrieve", "answer": now.label(), "payment_intent": intent});
                    lease.reconciled(detail).await?;
                    now
                }
            };
            match outcome {
                Outcome::Succeeded { .. } | Outcome::Canceled { .. } => {}
                Outcome::Authorized { .. } if lease.exhausted() => lease.believe_absence("retrieve").await?,
                Outcome::Unknown(error) => return Err(lease.unknown(error).await),
                other => return Err(lease.unconfirmed(other.label()).await),
            }
            finish(&lease, self.capture, id, &outcome).await
        })
    }
}

/// The payment as Stripe says it is now (`store::advance`, forward only, as for a webhook), and
/// the key's final answer, in one transaction: 200 with the payment when captured or canceled as
/// asked; 409 when it ended otherwise (a capture of an authorization that expired); 502 for a
/// settlement Stripe never made (the payment's settlement is released: it can be captured or
/// canceled again, with another key).
async fn finish(
    lease: &Lease,
    capture: bool,
    id: PaymentId,
    outcome: &Outcome,
) -> Result<StoredResponse, ProcessError> {
    let never = matches!(outcome, Outcome::Authorized { .. });
    let mut tx = lease.engine().pool().begin().await?;
    if never {
        sqlx::query!(
            "update payments set settlement = null, settled_by = null, updated_at = now() where id = $1",
            id.0
        )
        .execute(&mut *tx)
        .await?;
    } else {
        store::advance(&mut tx, id.0, outcome, None, &lease.engine().settings().budget, None).await?;
    }
    let payment = store::find(&mut *tx, lease.customer_id, id).await?.ok_or(sqlx::Error::RowNotFound)?;
    let response = match payment.status {
        _ if never => SETTLEMENT_ABANDONED.stored(
            SETTLEMENT_ABANDONED
                .problem("Stripe confirmed it never made it: the authorization is as it was.")
                .with("payment", id.to_string()),
        ),
        status if status == if capture { Status::Succeeded } else { Status::Canceled } => {
            StoredResponse::new(StatusCode::OK, "application/json", None, payment.to_json().to_string().into_bytes())
        }
        status => not_capturable(&id.to_string(), status.as_str(), None),
    };
    lease.finish_in(&mut tx, &response, never, json!({"payment": id.to_string()})).await?;
    tx.commit().await?;
    Ok(response)
}

fn not_capturable(payment: &str, status: &str, settlement: Option<&str>) -> StoredResponse {
    let detail = match settlement {
        Some(first) => format!("Its authorization was already claimed by a {first}: one capture or one cancel, once."),
        None => {
            format!("Only an authorized payment (requires_capture) can be captured or canceled; this one is {status}.")
        }
    };
    let problem = PAYMENT_NOT_CAPTURABLE.problem(detail).with("payment", payment).with("payment_status", status);
    PAYMENT_NOT_CAPTURABLE.stored(problem)
}
