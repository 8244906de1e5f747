//! Where a key is claimed: the atomic insert, and the decision taken when the key already exists.

use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use super::lease::{Lease, RecoveryPoint};
use super::operation::{Begun, Registered};
use super::replays::Final;
use super::{Engine, Event, EventKind, Fingerprint, IdempotencyKey, StoredResponse, secs};

/// An idempotent request, reduced to what the engine needs to know about it.
#[derive(Debug, Clone)]
pub struct Operation {
    /// Keys are scoped per customer: the same key from two customers is two operations.
    pub customer_id: Uuid,
    pub key: IdempotencyKey,
    pub method: &'static str,
    /// The route *template* (`/v1/payments`), not the concrete path.
    pub route: &'static str,
    /// The canonical request. It is stored, so abandoned work can be finished without the client.
    pub request: Value,
    pub fingerprint: Fingerprint,
}

impl Operation {
    pub fn new(
        customer_id: Uuid,
        key: IdempotencyKey,
        method: &'static str,
        route: &'static str,
        request: Value,
    ) -> Self {
        let fingerprint = Fingerprint::of(method, route, &request);
        Self { customer_id, key, method, route, request, fingerprint }
    }
}

/// What a request may do with its key.
#[derive(Debug)]
pub enum Claim {
    /// This request holds the lease (a new key, or an abandoned one reclaimed) and must drive the
    /// work from `lease.recovery_point`.
    Acquired(Lease),
    /// The work is done: replay this response.
    Completed(StoredResponse),
    /// The operation's first write refused the request ([`super::Begun::Rejected`]): answer
    /// this, which was not stored. The claim was rolled back with it: the key is unused.
    Rejected(StoredResponse),
    /// The key may not be taken now. Try again after `retry_after`.
    InFlight { retry_after: Duration, reason: Busy },
}

/// Why a key may not be taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// Another worker holds a live lease.
    InFlight,
    /// Its last attempt ended too recently: the backoff has not passed.
    Backoff,
    /// Its budget is spent (attempts or horizon): only the sweeper takes it, to confirm the
    /// outcome with the gateway.
    Reconciling,
}

impl Busy {
    /// The `reason` member of the 409 problem, and of the `conflict` event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Backoff => "backoff",
            Self::Reconciling => "reconciling",
        }
    }
}

/// Why a request may not use its key at all.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The key was first used for another endpoint.
    #[error("this Idempotency-Key was first used for {method} {route}")]
    RouteMismatch { method: String, route: String },
    /// The key was first used with another payload.
    #[error("this Idempotency-Key was first used with a different request body")]
    PayloadMismatch,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A stored row that this code could not have written.
    #[error("idempotency key {0} holds data this version cannot read")]
    Corrupt(Uuid),
}

/// The key's row as the claim statement returns it: either the row it just inserted, or the row
/// that was already there.
struct Row {
    /// Whether this statement inserted the row (the claim succeeded).
    claimed: bool,
    id: Uuid,
    method: String,
    route: String,
    fingerprint: Vec<u8>,
    state: String,
    lease_token: i64,
    attempts: i32,
    /// Zero or less once the lease has run out (and for final rows).
    lease_remaining_secs: f64,
    /// Until the key may be taken again (`idempotency_retry_at`); zero or less: now.
    retry_in_secs: f64,
    /// Whether the key's budget is spent (`idempotency_exhausted`).
    exhausted: bool,
    age_secs: f64,
    expires_in_secs: f64,
    response_status: Option<i16>,
    response_headers: Option<Value>,
    response_body: Option<Vec<u8>>,
}

/// What the claim's transaction made of a key.
enum Fused {
    /// This request created the key; its first write is committed with it.
    Claimed(Lease),
    /// The first write refused the request; nothing was committed.
    Rejected(StoredResponse),
    /// The key existed (or was invisible: `None`); nothing was written.
    Found(Option<Row>),
}

/// How often a claim may find its key invisible, gone or its reclaim beaten before giving up.
/// Each retry needs another worker's write to land in between, so more than a couple means
/// something odd.
const ATTEMPTS: usize = 4;

impl Engine {
    /// Claims `op.key` for `owner` (a name for logs and the dashboard, e.g. `http:host:pid`).
    /// A new key is claimed at `started`, with nothing else written; [`Engine::claim_with`]
    /// commits the operation's first write with it.
    pub async fn claim(&self, op: &Operation, owner: &str) -> Result<Claim, ClaimError> {
        self.claim_with(op, owner, None).await
    }

    /// Claims `op.key` for `owner`; when this request creates the key and `first` is given, the
    /// key row and `first`'s first write ([`super::Idempotent::begin`]) commit in one short
    /// transaction, and the lease starts at `first`'s first phase. Otherwise the existing key
    /// decides: replay, in flight, or taken over from where it stopped.
    pub async fn claim_with(
        &self,
        op: &Operation,
        owner: &str,
        first: Option<&Registered>,
    ) -> Result<Claim, ClaimError> {
        if let Some(response) = self.replay_from_memory(op)? {
            return Ok(Claim::Completed(response));
        }
        let initial = first.map_or(RecoveryPoint::STARTED, |first| first.first_phase.clone());
        for _ in 0..ATTEMPTS {
            let row = match first {
                None => self.claim_or_load(self.pool(), op, owner, &initial).await?,
                Some(first) => match self.claim_and_begin(op, owner, &initial, first).await? {
                    Fused::Claimed(lease) => return Ok(Claim::Acquired(lease)),
                    Fused::Rejected(response) => return Ok(Claim::Rejected(response)),
                    Fused::Found(row) => row,
                },
            };
            let Some(row) = row else {
                // Conflict, but the row is not visible to this statement (see below): look again.
                continue;
            };
            if row.claimed {
                EventKind::Claimed.count(1);
                return Ok(Claim::Acquired(self.lease(
                    op,
                    row.id,
                    row.lease_token,
                    initial,
                    row.attempts,
                    row.age_secs,
                )));
            }
            if let Some(claim) = self.decide(op, row, owner).await? {
                return Ok(claim);
            }
            // Our reclaim lost to another worker's; look again at what it made of the key.
        }
        // Retrying this fast against a key that keeps changing hands: tell the client to wait.
        Ok(Claim::InFlight { retry_after: Duration::from_secs(1), reason: Busy::InFlight })
    }

    /// The claim and the operation's first write, in one transaction: one commit for both. If
    /// the key already existed, the transaction only read it, and the row is returned for
    /// [`Self::decide`].
    async fn claim_and_begin(
        &self,
        op: &Operation,
        owner: &str,
        initial: &RecoveryPoint,
        first: &Registered,
    ) -> Result<Fused, ClaimError> {
        let mut tx = self.pool().begin().await?;
        let row = self.claim_or_load(&mut *tx, op, owner, initial).await?;
        let row = match row {
            Some(row) if row.claimed => row,
            found => {
                tx.rollback().await?;
                return Ok(Fused::Found(found));
            }
        };
        let mut lease = self.lease(op, row.id, row.lease_token, initial.clone(), row.attempts, row.age_secs);
        match self.first_write(first.driver.as_ref(), &mut tx, &mut lease).await? {
            Begun::Written => {
                tx.commit().await?;
                EventKind::Claimed.count(1);
                Ok(Fused::Claimed(lease))
            }
            Begun::Rejected(response) => {
                tx.rollback().await?;
                Ok(Fused::Rejected(response))
            }
            Begun::Taken => unreachable!("first_write moves past taken generations"),
        }
    }

    /// The final answer of `op.key` if this process replayed it a moment ago
    /// ([`super::replays`]), after the same checks as on the database's row (scope, then
    /// payload): no database, no await. So a caller can answer a retry storm's replays before it
    /// spawns anything for the request.
    pub fn replay_from_memory(&self, op: &Operation) -> Result<Option<StoredResponse>, ClaimError> {
        let Some(known) = self.replays().get(op.customer_id, op.key.as_str()) else { return Ok(None) };
        self.check_scope_and_payload(op, known.key_id, &known.method, &known.route, known.fingerprint.as_bytes())?;
        self.observe(op, known.key_id, EventKind::Replayed, json!({"status": known.response.status.as_u16()}));
        Ok(Some(known.response))
    }

    /// The atomic claim, and on conflict the existing row, in one round trip.
    ///
    /// The first branch is the claim itself: `INSERT … ON CONFLICT DO NOTHING RETURNING`. If it
    /// inserted nothing, the second branch reads the row that is already there. That read uses
    /// the statement's snapshot, taken before the insert ran: if the conflicting row was committed
    /// by another transaction *after* that (the insert waited for it), or was deleted meanwhile
    /// by the reaper, neither branch returns a row. `None` then means "look again", and the next
    /// statement, with a fresh snapshot, sees the row (or inserts anew).
    ///
    /// A new key is inserted at `initial`: `started`, or the operation's first phase when its
    /// first write shares the transaction.
    async fn claim_or_load<'e>(
        &self,
        executor: impl sqlx::PgExecutor<'e>,
        op: &Operation,
        owner: &str,
        initial: &RecoveryPoint,
    ) -> Result<Option<Row>, ClaimError> {
        let settings = self.settings();
        let budget = self.sql_budget();
        let row = sqlx::query_as!(
            Row,
            r#"
            with claimed as (
                insert into idempotency_keys
                    (id, customer_id, key, method, route, fingerprint, request,
                     lease_owner, locked_until, expires_at, recovery_point)
                values ($1, $2, $3, $4, $5, $6, $7,
                        $8, now() + $9 * interval '1 second', now() + $10 * interval '1 second', $15)
                on conflict (customer_id, key) do nothing
                returning *
            ), event as (
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, 'claimed', lease_token, jsonb_build_object('owner', $8::text)
                from claimed
            ), found as (
                select true as claimed, * from claimed
                union all
                select false, * from idempotency_keys
                where customer_id = $2 and key = $3 and not exists (select from claimed)
            )
            select claimed as "claimed!", id as "id!", method as "method!", route as "route!",
                   fingerprint as "fingerprint!", state as "state!",
                   lease_token as "lease_token!", attempts as "attempts!",
                   coalesce(extract(epoch from locked_until - now())::float8, 0) as "lease_remaining_secs!",
                   coalesce(extract(epoch from
                       idempotency_retry_at(locked_until, attempts, created_at, $11, $12, $13, $14) - now())::float8, 0)
                       as "retry_in_secs!",
                   idempotency_exhausted(attempts, created_at, $11, $12) as "exhausted!",
                   extract(epoch from now() - created_at)::float8 as "age_secs!",
                   extract(epoch from expires_at - now())::float8 as "expires_in_secs!",
                   response_status, response_headers, response_body
            from found
            "#,
            Uuid::now_v7(),
            op.customer_id,
            op.key.as_str(),
            op.method,
            op.route,
            op.fingerprint.as_bytes().as_slice(),
            op.request,
            owner,
            secs(settings.lease),
            secs(settings.key_ttl),
            budget.max_attempts,
            budget.horizon,
            budget.base,
            budget.cap,
            initial.as_str(),
        )
        .fetch_optional(executor)
        .await?;
        Ok(row)
    }

    /// Scope, then fingerprint, then state. `None` means "our reclaim lost a race; look again".
    async fn decide(&self, op: &Operation, row: Row, owner: &str) -> Result<Option<Claim>, ClaimError> {
        self.check_scope_and_payload(op, row.id, &row.method, &row.route, &row.fingerprint)?;
        match row.state.as_str() {
            "completed" | "failed" => {
                let stored =
                    StoredResponse::from_columns(row.response_status, row.response_headers.as_ref(), row.response_body)
                        .ok_or(ClaimError::Corrupt(row.id))?;
                self.observe(op, row.id, EventKind::Replayed, json!({"status": stored.status.as_u16()}));
                let known = Final {
                    key_id: row.id,
                    method: row.method,
                    route: row.route,
                    fingerprint: op.fingerprint,
                    response: stored.clone(),
                };
                let expires_in = Duration::try_from_secs_f64(row.expires_in_secs).unwrap_or_default();
                self.replays().put(op.customer_id, op.key.as_str(), known, expires_in);
                Ok(Some(Claim::Completed(stored)))
            }
            "processing" => {
                // A live lease first: its holder answers (or gives the key back) before anything
                // else can happen to the key. Then the budget, then the backoff.
                let (wait, reason) = if row.lease_remaining_secs > 0.0 {
                    if row.exhausted {
                        (row.lease_remaining_secs, Busy::Reconciling)
                    } else {
                        // Its holder answers or gives the key back within the gateway timeout.
                        (row.lease_remaining_secs.min(self.settings().gateway_timeout.as_secs_f64()), Busy::InFlight)
                    }
                } else if row.exhausted {
                    (row.retry_in_secs, Busy::Reconciling)
                } else if row.retry_in_secs > 0.0 {
                    (row.retry_in_secs, Busy::Backoff)
                } else {
                    return Ok(self.reclaim(op, row, owner).await?.map(Claim::Acquired));
                };
                let retry_after = retry_after(wait);
                self.observe(
                    op,
                    row.id,
                    EventKind::Conflict,
                    json!({"retry_after": retry_after.as_secs(), "reason": reason.as_str()}),
                );
                Ok(Some(Claim::InFlight { retry_after, reason }))
            }
            _ => Err(ClaimError::Corrupt(row.id)),
        }
    }

    /// Scope, then fingerprint. The row was found by (customer, key), so it is this customer's by
    /// construction; what remains is the operation it was created for, then the payload.
    fn check_scope_and_payload(
        &self,
        op: &Operation,
        key_id: Uuid,
        method: &str,
        route: &str,
        fingerprint: &[u8],
    ) -> Result<(), ClaimError> {
        if method != op.method || route != op.route {
            self.observe(op, key_id, EventKind::Mismatch, json!({"reason": "route", "route": route}));
            return Err(ClaimError::RouteMismatch { method: method.to_owned(), route: route.to_owned() });
        }
        if fingerprint != op.fingerprint.as_bytes() {
            self.observe(op, key_id, EventKind::Mismatch, json!({"reason": "payload"}));
            return Err(ClaimError::PayloadMismatch);
        }
        Ok(())
    }

    /// Takes over a key whose lease ran out and whose backoff has passed, within its budget: the
    /// token grows, so whoever held it before can no longer write. Succeeds only if the row is
    /// still as we saw it (the same token) and still allowed (the statement checks the budget
    /// and the backoff again, against the row it updates).
    ///
    /// The work resumes from the recovery point of the row this statement *updated*, never from
    /// the one the claim read: between the two, the old holder (slow, not dead: the fence only
    /// stops it once the token has grown) may have advanced the key.
    async fn reclaim(&self, op: &Operation, row: Row, owner: &str) -> Result<Option<Lease>, ClaimError> {
        let budget = self.sql_budget();
        let reclaimed = sqlx::query!(
            r#"
            with reclaimed as (
                update idempotency_keys
                   set lease_token = lease_token + 1,
                       lease_owner = $3,
                       locked_until = now() + $4 * interval '1 second',
                       attempts = attempts + 1,
                       updated_at = now()
                 where id = $1 and customer_id = $9 and lease_token = $2 and state = 'processing'
                   and locked_until <= now()
                   and not idempotency_exhausted(attempts, created_at, $5, $6)
                   and idempotency_retry_at(locked_until, attempts, created_at, $5, $6, $7, $8) <= now()
                returning id, customer_id, lease_token, attempts, recovery_point, created_at
            ), event as (
                insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)
                select id, customer_id, 'reclaimed', lease_token,
                       jsonb_build_object('owner', $3::text, 'recovery_point', recovery_point, 'attempts', attempts)
                from reclaimed
            )
            select lease_token, attempts, recovery_point,
                   extract(epoch from now() - created_at)::float8 as "age_secs!"
            from reclaimed
            "#,
            row.id,
            row.lease_token,
            owner,
            secs(self.settings().lease),
            budget.max_attempts,
            budget.horizon,
            budget.base,
            budget.cap,
            op.customer_id,
        )
        .fetch_optional(self.pool())
        .await?;
        let Some(r) = reclaimed else { return Ok(None) };
        let recovery_point = RecoveryPoint::parse(&r.recovery_point).ok_or(ClaimError::Corrupt(row.id))?;
        EventKind::Reclaimed.count(1);
        tracing::info!(key_id = %row.id, token = r.lease_token, ?recovery_point, "reclaimed an expired lease");
        Ok(Some(self.lease(op, row.id, r.lease_token, recovery_point, r.attempts, r.age_secs)))
    }

    /// The lease on `op`'s key row. The request is the client's own: its fingerprint matched the
    /// stored one, so it *is* the stored canonical request, and the row's copy need not be read.
    fn lease(
        &self,
        op: &Operation,
        key_id: Uuid,
        token: i64,
        recovery_point: RecoveryPoint,
        attempts: i32,
        age_secs: f64,
    ) -> Lease {
        let (customer_id, client_key, request) = (op.customer_id, op.key.as_str().to_owned(), op.request.clone());
        let age = Duration::try_from_secs_f64(age_secs).unwrap_or_default();
        let route = op.route.to_owned();
        let fingerprint = op.fingerprint;
        Lease::new(
            self.clone(),
            key_id,
            customer_id,
            route,
            client_key,
            fingerprint,
            token,
            recovery_point,
            request,
            attempts,
            age,
        )
    }

    fn observe(&self, op: &Operation, key_id: Uuid, kind: EventKind, detail: Value) {
        tracing::debug!(%key_id, kind = kind.as_str(), fingerprint = %op.fingerprint.short(), "idempotency event");
        self.events().record(Event { key_id, customer_id: op.customer_id, kind, lease_token: None, detail });
    }
}

/// The `Retry-After` for a key that may not be taken now: the time until it may, rounded up to
/// whole seconds (the header's unit), and at least one second (never "now": the client would
/// come back before the key is free).
pub fn retry_after(wait_secs: f64) -> Duration {
    Duration::from_secs(wait_secs.ceil().max(1.0) as u64)
}
