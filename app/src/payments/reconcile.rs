//! Asking the gateway for the truth: what became of a payment whose answer payonce does not know.
//!
//! Two cases, both driven by the sweeper:
//!
//! * **A key whose budget is spent** ([`key`]): clients may no longer take it over; the sweeper
//!   does, every `PAYONCE_BACKOFF_CAP_SECS`, and asks. It *retrieves* the PaymentIntent when its id
//!   is known (a webhook may have told it); otherwise, inside the downstream key's horizon, it
//!   *replays* the create with the same downstream key (Stripe answers from its saved result, or,
//!   if it never saw the call, executes it: the payment the customer asked for); past the horizon
//!   it *searches* by payonce's metadata. A known answer is applied through the normal finish path
//!   (201, 402, 202); refused or unknown leave the key processing until the next pass. Only an
//!   empty search, believed once the gateway's index has settled, gives the key up: nothing was
//!   charged.
//! * **A pending payment** ([`due_pending`], [`pending`]): `requires_action` or `processing`, its
//!   key already answered 202. Its look-ups are scheduled with the same backoff (columns on
//!   `payments`); each retrieves the PaymentIntent and moves the payment forward, never back.
//!
//! Every attempt is a `reconciled` event on the key's timeline: the method, and what the gateway
//! said.

use serde_json::json;
use uuid::Uuid;

use super::model::{Payment, PaymentStatus};
use super::process::{self, ProcessError};
use super::store;
use crate::gateway::{Gateway, Outcome};
use crate::idempotency::events::{self, Event};
use crate::idempotency::{Engine, EventKind, Lease, StoredResponse};

/// Reconciles a key whose budget is spent, from `payment_created` (the payment exists).
pub(super) async fn key(gateway: &Gateway, lease: Lease, payment: Payment) -> Result<StoredResponse, ProcessError> {
    let (method, outcome) = if let Some(intent) = payment.payment_intent.as_deref() {
        ("retrieve", lease.hold(gateway.retrieve(intent)).await?)
    } else if lease.within_horizon() {
        ("replay", lease.hold(gateway.charge(process::charge_for(&payment, &lease))).await?)
    } else {
        match lease.hold(gateway.search(&payment.id.to_string())).await? {
            Some(outcome) => ("search", outcome),
            None => {
                lease.believe_absence("search").await?;
                return process::not_charged(&lease, Some(&payment), "the gateway never gave an answer that tells")
                    .await;
            }
        }
    };
    lease
        .reconciled(json!({"method": method, "answer": outcome.label(), "payment_intent": outcome.payment_intent()}))
        .await?;
    process::conclude(&lease, payment, outcome).await
}

/// A pending payment whose look-up is due.
#[derive(Debug)]
pub struct Due {
    pub id: Uuid,
    pub customer_id: Uuid,
    /// The key it was created under (the timeline), even if the key was reaped since.
    pub key_id: Option<Uuid>,
    pub payment_intent: Option<String>,
    pub status: String,
}

/// Takes up to `limit` payments whose look-up is due and, in the same statement, pushes each
/// one's next look-up forward (`payonce_backoff` of its look-ups so far, up to the budget's
/// `pending_cap`), so no lock is held across the gateway call and no other sweeper takes it
/// meanwhile. A final payment is looked up once (a stale webhook asked for it) and unscheduled.
pub async fn due_pending(engine: &Engine, limit: i64) -> sqlx::Result<Vec<Due>> {
    let budget = engine.settings().budget;
    sqlx::query_as!(
        Due,
        r#"
        with due as (
            select id from payments
            where reconcile_at <= now()
            order by reconcile_at
            limit $1
            for update skip locked
        )
        update payments p
           set reconcile_attempts = p.reconcile_attempts + 1,
               reconcile_at = case when p.status in ('requires_action', 'processing')
                                   then now() + payonce_backoff(p.reconcile_attempts + 1, $2, $3)
                              end
          from due
         where p.id = due.id
        returning p.id, p.customer_id, p.key_id, p.gateway_payment_intent_id as payment_intent, p.status
        "#,
        limit,
        budget.backoff.base.as_secs_f64(),
        budget.pending_cap.as_secs_f64(),
    )
    .fetch_all(engine.pool())
    .await
}

/// What a look-up of a pending payment found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Looked {
    /// The payment moved forward (to this status).
    Moved(PaymentStatus),
    /// The gateway said what was known already, or less.
    Unchanged,
    /// No answer that tells (refused or unknown): asked again at the next due time.
    NoAnswer,
}

/// Looks one pending payment up and moves it forward with what the gateway says.
pub async fn pending(engine: &Engine, gateway: &Gateway, due: &Due) -> sqlx::Result<Looked> {
    let Some(intent) = due.payment_intent.as_deref() else {
        // A pending payment always has its PaymentIntent: the answer that made it pending named it.
        tracing::error!(payment = %due.id, status = due.status, "a pending payment without a PaymentIntent; not looked up");
        return Ok(Looked::NoAnswer);
    };
    let outcome = gateway.retrieve(intent).await;
    let detail = json!({"method": "retrieve", "answer": outcome.label(), "payment_intent": intent});
    match &outcome {
        Outcome::Succeeded { .. }
        | Outcome::Declined(_)
        | Outcome::Pending { .. }
        | Outcome::Authorized { .. }
        | Outcome::Canceled { .. } => {
            let mut conn = engine.pool().acquire().await?;
            let advanced = store::advance(
                &mut conn,
                due.id,
                &outcome,
                None,
                &engine.settings().budget,
                Some((EventKind::Reconciled, detail)),
            )
            .await?;
            Ok(match advanced {
                Some(advanced) if advanced.moved => Looked::Moved(advanced.to),
                _ => Looked::Unchanged,
            })
        }
        Outcome::Refused(refusal) => {
            if let Some(key_id) = due.key_id {
                let refused = refusal.detail();
                for (kind, detail) in [(EventKind::Reconciled, detail), (EventKind::Refused, refused)] {
                    let event = Event { key_id, customer_id: due.customer_id, kind, lease_token: None, detail };
                    events::write(engine.pool(), event).await?;
                }
            }
            Ok(Looked::NoAnswer)
        }
        Outcome::Unknown(_) => {
            if let Some(key_id) = due.key_id {
                let event = Event {
                    key_id,
                    customer_id: due.customer_id,
                    kind: EventKind::Reconciled,
                    lease_token: None,
                    detail,
                };
                events::write(engine.pool(), event).await?;
            }
            Ok(Looked::NoAnswer)
        }
    }
}
