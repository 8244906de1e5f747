//! The Stripe routes: `POST /v1/payment_intents` and `GET /v1/payment_intents/{id}`.
//!
//! A create call goes through these steps, in this order (see the `faults` and `idempotency`
//! module docs for each rule):
//!
//! ```text
//! authenticate ─► validate ─► idempotency ─┬─ saved, same params ─► replay (latency only)
//!   (401)          (400)                   ├─ in flight ─► 409, other params ─► 400
//!                                          └─ claimed ─► draw faults ─► execution task:
//!                                               delay ─► fail (500, release) | hold ─►
//!                                               execute + save + ledger, atomically ─►
//!                                               answer | lose the response
//! ```
//!
//! Nothing before the claim is saved; everything after it is, except an injected outage.

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::error::{ApiError, ErrorObject, ErrorType};
use super::faults::{Action, Plan};
use super::form::{CreateParams, Form};
use super::idempotency::{Begin, Claim, Fingerprint, SavedResponse};
use super::ledger::Charge;
use super::objects::{self, PaymentIntent, new_id};
use super::payment_methods::{self, CardBehaviour, Decline};
use super::{Simulator, State as SimState};

const PAYMENT_INTENTS: &str = "/v1/payment_intents";

/// Stripe's limit on `Idempotency-Key` length.
const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// A label for the request log, put in the response's extensions by whoever decided the outcome
/// (`succeeded`, `card_declined`, `idempotency_key_in_use`, `fault_fail`, …).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outcome(pub &'static str);

pub(super) fn router() -> Router<Simulator> {
    Router::new()
        .route(PAYMENT_INTENTS, post(create_payment_intent))
        .route("/v1/payment_intents/{id}", get(retrieve_payment_intent))
}

/// Any other URL, or a known URL with another method: Stripe's 404.
pub(super) async fn unrecognized(method: Method, uri: Uri) -> ApiError {
    ApiError::invalid_request(format!(
        "Unrecognized request URL ({method}: {}). Please see https://stripe.com/docs or we can \
         help at https://support.stripe.com/.",
        uri.path()
    ))
    .with_status(StatusCode::NOT_FOUND)
}

async fn create_payment_intent(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let body = body?;
    require_form_encoding(&headers)?;
    let form = Form::parse(&body);
    let params = CreateParams::from_form(&form)?;
    let idempotency_key = idempotency_key(&headers)?;
    let fingerprint = form.canonical();

    let (plan, epoch) = match decide(&sim, &api_key, idempotency_key.as_deref(), fingerprint, &params)? {
        Decision::Execute { plan, epoch } => (plan, epoch),
        Decision::Replay { saved, delay } => {
            tokio::time::sleep(delay).await;
            return Ok(respond(saved, true));
        }
    };

    // Reaching execution means the key, if there is one, is now claimed by this request.
    let claim = idempotency_key.map(|key| Claim::new(sim.clone(), api_key.clone(), key, epoch));
    let execution = Execution { sim, api_key, claim, params, plan, epoch };
    // Axum drops this handler's future when the client disconnects. Execution runs in its own
    // task so that once it has begun, the charge and the saved result always happen: a client
    // that gave up (or a load balancer that cut it off) is exactly the case idempotency is for.
    match tokio::spawn(execution.run()).await {
        Ok(response) => Ok(response),
        Err(join_error) => {
            // The claim was dropped with the task, so the key is free for a retry.
            tracing::error!(error = %join_error, "stripe simulator execution task failed");
            Err(ApiError::internal("An unexpected error occurred in the simulator."))
        }
    }
}

/// What the idempotency layer decided for a create call that passed validation.
enum Decision {
    /// Execute: the key (if any) is claimed, and the faults for this call are drawn.
    Execute { plan: Plan, epoch: u64 },
    /// Answer with the saved result after `delay` (latency applies to replays, nothing else).
    Replay { saved: SavedResponse, delay: Duration },
}

/// The idempotency decision and the fault draw, in one critical section: two racing requests
/// cannot both claim a key, and `next_calls` counts each execution exactly once.
fn decide(
    sim: &Simulator,
    api_key: &str,
    idempotency_key: Option<&str>,
    fingerprint: Fingerprint,
    params: &CreateParams,
) -> Result<Decision, ApiError> {
    let mut state = sim.state();
    let payment_method = params.payment_method.as_deref();
    if let Some(key) = idempotency_key {
        match state.account(api_key).keys.begin(key, fingerprint) {
            Begin::Execute => {}
            Begin::Replay(saved) => {
                let delay = state.faults.replay_delay(payment_method);
                return Ok(Decision::Replay { saved, delay });
            }
            Begin::InUse => return Err(ApiError::idempotency_key_in_use()),
            Begin::Mismatch => return Err(ApiError::idempotency_mismatch()),
        }
    }
    let plan = state.faults.plan_execution(payment_method);
    Ok(Decision::Execute { plan, epoch: state.epoch })
}

/// One create call that claimed its key (or had none) and is about to execute.
struct Execution {
    sim: Simulator,
    api_key: String,
    /// `None` without an `Idempotency-Key`.
    claim: Option<Claim>,
    params: CreateParams,
    plan: Plan,
    /// The state generation this call started in; see `Simulator::reset`.
    epoch: u64,
}

impl Execution {
    async fn run(mut self) -> Response {
        if !self.plan.delay.is_zero() {
            tokio::time::sleep(self.plan.delay).await;
        }
        match self.plan.action {
            Action::Fail => return self.fail(),
            Action::Hold(hold) => tokio::time::sleep(hold).await,
            Action::Execute | Action::LoseResponse => {}
        }

        let saved = {
            let mut state = self.sim.state();
            if state.epoch != self.epoch {
                None
            } else {
                let key = self.claim.as_ref().map(Claim::key);
                let saved = execute(&mut state, &self.api_key, key, &self.params);
                if let Some(claim) = self.claim.as_mut() {
                    claim.save(&mut state.account(&self.api_key).keys, saved.clone());
                }
                Some(saved)
            }
            // The lock is released here, before `self.claim` can be dropped (dropping an unsaved
            // claim takes the lock to release the key).
        };
        let Some(saved) = saved else {
            return ApiError::internal(
                "The simulator was reset while this request was in flight; nothing was executed.",
            )
            .into_response();
        };
        if self.plan.action == Action::LoseResponse { lost_response(saved.status) } else { respond(saved, false) }
    }

    /// An injected outage: nothing executed, nothing saved; dropping the claim frees the key.
    fn fail(self) -> Response {
        drop(self.claim);
        let mut response = ApiError::internal(
            "An unknown error occurred. (Injected by the payonce simulator's fail_rate: nothing \
             was executed or saved, so a retry with the same Idempotency-Key executes.)",
        )
        .into_response();
        response.extensions_mut().insert(Outcome("fault_fail"));
        response
    }
}

/// Creates the PaymentIntent and, if confirmed, charges or declines. Runs under the lock, so the
/// PaymentIntent, the ledger entry and the saved result appear together.
fn execute(state: &mut SimState, api_key: &str, idempotency_key: Option<&str>, params: &CreateParams) -> SavedResponse {
    // Looking up the payment method is part of execution on Stripe, so "No such PaymentMethod"
    // is saved and replayed like any other result of the call.
    let card = match params.payment_method.as_deref() {
        None => None,
        Some(id) => match payment_methods::lookup(id) {
            Some(behaviour) => Some((id, behaviour)),
            None => {
                return saved_error(&ApiError::resource_missing("PaymentMethod", id, "payment_method"));
            }
        },
    };

    let mut intent = PaymentIntent::new(params, objects::now());
    let saved = match card {
        Some((payment_method, CardBehaviour::Succeeds)) if params.confirm => {
            let charge = new_id("ch");
            intent.succeed(&charge);
            state.ledger.record(Charge {
                payment_intent: intent.id.clone(),
                charge,
                idempotency_key: idempotency_key.map(str::to_owned),
                amount: intent.amount,
                currency: intent.currency.clone(),
                payment_method: payment_method.to_owned(),
                metadata: intent.metadata.clone(),
                created: intent.created,
            });
            saved_intent(&intent)
        }
        Some((_, CardBehaviour::Declines(decline))) if params.confirm => {
            // Stripe records a failed charge for a decline; it is not in the ledger of charges.
            let charge = new_id("ch");
            let error = decline_error(decline, &charge);
            intent.decline(&charge, error.clone());
            let payment_intent = Some(Box::new(intent.clone()));
            saved_error(&ApiError::card_error(ErrorObject { payment_intent, ..error }))
        }
        _ => saved_intent(&intent),
    };
    state.account(api_key).payment_intents.insert(intent.id.clone(), intent);
    saved
}

fn decline_error(decline: Decline, charge: &str) -> ErrorObject {
    ErrorObject {
        kind: ErrorType::Card,
        code: Some(decline.code),
        decline_code: Some(decline.decline_code),
        message: decline.message.to_owned(),
        // Stripe points an expired card at the field the customer has to fix.
        param: (decline.code == "expired_card").then(|| "exp_month".to_owned()),
        charge: Some(charge.to_owned()),
        payment_intent: None,
    }
}

fn saved_intent(intent: &PaymentIntent) -> SavedResponse {
    SavedResponse { status: StatusCode::OK, body: objects::to_json(intent), outcome: intent.status.as_str() }
}

fn saved_error(error: &ApiError) -> SavedResponse {
    SavedResponse { status: error.status, body: error.body(), outcome: error.outcome() }
}

/// Renders a saved result, marking replays as Stripe does.
fn respond(saved: SavedResponse, replayed: bool) -> Response {
    let mut response =
        (saved.status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], saved.body).into_response();
    if replayed {
        response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response.extensions_mut().insert(Outcome(saved.outcome));
    response
}

/// The work is done and saved, but the client must not learn the result: the body fails, so
/// hyper aborts the connection instead of completing the response (in practice before even the
/// buffered status line is flushed). The client sees the connection close with no answer, as when
/// a connection dies after the server committed; async-stripe reports `StripeError::ClientError`.
fn lost_response(status: StatusCode) -> Response {
    let failing_body = futures_util::stream::once(async {
        Err::<Bytes, _>(std::io::Error::other("response lost on purpose (drop_after_charge_rate)"))
    });
    let mut response =
        (status, [(CONTENT_TYPE, HeaderValue::from_static("application/json"))], Body::from_stream(failing_body))
            .into_response();
    response.extensions_mut().insert(Outcome("fault_lost_response"));
    response
}

async fn retrieve_payment_intent(
    State(sim): State<Simulator>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let api_key = api_key(&headers)?;
    let Path(id) = path?;
    // Objects are scoped per API key: another key's PaymentIntent does not exist for this one.
    let saved = {
        let state = sim.state();
        state.accounts.get(&api_key).and_then(|account| account.payment_intents.get(&id)).map(saved_intent)
    };
    let saved = saved.ok_or_else(|| {
        ApiError::resource_missing("payment_intent", &id, "intent").with_status(StatusCode::NOT_FOUND)
    })?;
    Ok(respond(saved, false))
}

/// The API key, from `Authorization: Bearer sk_…` (Stripe's libraries) or HTTP Basic with the
/// key as user name (`curl -u sk_test_…:`). Never logged.
fn api_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Err(ApiError::unauthorized(
            "You did not provide an API key. You need to provide your API key in the \
             Authorization header, using Bearer auth (e.g. 'Authorization: Bearer \
             YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication for details.",
        ));
    };
    let value = value.to_str().unwrap_or_default();
    let (scheme, credentials) = value.split_once(' ').unwrap_or((value, ""));
    let credentials = credentials.trim();
    let key = if scheme.eq_ignore_ascii_case("bearer") {
        credentials.to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let decoded =
            BASE64.decode(credentials).ok().and_then(|bytes| String::from_utf8(bytes).ok()).unwrap_or_default();
        decoded.split_once(':').map_or(decoded.as_str(), |(user, _)| user).to_owned()
    } else {
        String::new()
    };
    let well_formed = key.len() > 3
        && (key.starts_with("sk_") || key.starts_with("rk_"))
        && key.bytes().all(|byte| byte.is_ascii_graphic());
    if !well_formed {
        return Err(ApiError::unauthorized(format!("Invalid API Key provided: {}", masked(&key))));
    }
    Ok(key)
}

/// Stripe echoes only the end of a rejected key.
fn masked(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    match chars.len() {
        n if n >= 12 => format!("********{}", chars[n - 4..].iter().collect::<String>()),
        _ => "********".to_owned(),
    }
}

/// The `Idempotency-Key` header, taken verbatim (Stripe clients send a bare token).
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::invalid_request(format!(
            "Keys for idempotent requests must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} printable ASCII \
             characters."
        ))
    };
    let key = value.to_str().map_err(|_| invalid())?;
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err(invalid());
    }
    Ok(Some(key.to_owned()))
}

/// Stripe's API takes form bodies only; a JSON body would otherwise surface as a confusing
/// "unknown parameter" error. No `Content-Type` at all is accepted as a form.
fn require_form_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(content_type) = headers.get(CONTENT_TYPE) else {
        return Ok(());
    };
    let content_type = content_type.to_str().unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Ok(())
    } else {
        Err(ApiError::invalid_request(format!(
            "Invalid request: Stripe's API takes application/x-www-form-urlencoded bodies, not \
             '{content_type}'."
        )))
    }
}
