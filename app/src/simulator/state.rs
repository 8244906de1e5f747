//! The simulator's state: one mutex over everything, and the handle that owns it.
//!
//! Critical sections are short and never span an `.await`. One lock makes "create the
//! PaymentIntent, append the charge, save the idempotent result, record the events" a single
//! atomic step. Work that must happen *outside* the lock (a webhook delivery, a timer that moves a
//! bank debit on) is queued in [`State::outbox`] and started by `jobs::transact` once the lock is
//! released: nothing slow ever runs under it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::faults::FaultState;
use super::idempotency::Keys;
use super::ledger::{self, Ledger};
use super::objects::{Charge, Event, PaymentIntent, Refund, WebhookEndpoint};
use super::webhooks::log::{DeliveryJob, EventLog};

/// The simulator: its state and its HTTP routes.
///
/// Cheap to clone (an `Arc` inside); every clone is the same simulator. All state is in memory
/// for the life of the process.
#[derive(Clone)]
pub struct Simulator {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Sends webhook deliveries (plain HTTP: the endpoints a test registers are local).
    http: reqwest::Client,
}

impl Default for Simulator {
    fn default() -> Self {
        // Deliveries go straight to the endpoint, as Stripe's do: never through a proxy taken
        // from the environment.
        let http = reqwest::Client::builder().no_proxy().build().unwrap_or_default();
        Self { inner: Arc::new(Inner { state: Mutex::new(State::default()), http }) }
    }
}

impl Simulator {
    /// A simulator with no objects, no charges and no faults.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; if something ever did, the state is still
        // consistent (each critical section is one step), so keep serving rather than fail
        // every later request.
        self.inner.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator").finish_non_exhaustive()
    }
}

/// Everything the simulator knows.
#[derive(Default)]
pub(crate) struct State {
    /// Incremented by every reset. A request, timer or delivery that began before a reset finds a
    /// different epoch when it comes to act, and does nothing: a reset is a clean cut.
    pub epoch: u64,
    /// Objects, events, endpoints and idempotency keys per API key, as Stripe scopes them per
    /// account.
    pub accounts: HashMap<String, Account>,
    /// Every successful charge and refund.
    pub ledger: Ledger,
    /// The faults to inject and the random source of their draws.
    pub faults: FaultState,
    /// The knobs that are not faults: how long a bank debit processes, the delivery policy.
    pub settings: Settings,
    /// Every event with its deliveries and their attempts (`GET /_sim/events`).
    pub events: EventLog,
    /// Deliveries waiting for `POST /_sim/webhooks/release` (the `webhook_hold` fault).
    pub held: Vec<DeliveryJob>,
    /// Work to start once the lock is released (see `jobs::transact`).
    pub outbox: Vec<Job>,
}

impl State {
    pub fn account(&mut self, api_key: &str) -> &mut Account {
        // Look up before `entry`, which would allocate the key on every call of every request.
        if !self.accounts.contains_key(api_key) {
            self.accounts.insert(api_key.to_owned(), Account::default());
        }
        self.accounts.get_mut(api_key).expect("inserted just above")
    }

    /// The API key whose account `holds` the object a control route names (the routes name an
    /// object, not an account).
    pub fn owner(&self, holds: impl Fn(&Account) -> bool) -> Option<String> {
        self.accounts.iter().find(|(_, account)| holds(account)).map(|(api_key, _)| api_key.clone())
    }

    /// Runs `apply` on the state `after` this long, unless the simulator is reset meanwhile.
    pub fn later(&mut self, after: Duration, apply: impl FnOnce(&mut State) + Send + 'static) {
        self.outbox.push(Job::Later { after, epoch: self.epoch, apply: Box::new(apply) });
    }
}

/// What one API key owns.
#[derive(Debug, Default)]
pub(crate) struct Account {
    /// PaymentIntents by id, and their ids in creation order (lists and searches).
    pub payment_intents: HashMap<String, PaymentIntent>,
    pub payment_intent_order: Vec<String>,
    /// Charges by id.
    pub charges: HashMap<String, Charge>,
    /// Refunds by id, and their ids in creation order.
    pub refunds: HashMap<String, Refund>,
    pub refund_order: Vec<String>,
    /// The ledger entries of pending refunds (bank debits), recorded once each succeeds.
    pub pending_refunds: HashMap<String, ledger::Refund>,
    /// Webhook endpoints in creation order (each with its secret).
    pub webhook_endpoints: Vec<WebhookEndpoint>,
    /// Events in creation order, and their positions by id.
    pub events: Vec<Event>,
    pub event_positions: HashMap<String, usize>,
    /// Idempotency keys: claims in flight and saved results.
    pub keys: Keys,
}

/// Work started outside the lock.
pub(crate) enum Job {
    /// Send one event to one endpoint (with its retries).
    Deliver(DeliveryJob),
    /// Change the state later (a bank debit settles, a refund's details arrive).
    Later { after: Duration, epoch: u64, apply: Box<dyn FnOnce(&mut State) + Send> },
}

/// The knobs that are not faults (`GET`/`PUT /_sim/settings`). Every field is optional in JSON.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// How long a bank debit (`pm_usBankAccount_*`) stays `processing`, and its refunds
    /// `pending`, in milliseconds.
    pub processing_ms: u64,
    /// How long a webhook endpoint has to answer one delivery attempt, in milliseconds.
    pub webhook_timeout_ms: u64,
    /// The wait before the first retry of a failed delivery; each later wait doubles.
    pub webhook_retry_base_ms: u64,
    /// Attempts per delivery, the first included; after the last failure the delivery is
    /// `failed` and never sent again.
    pub webhook_max_attempts: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Self { processing_ms: 3_000, webhook_timeout_ms: 5_000, webhook_retry_base_ms: 1_000, webhook_max_attempts: 6 }
    }
}

/// Why a [`Settings`] value was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    #[error("{field} must be between {min} and {max}, got {value}")]
    OutOfRange { field: &'static str, min: u64, max: u64, value: u64 },
}

impl Settings {
    /// Checks every field; the first problem found is reported.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let checks = [
            ("processing_ms", self.processing_ms, 0, 600_000),
            ("webhook_timeout_ms", self.webhook_timeout_ms, 1, 60_000),
            ("webhook_retry_base_ms", self.webhook_retry_base_ms, 0, 600_000),
            ("webhook_max_attempts", u64::from(self.webhook_max_attempts), 1, 20),
        ];
        for (field, value, min, max) in checks {
            if !(min..=max).contains(&value) {
                return Err(SettingsError::OutOfRange { field, min, max, value });
            }
        }
        Ok(())
    }

    pub fn processing(&self) -> Duration {
        Duration::from_millis(self.processing_ms)
    }

    /// The wait after failed attempt `attempt` (1-based): base × 2^(attempt − 1), bounded.
    pub fn retry_delay(&self, attempt: u32) -> Duration {
        let factor = 1u64 << attempt.saturating_sub(1).min(20);
        Duration::from_millis(self.webhook_retry_base_ms.saturating_mul(factor))
    }
}
