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
/// an orchestrator restart healthy servers.
async fn healthz() -> axum::Json<Value> {
    axum::Json(json!({"status": "ok"}))
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
