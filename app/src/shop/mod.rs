//! The demo shop: the customer's side of the story, and a double-click-proof checkout.
//!
//! The checkout form carries an idempotency key the server generated when it rendered the page
//! (a UUID v7). Paying runs the very code of `POST /v1/payments` ([`crate::http::idempotent::execute`])
//! under that key, so a double click, a resubmit, or the back button and Pay again all arrive
//! as retries of one request, and the customer is charged once. Results follow
//! post/redirect/get: a payment ends on its receipt's URL, which can be reloaded safely.
//!
//! "Authorize now, capture when it ships" (a box on the checkout) makes the payment
//! `"capture": "manual"`: the card is only held, and the receipt offers Capture and Cancel
//! authorization, each the API's own capture or cancel under a key of its own ([`receipt`]).
//!
//! ```text
//! GET  /                          sign in (with a customer's API key), then the catalogue
//! POST /shop/sign-in              POST /shop/sign-out
//! GET  /shop/checkout/{product}   the checkout form, with a fresh key
//! POST /shop/checkout             pay (or authorize only): 303 to the receipt, or to the "in
//!                                 progress" page, or the form again (declined: a fresh key;
//!                                 gateway down: the same key)
//! GET  /shop/payments/{key}       what became of a payment attempt (refreshes while in flight)
//! GET  /shop/receipts/{payment}   the receipt (of an authorization: its Capture and Cancel buttons)
//! POST /shop/receipts/{payment}/capture, …/cancel
//!                                 settle an authorization: 303 to its receipt, which says how
//! ```
//!
//! Signing in by pasting an API key is a demo shortcut (customers have no passwords): the key is
//! checked once, only the customer's id is kept in the session, and the key is never shown back.

pub mod catalogue;
mod receipt;

use askama::Template;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::{Deserialize, Serialize};
use tower_sessions::Session;
use tower_sessions::cookie::SameSite;
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::http::idempotent::{execute, operation};
use crate::idempotency::{IdempotencyKey, StoredResponse};
use crate::operations::Op;
use crate::payments::model::CaptureMethod;
use crate::payments::{CreatePayment, PaymentId, PaymentStatus, store};
use crate::state::AppState;
use crate::web::page::{self, WebError};
use crate::web::{csrf, money, session};
use catalogue::{CARDS, PRODUCTS, Product, TestCard};

/// The shop's cookie: sent site-wide (the shop lives at `/`), kept on links from elsewhere.
const COOKIE: session::Cookie =
    session::Cookie { name: "payonce_shop", path: "/", same_site: SameSite::Lax, csrf: "payonce_shop_csrf" };
/// A shopper is signed out after this long without a click.
const IDLE: std::time::Duration = std::time::Duration::from_secs(60 * 60);
/// The session key holding the signed-in customer.
const SHOPPER: &str = "shopper";

/// The shop's routes, with their session, CSRF and header layers.
pub fn router(state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/", get(home))
        .route("/shop/sign-in", post(sign_in))
        .route("/shop/sign-out", post(sign_out))
        .route("/shop/checkout/{product}", get(checkout))
        .route("/shop/checkout", post(pay))
        .route("/shop/payments/{key}", get(attempt))
        .route("/shop/receipts/{payment}", get(receipt::show))
        .route("/shop/receipts/{payment}/{action}", post(receipt::settle))
        .layer(axum::middleware::from_fn_with_state(
            csrf::Policy { cookie: COOKIE, secure: state.web.config.secure_cookies },
            csrf::protect,
        ))
        .layer(session::layer(state.engine.pool(), &state.web.config, COOKIE, IDLE))
        .layer(axum::middleware::from_fn(page::headers))
}

/// The signed-in customer, as kept in the session.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Shopper {
    id: Uuid,
    name: String,
}

/// A request from a signed-in customer; anyone else is sent to the sign-in form.
struct SignedIn {
    shopper: Shopper,
    csrf: String,
}

impl FromRequestParts<AppState> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let session = Session::from_request_parts(parts, state).await.map_err(IntoResponse::into_response)?;
        let shopper = session.get::<Shopper>(SHOPPER).await.map_err(|err| WebError::from(err).into_response())?;
        let Some(shopper) = shopper else {
            return Err(Redirect::to("/").into_response());
        };
        session::touch(&session).await.map_err(|err| WebError::from(err).into_response())?;
        let csrf = csrf::token(&session).await.map_err(IntoResponse::into_response)?;
        Ok(Self { shopper, csrf })
    }
}

// ---------------------------------------------------------------------------------------------
// Home and signing in

#[derive(Template)]
#[template(path = "shop/home.html")]
struct HomePage {
    csrf: String,
    shopper: Option<String>,
    products: Vec<ProductView>,
    recent: Vec<RecentPayment>,
    error: Option<&'static str>,
}

struct ProductView {
    id: &'static str,
    name: &'static str,
    blurb: &'static str,
    price: String,
}

impl From<&Product> for ProductView {
    fn from(p: &Product) -> Self {
        Self { id: p.id, name: p.name, blurb: p.blurb, price: money(p.amount, p.currency) }
    }
}

struct RecentPayment {
    id: String,
    description: String,
    amount: String,
    status: &'static str,
    /// Whether it has a receipt (paid, authorized or canceled).
    receipt: bool,
}

/// `GET /`.
async fn home(
    State(state): State<AppState>,
    session: Session,
    anonymous: csrf::Anonymous,
) -> Result<Response, WebError> {
    let shopper = session.get::<Shopper>(SHOPPER).await?;
    let recent = match &shopper {
        Some(shopper) => store::list(state.engine.pool(), shopper.id, 5, None)
            .await?
            .0
            .into_iter()
            .map(|p| RecentPayment {
                id: p.id.to_string(),
                description: p.description.clone().unwrap_or_default(),
                amount: money(p.amount, &p.currency),
                status: p.status.as_str(),
                receipt: receipt::exists(p.status),
            })
            .collect(),
        None => Vec::new(),
    };
    // A visitor who is not signed in gets the anonymous forms' token: no session row for them.
    let csrf = if shopper.is_some() { csrf::token(&session).await? } else { anonymous.token() };
    let page = HomePage {
        csrf,
        shopper: shopper.map(|s| s.name),
        products: PRODUCTS.iter().map(ProductView::from).collect(),
        recent,
        error: None,
    };
    page::render(StatusCode::OK, &page)
}

#[derive(Deserialize)]
struct SignInForm {
    api_key: String,
}

/// `POST /shop/sign-in`.
async fn sign_in(
    State(state): State<AppState>,
    session: Session,
    anonymous: csrf::Anonymous,
    Form(form): Form<SignInForm>,
) -> Result<Response, WebError> {
    let Some(customer) = state.auth.authenticate(form.api_key.trim()).await? else {
        let page = HomePage {
            csrf: anonymous.token(),
            shopper: None,
            products: PRODUCTS.iter().map(ProductView::from).collect(),
            recent: Vec::new(),
            error: Some("That is not a valid API key. Create one with `payonce customers create NAME`."),
        };
        return page::render(StatusCode::UNAUTHORIZED, &page);
    };
    session.cycle_id().await?;
    session.insert(SHOPPER, Shopper { id: customer.id, name: customer.name }).await?;
    csrf::rotate(&session).await?;
    Ok(Redirect::to("/").into_response())
}

/// `POST /shop/sign-out`.
async fn sign_out(session: Session) -> Result<Response, WebError> {
    session.flush().await?;
    Ok(Redirect::to("/").into_response())
}

// ---------------------------------------------------------------------------------------------
// Checkout

#[derive(Template)]
#[template(path = "shop/checkout.html")]
struct CheckoutPage {
    csrf: String,
    shopper: String,
    product: ProductView,
    /// The idempotency key of this form: new for a new payment, the same for a retry.
    key: String,
    cards: Vec<(&'static TestCard, bool)>,
    /// "Authorize now, capture when it ships" is ticked: the payment is `"capture": "manual"`.
    manual: bool,
    /// A retry of an attempt whose outcome is unknown: the card cannot be changed.
    retry_of: Option<&'static TestCard>,
    /// What happened to the last attempt (a decline, an outage).
    notice: Option<Notice>,
}

struct Notice {
    /// `error` or `warning`.
    level: &'static str,
    title: String,
    text: String,
}

impl CheckoutPage {
    /// A form for a new payment of `product`, with a fresh key; `manual` ticks "authorize only".
    fn fresh(signed_in: &SignedIn, product: &Product, card: &str, manual: bool, notice: Option<Notice>) -> Self {
        Self {
            csrf: signed_in.csrf.clone(),
            shopper: signed_in.shopper.name.clone(),
            product: product.into(),
            key: Uuid::now_v7().to_string(),
            cards: CARDS.iter().map(|c| (c, c.payment_method == card)).collect(),
            manual,
            retry_of: None,
            notice,
        }
    }
}

/// `GET /shop/checkout/{product}`.
async fn checkout(signed_in: SignedIn, Path(product): Path<String>) -> Result<Response, WebError> {
    let product = catalogue::product(&product).ok_or(WebError::NotFound)?;
    let mut response =
        page::render(StatusCode::OK, &CheckoutPage::fresh(&signed_in, product, CARDS[0].payment_method, false, None))?;
    // Not `no-store` (the default of these pages): the back button must show this very page,
    // with its key, so that paying from it again is a retry and not a new payment.
    response.headers_mut().insert(axum::http::header::CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
    Ok(response)
}

#[derive(Deserialize)]
struct PayForm {
    product: String,
    card: String,
    key: String,
    /// `manual` when "authorize now, capture when it ships" is ticked (a checkbox: absent otherwise).
    #[serde(default)]
    capture: Option<String>,
}

/// `POST /shop/checkout`: pay, through the API's own code path, under the form's key.
async fn pay(
    State(state): State<AppState>,
    signed_in: SignedIn,
    Form(form): Form<PayForm>,
) -> Result<Response, WebError> {
    let product = catalogue::product(&form.product).ok_or_else(|| WebError::BadRequest("unknown product".into()))?;
    let card = catalogue::card(&form.card).ok_or_else(|| WebError::BadRequest("pick one of the test cards".into()))?;
    // The key comes from our own form; anything but a UUID was not made by it.
    let key = Uuid::try_parse(&form.key)
        .ok()
        .and_then(|uuid| IdempotencyKey::new(uuid.to_string()).ok())
        .ok_or_else(|| WebError::BadRequest("the checkout form is damaged; reload it".into()))?;
    // Part of the request, so of its fingerprint: the same form sent again with the box changed
    // is another payment under a used key (422, a fresh form), never a silent switch.
    let manual = match form.capture.as_deref() {
        None => false,
        Some("manual") => true,
        Some(_) => return Err(WebError::BadRequest("the checkout form is damaged; reload it".into())),
    };
    let body = CreatePayment {
        amount: product.amount,
        currency: product.currency.to_owned(),
        payment_method: card.payment_method.to_owned(),
        description: Some(product.name.to_owned()),
        metadata: Some([("product".to_owned(), product.id.to_owned())].into()),
        capture: manual.then_some(CaptureMethod::Manual),
    };
    let request =
        body.validate().map_err(|errors| WebError::Internal(format!("catalogue payment invalid: {errors:?}")))?;
    let op = operation(Op::Payment, signed_in.shopper.id, key.clone(), &request)
        .map_err(|err| WebError::Internal(err.to_string()))?;
    match execute(&state, Op::Payment, op).await {
        Ok(answer) => outcome(&state, &signed_in, &key.to_string(), answer.stored).await,
        // Another request with this key (the first of a double click) holds it: follow it.
        Err(ApiError::InFlight { .. }) => Ok(Redirect::to(&format!("/shop/payments/{key}")).into_response()),
        // The outcome is unknown: offer the same key again, which resumes, never repeats.
        Err(err @ (ApiError::Gateway { .. } | ApiError::GatewayRefused { .. } | ApiError::DatabaseUnavailable(_))) => {
            tracing::info!(error = %err, "checkout: no final answer yet");
            // The same key, card and choice: a retry must be the same payment.
            let mut page = CheckoutPage::fresh(&signed_in, product, card.payment_method, manual, None);
            page.key = key.to_string();
            page.retry_of = Some(card);
            page.notice = Some(Notice {
                level: "warning",
                title: "The payment did not go through yet".into(),
                text: "The payment service did not answer in time. Press Pay again: it is safe, you will not be \
                       charged twice."
                    .into(),
            });
            page::render(StatusCode::SERVICE_UNAVAILABLE, &page)
        }
        // The key was used for other details (a card changed after a failure): a fresh form.
        Err(ApiError::KeyReused(_)) => {
            let notice = Notice {
                level: "warning",
                title: "This form was already used".into(),
                text: "That checkout form was already used for a payment with other details. Check your choice on \
                       this fresh form and pay."
                    .into(),
            };
            page::render(
                StatusCode::UNPROCESSABLE_ENTITY,
                &CheckoutPage::fresh(&signed_in, product, card.payment_method, manual, Some(notice)),
            )
        }
        Err(err) => Err(WebError::Internal(err.to_string())),
    }
}

/// The page for an answer: the receipt (303), the form again with why it failed, or, while the
/// payment is pending (a 202: the bank or the customer's authentication has the last word), the
/// "in progress" page until the payment itself is final.
async fn outcome(
    state: &AppState,
    signed_in: &SignedIn,
    key: &str,
    stored: StoredResponse,
) -> Result<Response, WebError> {
    let payment_id = stored
        .headers
        .iter()
        .find(|(name, _)| name == axum::http::header::LOCATION)
        .and_then(|(_, value)| value.to_str().ok())
        .and_then(|location| location.rsplit('/').next())
        .and_then(PaymentId::parse);
    if stored.status == StatusCode::CREATED
        && let Some(id) = payment_id
    {
        return Ok(Redirect::to(&format!("/shop/receipts/{id}")).into_response());
    }
    let payment = match payment_id {
        Some(id) => store::find(state.engine.pool(), signed_in.shopper.id, id).await?,
        None => None,
    };
    if stored.status == StatusCode::ACCEPTED {
        match payment.as_ref().map(|p| p.status) {
            // Final for the customer: paid, authorized (manual capture), or released.
            Some(status) if receipt::exists(status) => {
                let id = payment.as_ref().map(|p| p.id.to_string()).unwrap_or_default();
                return Ok(Redirect::to(&format!("/shop/receipts/{id}")).into_response());
            }
            Some(PaymentStatus::Failed) => {}
            _ => {
                let page = PendingPage {
                    shopper: signed_in.shopper.name.clone(),
                    csrf: signed_in.csrf.clone(),
                    key: key.to_owned(),
                };
                return page::render(StatusCode::OK, &page);
            }
        }
    }
    let product = payment
        .as_ref()
        .and_then(|p| p.metadata.get("product")?.as_str().and_then(catalogue::product))
        .unwrap_or(&PRODUCTS[0]);
    let reason = payment.as_ref().and_then(|p| p.failure.as_ref()).map(|f| f.message.clone());
    let notice = if stored.status == StatusCode::PAYMENT_REQUIRED {
        Notice {
            level: "error",
            title: "Your card was declined".into(),
            text: format!(
                "{} You have not been charged. Choose another card to try again.",
                reason.unwrap_or_else(|| "The card was declined.".into())
            ),
        }
    } else {
        Notice {
            level: "error",
            title: "The payment failed".into(),
            text: format!(
                "{} Check your payments before paying again.",
                reason.unwrap_or_else(|| "The payment could not be completed.".into())
            ),
        }
    };
    let card = payment.as_ref().map_or(CARDS[0].payment_method, |p| {
        CARDS
            .iter()
            .find(|c| c.payment_method != p.payment_method)
            .map_or(CARDS[0].payment_method, |c| c.payment_method)
    });
    let manual = payment.as_ref().is_some_and(|p| p.manual_capture);
    page::render(stored.status, &CheckoutPage::fresh(signed_in, product, card, manual, Some(notice)))
}

#[derive(Template)]
#[template(path = "shop/pending.html")]
struct PendingPage {
    shopper: String,
    csrf: String,
    key: String,
}

/// `GET /shop/payments/{key}`: the attempt's final page, or "in progress" until it has one.
async fn attempt(
    State(state): State<AppState>,
    signed_in: SignedIn,
    Path(key): Path<String>,
) -> Result<Response, WebError> {
    let stored = state
        .engine
        .stored_response(signed_in.shopper.id, &key, crate::payments::ROUTE)
        .await?
        .ok_or(WebError::NotFound)?;
    match stored {
        Some(stored) => outcome(&state, &signed_in, &key, stored).await,
        None => page::render(
            StatusCode::OK,
            &PendingPage { shopper: signed_in.shopper.name.clone(), csrf: signed_in.csrf.clone(), key },
        ),
    }
}
