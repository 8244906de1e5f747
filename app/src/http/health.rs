//! Liveness and readiness probes, and the Prometheus metrics.

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::openapi::{NoProblems, problems};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz)).routes(routes!(readyz)).routes(routes!(metrics))
}

/// `/healthz`'s answer: the process is up, the claim strategy it runs, its pool's use.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Probe {
    pub status: ProbeStatus,
    /// The claim strategy payments run under (`PAYONCE_CLAIM_STRATEGY`): `on-conflict` is the
    /// engine's own, the others are the lab's (docs/strategies.md).
    #[schema(value_type = String, pattern = "^(on-conflict|for-update|redis|check-then-insert)$")]
    pub claim_strategy: &'static str,
    /// Whether the server runs in lab mode (`PAYONCE_LAB=1`, the `/lab/{strategy}/…` routes).
    pub lab: bool,
    pub pool: PoolUse,
    /// Only when the strategy is a lab one: loud when it can charge twice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// What the strategy does not guarantee that the engine does (empty for `on-conflict`).
    pub lacks: Vec<&'static str>,
}

/// The database pool's connections: open, idle among them, and the most it opens.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = PoolUse)]
pub struct PoolUse {
    pub size: u32,
    pub idle: usize,
    pub max: u32,
}

/// `/readyz`'s answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Readiness {
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
/// an orchestrator restart healthy servers. Says which claim strategy runs (loudly, when it is
/// not the engine's own) and how much of the pool is in use, for the lab's benchmark.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process serves HTTP; which claim strategy runs, and the pool's use.",
               body = Probe), NoProblems)
)]
async fn healthz(State(state): State<AppState>) -> axum::Json<Probe> {
    let strategy = state.lab.strategy();
    let pool = state.engine.pool();
    let warning = if !strategy.is_safe() {
        Some(format!(
            "claim strategy {strategy} CHARGES TWICE under concurrent retries: a lab server, never for real payments"
        ))
    } else if strategy != crate::lab::Strategy::OnConflict {
        Some(format!("claim strategy {strategy}: a lab strategy, without the engine's other guarantees (lacks)"))
    } else {
        None
    };
    axum::Json(Probe {
        status: ProbeStatus::Ok,
        claim_strategy: strategy.as_str(),
        lab: state.lab.is_lab(),
        pool: PoolUse { size: pool.size(), idle: pool.num_idle(), max: pool.options().get_max_connections() },
        warning,
        lacks: strategy.lacks().to_vec(),
    })
}

/// The process can do useful work: the database answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses((status = 200, description = "The database answers.", body = Readiness), ReadyProblems)
)]
async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Readiness>, ApiError> {
    let ping = sqlx::query_scalar!("select 1 as \"one!\"").fetch_one(state.engine.pool());
    match tokio::time::timeout(Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => Ok(axum::Json(Readiness { status: ProbeStatus::Ready })),
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
