//! Prometheus metrics, served at `GET /metrics` in the text exposition format.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `payonce_idempotency_events_total` | counter | `kind` | one per event of the key log: `claimed`, `replayed`, `conflict` (409), `mismatch` (422), `reclaimed`, `payment_created`, `completed`, `released`, `lease_lost`, `failed`, `expired` (reaped), `refused`, `reconciled`, `webhook` |
//! | `payonce_gateway_request_duration_seconds` | histogram | `call`, `outcome` | one per gateway call (`create`, `retrieve`, `search`): `succeeded`, `declined`, `pending`, `refused`, `timeout`, `transport`, `unavailable`, `unreadable`, `none` (an empty search) |
//! | `payonce_gateway_refusals_total` | counter | `reason` | the gateway refused payonce's own request: `authentication`, `permission`, `unknown_url`, `not_found`, `invalid_request`, `idempotency`, `unexpected_status`, `not_retryable` |
//! | `payonce_sweeps_total` | counter | | sweeper passes |
//!
//! `docs/operations.md` says what each means for an operator.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Gateway latency buckets, in seconds: a card payment takes 0.2–2 s at Stripe; the tail matters.
const GATEWAY_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Installs the process-wide recorder (once; later calls return the same handle).
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("payonce_gateway_request_duration_seconds".into()),
                    GATEWAY_BUCKETS,
                )
                .expect("the bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics will stay empty");
            }
            handle
        })
        .clone()
}
