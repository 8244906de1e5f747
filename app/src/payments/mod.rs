//! Payments: the resource the idempotency engine protects.
//!
//! * [`request`]: the `POST /v1/payments` body and its validation into a canonical [`NewPayment`];
//! * [`process`]: the recovery points, and the gateway call between them;
//! * [`reconcile`]: asking the gateway what became of a payment (spent keys, pending payments);
//! * [`webhook`]: Stripe's events, recorded and applied once;
//! * [`model`]: the payment, its id, its statuses and its JSON;
//! * [`store`]: reading payments back, and moving them forward (never back).

pub mod model;
pub mod process;
pub mod reconcile;
pub mod request;
pub mod store;
pub mod webhook;

pub use model::{Payment, PaymentId, PaymentStatus};
pub use request::{CreatePayment, NewPayment};

/// The route whose keys this module drives, as recorded on each key.
pub const ROUTE: &str = "/v1/payments";
