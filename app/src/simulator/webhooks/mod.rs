//! Webhooks the Stripe way: endpoints registered through the API, events signed with Stripe's
//! scheme and delivered at least once.
//!
//! ```text
//! endpoints.rs   POST/GET/DELETE /v1/webhook_endpoints: the endpoint object, its whsec_ secret
//! signature.rs   Stripe-Signature: t=…,v1=HMAC-SHA256(secret, "t.payload")
//! delivery.rs    one task per delivery: attempts, timeout, backoff, the release of held ones
//! log.rs         what GET /_sim/events shows: every event, its deliveries and their attempts
//! ```

pub(crate) mod delivery;
pub(crate) mod endpoints;
pub(crate) mod log;
mod signature;
