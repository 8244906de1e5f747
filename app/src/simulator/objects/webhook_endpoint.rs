//! The WebhookEndpoint (<https://docs.stripe.com/api/webhook_endpoints/object>).

use std::collections::BTreeMap;

use serde::Serialize;

use super::Null;

#[derive(Clone, Debug, Serialize)]
pub(crate) struct WebhookEndpoint {
    /// `we_` + 24 alphanumerics.
    pub id: String,
    pub object: &'static str,
    pub api_version: Option<String>,
    pub application: Null,
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

/// What a create call (or `payonce stripe-sim --webhook-url`) asks for.
#[derive(Clone, Debug)]
pub(crate) struct EndpointDraft {
    pub url: String,
    pub enabled_events: Vec<String>,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub api_version: Option<String>,
    /// `whsec_…`; a random one when `None`.
    pub secret: Option<String>,
}

impl WebhookEndpoint {
    /// A new, enabled endpoint.
    pub fn new(draft: EndpointDraft) -> Self {
        let secret = draft.secret.unwrap_or_else(|| format!("whsec_{}", super::random_alphanumeric(32)));
        Self {
            id: super::new_id("we"),
            object: "webhook_endpoint",
            api_version: draft.api_version,
            application: Null,
            created: super::now(),
            description: draft.description,
            enabled_events: draft.enabled_events,
            livemode: false,
            metadata: draft.metadata,
            secret: Some(secret),
            status: "enabled",
            url: draft.url,
        }
    }

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

impl DeletedWebhookEndpoint {
    pub fn new(id: String) -> Self {
        Self { id, object: "webhook_endpoint", deleted: true }
    }
}
