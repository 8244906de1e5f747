//! The refund routes: `POST /v1/refunds` (idempotent, like a create), `GET /v1/refunds/{id}` and
//! `GET /v1/refunds` (newest first; `payment_intent`, `charge`, pagination), with Stripe's
//! errors: `charge_already_refunded` when nothing remains, `amount_too_large` for more than
//! remains, and a 400 for a PaymentIntent with no successful charge or only an authorization.

mod create;

use std::collections::BTreeMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::Response;
use axum::routing::get;

use create::{RefundParams, Target};
pub(crate) use create::{fail_after_success, settle};

use crate::simulator::error::ApiError;
use crate::simulator::execution;
use crate::simulator::faults::Operation;
use crate::simulator::form::{Form, apply_metadata, invalid_enum, is_list_index, non_empty, parse_amount};
use crate::simulator::http::{Caller, Created, Page, RequestId, api_key, require_form_encoding};
use crate::simulator::objects::RefundReason;
use crate::simulator::response::SavedResponse;
use crate::simulator::state::{Simulator, State as SimState};

const REFUNDS: &str = "/v1/refunds";

pub(crate) fn router() -> Router<Simulator> {
    Router::new().route(REFUNDS, get(list).post(create)).route("/v1/refunds/{id}", get(retrieve))
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
    let params = parse(&form)?;
    let api_key = caller.api_key.clone();
    let target = params.target.clone();
    execution::write(
        sim,
        caller,
        Some(Operation::CreateRefund),
        (REFUNDS, form.canonical()),
        move |state| create::payment_method(state, &api_key, &target),
        move |state, ctx| create::create(state, ctx, &params),
    )
    .await
}

fn parse(form: &Form) -> Result<RefundParams, ApiError> {
    let (mut payment_intent, mut charge, mut amount, mut reason) = (None, None, None, None);
    let mut metadata = BTreeMap::new();
    for param in form.params()? {
        match (param.name, param.inner) {
            ("payment_intent", None) => payment_intent = non_empty(param.value),
            ("charge", None) => charge = non_empty(param.value),
            ("amount", None) => amount = Some(parse_amount("amount", param.value)?),
            ("reason", None) if param.value.is_empty() => reason = None,
            ("reason", None) => {
                let parsed = RefundReason::parse(param.value);
                reason = Some(parsed.ok_or_else(|| {
                    invalid_enum("reason", param.value, "duplicate, fraudulent, requested_by_customer")
                })?);
            }
            ("metadata", inner) => apply_metadata(&mut metadata, inner, param.value)?,
            ("expand", inner) if is_list_index(inner) => {}
            _ => {
                return Err(ApiError::parameter_unknown(
                    param.key,
                    "payment_intent, charge, amount, reason, metadata and expand",
                ));
            }
        }
    }
    let target = match (payment_intent, charge) {
        (Some(payment_intent), None) => Target::PaymentIntent(payment_intent),
        (None, Some(charge)) => Target::Charge(charge),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_request(
                "You can only specify one of these parameters: charge, payment_intent.",
            )
            .param("payment_intent"));
        }
        (None, None) => {
            return Err(ApiError::invalid_request(
                "One of the following params should be provided for this request: payment_intent or charge.",
            )
            .code("parameter_missing")
            .param("payment_intent"));
        }
    };
    Ok(RefundParams { target, amount, reason, metadata })
}

async fn retrieve(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let Path(id) = path?;
    let payment_method = |state: &SimState| {
        let refund = state.accounts.get(&api_key)?.refunds.get(&id)?;
        create::payment_method(state, &api_key, &Target::Charge(refund.charge.clone()))
    };
    let read = |state: &SimState| {
        let refund = state.accounts.get(&api_key).and_then(|account| account.refunds.get(&id));
        let refund = refund.ok_or_else(|| ApiError::not_found("refund", &id, "id"))?;
        Ok(SavedResponse::ok(refund, "refund"))
    };
    execution::read(&sim, payment_method, read).await
}

async fn list(State(sim): State<Simulator>, uri: Uri, headers: HeaderMap) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let (mut payment_intent, mut charge, mut created) = (None, None, Created::default());
    let supported = "payment_intent, charge, created, limit, starting_after, ending_before and expand";
    let page = Page::parse(uri.query(), supported, |param| {
        match (param.name, param.inner) {
            ("payment_intent", None) => payment_intent = non_empty(param.value),
            ("charge", None) => charge = non_empty(param.value),
            _ => return created.take(param),
        }
        Ok(true)
    })?;
    let read = |state: &SimState| {
        let Some(account) = state.accounts.get(&api_key) else {
            return Ok(SavedResponse::ok(&page.list(Vec::<(String, ())>::new(), REFUNDS), "list"));
        };
        let refunds = account.refund_order.iter().rev().map(|id| &account.refunds[id]);
        let wanted = refunds.filter(|refund| {
            payment_intent.as_ref().is_none_or(|wanted| &refund.payment_intent == wanted)
                && charge.as_ref().is_none_or(|wanted| &refund.charge == wanted)
                && created.contains(refund.created)
        });
        let items = wanted.map(|refund| (refund.id.clone(), refund)).collect();
        Ok(SavedResponse::ok(&page.list(items, REFUNDS), "list"))
    };
    execution::read(&sim, |_| None, read).await
}
