//! The PaymentIntent routes: `POST /v1/payment_intents` (create, and confirm), `GET
//! /v1/payment_intents/{id}` (the current state) and `GET /v1/payment_intents/search`.
//!
//! ```text
//! params.rs   the create call's parameters, the return_url rule
//! confirm.rs  what a confirmation does per payment method; settling, authenticating
//! search.rs   the search query language subset
//! ```

mod confirm;
mod params;
mod search;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Extension, Path, State};
use axum::http::header::HOST;
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::{get, post};

pub(crate) use confirm::authenticate;
use params::CreateParams;
use search::Query;

use crate::simulator::error::ApiError;
use crate::simulator::execution;
use crate::simulator::faults::Operation;
use crate::simulator::form::{Form, is_list_index, parse_limit};
use crate::simulator::http::{Caller, RequestId, api_key, legacy_api_version, require_form_encoding};
use crate::simulator::objects::SearchResult;
use crate::simulator::response::SavedResponse;
use crate::simulator::state::{Simulator, State as SimState};

const PAYMENT_INTENTS: &str = "/v1/payment_intents";
const SEARCH: &str = "/v1/payment_intents/search";

pub(crate) fn router() -> Router<Simulator> {
    Router::new()
        .route(PAYMENT_INTENTS, post(create))
        .route(SEARCH, get(search))
        .route("/v1/payment_intents/{id}", get(retrieve))
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
    let params = CreateParams::from_form(&form, legacy_api_version(&headers))?;
    let base_url = format!("http://{}", headers.get(HOST).and_then(|host| host.to_str().ok()).unwrap_or("127.0.0.1"));
    let payment_method = params.payment_method.clone();
    execution::write(
        sim,
        caller,
        Some(Operation::CreatePaymentIntent),
        (PAYMENT_INTENTS, form.canonical()),
        |_| payment_method,
        move |state, ctx| confirm::create(state, ctx, &params, &base_url),
    )
    .await
}

async fn retrieve(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let Path(id) = path?;
    let mut expand_latest_charge = false;
    for param in Form::query(uri.query()).params()? {
        match (param.name, param.inner) {
            ("expand", inner) if is_list_index(inner) => expand_latest_charge |= param.value == "latest_charge",
            _ => return Err(ApiError::parameter_unknown(param.key, "expand")),
        }
    }
    let payment_method = |state: &SimState| {
        let intent = state.accounts.get(&api_key)?.payment_intents.get(&id)?;
        intent.confirmed_with.clone().or_else(|| intent.payment_method.clone())
    };
    let read = |state: &SimState| {
        // Objects are scoped per API key: another key's PaymentIntent does not exist for this one.
        let account = state.accounts.get(&api_key);
        let found = account.and_then(|account| Some((account, account.payment_intents.get(&id)?)));
        let (account, intent) = found.ok_or_else(|| ApiError::not_found("payment_intent", &id, "intent"))?;
        Ok(SavedResponse::ok(&confirm::render(account, intent, expand_latest_charge), intent.status.as_str()))
    };
    execution::read(&sim, payment_method, read).await
}

/// Searches are answered from the current state at once (Stripe's index may lag up to a minute).
async fn search(State(sim): State<Simulator>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let (mut query, mut limit, mut page) = (None, 10, None);
    for param in Form::query(uri.query()).params()? {
        match (param.name, param.inner) {
            ("query", None) => query = Some(Query::parse(param.value)?),
            ("limit", None) => limit = parse_limit(param.key, param.value, 100)?,
            ("page", None) => page = Some(param.value.to_owned()),
            ("expand", inner) if is_list_index(inner) => {}
            _ => return Err(ApiError::parameter_unknown(param.key, "query, limit, page and expand")),
        }
    }
    let query = query.ok_or_else(|| ApiError::parameter_missing("query"))?;
    let read = |state: &SimState| {
        let Some(account) = state.accounts.get(&api_key) else {
            return Ok(search_page(Vec::new(), false));
        };
        // Newest first, as Stripe orders search results; a page cursor is the last id shown.
        let mut newest_first = account.payment_intent_order.iter().rev();
        if let Some(page) = &page {
            let after = page.strip_prefix("page_").filter(|after| account.payment_intents.contains_key(*after));
            let after =
                after.ok_or_else(|| ApiError::invalid_request(format!("Invalid page: {page}")).param("page"))?;
            newest_first.by_ref().find(|id| id.as_str() == after);
        }
        let mut hits = newest_first.map(|id| &account.payment_intents[id]).filter(|intent| query.matches(intent));
        let data: Vec<_> = hits.by_ref().take(limit).map(|intent| confirm::render(account, intent, false)).collect();
        Ok(search_page(data, hits.next().is_some()))
    };
    execution::read(&sim, |_| None, read).await
}

fn search_page(data: Vec<serde_json::Value>, has_more: bool) -> SavedResponse {
    let next_page = has_more.then(|| data.last().and_then(|last| last["id"].as_str()).map(|id| format!("page_{id}")));
    let result = SearchResult { object: "search_result", data, has_more, next_page: next_page.flatten(), url: SEARCH };
    SavedResponse::ok(&result, "search_result")
}
