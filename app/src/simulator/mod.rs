//! A Stripe-wire-compatible simulator, with an exact ledger of charges and refunds, webhooks
//! delivered at least once, and injectable faults.
//!
//! payonce talks to Stripe through async-stripe. Pointed at this simulator instead (a base URL
//! such as `http://127.0.0.1:PORT/`), the same client code runs unchanged, offline, and every
//! failure an exactly-once design must survive can be produced on demand. It runs inside
//! `payonce serve` when no `STRIPE_SECRET_KEY` is set, or alone as `payonce stripe-sim`. The
//! contract is Stripe's API as its OpenAPI description defines it: every request payonce sends and
//! every answer and event of the simulator is checked against the description, both ways
//! (`app/tests/api/conformance`), async-stripe (rc.10) deserialises everything it returns,
//! Stripe's official Python and Node libraries drive it unchanged (`.ci/stripe-python-check`,
//! `.ci/stripe-node-check`), and its webhook signatures verify with async-stripe-webhook and the
//! Node library. The full reference is `docs/simulator.md`.
//!
//! # What it is
//!
//! - **Stripe's wire format** for PaymentIntents (create and confirm, capture and cancel,
//!   retrieve, list, search in Stripe's query language), refunds (create, retrieve, list), charges (retrieve), webhook
//!   endpoints (create, retrieve, list, delete) and events (retrieve, list): form bodies with
//!   `metadata[k]=v`, Bearer (or Basic) auth with `sk_…`/`rk_…` keys, Stripe's ids, objects (every
//!   property Stripe sends, `null` where the simulator has nothing to say), error envelope
//!   (`doc_url`, `request_log_url`, a card error's PaymentMethod), status codes, headers
//!   (`Request-Id`, `Stripe-Version`, `Idempotency-Key`, `Original-Request`,
//!   `Stripe-Should-Retry`), and the `return_url` rule of API versions since 2023-08-16.
//! - **Stripe's test payment methods** decide the outcome, including the pending ones: cards
//!   that succeed or decline (`pm_card_visa`, `pm_card_chargeDeclinedInsufficientFunds`, …),
//!   3-D Secure (`pm_card_threeDSecure2Required`: `requires_action` until the customer answers
//!   through `POST /_sim/payment_intents/{id}/authenticate`), and bank debits
//!   (`pm_usBankAccount_success`, `pm_usBankAccount_accountClosed`: `processing`, then settled
//!   after the `processing_ms` knob). With `capture_method=manual` a card is only authorized
//!   (`requires_capture`) until `POST /v1/payment_intents/{id}/capture` takes all or part of it,
//!   a cancel releases it, or `POST /_sim/payment_intents/{id}/expire_authorization` lets it
//!   expire as Stripe does after 7 days.
//! - **Stripe's idempotency semantics** on every POST, per API key and `Idempotency-Key`: saved
//!   results, replays with `Idempotent-Replayed: true`, 400 for a key reused with other
//!   parameters or on another route, 409 while in flight. Work that has begun always finishes,
//!   even if the client hangs up.
//! - **Events and webhooks**: Stripe's Event objects (`request.idempotency_key` is the key of the
//!   call that caused them, `null` for asynchronous transitions), delivered to registered
//!   endpoints at least once, signed with Stripe's scheme, retried with compressed backoff, on
//!   their own tasks, never under the state's lock.
//! - **A ledger** ([`Simulator::charges`], [`Simulator::refunds`], `GET /_sim/charges`,
//!   `GET /_sim/refunds`): one entry per charge when money actually moves (a capture, never an
//!   authorization alone), one per refund, with the Idempotency-Key and metadata they were made
//!   with. This is how tests and load tests *prove* that nothing was charged twice and never
//!   more was refunded than charged.
//! - **Faults** ([`Faults`], `PUT /_sim/faults`): latency, outages, timeouts that still charge,
//!   responses lost after the charge (on creates, captures, cancels, refunds and reads, scoped
//!   to operations, a payment method or the next N calls), and webhook deliveries lost,
//!   duplicated, delayed or held and released out of order; reproducible with a seed. Knobs
//!   that are not faults (processing time, delivery policy) are [`Settings`]
//!   (`PUT /_sim/settings`).
//!
//! # What it is not
//!
//! Not a Stripe emulator. There are no customers, separate confirm calls, multicapture or
//! incremental authorization, disputes, payouts, Connect, rate limits or live mode;
//! authorizations expire only when told to; card refunds always succeed at once, bank-debit
//! refunds stay `pending` for the processing knob and fail only when told to
//! (`POST /_sim/refunds/{id}/settle`); bank debits need no mandate or verification; searches
//! see new objects at once (Stripe's index may lag up to a minute); saved idempotent results
//! never expire (Stripe keeps them 24 hours); events are rendered in the API version
//! async-stripe pins, whatever the endpoint's `api_version`; webhook URLs must be plain `http`
//! (it has no TLS client); all state is in memory and lost when the process exits. What is
//! outside the subset is refused loudly (`parameter_unknown`, Stripe's 404, a 400 naming what
//! the search language does not allow) rather than ignored; only `expand` (honoured for a
//! PaymentIntent's `latest_charge` and a search's `total_count`) and `mandate_data` are accepted
//! without effect.
//!
//! # Layout
//!
//! Imports flow one way: the server assembles the routes; routes call the execution pipeline
//! and the domain; the domain changes the state through `jobs`; objects, error and response are
//! leaves.
//!
//! ```text
//! server.rs              Simulator::router, the headers/log middleware, start / serve
//! control.rs             the /_sim routes and their Rust equivalents on Simulator
//! payment_intents/       create + confirm (params, confirm: per payment method), capture, cancel
//!                        (and expiry), retrieve, search
//! refunds/               create (the refund itself), retrieve, list
//! charges.rs             GET /v1/charges/{id}
//! webhooks/              endpoints (routes), delivery (tasks, retries), signature, log
//! events/                emit (record + queue deliveries), routes (GET /v1/events…)
//! execution.rs           the pipeline of every write (idempotency, faults, claim) and read
//! http.rs                auth, Idempotency-Key, Stripe-Version, form encoding, pagination,
//!                        the created filter
//! jobs.rs                transact: change the state, then start deliveries and timers unlocked
//! state.rs               Simulator (the handle), State, Account, Settings, Job
//! idempotency.rs         claims, saved results, replays, mismatches
//! faults.rs              Faults: validation, scope, the per-call and per-delivery draws
//! payment_methods.rs     Stripe's test payment methods: what each pays with and does
//! ledger.rs              charges and refunds, append-only
//! form.rs                form and query decoding, the parsing rules routes share
//! objects/               PaymentIntent, Charge, Refund, PaymentMethod, Event, WebhookEndpoint,
//!                        lists, ids: one builder each
//! error.rs, response.rs  Stripe's error envelope; JSON answers and saved results
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
