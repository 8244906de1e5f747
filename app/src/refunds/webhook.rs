//! Stripe's events about refunds, applied forward only: the refunds' handler of the webhook
//! inbox ([`crate::inbox`], which records each event once).
//!
//! A refund event (`refund.created`, `refund.updated`, `refund.failed`, `charge.refund.updated`)
//! carries the gateway's refund with its current `status`. It names payonce's refund by the
//! metadata payonce sent (`payonce_refund`), by the gateway's refund id once payonce stored it,
//! or by the downstream key of the refund call; the refund's row is locked until commit. Then:
//!
//! * a `pending` refund moves to `succeeded` or `failed` (a failed one gives its reservation
//!   back to the payment, as when the gateway's own answer says so);
//! * a `succeeded` refund moves to `failed` on `refund.failed`: Stripe reports a refund that
//!   could not reach the customer after it succeeded (an expired or closed card), and the money
//!   came back to the merchant. Its reservation is given back once, and the payment's page says
//!   it was reversed;
//! * the gateway's refund id is filled in if payonce does not have it yet (its answer was lost);
//! * an event saying less than payonce knows (`pending` about a final refund, `succeeded` about
//!   a failed one) changes nothing: `stale`;
//! * an event naming a refund payonce does not have is `unmatched`.
//!
//! A refund's statuses are ranked pending → succeeded → failed (failed is final, reachable from
//! both), so ranking them is all the ordering there is: no event time is kept.
//!
//! `charge.refunded` carries the charge and its refund totals: the gateway's sums, not any of
//! payonce's refunds. It is recorded on the timeline of the refund key whose call caused it (or
//! of the payment's key) and `ignored`: payonce's amounts are its own reservations, and never
//! change because of it. A charge refunded beyond what payonce reserved is logged as a warning
//! (refunds made outside payonce, in the Dashboard).
//!
//! Every event that names a refund goes on its key's timeline.

use std::collections::HashMap;

use sqlx::PgConnection;
use stripe_shared::{Charge, Refund as GatewayRefund};
use stripe_webhook::EventObject;
use uuid::Uuid;

use super::model::{RefundId, RefundStatus};
use super::store;
use crate::gateway::{self, RefundOutcome};
use crate::idempotency::{BoxFuture, Engine};
use crate::inbox::{self, Delivery, Effect, Handled, Handler, Timeline};

/// The refund event types payonce acts on.
pub const HANDLED: [&str; 5] =
    ["refund.created", "refund.updated", "refund.failed", "charge.refund.updated", "charge.refunded"];

/// The refunds' handler of the inbox.
pub struct RefundEvents;

impl Handler for RefundEvents {
    fn acts_on(&self) -> &'static [&'static str] {
        &HANDLED
    }

    fn concerns(&self, kind: &str) -> bool {
        kind.starts_with("refund.") || kind.starts_with("charge.refund")
    }

    fn apply<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        _engine: &'a Engine,
        event: &'a Delivery<'a>,
    ) -> BoxFuture<'a, sqlx::Result<Handled>> {
        Box::pin(async move {
            match event.object {
                Some(EventObject::RefundCreated(refund))
                | Some(EventObject::RefundUpdated(refund))
                | Some(EventObject::RefundFailed(refund))
                | Some(EventObject::ChargeRefundUpdated(refund)) => apply_refund(tx, event, refund).await,
                Some(EventObject::ChargeRefunded(charge)) => apply_charge(tx, event, charge).await,
                _ => Ok(Handled::default()),
            }
        })
    }
}

/// What a refund event says of the refund, if it says something payonce knows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    status: RefundStatus,
    /// Why it failed: the gateway's `failure_reason` (or status) and a message.
    failure: Option<(String, String)>,
}

fn said_of(kind: &str, refund: &GatewayRefund) -> Option<Said> {
    let outcome =
        RefundOutcome::of_refund(refund.id.as_str(), refund.status.as_deref(), refund.failure_reason.as_deref());
    let said = match outcome {
        RefundOutcome::Succeeded { .. } => Said { status: RefundStatus::Succeeded, failure: None },
        RefundOutcome::Pending { .. } => Said { status: RefundStatus::Pending, failure: None },
        RefundOutcome::Declined { code, message, .. } => {
            Said { status: RefundStatus::Failed, failure: Some((code, message)) }
        }
        RefundOutcome::Refused(_) | RefundOutcome::Unknown(_) => return None,
    };
    // `refund.failed` is about a failure; anything else under that type is not what it says.
    (kind != "refund.failed" || said.status == RefundStatus::Failed).then_some(said)
}

/// The refund an event names, locked for the transaction.
struct Target {
    id: Uuid,
    key_id: Uuid,
    customer_id: Uuid,
    payment_id: Uuid,
    amount: i64,
    status: String,
    gateway_refund_id: Option<String>,
}

/// Applies a refund event to the refund it names, inside the inbox's transaction.
async fn apply_refund(tx: &mut PgConnection, event: &Delivery<'_>, refund: &GatewayRefund) -> sqlx::Result<Handled> {
    let gateway_refund = refund.id.as_str();
    let Some(target) = find(tx, refund.metadata.as_ref(), gateway_refund, event.request_key).await? else {
        return Ok(Handled::unmatched());
    };
    let current = RefundStatus::parse(&target.status)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown refund status {:?}", target.status).into()))?;
    let timeline = Timeline { key_id: target.key_id, customer_id: target.customer_id };
    let handled_as = |effect| Handled {
        effect,
        payment: Some(target.payment_id),
        refund: Some(target.id),
        timeline: Some(timeline),
    };
    let public = RefundId(target.id).to_string();
    let mut detail = event.detail();
    detail["refund"] = public.as_str().into();
    detail["gateway_refund"] = gateway_refund.into();

    // Another gateway refund than the one payonce has for this refund, carrying its metadata: not
    // this refund's record, whatever it says.
    if target.gateway_refund_id.as_deref().is_some_and(|known| known != gateway_refund) {
        tracing::warn!(
            event = event.id,
            refund = %public,
            gateway_refund,
            known = target.gateway_refund_id.as_deref(),
            "a refund event names another gateway refund than payonce's for this refund"
        );
        detail["effect"] = Effect::Ignored.as_str().into();
        detail["refund_status"] = current.as_str().into();
        inbox::note(tx, timeline, detail).await?;
        return Ok(handled_as(Effect::Ignored));
    }

    let said = said_of(event.kind, refund);
    let fills_reference = target.gateway_refund_id.is_none();
    let (effect, moves_to) = match &said {
        None => {
            tracing::warn!(
                event = event.id,
                kind = event.kind,
                status = refund.status.as_deref(),
                "a refund event whose refund does not match its type, or in a status payonce does not know"
            );
            (Effect::Ignored, None)
        }
        Some(said) if current == RefundStatus::Pending && said.status != RefundStatus::Pending => {
            (Effect::Applied, Some(said))
        }
        Some(said) if current == RefundStatus::Succeeded && said.status == RefundStatus::Failed => {
            tracing::warn!(
                event = event.id,
                refund = %public,
                gateway_refund,
                amount = target.amount,
                "a succeeded refund failed at the gateway (the money came back): its amount is refundable again"
            );
            (Effect::Applied, Some(said))
        }
        Some(said) if said.status == current => (if fills_reference { Effect::Applied } else { Effect::Ignored }, None),
        // Less than payonce knows: never backwards.
        Some(_) => (Effect::Stale, None),
    };
    if moves_to.is_some() || fills_reference {
        advance(tx, &target, moves_to, gateway_refund).await?;
    }
    detail["effect"] = effect.as_str().into();
    detail["refund_status"] = moves_to.map_or(current, |said| said.status).as_str().into();
    if let Some(said) = moves_to {
        detail["from"] = current.as_str().into();
        detail["to"] = said.status.as_str().into();
    }
    inbox::note(tx, timeline, detail).await?;
    Ok(handled_as(effect))
}

/// The refund an event names: by payonce's metadata, by the gateway's refund id, or by the
/// downstream key of the refund call; locked until commit, so that an event and the key's own
/// final write (`process::finish`, which only moves a pending refund) apply one after the other.
async fn find(
    tx: &mut PgConnection,
    metadata: Option<&HashMap<String, String>>,
    gateway_refund: &str,
    request_key: Option<&str>,
) -> sqlx::Result<Option<Target>> {
    let by_metadata = metadata.and_then(|m| m.get(gateway::REFUND_METADATA)).and_then(|id| RefundId::parse(id));
    let by_key = request_key.and_then(gateway::key_of_refund);
    sqlx::query_as!(
        Target,
        r#"
        select id, key_id, customer_id, payment_id, amount, status, gateway_refund_id
        from refunds
        where id = $1 or gateway_refund_id = $2 or id = $3 or key_id = $3
        order by (id = $1) desc nulls last, (gateway_refund_id = $2) desc nulls last
        limit 1
        for update
        "#,
        by_metadata.map(|id| id.0),
        gateway_refund,
        by_key,
    )
    .fetch_optional(tx)
    .await
}

/// Moves a pending refund to the status the gateway said (a failed one gives its reservation
/// back to the payment, in the same statement), and fills in the gateway's refund id if missing:
/// [`store::advance`], the statement the sweeper's look-ups use too.
async fn advance(tx: &mut PgConnection, target: &Target, to: Option<&Said>, gateway_refund: &str) -> sqlx::Result<()> {
    let failure = to.and_then(|said| said.failure.as_ref()).map(|(code, message)| (code.as_str(), message.as_str()));
    store::advance(tx, target.id, to.map(|said| said.status), gateway_refund, failure).await?;
    let status = to.map(|said| said.status.as_str());
    tracing::info!(refund = %RefundId(target.id), to = status, amount = target.amount, "refund advanced by a webhook event");
    Ok(())
}

/// The payment (and refund) a `charge.refunded` names.
struct Charged {
    payment_id: Uuid,
    payment_key: Option<Uuid>,
    customer_id: Uuid,
    amount_refunded: i64,
    refund_id: Option<Uuid>,
    refund_key: Option<Uuid>,
}

/// Records a `charge.refunded` on the timeline of the refund key whose call caused it (or of the
/// payment's key): ignored, since the charge's totals are the gateway's sums and payonce's
/// amounts are its own reservations.
async fn apply_charge(tx: &mut PgConnection, event: &Delivery<'_>, charge: &Charge) -> sqlx::Result<Handled> {
    let by_key = event.request_key.and_then(gateway::key_of_refund);
    let payment_intent = charge.payment_intent.as_ref().map(|intent| intent.id().as_str());
    let charged = sqlx::query_as!(
        Charged,
        r#"
        select p.id as payment_id, p.key_id as payment_key, p.customer_id, p.amount_refunded,
               r.id as "refund_id?", r.key_id as "refund_key?"
        from payments p left join refunds r on r.payment_id = p.id and (r.id = $2 or r.key_id = $2)
        where p.id = coalesce(
            (select payment_id from refunds where id = $2 or key_id = $2 limit 1),
            (select id from payments where gateway_payment_intent_id = $1 limit 1)
        )
        "#,
        payment_intent,
        by_key,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(charged) = charged else {
        return Ok(Handled::unmatched());
    };
    let key_id = charged.refund_key.or(charged.payment_key);
    let timeline = key_id.map(|key_id| Timeline { key_id, customer_id: charged.customer_id });
    if charge.amount_refunded > charged.amount_refunded {
        tracing::warn!(
            event = event.id,
            charge = charge.id.as_str(),
            charge_amount_refunded = charge.amount_refunded,
            reserved = charged.amount_refunded,
            "the charge is refunded beyond what payonce's refunds hold: refunds made outside payonce?"
        );
    }
    if let Some(timeline) = timeline {
        let mut detail = event.detail();
        detail["effect"] = Effect::Ignored.as_str().into();
        detail["reason"] =
            "the charge's refund totals are the gateway's; payonce's refunds move by their own events".into();
        detail["charge_amount_refunded"] = charge.amount_refunded.into();
        detail["amount_refunded"] = charged.amount_refunded.into();
        inbox::note(tx, timeline, detail).await?;
    }
    Ok(Handled { effect: Effect::Ignored, payment: Some(charged.payment_id), refund: charged.refund_id, timeline })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refund(status: &str, failure_reason: Option<&str>) -> GatewayRefund {
        let json = serde_json::json!({
            "id": "re_1", "object": "refund", "amount": 100, "charge": "ch_1", "created": 1,
            "currency": "usd", "metadata": {}, "payment_intent": "pi_1", "status": status,
            "failure_reason": failure_reason,
        });
        miniserde::json::from_str(&json.to_string()).expect("a refund")
    }

    /// What each status says; `refund.failed` must carry a failed refund.
    #[test]
    fn what_events_say() {
        let said = |kind, status, reason| said_of(kind, &refund(status, reason)).map(|said| said.status);
        assert_eq!(said("refund.updated", "succeeded", None), Some(RefundStatus::Succeeded));
        assert_eq!(said("refund.created", "pending", None), Some(RefundStatus::Pending));
        assert_eq!(said("refund.updated", "canceled", None), Some(RefundStatus::Failed));
        assert_eq!(said("refund.failed", "succeeded", None), None);
        assert_eq!(said("refund.updated", "strange", None), None);
        let failed = said_of("refund.failed", &refund("failed", Some("lost_or_stolen_card"))).unwrap();
        assert_eq!(failed.failure.unwrap().0, "lost_or_stolen_card");
    }
}
