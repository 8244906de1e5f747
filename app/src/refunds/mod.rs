//! Refunds: the second resource the idempotency engine protects, and the worked example of
//! making an endpoint idempotent (docs/architecture.md, "Making your own endpoint idempotent").
//!
//! * [`request`]: the `POST /v1/refunds` body and its validation into a canonical [`NewRefund`];
//! * [`process`]: the refund as an [`crate::idempotency::Idempotent`] operation: the reservation
//!   committed with the claim, the gateway call, the final write;
//! * [`model`]: the refund, its id, its statuses and its JSON;
//! * [`store`]: reading refunds back, and moving a pending one forward;
//! * [`reconcile`]: looking pending refunds up at the gateway when no webhook told (the
//!   sweeper's safety net);
//! * [`webhook`]: Stripe's refund events, applied forward only (the refunds' handler of the
//!   webhook inbox, [`crate::inbox`]).
//!
//! Keys stop one request from happening twice; they do not stop two *different* requests from
//! refunding one payment at once. That is the resource's invariant, kept by the database at the
//! refund's first write: the payment's `amount_refunded` is raised by a conditional update under
//! a row lock held for that one short transaction (never across the gateway call), so the sum of
//! a payment's refunds can never exceed what was paid.

pub mod model;
pub mod process;
pub mod reconcile;
pub mod request;
pub mod store;
pub mod webhook;

pub use model::{Refund, RefundId, RefundStatus};
pub use process::{REFUND_CREATED, Refunds};
pub use request::{CreateRefund, NewRefund};

/// The route whose keys this module drives, as recorded on each key.
pub const ROUTE: &str = "/v1/refunds";
