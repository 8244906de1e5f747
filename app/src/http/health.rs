//! Liveness and readiness probes, and the Prometheus metrics.

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::openapi::{NoProblems, problems};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz)).routes(routes!(readyz)).routes(routes!(metrics))
}

/// A probe's answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Probe {
    pub status: ProbeStatus,
}

/// `ok` from `/healthz`, `ready` from `/readyz`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    Ok,
    Ready,
}

problems!(
    /// `/readyz` fails when the database does not answer.
    ReadyProblems: SERVICE_UNAVAILABLE
);

/// The process is up and serving HTTP. Checks nothing else, so a database outage does not make
/// an orchestrator restart healthy servers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process serves HTTP.", body = Probe), NoProblems)
)]
async fn healthz() -> axum::Json<Probe> {
    axum::Json(Probe { status: ProbeStatus::Ok })
}

/// The process can do useful work: the database answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses((status = 200, description = "The database answers.", body = Probe), ReadyProblems)
)]
async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Probe>, ApiError> {
    let ping = sqlx::query_scalar!("select 1 as \"one!\"").fetch_one(state.engine.pool());
    match tokio::time::timeout(Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => Ok(axum::Json(Probe { status: ProbeStatus::Ready })),
        Ok(Err(err)) => Err(ApiError::DatabaseUnavailable(err)),
        Err(_) => Err(ApiError::DatabaseUnavailable(sqlx::Error::PoolTimedOut)),
    }
}

/// `GET /metrics`: Prometheus text format (see [`crate::metrics`]).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4 (docs/operations.md lists the series).",
         body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
        NoProblems,
    )
)]
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
}
