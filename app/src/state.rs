//! What every handler can reach, the API's and the pages' alike: built once by [`crate::server`]
//! and handed to the routers [`crate::app`] assembles.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::customers::Authenticator;
use crate::gateway::Gateway;
use crate::idempotency::Engine;
use crate::lab::Claims;
use crate::operations::Op;

/// What every handler can reach: [`Services`], shared. Axum clones the state for each request
/// (and the idempotent path once more for its task): that copies one pointer. Cloning the
/// services themselves (their clients, pools and the registry's map) cost a replay a third of
/// its CPU (docs/performance.md, "Replays that cloned the whole state").
#[derive(Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    pub fn new(services: Services) -> Self {
        Self(Arc::new(services))
    }

    /// A copy of the services, to change some of them (a second server on the same database).
    pub fn services(&self) -> Services {
        (*self.0).clone()
    }
}

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// The services a handler can reach, built once at startup.
#[derive(Clone)]
pub struct Services {
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

impl Services {
    /// Who claims `op`'s keys on this server: the engine, but for the payments of a lab server
    /// started with another strategy (`PAYONCE_CLAIM_STRATEGY`). Fixed at startup.
    pub fn claims(&self, op: Op) -> Claims {
        match op {
            Op::Payment => Claims::of(self.lab.strategy()),
            _ => Claims::Engine,
        }
    }
}
