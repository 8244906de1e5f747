//! `/v1/payments`: create (idempotent), show, list.

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
use crate::captures::Settle;
use crate::idempotency::IdempotencyKey;
use crate::operations::Op;
use crate::payments::model::PaymentView;
use crate::payments::{CreatePayment, PaymentId, store};
use crate::problem::FieldError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(show))
        .routes(routes!(capture))
        .routes(routes!(cancel))
}

problems!(
    /// What `POST /v1/payments` answers besides the payment.
    CreateProblems: idempotent, CARD_DECLINED, PAYMENT_REJECTED, PAYMENT_ABANDONED, LOCK_SERVICE_UNAVAILABLE
);

problems!(
    /// What reading payments answers besides them.
    ReadProblems: UNAUTHORIZED, INVALID_REQUEST, NOT_FOUND, SERVICE_UNAVAILABLE
);

problems!(
    /// What listing payments answers besides them.
    ListProblems: UNAUTHORIZED, INVALID_REQUEST, SERVICE_UNAVAILABLE
);

/// Create a payment, once per `Idempotency-Key`.
///
/// The first request with a key charges (201 once it succeeded, 202 while it is pending at the
/// gateway, 402 if it was declined); every later request with the same key and body gets that
/// same answer back, with `Idempotent-Replayed: true`, and never charges again. A retry while
/// the first is still running gets 409 with `Retry-After`; the same key with another body, 422.
/// An answer the gateway did not give (503) is not stored: retry with the same key.
#[utoipa::path(
    post,
    path = "/v1/payments",
    tag = "payments",
    operation_id = "createPayment",
    security(("api_key" = [])),
    request_body = CreatePayment,
    responses(
        (status = 201, description = "The payment succeeded (or this is the replay of its first answer).",
         body = PaymentView,
         headers(("Location" = String, description = "The payment's URL.")),
         links(("GetPayment" = (operation_id = "getPayment", parameters(("id" = "$response.body#/id")),
                                description = "The payment, as it is now.")))),
        (status = 202, description = "The payment is pending at the gateway (`processing`, or `requires_action` \
                                      with Stripe's `next_action`); follow it with `GET /v1/payments/{id}`. A replay \
                                      of the key gets this same answer.",
         body = PaymentView,
         headers(("Location" = String, description = "The payment's URL.")),
         links(("GetPayment" = (operation_id = "getPayment", parameters(("id" = "$response.body#/id")),
                                description = "The payment, as it is now.")))),
        CreateProblems,
    )
)]
async fn create(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    key: IdempotencyKey,
    Json(body): Json<CreatePayment>,
) -> Result<Response, ApiError> {
    let request = body.validate().map_err(ApiError::invalid_fields)?;
    idempotent::respond(&state, Op::Payment, customer.id, key, &request).await
}

problems!(
    SettleProblems: idempotent, NOT_FOUND, PAYMENT_NOT_CAPTURABLE, SETTLEMENT_ABANDONED
);

/// The body of a capture: how much to capture, all that is capturable when absent.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CaptureBody {
    #[schema(minimum = 1, maximum = 99_999_999)]
    pub amount_to_capture: Option<i64>,
}

/// Capture an authorized payment (`"capture": "manual"`): all of it, or `amount_to_capture`; once.
///
/// The money moves now. However many keys capture or cancel one payment, one capture or one
/// cancel happens (the others get 409 `payment-not-capturable`, without using their key).
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/capture",
    tag = "payments",
    operation_id = "capturePayment",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The payment's id (`pay_…`).")),
    request_body = CaptureBody,
    responses(
        (status = 200, description = "Captured (or the replay of that answer).", body = PaymentView),
        SettleProblems,
    )
)]
async fn capture(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    key: IdempotencyKey,
    Path(id): Path<String>,
    Json(body): Json<CaptureBody>,
) -> Result<Response, ApiError> {
    if let Some(why) = body.amount_to_capture.and_then(crate::money::out_of_range) {
        return Err(ApiError::invalid_fields(vec![FieldError::new("amount_to_capture", why)]));
    }
    let payment = PaymentId::parse(&id).ok_or(ApiError::NotFound)?.to_string();
    let request = Settle { payment, amount_to_capture: body.amount_to_capture };
    idempotent::respond(&state, Op::Capture, customer.id, key, &request).await
}

/// Cancel an authorized payment (`"capture": "manual"`): its hold is released, no money moves; once.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/cancel",
    tag = "payments",
    operation_id = "cancelPayment",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The payment's id (`pay_…`).")),
    responses(
        (status = 200, description = "Canceled (or the replay of that answer).", body = PaymentView),
        SettleProblems,
    )
)]
async fn cancel(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    key: IdempotencyKey,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let payment = PaymentId::parse(&id).ok_or(ApiError::NotFound)?.to_string();
    idempotent::respond(&state, Op::Cancel, customer.id, key, &Settle { payment, amount_to_capture: None }).await
}

#[utoipa::path(
    get,
    path = "/v1/payments/{id}",
    tag = "payments",
    operation_id = "getPayment",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The payment's id (`pay_…`).")),
    responses((status = 200, description = "The payment.", body = PaymentView), ReadProblems)
)]
async fn show(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = PaymentId::parse(&id).ok_or(ApiError::NotFound)?;
    let payment = store::find(state.engine.pool(), customer.id, id).await?.ok_or(ApiError::NotFound)?;
    Ok(axum::Json(payment.view()).into_response())
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListParams {
    /// How many payments to return.
    #[param(minimum = 1, maximum = 100, default = 10)]
    limit: Option<u32>,
    /// A payment id: return the payments created before it (the `id` of a page's last payment).
    #[param(pattern = "^pay_[0-9a-fA-F]{32}$")]
    starting_after: Option<String>,
}

/// A page of payments.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PaymentList {
    pub object: ListObject,
    /// `/v1/payments`.
    pub url: &'static str,
    /// Newest first.
    pub data: Vec<PaymentView>,
    /// Whether older payments follow (ask again with `starting_after` = the last `id`).
    pub has_more: bool,
}

/// The caller's payments, newest first.
#[utoipa::path(
    get,
    path = "/v1/payments",
    tag = "payments",
    operation_id = "listPayments",
    security(("api_key" = [])),
    params(ListParams),
    responses((status = 200, description = "A page of the caller's payments.", body = PaymentList), ListProblems)
)]
async fn list(
    State(state): State<AppState>,
    Authenticated(customer): Authenticated,
    Query(params): Query<ListParams>,
) -> Result<Response, ApiError> {
    let limit = list::limit(params.limit)?;
    let starting_after =
        list::id(params.starting_after.as_deref(), PaymentId::parse, "starting_after must be a payment id (pay_…)")?;
    let (payments, has_more) = store::list(state.engine.pool(), customer.id, limit, starting_after).await?;
    let data = payments.iter().map(|p| p.view()).collect();
    Ok(axum::Json(PaymentList { object: ListObject::List, url: Op::Payment.route(), data, has_more }).into_response())
}
