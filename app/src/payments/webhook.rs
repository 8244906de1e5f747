//! Stripe's events about payments (`payment_intent.*`), applied forward only: the payments'
//! handler of the webhook inbox ([`crate::inbox`], which records each event once).
//!
//! The effect only ever moves a payment forward (`store::advance`); an event older than what
//! payonce knows (its status ranks below the payment's, or it was created before the last event
//! applied) changes nothing and schedules an immediate look-up of the PaymentIntent instead.
//! Every event that names a payment goes on its key's timeline.

use std::collections::HashMap;

use sqlx::PgConnection;
use stripe_shared::PaymentIntent;
use stripe_webhook::EventObject;
use time::OffsetDateTime;
use uuid::Uuid;

use super::model::{Answered, PaymentId};
use super::store;
use crate::gateway::{self, Outcome, PendingStatus};
use crate::idempotency::{BoxFuture, Engine, EventKind};
use crate::inbox::{self, Delivery, Effect, Handled, Handler, Timeline};

/// The payment an event names, locked for the transaction, compared with what the event says.
struct Target {
    id: Uuid,
    key_id: Option<Uuid>,
    customer_id: Uuid,
    status: String,
    /// The event's status is the payment's.
    same: bool,
    /// The event's status ranks below the payment's, or is the other terminal status.
    behind: bool,
    /// The event was created before the last one applied.
    older: bool,
}

/// The payments' handler of the inbox.
pub struct PaymentEvents;

impl Handler for PaymentEvents {
    fn acts_on(&self) -> &'static [&'static str] {
        &HANDLED
    }

    fn concerns(&self, kind: &str) -> bool {
        kind.starts_with("payment_intent.")
    }

    fn apply<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        engine: &'a Engine,
        event: &'a Delivery<'a>,
    ) -> BoxFuture<'a, sqlx::Result<Handled>> {
        Box::pin(async move {
            match event.object.and_then(intent_of) {
                Some(intent) => apply(tx, engine, event, intent).await,
                None => Ok(Handled::default()),
            }
        })
    }
}

/// The PaymentIntent of a PaymentIntent event.
fn intent_of(object: &EventObject) -> Option<&PaymentIntent> {
    use EventObject as O;
    match object {
        O::PaymentIntentSucceeded(intent)
        | O::PaymentIntentProcessing(intent)
        | O::PaymentIntentRequiresAction(intent)
        | O::PaymentIntentPaymentFailed(intent)
        | O::PaymentIntentCanceled(intent)
        | O::PaymentIntentCreated(intent)
        | O::PaymentIntentAmountCapturableUpdated(intent)
        | O::PaymentIntentPartiallyFunded(intent) => Some(intent),
        _ => None,
    }
}

/// What a PaymentIntent event of type `kind` says the payment is, if payonce acts on the type.
/// The type decides which answer is possible (a `payment_intent.created` event carries a
/// PaymentIntent that has not been confirmed yet, whose status means nothing about the payment);
/// the PaymentIntent gives its details.
fn answer_of(kind: &str, intent: &PaymentIntent, raw_next_action: serde_json::Value) -> Option<Outcome> {
    let outcome = gateway::classify_intent(intent, raw_next_action);
    let expected = matches!(
        (kind, &outcome),
        ("payment_intent.succeeded", Outcome::Succeeded { .. })
            | ("payment_intent.processing", Outcome::Pending { status: PendingStatus::Processing, .. })
            | ("payment_intent.requires_action", Outcome::Pending { status: PendingStatus::RequiresAction, .. })
            | ("payment_intent.amount_capturable_updated", Outcome::Authorized { .. })
            | ("payment_intent.payment_failed", Outcome::Declined(_))
            | ("payment_intent.canceled", Outcome::Canceled { .. })
    );
    expected.then_some(outcome)
}

/// The PaymentIntent event types payonce acts on.
pub const HANDLED: [&str; 6] = [
    "payment_intent.succeeded",
    "payment_intent.processing",
    "payment_intent.requires_action",
    "payment_intent.amount_capturable_updated",
    "payment_intent.payment_failed",
    "payment_intent.canceled",
];

/// Applies a PaymentIntent event to the payment it names, inside the inbox's transaction.
async fn apply(
    tx: &mut PgConnection,
    engine: &Engine,
    event: &Delivery<'_>,
    intent: &PaymentIntent,
) -> sqlx::Result<Handled> {
    let (kind, created) = (event.kind, event.created_at());
    let handled = HANDLED.contains(&kind);
    let answer = if handled { answer_of(kind, intent, event.raw_object["next_action"].clone()) } else { None };
    let answered = answer.as_ref().and_then(Answered::of);
    let status = answered.as_ref().map(|answered| answered.status.as_str());
    let Some(target) = find(tx, &intent.metadata, intent.id.as_str(), event.request_key, status, created).await? else {
        return Ok(Handled::unmatched());
    };
    let timeline = target.key_id.map(|key_id| Timeline { key_id, customer_id: target.customer_id });
    let handled_as = |effect| Handled { effect, payment: Some(target.id), refund: None, timeline };
    let mut detail = event.detail();
    let effect = match &answer {
        None if !handled => Effect::Ignored,
        // A handled type whose PaymentIntent says something else: look the truth up.
        None => {
            tracing::warn!(
                event = event.id,
                kind,
                status = intent.status.as_str(),
                "an event whose PaymentIntent does not match its type"
            );
            Effect::Stale
        }
        // Never backwards; and an event older than what is known may mean a newer one was
        // missed: ask the gateway.
        Some(_) if target.older || target.behind => Effect::Stale,
        Some(_) if target.same => Effect::Ignored,
        Some(outcome) => {
            detail["effect"] = Effect::Applied.as_str().into();
            let budget = engine.settings().budget;
            store::advance(tx, target.id, outcome, Some(created), &budget, Some((EventKind::Webhook, detail))).await?;
            return Ok(handled_as(Effect::Applied));
        }
    };
    if effect == Effect::Stale {
        schedule_lookup(tx, target.id).await?;
    }
    if let Some(timeline) = timeline {
        detail["effect"] = effect.as_str().into();
        detail["status"] = target.status.as_str().into();
        inbox::note(tx, timeline, detail).await?;
    }
    Ok(handled_as(effect))
}

/// The payment an event names, by payonce's metadata on the PaymentIntent, by the PaymentIntent's
/// id, or by the downstream idempotency key of the request that caused it (which names the
/// payment, or an older payonce's key row: [`gateway::key_of_downstream`]); locked until commit,
/// so two events about one payment apply one after the other. Compared, by the database's
/// `payment_status_rank`, with the `status` the event says (if any) and its `created`.
async fn find(
    tx: &mut PgConnection,
    metadata: &HashMap<String, String>,
    payment_intent: &str,
    request_key: Option<&str>,
    status: Option<&str>,
    created: OffsetDateTime,
) -> sqlx::Result<Option<Target>> {
    let by_metadata = metadata.get(gateway::PAYMENT_METADATA).and_then(|id| PaymentId::parse(id)).map(|id| id.0);
    let by_key = request_key.and_then(gateway::key_of_downstream);
    sqlx::query_as!(
        Target,
        r#"
        select id, key_id, customer_id, status,
               coalesce(status = $4, false) as "same!",
               coalesce(payment_status_rank($4) < payment_status_rank(status)
                        or (payment_status_rank($4) = payment_status_rank(status) and status <> $4), false) as "behind!",
               coalesce(gateway_event_at > $5, false) as "older!"
        from payments
        where id = $1 or gateway_payment_intent_id = $2 or id = $3 or key_id = $3
        order by (id = $1) desc nulls last, (gateway_payment_intent_id = $2) desc nulls last
        limit 1
        for update
        "#,
        by_metadata,
        payment_intent,
        by_key,
        status,
        created,
    )
    .fetch_optional(tx)
    .await
}

/// Asks the sweeper to look the payment up at its next pass.
async fn schedule_lookup(tx: &mut PgConnection, payment: Uuid) -> sqlx::Result<()> {
    sqlx::query!("update payments set reconcile_at = now() where id = $1", payment).execute(tx).await?;
    Ok(())
}
