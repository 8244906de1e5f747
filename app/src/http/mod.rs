//! The JSON API: its routes, extractors, errors and the middleware that shapes every response.
//!
//! Every route module exposes `router()`; they are merged in [`api`] (utoipa-axum routers, each
//! route documented in the OpenAPI description as it is registered, see [`openapi`]). Errors are
//! [`error::ApiError`], rendered as RFC 9457 problems ([`crate::problem`]); [`edge`] refuses what
//! no route may receive and gives every other error response a problem body. The whole
//! application (the API, the pages, the middleware around both) is assembled in [`crate::app`].

pub mod bench;
pub mod edge;
pub mod error;
pub mod extract;
pub mod health;
pub mod idempotent;
pub mod lab;
pub mod list;
pub mod openapi;
pub mod payments;
pub mod refunds;
pub mod webhooks;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

/// The API: every router here is documented in the OpenAPI description (`GET /openapi.json`).
/// The one list of the API's routes; a new route module is merged here (see [`openapi`]).
pub fn api() -> OpenApiRouter<AppState> {
    openapi::base()
        .merge(health::router())
        .merge(payments::router())
        .merge(refunds::router())
        .merge(webhooks::router())
        .routes(routes!(openapi::serve))
}
