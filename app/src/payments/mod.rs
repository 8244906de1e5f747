//! Payments: the resource the idempotency engine protects.
//!
//! * [`request`]: the `POST /v1/payments` body and its validation into a canonical [`NewPayment`];
//! * [`process`]: the recovery points, and the gateway call between them;
//! * [`model`]: the payment, its id and its JSON;
//! * [`store`]: reading payments back.

pub mod model;
pub mod process;
pub mod request;
pub mod store;

pub use model::{Payment, PaymentId, PaymentStatus};
pub use request::{CreatePayment, FieldError, NewPayment};

/// The route whose keys this module drives, as recorded on each key.
pub const ROUTE: &str = "/v1/payments";
