//! The WebhookEndpoint (<https://docs.stripe.com/api/webhook_endpoints/object>).

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub(crate) struct WebhookEndpoint {
    /// `we_` + 24 alphanumerics.
    pub id: String,
    pub object: &'static str,
    pub api_version: Option<String>,
    pub application: Option<String>,
    pub created: i64,
    pub description: Option<String>,
    /// Event types, or `["*"]` for all.
    pub enabled_events: Vec<String>,
    pub livemode: bool,
    pub metadata: BTreeMap<String, String>,
    /// `whsec_…`, the signing secret: rendered only in the create response, as on Stripe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    pub status: &'static str,
    pub url: String,
}

impl WebhookEndpoint {
    /// Whether an event of type `kind` is sent to this endpoint.
    pub fn wants(&self, kind: &str) -> bool {
        self.enabled_events.iter().any(|enabled| enabled == "*" || enabled == kind)
    }

    /// The endpoint as every response but the create one shows it: without its secret.
    pub fn public(&self) -> Self {
        Self { secret: None, ..self.clone() }
    }
}

/// What `DELETE /v1/webhook_endpoints/{id}` answers.
#[derive(Debug, Serialize)]
pub(crate) struct DeletedWebhookEndpoint {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}
