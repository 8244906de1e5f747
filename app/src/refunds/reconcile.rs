//! Asking the gateway what became of a pending refund: the safety net under refund webhooks.
//!
//! A refund the gateway answered `pending` (a bank debit's refund settles in days) is answered
//! 201 `pending` and its amount stays reserved on the payment. Its webhook (`refund.updated`,
//! `refund.failed`) normally moves it on; if webhooks are not configured, or every delivery is
//! lost, nothing would. So, as for pending payments ([`crate::payments::reconcile`]), its
//! look-ups are scheduled with the one backoff (`refunds.reconcile_at`, set by the key's final
//! write while it is pending with the gateway's id), and the sweeper ([`due_pending`],
//! [`pending`]) retrieves it (`GET /v1/refunds/{id}`) when one is due:
//!
//! * succeeded or failed: applied forward only, with the webhook's own statement
//!   ([`store::advance`]: a failed refund gives its reservation back, once), under the refund's
//!   row lock, with a `reconciled` event on its key's timeline in the same transaction;
//! * still pending: asked again at the next due time (pushed forward when taken);
//! * refused or unknown: asked again too, never a guess. A `reconciled` event says what the
//!   gateway said (and a `refused` event why it refused).

use serde_json::{Value, json};
use uuid::Uuid;

use super::model::{RefundId, RefundStatus};
use super::store;
use crate::gateway::{Gateway, RefundOutcome};
use crate::idempotency::events::{self, Event};
use crate::idempotency::{Engine, EventKind};

/// A pending refund whose look-up is due.
#[derive(Debug)]
pub struct Due {
    pub id: Uuid,
    pub customer_id: Uuid,
    /// The key that created it (its timeline), even if the key was reaped since.
    pub key_id: Uuid,
    /// The gateway's refund id: what is looked up.
    pub gateway_refund: Option<String>,
    pub status: String,
}

/// Takes up to `limit` refunds whose look-up is due and, in the same statement, pushes each
/// one's next look-up forward (`payonce_backoff` of its look-ups so far, up to the budget's
/// `pending_cap`), so no lock is held across the gateway call and no other sweeper takes it
/// meanwhile. One that is no longer pending is unscheduled.
pub async fn due_pending(engine: &Engine, limit: i64) -> sqlx::Result<Vec<Due>> {
    let budget = engine.settings().budget;
    sqlx::query_as!(
        Due,
        r#"
        with due as (
            select id from refunds
            where reconcile_at <= now()
            order by reconcile_at
            limit $1
            for update skip locked
        )
        update refunds r
           set reconcile_attempts = r.reconcile_attempts + 1,
               reconcile_at = case when r.status = 'pending' and r.gateway_refund_id is not null
                                   then now() + payonce_backoff(r.reconcile_attempts + 1, $2, $3)
                              end
          from due
         where r.id = due.id
        returning r.id, r.customer_id, r.key_id, r.gateway_refund_id as gateway_refund, r.status
        "#,
        limit,
        budget.backoff.base.as_secs_f64(),
        budget.pending_cap.as_secs_f64(),
    )
    .fetch_all(engine.pool())
    .await
}

/// What a look-up of a pending refund found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Looked {
    /// The refund settled (to this status).
    Moved(RefundStatus),
    /// Still pending at the gateway, or settled already here (a webhook got there first).
    Unchanged,
    /// No answer that tells (refused or unknown): asked again at the next due time.
    NoAnswer,
}

/// Looks one pending refund up and moves it forward with what the gateway says.
pub async fn pending(engine: &Engine, gateway: &Gateway, due: &Due) -> sqlx::Result<Looked> {
    if due.status != RefundStatus::Pending.as_str() {
        return Ok(Looked::Unchanged);
    }
    let Some(gateway_refund) = due.gateway_refund.as_deref() else {
        // Only a refund with the gateway's id is scheduled; without one, its key's work tells.
        tracing::error!(refund = %RefundId(due.id), "a scheduled refund without the gateway's id; not looked up");
        return Ok(Looked::NoAnswer);
    };
    let outcome = gateway.retrieve_refund(gateway_refund).await;
    let mut detail = json!({
        "method": "retrieve",
        "answer": outcome.label(),
        "refund": RefundId(due.id).to_string(),
        "gateway_refund": gateway_refund,
    });
    let (to, failure) = match &outcome {
        RefundOutcome::Succeeded { refund } if refund == gateway_refund => (RefundStatus::Succeeded, None),
        RefundOutcome::Declined { refund: Some(refund), code, message } if refund == gateway_refund => {
            (RefundStatus::Failed, Some((code.as_str(), message.as_str())))
        }
        RefundOutcome::Pending { refund } if refund == gateway_refund => {
            record(engine, due, EventKind::Reconciled, detail).await?;
            return Ok(Looked::Unchanged);
        }
        RefundOutcome::Refused(refusal) => {
            record(engine, due, EventKind::Reconciled, detail).await?;
            record(engine, due, EventKind::Refused, refusal.detail()).await?;
            return Ok(Looked::NoAnswer);
        }
        // Unknown, or an answer about another refund than the one asked for (or an error
        // answer read as a decline, which names none): nothing that tells about this one.
        _ => {
            record(engine, due, EventKind::Reconciled, detail).await?;
            return Ok(Looked::NoAnswer);
        }
    };

    // The row lock orders this write with a webhook event about the same refund, and with the
    // key's own final write; whichever comes second finds it settled and changes nothing.
    let mut tx = engine.pool().begin().await?;
    let current: String =
        sqlx::query_scalar!("select status from refunds where id = $1 for update", due.id).fetch_one(&mut *tx).await?;
    let moved = store::advance(&mut tx, due.id, Some(to), gateway_refund, failure).await?;
    detail["from"] = current.as_str().into();
    detail["to"] = if moved { to.as_str() } else { current.as_str() }.into();
    let event = Event {
        key_id: due.key_id,
        customer_id: due.customer_id,
        kind: EventKind::Reconciled,
        lease_token: None,
        detail,
    };
    events::write(&mut *tx, event).await?;
    tx.commit().await?;
    if moved {
        tracing::info!(refund = %RefundId(due.id), to = to.as_str(), "a pending refund settled when looked up");
        Ok(Looked::Moved(to))
    } else {
        Ok(Looked::Unchanged)
    }
}

/// An event on the refund's key timeline, written before the next look-up is due.
async fn record(engine: &Engine, due: &Due, kind: EventKind, detail: Value) -> sqlx::Result<()> {
    let event = Event { key_id: due.key_id, customer_id: due.customer_id, kind, lease_token: None, detail };
    events::write(engine.pool(), event).await
}
