//! The seam between the engine and what a request does: the [`Idempotent`] trait an operation
//! implements, and the engine's side of it (driving a held key, the registry the sweeper
//! dispatches through). Submitting a request, which claims and then drives, is
//! [`super::submit`]'s.
//!
//! An operation declares four things; the engine does everything else (claim, scope,
//! fingerprint, state, lease, heartbeat, fencing, recovery, the sweeper's completion, events,
//! replay):
//!
//! * its **route** (method and route template): the scope of its keys, given with its first
//!   phase and its [`Idempotent`] when it is registered ([`Registered`]);
//! * its **canonical request**: the caller builds an [`Operation`](super::Operation) from it,
//!   which fingerprints it and stores it with the key, so the work can be finished without the
//!   client ([`Lease::request_as`] reads it back);
//! * its **phases**: the recovery points between `started` and `finished`, what each commits.
//!   The first is written by [`Idempotent::begin`] *inside the claim's transaction*: the key and
//!   the operation's first local write commit together, and a new key costs no commit of its
//!   own. The others are committed with [`Lease::advance_in`];
//! * its **final response**, stored with its last write by [`Lease::finish_in`] (or an
//!   equivalent single statement), and replayed byte for byte from then on.
//!
//! [`Idempotent::resume`] drives a held key from whatever point it is at; the engine calls it
//! for a fresh claim, for a client retry that took over an abandoned key, and from the sweeper,
//! alike. docs/architecture.md ("Making your own endpoint idempotent") walks through the refund.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::downstream::{GatewayError, Refusal};
use super::lease::{FenceError, Lease, LeaseLost, RecoveryPoint};
use super::{Engine, StoredResponse};

/// A boxed future, as the trait's methods return (the trait is used as `dyn Idempotent`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What an endpoint declares to be made idempotent by the engine: its work. Its route and its
/// phases are the registry's ([`Registered`]), so an operation cannot say them twice.
pub trait Idempotent: Send + Sync {
    /// The first local write, inside the claim's transaction `conn` (the key row already exists
    /// in it, at the operation's first phase: `lease.recovery_point`). Its events go in the same
    /// transaction. The resource it makes is named [`Lease::identity`], and if that name is
    /// taken, it writes nothing and returns [`Begun::Taken`]. Returns [`Begun::Rejected`] if the
    /// resource's state refuses the request (a refund of more than remains): the transaction is
    /// rolled back and the key is not used. What it inserted may be handed to [`Self::resume`]
    /// with [`Lease::carry`].
    fn begin<'a>(&'a self, conn: &'a mut PgConnection, lease: &'a mut Lease) -> BoxFuture<'a, sqlx::Result<Begun>>;

    /// Drives a held key from `lease.recovery_point` (its first phase or later: the engine
    /// begins a key still at `started` itself) to its stored final response.
    fn resume(&self, lease: Lease) -> BoxFuture<'_, Result<StoredResponse, ProcessError>>;

    /// The scheduled look-up, the sweeper's net under webhooks: takes up to `limit` of what this
    /// operation left pending at the gateway and is due to be asked about again (a bank debit
    /// `processing`, a refund `pending`), and moves each forward with what the gateway says,
    /// never by a guess ([`LookedUp::each`] runs them). An operation whose answers are all final
    /// keeps this default, which looks nothing up.
    fn look_up_due<'a>(&'a self, engine: &'a Engine, limit: i64) -> BoxFuture<'a, sqlx::Result<LookedUp>> {
        let _ = (engine, limit);
        Box::pin(async { Ok(LookedUp::default()) })
    }
}

/// What one scheduled look-up ([`Idempotent::look_up_due`]) did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LookedUp {
    /// Taken (due, and rescheduled in the same statement).
    pub taken: usize,
    /// Asked about, with an answer or without.
    pub looked_up: usize,
    /// Moved forward by what the gateway said.
    pub moved: usize,
    /// Failed on the database (or panicked).
    pub errors: usize,
}

impl LookedUp {
    /// Looks every one of `due` up at once with `look` (`true`: it moved forward), each in a task
    /// of its own, and counts what happened.
    pub async fn each<T, F, Fut>(due: Vec<T>, look: F) -> Self
    where
        F: Fn(T) -> Fut,
        Fut: Future<Output = sqlx::Result<bool>> + Send + 'static,
    {
        let mut report = Self { taken: due.len(), ..Self::default() };
        let mut work = tokio::task::JoinSet::new();
        for one in due {
            work.spawn(look(one));
        }
        while let Some(joined) = work.join_next().await {
            match joined {
                Ok(Ok(moved)) => {
                    report.looked_up += 1;
                    report.moved += usize::from(moved);
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "a look-up failed");
                    report.errors += 1;
                }
                Err(err) => {
                    tracing::error!(error = %err, "a look-up task panicked");
                    report.errors += 1;
                }
            }
        }
        report
    }
}

/// What [`Idempotent::begin`] made of the request.
#[derive(Debug)]
pub enum Begun {
    /// The first write is in the transaction; commit it with the claim.
    Written,
    /// The resource refuses the request now (this answer, not stored: the key stays unused).
    Rejected(StoredResponse),
    /// The resource this generation of the request names ([`Lease::identity`]) exists already:
    /// the request was made before, under a key since forgotten on purpose (expired). Nothing was
    /// written; the engine tries the next generation ([`super::identity`]).
    Taken,
}

/// Why a key was not driven to completion this time.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Another worker took the key over; it will finish the work.
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
    /// The gateway gave no answer that tells. The lease was released; the key may be tried
    /// again after `retry_after`.
    #[error("{error}")]
    Gateway { error: GatewayError, retry_after: Duration },
    /// The gateway refused payonce's own request (its configuration). Nothing was stored; the
    /// lease was released; the key may be tried again after `retry_after`.
    #[error("the gateway refused payonce's request ({}): {}", .refusal.reason.as_str(), .refusal.message)]
    Refused { refusal: Refusal, retry_after: Duration },
    /// A search found nothing, too soon after the last create call to believe it. The lease was
    /// released; the sweeper asks again after `retry_after`.
    #[error("the gateway found nothing yet; too early to believe it")]
    Unconfirmed { retry_after: Duration },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The stored state cannot be continued by this code.
    #[error("idempotency key {key_id}: {reason}")]
    Corrupt { key_id: Uuid, reason: String },
}

impl From<FenceError> for ProcessError {
    fn from(err: FenceError) -> Self {
        match err {
            FenceError::LeaseLost(lost) => Self::LeaseLost(lost),
            FenceError::Database(err) => Self::Database(err),
        }
    }
}

impl Engine {
    /// Drives a held key with `operation` to its stored response. A key still at `started`
    /// (claimed without its first write: an older version's key, or a plain [`Engine::claim`])
    /// gets its first write first ([`Engine::begin`]): if the resource refuses, that is the key's
    /// final answer. So no operation handles `started` itself.
    pub async fn drive(&self, operation: &Registered, mut lease: Lease) -> Result<StoredResponse, ProcessError> {
        if lease.recovery_point == RecoveryPoint::STARTED
            && let Begun::Rejected(response) = self.begin(operation, &mut lease).await?
        {
            return Ok(response);
        }
        let (key_id, customer_id, token) = (lease.key_id, lease.customer_id, lease.token);
        let driven = operation.driver.resume(lease).await;
        if let Err(ProcessError::Database(err)) = &driven {
            // The database failed mid-way (a failover, a timeout, a refused write). Held, the key
            // would stay in flight until its lease ran out, and the client's retry would meet
            // 409s; given back, the retry resumes it as soon as its backoff allows, under the same
            // downstream key. A database still failing refuses this too: the lease runs out then.
            if let Err(release) =
                self.release_key(key_id, customer_id, token, "the database failed mid-way", None).await
            {
                tracing::warn!(error = %err, release = %release, "could not give the key back after a database error");
            }
        }
        driven
    }

    /// For a key at `started`: writes the operation's first phase in a transaction of its own,
    /// fenced. A rejection is stored as the key's final answer (`failed`): nobody else would
    /// ever answer it.
    pub async fn begin(&self, operation: &Registered, lease: &mut Lease) -> Result<Begun, ProcessError> {
        let mut tx = self.pool().begin().await?;
        lease.advance_in(&mut tx, &RecoveryPoint::STARTED, &operation.first_phase, None).await?;
        let begun = self.first_write(operation.driver.as_ref(), &mut tx, lease).await?;
        if let Begun::Rejected(response) = &begun {
            lease.finish_in(&mut tx, response, true, serde_json::json!({"reason": "rejected"})).await?;
        }
        tx.commit().await?;
        Ok(begun)
    }
}

impl Lease {
    /// A key whose stored state this code cannot continue (an unreadable request, a resource
    /// missing at the point that wrote it): [`ProcessError::Corrupt`], one mapping for every
    /// operation.
    pub fn corrupt(&self, reason: impl Into<String>) -> ProcessError {
        ProcessError::Corrupt { key_id: self.key_id, reason: reason.into() }
    }

    /// The canonical request stored with the key, as the operation's own type; unreadable, the
    /// key is [`Lease::corrupt`]. In [`Idempotent::begin`], whose errors are the database's, it
    /// becomes a decode error.
    pub fn request_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, ProcessError> {
        T::deserialize(&self.request).map_err(|err| self.corrupt(format!("its stored request is unreadable: {err}")))
    }

    /// [`Lease::request_as`] for [`Idempotent::begin`], whose errors are the database's.
    pub fn request_for_begin<T: serde::de::DeserializeOwned>(&self) -> sqlx::Result<T> {
        self.request_as().map_err(|err| sqlx::Error::Decode(err.into()))
    }

    /// Gives the key back after an attempt whose answer does not tell (a refusal, an unknown
    /// outcome, an absence too early to believe), so the next attempt can start as soon as its
    /// backoff allows. Returns how long that is. A key no longer ours was taken over:
    /// [`ProcessError::LeaseLost`]. If the database cannot be reached, the lease simply runs
    /// out, and the next attempt waits for that.
    pub async fn give_back(&self, reason: &str, refused: Option<serde_json::Value>) -> Result<Duration, ProcessError> {
        match self.release(reason, refused).await {
            Ok(Some(retry_after)) => Ok(retry_after),
            Ok(None) => Err(self.lost().into()),
            Err(err) => {
                tracing::warn!(key_id = %self.key_id, error = %err, "could not release the key");
                Ok(self.engine().settings().lease)
            }
        }
    }

    /// The downstream call gave no answer that tells: the key is given back, to be asked again
    /// under the same downstream key, and the caller returns this error (its `retry_after` says
    /// when). One mapping for every operation.
    pub async fn unknown(&self, error: GatewayError) -> ProcessError {
        tracing::warn!(key_id = %self.key_id, %error, "no answer that tells from the gateway; releasing the key");
        self.given_back(&error.to_string(), None, |retry_after| ProcessError::Gateway { error, retry_after }).await
    }

    /// The downstream service refused payonce's own request: the key is given back with the
    /// refusal on its timeline (an operator fixes the cause; nothing is the customer's answer).
    pub async fn refused(&self, refusal: Refusal) -> ProcessError {
        let (reason, detail) = (refusal.reason.as_str(), refusal.detail());
        self.given_back(reason, Some(detail), |retry_after| ProcessError::Refused { refusal, retry_after }).await
    }

    /// An answer that does not settle the key yet (an absence too early to believe, a state
    /// the work cannot end in): the key is given back for the sweeper to ask again.
    pub async fn unconfirmed(&self, reason: &str) -> ProcessError {
        self.given_back(reason, None, |retry_after| ProcessError::Unconfirmed { retry_after }).await
    }

    /// [`Lease::give_back`], then the error to return: `error` with the backoff, or the lease
    /// lost.
    async fn given_back(
        &self,
        reason: &str,
        refused: Option<serde_json::Value>,
        error: impl FnOnce(Duration) -> ProcessError,
    ) -> ProcessError {
        match self.give_back(reason, refused).await {
            Ok(retry_after) => error(retry_after),
            Err(err) => err,
        }
    }

    /// A `reconciled` event on the key's timeline: what asking the gateway for the truth found
    /// (the method, its answer), written before anything is done with it.
    pub async fn reconciled(&self, detail: serde_json::Value) -> sqlx::Result<()> {
        let event = super::Event {
            key_id: self.key_id,
            customer_id: self.customer_id,
            kind: super::EventKind::Reconciled,
            lease_token: Some(self.token),
            detail,
        };
        super::events::write(self.engine().pool(), event).await
    }

    /// The gateway has nothing of this key's work: a search by metadata, or a list, found none.
    /// That absence is believed only once every create call this key could have sent is older
    /// than the settle delay ([`Lease::search_settled`]: the horizon, after which none is sent,
    /// plus `PAYONCE_SEARCH_SETTLE_SECS`), for a search index to catch up *and* for a call the
    /// gateway held to have executed. Then `Ok`: the caller records the work as never done.
    /// Before, the key is given back, to be asked again: [`ProcessError::Unconfirmed`]. Either
    /// way a `reconciled` event says what was asked and whether the answer was believed. One rule
    /// for every operation (payments search, refunds list).
    pub async fn believe_absence(&self, method: &str) -> Result<(), ProcessError> {
        let settled = self.search_settled();
        self.reconciled(serde_json::json!({"method": method, "answer": "none", "believed": settled})).await?;
        if settled {
            return Ok(());
        }
        Err(self.unconfirmed(&format!("the gateway's {method} found nothing yet")).await)
    }
}

impl Engine {
    /// The operation's first write, at the first generation of the request whose resource does
    /// not exist yet ([`super::identity`]): never [`Begun::Taken`].
    pub(crate) async fn first_write(
        &self,
        operation: &dyn Idempotent,
        conn: &mut PgConnection,
        lease: &mut Lease,
    ) -> sqlx::Result<Begun> {
        loop {
            match operation.begin(conn, lease).await? {
                Begun::Taken if lease.generation < super::identity::MAX_GENERATIONS => lease.generation += 1,
                Begun::Taken => {
                    return Err(sqlx::Error::Protocol(format!(
                        "idempotency key {}: {} generations of this request exist already",
                        lease.key_id,
                        super::identity::MAX_GENERATIONS
                    )));
                }
                begun => return Ok(begun),
            }
        }
    }
}

/// An operation as the engine knows it: the route its keys are scoped to (with `POST`), the
/// recovery point its [`Idempotent::begin`] reaches, and what drives its keys.
#[derive(Clone)]
pub struct Registered {
    /// The route template (`/v1/refunds`): the scope of the keys, and how the sweeper finds
    /// the operation of an abandoned key.
    pub route: &'static str,
    /// The first recovery point after `started`.
    pub first_phase: RecoveryPoint,
    pub driver: Arc<dyn Idempotent>,
}

/// The operations one process serves, by route: how the sweeper drives an abandoned key without
/// knowing what it is.
#[derive(Clone, Default)]
pub struct Operations {
    by_route: HashMap<&'static str, Registered>,
}

impl std::fmt::Debug for Operations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.by_route.keys()).finish()
    }
}

impl Operations {
    /// Adds an operation (one per route: a second one for a route is a programming error).
    pub fn with(mut self, operation: Registered) -> Self {
        let previous = self.by_route.insert(operation.route, operation);
        assert!(previous.is_none(), "two operations registered for one route");
        self
    }

    /// The operation of a route.
    pub fn get(&self, route: &str) -> Option<&Registered> {
        self.by_route.get(route)
    }

    /// Every operation.
    pub fn all(&self) -> impl Iterator<Item = &Registered> {
        self.by_route.values()
    }

    /// Drives a held key with the operation it was claimed for ([`Engine::drive`]).
    pub async fn resume(&self, lease: Lease) -> Result<StoredResponse, ProcessError> {
        match self.get(&lease.route) {
            Some(operation) => lease.engine().clone().drive(operation, lease).await,
            None => Err(ProcessError::Corrupt {
                key_id: lease.key_id,
                reason: format!("no operation serves route {}", lease.route),
            }),
        }
    }
}
