//! `GET /v1/events/{id}` and `GET /v1/events` (newest first; `type`, `types[]`, pagination), as
//! on Stripe, scoped to the API key.

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::get;

use crate::simulator::error::ApiError;
use crate::simulator::http::{Created, Page, api_key};
use crate::simulator::response::SavedResponse;
use crate::simulator::state::Simulator;

pub(crate) fn router() -> Router<Simulator> {
    Router::new().route("/v1/events", get(list)).route("/v1/events/{id}", get(retrieve))
}

async fn retrieve(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let Path(id) = path?;
    let state = sim.state();
    let event = state
        .accounts
        .get(&api_key)
        .and_then(|account| account.event_positions.get(&id).map(|&position| &account.events[position]));
    let event = event.ok_or_else(|| ApiError::not_found("event", &id, "id"))?;
    Ok(SavedResponse::ok(event, "event").respond(false))
}

async fn list(State(sim): State<Simulator>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let (mut types, mut created): (Vec<String>, _) = (Vec::new(), Created::default());
    let supported = "created, limit, starting_after, ending_before, type, types and expand";
    let page = Page::parse(uri.query(), supported, |param| {
        match (param.name, param.inner) {
            ("type", None) | ("types", Some(_)) => types.push(param.value.to_owned()),
            _ => return created.take(param),
        }
        Ok(true)
    })?;
    let state = sim.state();
    let events = state.accounts.get(&api_key).map(|account| account.events.as_slice()).unwrap_or_default();
    // `type` takes `*` as a wildcard for one segment or the rest: `payment_intent.*`.
    let matches = |kind: &str| types.is_empty() || types.iter().any(|wanted| type_matches(wanted, kind));
    let wanted = events.iter().rev().filter(|event| matches(event.kind) && created.contains(event.created));
    let items = wanted.map(|event| (event.id.clone(), event)).collect();
    Ok(SavedResponse::ok(&page.list(items, "/v1/events"), "list").respond(false))
}

/// Stripe's `type` filter: an exact type, or a prefix ending in `.*`.
fn type_matches(wanted: &str, kind: &str) -> bool {
    match wanted.strip_suffix('*') {
        Some(prefix) => kind.starts_with(prefix),
        None => wanted == kind,
    }
}
