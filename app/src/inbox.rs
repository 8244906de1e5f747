//! The webhook inbox: Stripe's events recorded once, and handed by type to the resource they
//! concern ([`crate::payments::webhook`], [`crate::refunds::webhook`]).
//!
//! Stripe delivers each event at least once, in no particular order. Each one is applied in one
//! transaction that first records its id in `webhook_events` (the inbox, unique on the id) and
//! then lets the [`Handler`] of its type make its effect: a redelivery finds the id taken and
//! changes nothing. Handlers only ever move their resource forward, and put every event that
//! names one on its key's timeline; the inbox remembers that key, so that redeliveries go on the
//! same timeline (as observations: they change nothing) without knowing the resource.
//!
//! The signature is checked before any of this, by the HTTP handler ([`crate::http::webhooks`]),
//! which also holds the list of handlers.

use serde_json::json;
use sqlx::PgConnection;
use stripe_webhook::{Event, EventObject};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::idempotency::{BoxFuture, Engine, EventKind, events};

/// What became of a delivered event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// Its id was new; `effect` is what it did.
    Recorded(Effect),
    /// Its id was already in the inbox: nothing was done.
    Duplicate,
    /// Its `created` falls on no day the inbox keeps: older than the retention (which is never
    /// shorter than Stripe's 3 days of redeliveries, so only an event resent by hand, or one
    /// with a nonsense date, lands here), or more than [`crate::retention::DAYS_AHEAD`] days
    /// ahead. It is acknowledged, not recorded and not applied: without its day the inbox
    /// could not tell a second delivery from the first. The sweeper's look-ups of what is
    /// pending remain the net under it.
    OutsideWindow,
}

/// The effect of a new event (the inbox's `effect` column).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// The resource moved forward (or learnt the gateway's id for itself).
    Applied,
    /// Older than what was known: the resource stayed (a payment is looked up again).
    Stale,
    /// A type payonce does not act on, or nothing to change.
    #[default]
    Ignored,
    /// It names nothing payonce has.
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
    /// The event's object as async-stripe read it; `None` for an event it could not read.
    pub object: Option<&'a EventObject>,
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
            object: Some(&event.data.object),
            raw_object: &raw["data"]["object"],
        }
    }

    /// An event async-stripe could not read, from its JSON: only the envelope, never acted on.
    /// `None` if even that is missing, or if `inbox` acts on its type (it must be read).
    pub fn unread(raw: &'a serde_json::Value, inbox: &Inbox) -> Option<Self> {
        let kind = raw["type"].as_str()?;
        (!inbox.acts_on(kind)).then_some(Self {
            id: raw["id"].as_str()?,
            kind,
            created: raw["created"].as_i64()?,
            request_key: None,
            object: None,
            raw_object: &raw["data"]["object"],
        })
    }

    /// The payonce customer the event's object names in its metadata (`payonce_customer`, on
    /// every PaymentIntent and refund payonce makes): the inbox records the event under it, so
    /// that an event and its effect concern one customer's rows (one shard, were the tables
    /// distributed by customer: docs/ha.md). `None` for an object that names none (a charge).
    pub fn customer(&self) -> Option<Uuid> {
        let id = self.raw_object["metadata"]["payonce_customer"].as_str()?;
        crate::customers::CustomerId::parse(id).map(|customer| customer.0)
    }

    /// The event's `created` as a time (the epoch if Stripe sent nonsense).
    pub fn created_at(&self) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(self.created).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// What every timeline entry of this event says about it.
    pub fn detail(&self) -> serde_json::Value {
        json!({"event": self.id, "type": self.kind, "created": self.created})
    }
}

/// A key's timeline, with the customer it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    pub key_id: Uuid,
    pub customer_id: Uuid,
}

/// What a handler made of a new event: its effect, and what it concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Handled {
    pub effect: Effect,
    /// The payment it concerned (for a refund's event, the refund's payment).
    pub payment: Option<Uuid>,
    /// The refund it concerned.
    pub refund: Option<Uuid>,
    /// The key whose timeline it went on: its redeliveries are noted there too.
    pub timeline: Option<Timeline>,
}

impl Handled {
    /// An event that names nothing payonce has.
    pub fn unmatched() -> Self {
        Self { effect: Effect::Unmatched, ..Self::default() }
    }
}

/// What applies the events about one resource.
pub trait Handler: Send + Sync {
    /// The event types it acts on: the webhook endpoint subscribes to these, and an event of one
    /// of them that async-stripe cannot read is refused unapplied (Stripe redelivers it).
    fn acts_on(&self) -> &'static [&'static str];

    /// Whether events of `kind` are about its resource. It is handed those it does not act on
    /// too, so that they go on the resource's timeline (as ignored).
    fn concerns(&self, kind: &str) -> bool;

    /// Applies a new event inside the inbox's transaction (`tx`): only ever forward, and on the
    /// timeline of the key the resource was made under.
    fn apply<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        engine: &'a Engine,
        event: &'a Delivery<'a>,
    ) -> BoxFuture<'a, sqlx::Result<Handled>>;
}

/// The inbox and its handlers, one per resource.
pub struct Inbox {
    handlers: &'static [&'static dyn Handler],
}

impl Inbox {
    pub const fn new(handlers: &'static [&'static dyn Handler]) -> Self {
        Self { handlers }
    }

    /// Every event type some handler acts on: what the webhook endpoint subscribes to.
    pub fn subscriptions(&self) -> Vec<&'static str> {
        self.handlers.iter().flat_map(|handler| handler.acts_on().iter().copied()).collect()
    }

    /// Whether some handler acts on events of `kind`.
    pub fn acts_on(&self, kind: &str) -> bool {
        self.handlers.iter().any(|handler| handler.acts_on().contains(&kind))
    }

    /// Records a verified event and applies it, once.
    pub async fn receive(&self, engine: &Engine, event: Delivery<'_>) -> sqlx::Result<Receipt> {
        let (id, kind) = (event.id, event.kind);
        let mut tx = engine.pool().begin().await?;
        // Every delivery of an event carries its `created`, the inbox's partition key: the
        // conflict finds a redelivery within the days the inbox keeps (crate::retention).
        let new = sqlx::query_scalar!(
            r#"
            insert into webhook_events (id, type, created, effect, customer_id)
            values ($1, $2, $3, 'ignored', $4)
            on conflict (id, customer_id, created) do nothing
            returning id
            "#,
            id,
            kind,
            event.created_at(),
            event.customer().unwrap_or_default(),
        )
        .fetch_optional(&mut *tx)
        .await;
        let new = match new {
            Err(err) if outside_the_kept_days(&err) => {
                tx.rollback().await?;
                tracing::warn!(
                    event = id,
                    kind,
                    created = event.created,
                    "webhook event dated outside the days the inbox keeps; acknowledged, not applied"
                );
                return Ok(Receipt::OutsideWindow);
            }
            new => new?,
        };
        if new.is_none() {
            tx.rollback().await?;
            note_duplicate(engine, &event).await?;
            return Ok(Receipt::Duplicate);
        }
        let handled = match self.handlers.iter().find(|handler| handler.concerns(kind)) {
            Some(handler) => handler.apply(&mut tx, engine, &event).await?,
            None => Handled::default(),
        };
        let timeline = handled.timeline;
        sqlx::query!(
            r#"
            update webhook_events set effect = $2, payment_id = $3, refund_id = $4, key_id = $5
            where id = $1 and customer_id = $6 and created = $7
            "#,
            id,
            handled.effect.as_str(),
            handled.payment,
            handled.refund,
            timeline.map(|t| t.key_id),
            event.customer().unwrap_or_default(),
            event.created_at(),
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::info!(
            event = id,
            kind,
            effect = handled.effect.as_str(),
            payment = ?handled.payment,
            refund = ?handled.refund,
            "webhook event received"
        );
        Ok(Receipt::Recorded(handled.effect))
    }
}

/// A `webhook` event on a key's timeline, inside the inbox's transaction.
pub async fn note(tx: &mut PgConnection, timeline: Timeline, detail: serde_json::Value) -> sqlx::Result<()> {
    sqlx::query!(
        r#"
        insert into idempotency_events (key_id, customer_id, kind, detail) values ($1, $2, 'webhook', $3)
        "#,
        timeline.key_id,
        timeline.customer_id,
        detail,
    )
    .execute(tx)
    .await?;
    EventKind::Webhook.count(1);
    Ok(())
}

/// A redelivery goes on the timeline its first delivery went on (as an observation: it changes
/// nothing).
async fn note_duplicate(engine: &Engine, event: &Delivery<'_>) -> sqlx::Result<()> {
    let (id, kind) = (event.id, event.kind);
    let known = sqlx::query!(
        r#"
        select key_id as "key_id!", customer_id as "customer_id!"
        from webhook_events
        where id = $1 and created = $2 and key_id is not null and customer_id is not null
        "#,
        id,
        event.created_at(),
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

/// Whether `err` is PostgreSQL's refusal of a row whose partition key falls on no partition
/// (SQLSTATE 23514, "no partition of relation … found for row").
fn outside_the_kept_days(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|db| db.code().as_deref() == Some("23514") && db.message().starts_with("no partition of relation"))
}
