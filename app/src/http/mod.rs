//! The HTTP application: routes, shared state, middleware.
//!
//! Every route module exposes `router()`; they are merged here: the API's in [`api`] (utoipa-axum
//! routers, each route documented in the OpenAPI description as it is registered, see
//! [`openapi`]), the pages' in [`router`]. Errors are [`error::ApiError`], rendered as RFC 9457
//! problems ([`crate::problem`]); [`edge`] refuses what no route may receive and gives every other error
//! response a problem body.

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

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request};
use axum::{Extension, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::customers::Authenticator;
use crate::gateway::Gateway;
use crate::idempotency::Engine;
use error::ApiError;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub gateway: Gateway,
    /// How this server names itself as a lease owner (`http:<host>:<pid>`).
    pub owner: Arc<str>,
    /// Renders the Prometheus metrics.
    pub metrics: PrometheusHandle,
    /// Checks API keys.
    pub auth: Arc<Authenticator>,
    /// The HTML side's settings and its simulator client (admin dashboard, shop).
    pub web: crate::web::WebState,
    /// The secret Stripe signs webhook events with (`whsec_…`); without one, `POST
    /// /webhooks/stripe` refuses every event.
    pub webhook_secret: Option<Arc<crate::secret::Secret>>,
    /// The claim strategy and lab mode ([`crate::lab`]).
    pub lab: Arc<crate::lab::Lab>,
    /// Every idempotent operation, by route ([`crate::operations`]): what drives their keys.
    pub operations: crate::idempotency::Operations,
    /// Where the dashboard's read-only pages read: a replica, or the primary ([`crate::db::Reads`]).
    pub reads: crate::db::Reads,
}

impl AppState {
    /// Who claims `op`'s keys on this server: the engine, but for the payments of a lab server
    /// started with another strategy (`PAYONCE_CLAIM_STRATEGY`). Fixed at startup.
    pub fn claims(&self, op: crate::operations::Op) -> idempotent::Claims {
        match op {
            crate::operations::Op::Payment => idempotent::Claims::of(self.lab.strategy()),
            _ => idempotent::Claims::Engine,
        }
    }
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

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

/// The whole application. `bench_routes` adds the benchmark-only routes ([`bench`]).
pub fn router(state: AppState, bench_routes: bool) -> Router {
    let html = html(&state);
    let (api, description) = api().split_for_parts();
    let api = api.layer(Extension(openapi::Spec::new(description)));
    let routes = api.merge(html);
    let routes = if bench_routes { routes.merge(bench::router()) } else { routes };
    let routes = if state.lab.is_lab() { routes.merge(lab::router()) } else { routes };
    assemble(routes, state)
}

/// `payonce serve --admin-only`: the dashboard, the shop and the health checks, without the
/// payments API (whose requests get the usual 404 problem).
pub fn admin_router(state: AppState) -> Router {
    let routes = Router::from(health::router()).merge(html(&state));
    assemble(routes, state)
}

/// The HTML routers. They bring their own session layers: the JSON API never sees a cookie.
fn html(state: &AppState) -> Router<AppState> {
    Router::new()
        .merge(crate::admin::router(state))
        .merge(crate::shop::router(state))
        .merge(crate::web::page::assets_router())
}

/// The prefixes of the machine-facing routes: their 404 is always a problem document.
const API_PREFIXES: [&str; 5] = ["/v1/", "/webhooks/", "/lab/", "/bench/", "/_sim/"];

/// No route matched: an HTML page for a browser (it asks for `text/html`) on a path people
/// visit, the API's 404 problem for everything else (`/v1/…` whatever the client accepts).
async fn not_found(uri: axum::http::Uri, headers: axum::http::HeaderMap) -> axum::response::Response {
    use axum::response::IntoResponse;
    let api =
        API_PREFIXES.iter().any(|prefix| uri.path().starts_with(prefix) || uri.path() == prefix.trim_end_matches('/'));
    let browser = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.split(',').any(|media| media.trim().starts_with("text/html")));
    if browser && !api {
        let mut response = crate::web::page::WebError::NotFound.into_response();
        crate::web::page::secure(response.headers_mut());
        return response;
    }
    ApiError::NotFound.into_response()
}

/// `routes` with the fallbacks, the state and the middleware every response goes through.
fn assemble(routes: Router<AppState>, state: AppState) -> Router {
    let middleware = ServiceBuilder::new()
        // Outermost first: every request gets an id (or keeps the one it came with) before the
        // trace span opens, so every log line of the request carries it.
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &Request<_>| {
                    let id = request.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("-");
                    tracing::info_span!("request", id, method = %request.method(), path = %request.uri().path())
                })
                .on_request(())
                // Failed requests are logged once, with their cause, by `error::log_errors`.
                .on_failure(())
                .on_response(DefaultOnResponse::new().level(Level::INFO).latency_unit(tower_http::LatencyUnit::Millis)),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(axum::middleware::from_fn(error::log_errors))
        // Inside the logging, so the problems it makes of bare errors are logged too.
        .layer(axum::middleware::from_fn(edge::problems))
        .layer(CatchPanicLayer::custom(edge::catch_panic))
        .layer(axum::middleware::from_fn(edge::refuse))
        .layer(DefaultBodyLimit::max(extract::BODY_LIMIT));

    routes
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
        .layer(middleware)
}
