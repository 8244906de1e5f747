//! A Stripe-wire-compatible simulator, with an exact ledger of charges and injectable faults.
//!
//! payonce talks to Stripe through async-stripe. Pointed at this simulator instead (a base URL
//! such as `http://127.0.0.1:PORT/`), the same client code runs unchanged, offline, and every
//! failure an exactly-once design must survive can be produced on demand. It runs inside
//! `payonce serve` when no `STRIPE_SECRET_KEY` is set, or alone as `payonce stripe-sim`.
//!
//! # What it is
//!
//! - **Stripe's wire format** for the calls payonce makes: `POST /v1/payment_intents` (form
//!   encoded, `metadata[k]=v`, `confirm=true`) and `GET /v1/payment_intents/{id}`, Bearer (or
//!   Basic) auth with `sk_…`/`rk_…` keys, Stripe's ids, objects, error envelope and status codes.
//!   Stripe's test payment methods (`pm_card_visa`, `pm_card_chargeDeclinedInsufficientFunds`,
//!   …) decide the outcome.
//! - **Stripe's idempotency semantics**, per API key and `Idempotency-Key`: saved results,
//!   replays with `Idempotent-Replayed: true`, 400 on reused keys with other parameters, 409
//!   while in flight. Work that has begun always finishes, even if the client hangs up.
//! - **A ledger** ([`Simulator::charges`], `GET /_sim/charges`): one entry per successful charge,
//!   with the Idempotency-Key and metadata it was made with. This is how tests and load tests
//!   *prove* that nothing was charged twice.
//! - **Faults** ([`Faults`], `PUT /_sim/faults`): latency, outages, timeouts that still charge,
//!   and responses lost after the charge, optionally scoped to a payment method or the next N
//!   calls, reproducible with a seed.
//!
//! # What it is not
//!
//! Not a Stripe emulator. There are no customers, captures, refunds, webhooks, 3-D Secure
//! (`requires_action`), rate limits or live mode; saved idempotent results never expire (Stripe
//! keeps them 24 hours); all state is in memory and lost when the process exits. What is outside
//! the subset is refused loudly (`parameter_unknown`, Stripe's 404) rather than ignored; only
//! `expand`, which changes how ids are rendered and not what happens, is accepted and ignored.
//!
//! # Layout
//!
//! ```text
//! mod.rs              Simulator (the shared state), start / serve / RunningSimulator
//! api.rs              the Stripe routes: auth, create (the execution task), retrieve
//! form.rs             form decoding and create-parameter validation (Stripe's 400s)
//! idempotency.rs      claims, saved results, replays, mismatches
//! faults.rs           Faults: validation, scope, the per-call draw
//! payment_methods.rs  Stripe's test payment methods and what each one does
//! objects.rs          the PaymentIntent object and Stripe-like ids
//! ledger.rs           Charge and the append-only ledger
//! error.rs            Stripe's error envelope
//! control.rs          the /_sim routes
//! ```

mod charges;
mod control;
mod error;
mod events;
mod execution;
mod faults;
mod form;
mod http;
mod idempotency;
mod jobs;
mod ledger;
mod objects;
mod payment_intents;
mod payment_methods;
mod refunds;
mod response;
mod server;
mod state;
#[cfg(test)]
mod tests;
mod webhooks;

pub use faults::{Faults, FaultsError, Operation};
pub use ledger::{Charge, Refund};
pub use server::{RunningSimulator, serve, start};
pub use state::{Settings, SettingsError, Simulator};
pub use webhooks::log::{Attempt, Delivery, DeliveryState, EventRecord, RecordRequest};
