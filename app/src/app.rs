//! The whole application: the JSON API ([`crate::http`]), the dashboard ([`crate::admin`]), the
//! shop ([`crate::shop`]) and the static assets, behind the middleware every response goes
//! through. The process's composition root with [`crate::server`], which builds the
//! [`AppState`]: nothing below imports this module.

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request};
use axum::{Extension, Router};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::http::{self, error::ApiError};
use crate::state::AppState;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The whole application. `bench_routes` adds the benchmark-only routes ([`bench`]).
pub fn router(state: AppState, bench_routes: bool) -> Router {
    let html = html(&state);
    let (api, description) = http::api().split_for_parts();
    let api = api.layer(Extension(http::openapi::Spec::new(description)));
    let routes = api.merge(html);
    let routes = if bench_routes { routes.merge(http::bench::router()) } else { routes };
    let routes = if state.lab.is_lab() { routes.merge(http::lab::router()) } else { routes };
    assemble(routes, state)
}

/// `payonce serve --admin-only`: the dashboard, the shop and the health checks, without the
/// payments API (whose requests get the usual 404 problem).
pub fn admin_router(state: AppState) -> Router {
    let routes = Router::from(http::health::router()).merge(html(&state));
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
                // Failed requests are logged once, with their cause, by `http::error::log_errors`.
                .on_failure(())
                .on_response(DefaultOnResponse::new().level(Level::INFO).latency_unit(tower_http::LatencyUnit::Millis)),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(axum::middleware::from_fn(http::error::log_errors))
        // Inside the logging, so the problems it makes of bare errors are logged too.
        .layer(axum::middleware::from_fn(http::edge::problems))
        .layer(CatchPanicLayer::custom(http::edge::catch_panic))
        .layer(axum::middleware::from_fn(http::edge::refuse))
        .layer(DefaultBodyLimit::max(http::extract::BODY_LIMIT));

    routes
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
        .layer(middleware)
}
