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

/// The final answer about a payment that is another customer's, or nobody's: indistinguishable
/// on purpose. What an operation on a payment (a refund, a capture) answers when it names none.
pub fn no_such_payment() -> crate::idempotency::StoredResponse {
    use crate::problem::NOT_FOUND;
    NOT_FOUND.stored(NOT_FOUND.problem("There is no such payment for your API key."))
}
