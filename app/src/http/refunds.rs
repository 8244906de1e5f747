//! `/v1/refunds`: create (idempotent), show, list. The create handler is the whole of what an
//! endpoint needs to be idempotent: validate, then [`idempotent::respond`] with the operation's
//! entry in the registry ([`Op::Refund`]). The dashboard's refund form runs the very same
//! functions ([`idempotent::operation`], [`idempotent::execute`]).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::extract::{Authenticated, Json, Query};
use super::idempotent;
use super::list::{self, ListObject};
use super::openapi::problems;
use crate::idempotency::IdempotencyKey;
use crate::operations::Op;
use crate::payments::PaymentId;
use crate::refunds::model::RefundView;
use crate::refunds::{CreateRefund, RefundId, store};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create, list)).routes(routes!(show))
}

problems!(
    /// What `POST /v1/refunds` answers besides the refund.
    CreateProblems: idempotent, NOT_FOUND, PAYMENT_NOT_REFUNDABLE, REFUND_EXCEEDS_PAYMENT, REFUND_REJECTED,
        REFUND_ABANDONED
);

problems!(
    /// What reading a refund answers besides it.
    ReadProblems: UNAUTHORIZED, INVALID_REQUEST, NOT_FOUND, SERVICE_UNAVAILABLE
);

problems!(
    /// What listing refunds answers besides them.
    ListProblems: UNAUTHORIZED, INVALID_REQUEST, SERVICE_UNAVAILABLE
);

/// Refund a succeeded payment (all that remains of it, or `amount`), once per `Idempotency-Key`.
///
/// The first request with a key reserves the amount on the payment and refunds it at the
/// gateway (201); every later request with the same key gets that same answer back, with
/// `Idempotent-Replayed: true`. A refund for more than remains, or of a payment that has not
/// succeeded, is a 409 that does not use the key.
#[utoipa::path(
    post,
    path = "/v1/refunds",
    tag = "refunds",
    operation_id = "createRefund",
    security(("api_key" = [])),
    request_body = CreateRefund,
    responses(
        (status = 201, description = "The refund was made or is pending at the gateway (or this is the replay of \
                                      its first answer).",
         body = RefundView,
         headers(("Location" = String, description = "The refund's URL.")),
         links(("GetRefund" = (operation_id = "getRefund", parameters(("id" = "$response.body#/id")),
                               description = "The refund, as it is now.")))),
        CreateProblems,
    )
)]
async fn create(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    key: IdempotencyKey,
    Json(body): Json<CreateRefund>,
) -> Result<Response, ApiError> {
    let request = body.validate().map_err(ApiError::invalid_fields)?;
    idempotent::respond(&state, Op::Refund, customer.id, key, &request).await
}

/// One of the caller's refunds, as it is now; anyone else's is a 404.
#[utoipa::path(
    get,
    path = "/v1/refunds/{id}",
    tag = "refunds",
    operation_id = "getRefund",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The refund's id (`re_…`).")),
    responses((status = 200, description = "The refund.", body = RefundView), ReadProblems)
)]
async fn show(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = RefundId::parse(&id).ok_or(ApiError::NotFound)?;
    let refund = store::find(state.engine.pool(), customer.id, id).await?.ok_or(ApiError::NotFound)?;
    Ok(axum::Json(refund.view()).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListParams {
    /// A payment id: only that payment's refunds.
    #[param(pattern = "^pay_[0-9a-fA-F]{32}$")]
    payment: Option<String>,
    /// How many refunds to return.
    #[param(minimum = 1, maximum = 100, default = 10)]
    limit: Option<u32>,
    /// A refund id: return the refunds created before it (the `id` of a page's last refund).
    #[param(pattern = "^re_[0-9a-fA-F]{32}$")]
    starting_after: Option<String>,
}

/// A page of refunds.
#[derive(Serialize, utoipa::ToSchema)]
pub struct RefundList {
    pub object: ListObject,
    /// `/v1/refunds`.
    pub url: &'static str,
    /// Newest first.
    pub data: Vec<RefundView>,
    /// Whether older refunds follow (ask again with `starting_after` = the last `id`).
    pub has_more: bool,
}

/// The caller's refunds (of one payment, with `payment`), newest first.
#[utoipa::path(
    get,
    path = "/v1/refunds",
    tag = "refunds",
    operation_id = "listRefunds",
    security(("api_key" = [])),
    params(ListParams),
    responses((status = 200, description = "A page of the caller's refunds.", body = RefundList), ListProblems)
)]
async fn list(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Query(params): Query<ListParams>,
) -> Result<Response, ApiError> {
    let limit = list::limit(params.limit)?;
    let payment = list::id(params.payment.as_deref(), PaymentId::parse, "payment must be a payment id (pay_…)")?;
    let starting_after =
        list::id(params.starting_after.as_deref(), RefundId::parse, "starting_after must be a refund id (re_…)")?;
    let (refunds, has_more) = store::list(state.engine.pool(), customer.id, payment, limit, starting_after).await?;
    let data = refunds.iter().map(|r| r.view()).collect();
    Ok(axum::Json(RefundList { object: ListObject::List, url: Op::Refund.route(), data, has_more }).into_response())
}
