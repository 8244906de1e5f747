//! Liveness and readiness probes, and the Prometheus metrics.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).route("/metrics", get(metrics))
}

/// The process is up and serving HTTP. Checks nothing else, so a database outage does not make
/// an orchestrator restart healthy servers. Says which claim strategy runs (loudly, when it is
/// not the engine's own) and how much of the pool is in use, for the lab's benchmark.
async fn healthz(State(state): State<AppState>) -> axum::Json<Value> {
    let strategy = state.lab.strategy();
    let pool = state.engine.pool();
    let mut body = json!({
        "status": "ok",
        "claim_strategy": strategy.as_str(),
        "lab": state.lab.is_lab(),
        "pool": {"size": pool.size(), "idle": pool.num_idle(), "max": pool.options().get_max_connections()},
    });
    if !strategy.is_safe() {
        body["warning"] = json!(format!(
            "claim strategy {strategy} CHARGES TWICE under concurrent retries: a lab server, never for real payments"
        ));
    } else if strategy != crate::lab::Strategy::OnConflict {
        body["warning"] = json!(format!("claim strategy {strategy}: a lab strategy, see docs/strategies.md"));
    }
    axum::Json(body)
}

/// The process can do useful work: the database answers.
async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Value>, ApiError> {
    let ping = sqlx::query_scalar!("select 1 as \"one!\"").fetch_one(state.engine.pool());
    match tokio::time::timeout(Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => Ok(axum::Json(json!({"status": "ready"}))),
        Ok(Err(err)) => Err(ApiError::DatabaseUnavailable(err)),
        Err(_) => Err(ApiError::DatabaseUnavailable(sqlx::Error::PoolTimedOut)),
    }
}

/// `GET /metrics`: Prometheus text format (see [`crate::metrics`]).
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
}
