//! Stripe's events about payments, applied once: the webhook inbox.
//!
//! Stripe delivers each event at least once, in no particular order. Each one is applied in one
//! transaction that first records its id in `webhook_events` (the inbox, unique on the id) and
//! then makes its effect: a redelivery finds the id taken and changes nothing. The effect only
//! ever moves a payment forward (`store::advance`); an event older than what payonce knows (its
//! status ranks below the payment's, or it was created before the last event applied) changes
//! nothing and schedules an immediate look-up of the PaymentIntent instead. Every event that
//! names a payment goes on its key's timeline, duplicates included.
//!
//! The signature is checked before any of this, by the HTTP handler ([`crate::http::webhooks`]).

use std::collections::HashMap;

use serde_json::json;
use sqlx::PgConnection;
use stripe_shared::PaymentIntent;
use stripe_webhook::{Event, EventObject};
use time::OffsetDateTime;
use uuid::Uuid;

use super::model::{Answered, PaymentId};
use super::store;
use crate::gateway::{self, Outcome, PendingStatus};
use crate::idempotency::{Engine, EventKind, events};

/// What became of a delivered event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// Its id was new; `effect` is what it did.
    Recorded(Effect),
    /// Its id was already in the inbox: nothing was done.
    Duplicate,
}

/// The effect of a new event (the inbox's `effect` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The payment moved forward.
    Applied,
    /// Older than what was known: the payment stayed, and a look-up was scheduled.
    Stale,
    /// A type payonce does not act on, or nothing to change.
    Ignored,
    /// It names no payment payonce has.
    Unmatched,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Stale => "stale",
            Self::Ignored => "ignored",
            Self::Unmatched => "unmatched",
        }
    }
}

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

/// A verified event, as much of it as payonce reads.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub id: &'a str,
    /// The event's `type`.
    pub kind: &'a str,
    /// The event's `created` (Unix seconds).
    pub created: i64,
    /// The downstream idempotency key of the request that caused the event.
    pub request_key: Option<&'a str>,
    /// The PaymentIntent of a PaymentIntent event, as async-stripe read it.
    pub intent: Option<&'a PaymentIntent>,
    /// The event's `data.object` as sent (for members passed on as they are: `next_action`).
    pub raw_object: &'a serde_json::Value,
}

impl<'a> Delivery<'a> {
    /// An event async-stripe read.
    pub fn of(event: &'a Event, raw: &'a serde_json::Value) -> Self {
        Self {
            id: event.id.as_str(),
            kind: event.type_.as_str(),
            created: event.created,
            request_key: event.request.as_ref().and_then(|request| request.idempotency_key.as_deref()),
            intent: intent_of(&event.data.object),
            raw_object: &raw["data"]["object"],
        }
    }

    /// An event async-stripe could not read, from its JSON: only the envelope, never acted on.
    /// `None` if even that is missing, or if it is a type payonce acts on (it must be read).
    pub fn unread(raw: &'a serde_json::Value) -> Option<Self> {
        let kind = raw["type"].as_str()?;
        (!HANDLED.contains(&kind)).then_some(Self {
            id: raw["id"].as_str()?,
            kind,
            created: raw["created"].as_i64()?,
            request_key: None,
            intent: None,
            raw_object: &raw["data"]["object"],
        })
    }
}

/// Records a verified event and applies it, once.
pub async fn receive(engine: &Engine, event: Delivery<'_>) -> sqlx::Result<Receipt> {
    let (id, kind) = (event.id, event.kind);
    let created = OffsetDateTime::from_unix_timestamp(event.created).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let mut tx = engine.pool().begin().await?;
    let new = sqlx::query_scalar!(
        r#"
        insert into webhook_events (id, type, created, effect) values ($1, $2, $3, 'ignored')
        on conflict (id) do nothing
        returning id
        "#,
        id,
        kind,
        created,
    )
    .fetch_optional(&mut *tx)
    .await?;
    if new.is_none() {
        tx.rollback().await?;
        note_duplicate(engine, id, kind).await?;
        return Ok(Receipt::Duplicate);
    }
    let (effect, payment) = match event.intent {
        Some(intent) => apply(&mut tx, engine, &event, intent, created).await?,
        None => (Effect::Ignored, None),
    };
    sqlx::query!("update webhook_events set effect = $2, payment_id = $3 where id = $1", id, effect.as_str(), payment)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    tracing::info!(event = id, kind, effect = effect.as_str(), payment = ?payment, "webhook event received");
    Ok(Receipt::Recorded(effect))
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
            | ("payment_intent.payment_failed" | "payment_intent.canceled", Outcome::Declined(_))
    );
    expected.then_some(outcome)
}

/// The event types payonce acts on: its webhook endpoint subscribes to these.
pub const HANDLED: [&str; 5] = [
    "payment_intent.succeeded",
    "payment_intent.processing",
    "payment_intent.requires_action",
    "payment_intent.payment_failed",
    "payment_intent.canceled",
];

/// Applies a PaymentIntent event to the payment it names, inside the inbox's transaction.
async fn apply(
    tx: &mut PgConnection,
    engine: &Engine,
    event: &Delivery<'_>,
    intent: &PaymentIntent,
    created: OffsetDateTime,
) -> sqlx::Result<(Effect, Option<Uuid>)> {
    let kind = event.kind;
    let handled = HANDLED.contains(&kind);
    let answer = if handled { answer_of(kind, intent, event.raw_object["next_action"].clone()) } else { None };
    let answered = answer.as_ref().and_then(Answered::of);
    let status = answered.as_ref().map(|answered| answered.status.as_str());
    let Some(target) = find(tx, &intent.metadata, intent.id.as_str(), event.request_key, status, created).await? else {
        return Ok((Effect::Unmatched, None));
    };
    let detail = json!({"event": event.id, "type": kind, "created": created.unix_timestamp()});
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
            let mut detail = detail;
            detail["effect"] = Effect::Applied.as_str().into();
            let budget = engine.settings().budget;
            store::advance(tx, target.id, outcome, Some(created), &budget, EventKind::Webhook, detail).await?;
            return Ok((Effect::Applied, Some(target.id)));
        }
    };
    if effect == Effect::Stale {
        schedule_lookup(tx, target.id).await?;
    }
    note(tx, &target, detail, effect).await?;
    Ok((effect, Some(target.id)))
}

/// The payment an event names, by payonce's metadata on the PaymentIntent, by the PaymentIntent's
/// id, or by the downstream idempotency key of the request that caused it; locked until commit,
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
        where id = $1 or gateway_payment_intent_id = $2 or key_id = $3
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

/// A `webhook` event on the payment's key timeline, for an event that did not move it.
async fn note(
    tx: &mut PgConnection,
    target: &Target,
    mut detail: serde_json::Value,
    effect: Effect,
) -> sqlx::Result<()> {
    let Some(key_id) = target.key_id else { return Ok(()) };
    detail["effect"] = effect.as_str().into();
    detail["status"] = target.status.as_str().into();
    sqlx::query!(
        r#"
        insert into idempotency_events (key_id, customer_id, kind, detail) values ($1, $2, 'webhook', $3)
        "#,
        key_id,
        target.customer_id,
        detail,
    )
    .execute(tx)
    .await?;
    EventKind::Webhook.count(1);
    Ok(())
}

/// A redelivery goes on the timeline too (as an observation: it changes nothing).
async fn note_duplicate(engine: &Engine, id: &str, kind: &str) -> sqlx::Result<()> {
    let known = sqlx::query!(
        r#"
        select p.key_id as "key_id!", p.customer_id
        from webhook_events w join payments p on p.id = w.payment_id
        where w.id = $1 and p.key_id is not null
        "#,
        id,
    )
    .fetch_optional(engine.pool())
    .await?;
    if let Some(known) = known {
        engine.events().record(events::Event {
            key_id: known.key_id,
            customer_id: known.customer_id,
            kind: EventKind::Webhook,
            lease_token: None,
            detail: json!({"event": id, "type": kind, "effect": "duplicate"}),
        });
    }
    Ok(())
}

/// Deletes up to `limit` inbox entries older than `retention`. A redelivery after that is
/// applied again, which changes nothing: payments only move forward.
pub async fn purge(pool: &sqlx::PgPool, retention: std::time::Duration, limit: i64) -> sqlx::Result<u64> {
    let purged = sqlx::query!(
        r#"
        delete from webhook_events
        where id in (
            select id from webhook_events
            where received_at < now() - $1 * interval '1 second'
            order by received_at
            limit $2
        )
        "#,
        retention.as_secs_f64(),
        limit,
    )
    .execute(pool)
    .await?;
    Ok(purged.rows_affected())
}
