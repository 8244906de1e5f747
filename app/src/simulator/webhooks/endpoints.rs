//! `POST /v1/webhook_endpoints` (`url`, `enabled_events[]`, optional `description`, `metadata`,
//! `api_version`), `GET /v1/webhook_endpoints/{id}`, `GET /v1/webhook_endpoints` and `DELETE
//! /v1/webhook_endpoints/{id}`, as on Stripe. The `whsec_…` secret is in the create response
//! only. `enabled_events: ["*"]` means every event.

use std::collections::BTreeMap;
use std::str::FromStr;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::get;
use stripe_shared::event::EventType;

use crate::simulator::error::ApiError;
use crate::simulator::execution;
use crate::simulator::form::{Form, apply_metadata, is_list_index, non_empty};
use crate::simulator::http::{Caller, Page, RequestId, api_key, require_form_encoding};
use crate::simulator::objects::{DeletedWebhookEndpoint, EndpointDraft, WebhookEndpoint};
use crate::simulator::response::SavedResponse;
use crate::simulator::state::Simulator;

const ENDPOINTS: &str = "/v1/webhook_endpoints";

pub(crate) fn router() -> Router<Simulator> {
    Router::new()
        .route(ENDPOINTS, get(list).post(create))
        .route("/v1/webhook_endpoints/{id}", get(retrieve).delete(delete))
}

async fn create(
    State(sim): State<Simulator>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = Caller::from_request(&headers, &request_id)?;
    let body = body?;
    require_form_encoding(&headers)?;
    let form = Form::parse(&body);
    let draft = parse(&form)?;
    // Idempotent like every Stripe POST; faults never touch it.
    execution::write(
        sim,
        caller,
        None,
        (ENDPOINTS, form.canonical()),
        |_| None,
        move |state, ctx| {
            let endpoint = WebhookEndpoint::new(draft);
            state.account(&ctx.api_key).webhook_endpoints.push(endpoint.clone());
            SavedResponse::ok(&endpoint, "webhook_endpoint_created")
        },
    )
    .await
}

impl Simulator {
    /// Registers an endpoint for `api_key`'s account that receives every event, signed with a
    /// `whsec_…` secret of the caller's choosing; returns its id. This is what `payonce stripe-sim
    /// --webhook-url` does at startup, so that several servers given the same
    /// `STRIPE_WEBHOOK_SECRET` verify its deliveries (as `stripe listen` does with one secret per
    /// machine); an endpoint created through the API gets a random secret, answered once.
    pub fn add_webhook_endpoint(&self, api_key: &str, url: &str, secret: &str) -> Result<String, String> {
        if reqwest::Url::parse(url).ok().is_none_or(|parsed| !matches!(parsed.scheme(), "http" | "https")) {
            return Err(format!("the webhook URL must be an absolute http(s) URL, got {url:?}"));
        }
        if !secret.starts_with("whsec_") || secret.len() <= "whsec_".len() {
            return Err("the webhook secret must be whsec_ followed by the secret".to_owned());
        }
        let endpoint = WebhookEndpoint::new(EndpointDraft {
            url: url.to_owned(),
            enabled_events: vec!["*".to_owned()],
            description: Some("registered at startup".to_owned()),
            metadata: BTreeMap::new(),
            api_version: None,
            secret: Some(secret.to_owned()),
        });
        let id = endpoint.id.clone();
        self.state().account(api_key).webhook_endpoints.push(endpoint);
        Ok(id)
    }
}

/// The endpoint a create call describes (its id, time and secret are given at execution).
fn parse(form: &Form) -> Result<EndpointDraft, ApiError> {
    let (mut url, mut description, mut api_version) = (None, None, None);
    let mut enabled_events = Vec::new();
    let mut metadata = BTreeMap::new();
    for param in form.params()? {
        match (param.name, param.inner) {
            ("url", None) => url = non_empty(param.value),
            ("description", None) => description = non_empty(param.value),
            ("api_version", None) => api_version = non_empty(param.value),
            ("metadata", inner) => apply_metadata(&mut metadata, inner, param.value)?,
            ("enabled_events", inner) if is_list_index(inner) => {
                let known =
                    param.value == "*" || !matches!(EventType::from_str(param.value), Ok(EventType::Unknown(_)));
                if !known {
                    return Err(ApiError::invalid_request(format!(
                        "Invalid {}: must be one of Stripe's event types (see \
                         https://docs.stripe.com/api/events/types) or *, got '{}'",
                        param.key, param.value
                    ))
                    .param(param.key));
                }
                enabled_events.push(param.value.to_owned());
            }
            ("expand", inner) if is_list_index(inner) => {}
            _ => {
                return Err(ApiError::parameter_unknown(
                    param.key,
                    "url, enabled_events, description, metadata, api_version and expand",
                ));
            }
        }
    }
    let url = url.ok_or_else(|| ApiError::parameter_missing("url"))?;
    let parsed = reqwest::Url::parse(&url).ok().filter(|parsed| matches!(parsed.scheme(), "http" | "https"));
    if parsed.is_none() {
        return Err(ApiError::invalid_request(format!("Invalid URL: {url}. The URL must be an absolute http(s) URL."))
            .param("url"));
    }
    if enabled_events.is_empty() {
        return Err(ApiError::parameter_missing("enabled_events"));
    }
    Ok(EndpointDraft { url, enabled_events, description, metadata, api_version, secret: None })
}

async fn retrieve(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let Path(id) = path?;
    let state = sim.state();
    let endpoints =
        state.accounts.get(&api_key).map(|account| account.webhook_endpoints.as_slice()).unwrap_or_default();
    let endpoint = endpoints.iter().find(|endpoint| endpoint.id == id);
    let endpoint = endpoint.ok_or_else(|| ApiError::not_found("webhook_endpoint", &id, "id"))?;
    Ok(SavedResponse::ok(&endpoint.public(), "webhook_endpoint").respond(false))
}

async fn list(State(sim): State<Simulator>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let page = Page::parse(uri.query(), "limit, starting_after, ending_before and expand", |_| Ok(false))?;
    let state = sim.state();
    let endpoints =
        state.accounts.get(&api_key).map(|account| account.webhook_endpoints.as_slice()).unwrap_or_default();
    let items = endpoints.iter().rev().map(|endpoint| (endpoint.id.clone(), endpoint.public())).collect();
    Ok(SavedResponse::ok(&page.list(items, ENDPOINTS), "list").respond(false))
}

/// Deleting an endpoint stops its pending deliveries (between attempts).
async fn delete(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let Path(id) = path?;
    let mut state = sim.state();
    let endpoints = &mut state.account(&api_key).webhook_endpoints;
    let position = endpoints.iter().position(|endpoint| endpoint.id == id);
    let position = position.ok_or_else(|| ApiError::not_found("webhook_endpoint", &id, "id"))?;
    endpoints.remove(position);
    let deleted = DeletedWebhookEndpoint::new(id);
    Ok(SavedResponse::ok(&deleted, "webhook_endpoint_deleted").respond(false))
}
