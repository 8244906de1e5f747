//! The PaymentIntent routes: `POST /v1/payment_intents` (create, and confirm), `POST
//! /v1/payment_intents/{id}/capture` and `…/cancel`, `GET /v1/payment_intents/{id}` (the current
//! state), `GET /v1/payment_intents` (the list) and `GET /v1/payment_intents/search`.
//!
//! ```text
//! params.rs   the create call's parameters, the return_url rule
//! confirm.rs  what a confirmation does per payment method; settling, authenticating
//! capture.rs  capturing an authorization (capture_method=manual)
//! cancel.rs   canceling; an authorization that expires
//! search.rs   Stripe's search query language, over the PaymentIntent's search fields
//! ```

mod cancel;
mod capture;
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

use cancel::CancelParams;
pub(crate) use cancel::expire_authorization;
use capture::CaptureParams;
pub(crate) use confirm::authenticate;
use params::CreateParams;
use search::Query;

use crate::simulator::error::ApiError;
use crate::simulator::execution::{self, Ctx};
use crate::simulator::faults::Operation;
use crate::simulator::form::{Form, is_list_index, non_empty, parse_limit};
use crate::simulator::http::{Caller, Created, Page, RequestId, api_key, legacy_api_version, require_form_encoding};
use crate::simulator::objects::SearchResult;
use crate::simulator::response::SavedResponse;
use crate::simulator::state::{Simulator, State as SimState};

const PAYMENT_INTENTS: &str = "/v1/payment_intents";
const SEARCH: &str = "/v1/payment_intents/search";

pub(crate) fn router() -> Router<Simulator> {
    Router::new()
        .route(PAYMENT_INTENTS, get(list).post(create))
        .route(SEARCH, get(search))
        .route("/v1/payment_intents/{id}", get(retrieve))
        .route(CaptureParams::ROUTE, post(act::<CaptureParams>))
        .route(CancelParams::ROUTE, post(act::<CancelParams>))
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

/// A write on one PaymentIntent (capture, cancel): its route, its name for the faults, its
/// parameters (the implementing type) and what it does.
trait Action: Sized + Send + 'static {
    const ROUTE: &'static str;
    const OPERATION: Operation;
    /// Validates the form, before anything executes (a refusal here saves nothing for the key).
    fn from_form(form: &Form) -> Result<Self, ApiError>;
    /// Runs under the lock, on PaymentIntent `id`; its answer is saved for the key.
    fn execute(&self, state: &mut SimState, ctx: &Ctx, id: &str) -> SavedResponse;
}

/// `POST /v1/payment_intents/{id}/capture` and `…/cancel`: authenticates and validates the call,
/// then runs it through the pipeline of every write: idempotency (the key's fingerprint is the
/// route, the PaymentIntent and the form), the faults scoped to the operation and to the
/// PaymentIntent's payment method, the saved result.
async fn act<A: Action>(
    State(sim): State<Simulator>,
    Extension(request_id): Extension<RequestId>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = Caller::from_request(&headers, &request_id)?;
    let Path(id) = path?;
    let body = body?;
    require_form_encoding(&headers)?;
    let form = Form::parse(&body);
    let params = A::from_form(&form)?;
    let mut fingerprint = form.canonical();
    // Not a form key (the form's are checked above): the same key on another PaymentIntent is
    // another request.
    fingerprint.push((":intent".to_owned(), id.clone()));
    let api_key = caller.api_key.clone();
    let scoped = id.clone();
    execution::write(
        sim,
        caller,
        Some(A::OPERATION),
        (A::ROUTE, fingerprint),
        move |state| payment_method_of(state, &api_key, &scoped),
        move |state, ctx| params.execute(state, ctx, &id),
    )
    .await
}

/// The payment method a PaymentIntent is about (the one it was confirmed with, kept after Stripe
/// detaches it), for faults scoped to one.
fn payment_method_of(state: &SimState, api_key: &str, id: &str) -> Option<String> {
    let intent = state.accounts.get(api_key)?.payment_intents.get(id)?;
    intent.confirmed_with.clone().or_else(|| intent.payment_method.clone())
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
    let payment_method = |state: &SimState| payment_method_of(state, &api_key, &id);
    let read = |state: &SimState| {
        // Objects are scoped per API key: another key's PaymentIntent does not exist for this one.
        let account = state.accounts.get(&api_key);
        let found = account.and_then(|account| Some((account, account.payment_intents.get(&id)?)));
        let (account, intent) = found.ok_or_else(|| ApiError::not_found("payment_intent", &id, "intent"))?;
        Ok(SavedResponse::ok(&confirm::render(account, intent, expand_latest_charge), intent.status.as_str()))
    };
    execution::read(&sim, payment_method, read).await
}

/// The PaymentIntents, newest first: `created`, `customer` (there are none: a customer filter
/// finds nothing), pagination.
async fn list(State(sim): State<Simulator>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let (mut created, mut customer) = (Created::default(), None);
    let supported = "created, customer, limit, starting_after, ending_before and expand";
    let page = Page::parse(uri.query(), supported, |param| {
        if param.name == "customer" && param.inner.is_none() {
            customer = non_empty(param.value);
            return Ok(true);
        }
        created.take(param)
    })?;
    let read = |state: &SimState| {
        let account = state.accounts.get(&api_key);
        let intents = account.into_iter().flat_map(|account| {
            account.payment_intent_order.iter().rev().map(move |id| (account, &account.payment_intents[id]))
        });
        let items = intents
            .filter(|(_, intent)| customer.is_none() && created.contains(intent.created))
            .map(|(account, intent)| (intent.id.clone(), confirm::render(account, intent, false)))
            .collect();
        Ok(SavedResponse::ok(&page.list(items, PAYMENT_INTENTS), "list"))
    };
    execution::read(&sim, |_| None, read).await
}

/// Searches are answered from the current state at once (Stripe's index may lag up to a minute).
async fn search(State(sim): State<Simulator>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let (mut query, mut limit, mut page, mut total_count) = (None, 10, None, false);
    for param in Form::query(uri.query()).params()? {
        match (param.name, param.inner) {
            ("query", None) => query = Some(Query::parse(param.value)?),
            ("limit", None) => limit = parse_limit(param.key, param.value, 100)?,
            ("page", None) => page = Some(param.value.to_owned()),
            ("expand", inner) if is_list_index(inner) => total_count |= param.value == "total_count",
            _ => return Err(ApiError::parameter_unknown(param.key, "query, limit, page and expand")),
        }
    }
    let query = query.ok_or_else(|| ApiError::parameter_missing("query"))?;
    let read = |state: &SimState| {
        let Some(account) = state.accounts.get(&api_key) else {
            return Ok(search_page(Vec::new(), false, total_count.then_some(0)));
        };
        // Newest first, as Stripe orders search results; a page cursor is the last id shown.
        let newest_first: Vec<_> =
            account.payment_intent_order.iter().rev().map(|id| &account.payment_intents[id]).collect();
        let start = match &page {
            Some(page) => {
                let after =
                    page.strip_prefix("page_").and_then(|after| newest_first.iter().position(|pi| pi.id == after));
                after.ok_or_else(|| ApiError::invalid_request(format!("Invalid page: {page}")).param("page"))? + 1
            }
            None => 0,
        };
        let mut hits = newest_first[start..].iter().filter(|intent| query.matches(intent));
        let data: Vec<_> = hits.by_ref().take(limit).map(|intent| confirm::render(account, intent, false)).collect();
        let has_more = hits.next().is_some();
        let total = total_count.then(|| newest_first.iter().filter(|intent| query.matches(intent)).count());
        Ok(search_page(data, has_more, total))
    };
    execution::read(&sim, |_| None, read).await
}

fn search_page(data: Vec<serde_json::Value>, has_more: bool, total_count: Option<usize>) -> SavedResponse {
    let next_page = has_more.then(|| data.last().and_then(|last| last["id"].as_str()).map(|id| format!("page_{id}")));
    SavedResponse::ok(&SearchResult::new(data, next_page.flatten(), total_count, SEARCH), "search_result")
}
