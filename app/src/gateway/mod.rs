//! Where the gateway is called: Stripe, through async-stripe.
//!
//! Every charge is one `POST /v1/payment_intents` with `confirm=true` and a *downstream*
//! idempotency key derived from the payonce key's row id ([`downstream_key`]). A retry of the same
//! payonce key, by the client, by another server, or by the sweeper after a crash, therefore
//! sends Stripe the same key and gets the same PaymentIntent back: the gateway itself makes the
//! charge happen once, even if payonce forgot that it asked. Stripe remembers a key for 24 hours;
//! payonce sends none older than its horizon (`PAYONCE_DOWNSTREAM_KEY_TTL_SECS`, under 24 h) and
//! after it only looks payments up: [`Gateway::retrieve`] by PaymentIntent id, or
//! [`Gateway::search`] by payonce's own metadata.
//!
//! Every answer becomes one [`Outcome`] ([`outcome`]): succeeded, declined, pending, refused or
//! unknown. Refusals (payonce's own configuration) are logged at ERROR and counted here, for
//! every call alike.
//!
//! The same code talks to real Stripe and to the built-in simulator ([`crate::simulator`]): only
//! the base URL and the secret key differ.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub mod outcome;
mod transport;

use bytes::Bytes;
use serde_json::Value;
use stripe::StripeError;
use stripe_client_core::{RequestBuilder, StripeRequest};
use stripe_core::payment_intent::{
    CancelPaymentIntent, CapturePaymentIntent, CreatePaymentIntent, CreatePaymentIntentAutomaticPaymentMethods,
    CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects, RetrievePaymentIntent, SearchPaymentIntent,
};
use stripe_core::refund::{CreateRefund, CreateRefundReason, ListRefund, RetrieveRefund};
use stripe_misc::WebhookEndpoint;
use stripe_misc::webhook_endpoint::{CreateWebhookEndpoint, CreateWebhookEndpointEnabledEvents};
use stripe_shared::{ApiErrors, PaymentIntent, Refund};
use stripe_types::{List, SearchList};
use uuid::Uuid;

use crate::secret::Secret;
pub use outcome::{
    Decline, DeclinedBy, ErrorAnswer, GatewayError, IntentAnswer, Outcome, PendingStatus, RefundOutcome, Refusal,
};
pub(crate) use transport::Transport;

/// How payonce reaches its gateway.
#[derive(Clone)]
pub struct Gateway {
    transport: Transport,
    /// Per-call deadline; past it the outcome is unknown and the key is released for a retry.
    timeout: Duration,
    /// Where the calls go, for logs and the dashboard (never includes the secret key).
    base_url: String,
}

/// What to charge.
#[derive(Debug, Clone)]
pub struct Charge<'a> {
    pub amount: i64,
    pub currency: &'a str,
    pub payment_method: &'a str,
    pub description: Option<&'a str>,
    /// Client metadata plus payonce's audit keys.
    pub metadata: HashMap<String, String>,
    /// The deterministic downstream idempotency key.
    pub idempotency_key: String,
    /// Authorize only (`capture_method=manual`): the money moves when the payment is captured.
    pub manual_capture: bool,
}

/// What to refund.
#[derive(Debug, Clone)]
pub struct RefundCall<'a> {
    /// The PaymentIntent whose charge is refunded.
    pub payment_intent: &'a str,
    pub amount: i64,
    /// `duplicate`, `fraudulent` or `requested_by_customer`.
    pub reason: Option<&'a str>,
    /// Client metadata plus payonce's audit keys.
    pub metadata: HashMap<String, String>,
    /// The deterministic downstream idempotency key ([`refund_key`]).
    pub idempotency_key: String,
}

/// The metadata key that names payonce's refund on every refund it creates.
pub const REFUND_METADATA: &str = "payonce_refund";

/// The downstream idempotency key of a refund: from the refund's id, which is its request's
/// identity ([`crate::idempotency::identity`]), so the same request sends the same key even after
/// the database forgot it. Its own prefix: a refund key never collides with a charge key.
/// (A refund an older payonce made, with a random id, keeps the key of its payonce key row,
/// `key_id`, which it was sent with.)
pub fn refund_key(refund_id: Uuid, key_id: Uuid) -> String {
    format!("{REFUND_PREFIX}{}", seed(refund_id, key_id).simple())
}

/// The prefix of every refund's downstream idempotency key.
const REFUND_PREFIX: &str = "payonce-refund-";

/// The refund a refund's downstream key names (or, for an older payonce's, its key row): Stripe's
/// refund events, and the `charge.refunded` of a refund call, carry it.
pub fn key_of_refund(downstream: &str) -> Option<Uuid> {
    uuid_after(downstream, REFUND_PREFIX)
}

/// The prefix of every charge's downstream idempotency key.
const DOWNSTREAM_PREFIX: &str = "payonce-charge-";

/// The downstream idempotency key of a payment: from the payment's id, which is its request's
/// identity (the customer, the client's key, the request's fingerprint and its generation:
/// [`crate::idempotency::identity`]). Whoever resumes the work, and a retry after the database
/// forgot the key (a restore, a failover that lost commits), sends the same key with the same
/// parameters, and Stripe returns the same PaymentIntent. Not the client's raw key, which is only
/// unique per customer. (A payment an older payonce made, with a random id, keeps the key of its
/// payonce key row, `key_id`, which it was sent with.)
pub fn downstream_key(payment_id: Uuid, key_id: Uuid) -> String {
    format!("{DOWNSTREAM_PREFIX}{}", seed(payment_id, key_id).simple())
}

/// What a downstream key is made from: the resource's identity, or for a resource an older
/// payonce named at random, its key row's id.
fn seed(resource: Uuid, key_id: Uuid) -> Uuid {
    if crate::idempotency::identity::is_identity(resource) { resource } else { key_id }
}

/// The payment a downstream key names (or, for an older payonce's, its key row): Stripe's events
/// name the key of the request that caused them.
pub fn key_of_downstream(downstream: &str) -> Option<Uuid> {
    uuid_after(downstream, DOWNSTREAM_PREFIX)
}

fn uuid_after(downstream: &str, prefix: &str) -> Option<Uuid> {
    let hex = downstream.strip_prefix(prefix)?;
    (hex.len() == 32).then(|| Uuid::try_parse(hex).ok()).flatten()
}

/// The metadata key that names payonce's payment on every PaymentIntent it creates.
pub const PAYMENT_METADATA: &str = "payonce_payment";

impl Gateway {
    /// A gateway at `base_url` (Stripe's own when `None`). A base URL with a path must end in `/`.
    pub fn new(secret_key: &str, base_url: Option<&str>, timeout: Duration) -> Result<Self, StripeError> {
        let base_url = match base_url {
            Some(url) if url.ends_with('/') => url.to_owned(),
            Some(url) => format!("{url}/"),
            None => "https://api.stripe.com/".to_owned(),
        };
        let transport = Transport::new(secret_key, base_url.clone(), timeout)?;
        Ok(Self { transport, timeout, base_url })
    }

    /// The deadline of one call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Where the calls go.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Creates and confirms a PaymentIntent. One attempt, with the caller's downstream key: the
    /// caller decides when to retry, so retries survive restarts.
    ///
    /// Redirect-based payment methods are turned off (`automatic_payment_methods[allow_redirects]
    /// =never`): payonce confirms server-side and has no page to send a customer back to, and
    /// without it Stripe requires a `return_url` on every confirmation.
    pub async fn charge(&self, charge: Charge<'_>) -> Outcome {
        let mut request = CreatePaymentIntent::new(
            charge.amount,
            charge.currency.parse::<stripe_types::Currency>().unwrap_or_default(),
        )
        .payment_method(charge.payment_method)
        .confirm(true)
        .automatic_payment_methods(CreatePaymentIntentAutomaticPaymentMethods {
            enabled: true,
            allow_redirects: Some(CreatePaymentIntentAutomaticPaymentMethodsAllowRedirects::Never),
        })
        .metadata(charge.metadata);
        if let Some(description) = charge.description {
            request = request.description(description);
        }
        if charge.manual_capture {
            request = request.capture_method(stripe_shared::PaymentIntentCaptureMethod::Manual);
        }
        let started = Instant::now();
        let outcome = match self.call(request.build(), Some(&charge.idempotency_key)).await {
            Ok(body) => intent_outcome(&body),
            Err(outcome) => outcome,
        };
        self.settle("create", started, outcome)
    }

    /// Captures `amount` of an authorized PaymentIntent (all of what is capturable when `None`),
    /// under the caller's downstream key: one attempt, as for [`Self::charge`].
    pub async fn capture(&self, payment_intent: &str, amount: Option<i64>, idempotency_key: &str) -> Outcome {
        let mut request = CapturePaymentIntent::new(payment_intent);
        if let Some(amount) = amount {
            request = request.amount_to_capture(amount);
        }
        let started = Instant::now();
        let outcome = match self.call(request.build(), Some(idempotency_key)).await {
            Ok(body) => intent_outcome(&body),
            Err(outcome) => outcome,
        };
        self.settle("capture", started, outcome)
    }

    /// Cancels a PaymentIntent (releases its authorization), under the caller's downstream key.
    pub async fn cancel(&self, payment_intent: &str, idempotency_key: &str) -> Outcome {
        let started = Instant::now();
        let outcome = match self.call(CancelPaymentIntent::new(payment_intent).build(), Some(idempotency_key)).await {
            Ok(body) => intent_outcome(&body),
            Err(outcome) => outcome,
        };
        self.settle("cancel", started, outcome)
    }

    /// Looks a PaymentIntent up by id.
    pub async fn retrieve(&self, payment_intent: &str) -> Outcome {
        let started = Instant::now();
        let outcome = match self.call(RetrievePaymentIntent::new(payment_intent).build(), None).await {
            Ok(body) => intent_outcome(&body),
            Err(outcome) => outcome,
        };
        self.settle("retrieve", started, outcome)
    }

    /// Looks for the PaymentIntent of payonce's payment `payment` (`pay_…`) by its metadata.
    /// `None` when the search found none: only meaningful once Stripe's search index has caught
    /// up with the last create call (its documented lag is about a minute; payonce waits
    /// `PAYONCE_SEARCH_SETTLE_SECS`). Two PaymentIntents for one payment cannot come from one
    /// downstream key; if the search finds several, the furthest along is the answer and the
    /// rest is logged as an error.
    pub async fn search(&self, payment: &str) -> Option<Outcome> {
        let query = format!("metadata['{PAYMENT_METADATA}']:'{payment}'");
        let started = Instant::now();
        let mut found = match self.call(SearchPaymentIntent::new(query).limit(10).build(), None).await {
            Ok(body) => match search_outcomes(&body) {
                Ok(found) => found,
                Err(unreadable) => return Some(self.settle("search", started, unreadable)),
            },
            Err(outcome) => return Some(self.settle("search", started, outcome)),
        };
        if found.len() > 1 {
            let ids: Vec<_> = found.iter().filter_map(Outcome::payment_intent).collect();
            tracing::error!(
                payment,
                ?ids,
                "several PaymentIntents carry one payonce payment: check for a double charge"
            );
        }
        found.sort_by_key(rank);
        match found.pop() {
            Some(best) => Some(self.settle("search", started, best)),
            None => {
                observe("search", "none", started);
                None
            }
        }
    }

    /// Refunds (part of) a PaymentIntent's charge. One attempt, with the caller's downstream key.
    pub async fn refund(&self, call: RefundCall<'_>) -> RefundOutcome {
        let mut request =
            CreateRefund::new().payment_intent(call.payment_intent).amount(call.amount).metadata(call.metadata);
        if let Some(reason) = call.reason.and_then(|reason| reason.parse::<CreateRefundReason>().ok()) {
            request = request.reason(reason);
        }
        let started = Instant::now();
        let outcome = match self.call_refund(request.build(), Some(&call.idempotency_key)).await {
            Ok(body) => refund_outcome(&body),
            Err(outcome) => outcome,
        };
        observe("refund", outcome.label(), started);
        outcome
    }

    /// Looks a refund up by the gateway's id.
    pub async fn retrieve_refund(&self, refund: &str) -> RefundOutcome {
        let started = Instant::now();
        let outcome = match self.call_refund(RetrieveRefund::new(refund).build(), None).await {
            Ok(body) => refund_outcome(&body),
            Err(outcome) => outcome,
        };
        observe("retrieve_refund", outcome.label(), started);
        outcome
    }

    /// Looks for payonce's refund `refund` (`re_…`) among the refunds of `payment_intent`, by
    /// its metadata, reading **every page** of the list (newest first, `starting_after` the last
    /// one seen, while `has_more`): `None` means the gateway holds no such refund at all, never
    /// "not on the first page" (a payment may have any number of refunds). The list is read from
    /// the charge itself, not a search index; a call the gateway still holds may yet appear, which
    /// is for the caller's settle rule ([`crate::idempotency::Lease::believe_absence`]). A page
    /// that cannot be read is an unknown answer: the caller asks again later.
    pub async fn find_refund(&self, payment_intent: &str, refund: &str) -> Option<RefundOutcome> {
        let started = Instant::now();
        let mut after: Option<String> = None;
        let outcome = loop {
            let mut request = ListRefund::new().payment_intent(payment_intent).limit(100);
            if let Some(last) = &after {
                request = request.starting_after(last.as_str());
            }
            let body = match self.call_refund(request.build(), None).await {
                Ok(body) => body,
                Err(outcome) => return Some(outcome),
            };
            let page: List<Refund> = match parse(&body) {
                Ok(page) => page,
                Err(unreadable) => return Some(RefundOutcome::Unknown(unreadable)),
            };
            let found = page
                .data
                .iter()
                .find(|r| r.metadata.as_ref().and_then(|m| m.get(REFUND_METADATA)).is_some_and(|id| id == refund));
            if let Some(r) = found {
                break Some(RefundOutcome::of_refund(r.id.as_str(), r.status.as_deref(), r.failure_reason.as_deref()));
            }
            match page.data.last() {
                Some(last) if page.has_more => after = Some(last.id.as_str().to_owned()),
                _ => break None,
            }
        };
        observe("find_refund", outcome.as_ref().map_or("none", RefundOutcome::label), started);
        outcome
    }

    /// One refund call. `Err` holds what an error answer (or the lack of any) means.
    async fn call_refund(
        &self,
        request: RequestBuilder,
        idempotency_key: Option<&str>,
    ) -> Result<Bytes, RefundOutcome> {
        self.transport.call(request, idempotency_key, self.timeout).await.map_err(|err| match err.error {
            StripeError::Stripe(api, status) => {
                let outcome = error_answer(&api, status, err.should_retry).classify_refund();
                if let RefundOutcome::Refused(refusal) = &outcome {
                    self.settle("refund", Instant::now(), Outcome::Refused(refusal.clone()));
                }
                outcome
            }
            StripeError::Timeout => RefundOutcome::Unknown(GatewayError::Timeout(self.timeout)),
            StripeError::ClientError(msg) | StripeError::ConfigError(msg) => {
                RefundOutcome::Unknown(GatewayError::Transport(msg))
            }
            StripeError::JSONDeserialize(msg) => RefundOutcome::Unknown(GatewayError::Unreadable(msg)),
        })
    }

    /// Registers `url` as a webhook endpoint for `events`, in the API version async-stripe reads,
    /// and returns its signing secret (Stripe shows it in this answer only). `payonce serve`
    /// does this with its built-in simulator at startup; with real Stripe an operator creates
    /// the endpoint once (docs/operations.md).
    pub async fn register_webhook_endpoint(&self, url: &str, events: &[&str]) -> Result<Secret, String> {
        let events = events
            .iter()
            .map(|event| {
                event.parse::<CreateWebhookEndpointEnabledEvents>().map_err(|_| format!("unknown event {event}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let request = CreateWebhookEndpoint::new(events, url).api_version(stripe_shared::version::VERSION);
        let endpoint: WebhookEndpoint = match self.call(request.build(), None).await {
            Ok(body) => parse(&body).map_err(|err| err.to_string())?,
            Err(outcome) => return Err(format!("the gateway answered {}", outcome.label())),
        };
        let secret = endpoint.secret.ok_or("the gateway's answer holds no secret")?;
        tracing::info!(endpoint = %endpoint.id, url, "webhook endpoint registered");
        Ok(Secret::new(secret))
    }

    /// One call. `Err` holds what an error answer (or the lack of any) means.
    async fn call(&self, request: RequestBuilder, idempotency_key: Option<&str>) -> Result<Bytes, Outcome> {
        self.transport.call(request, idempotency_key, self.timeout).await.map_err(|err| match err.error {
            StripeError::Stripe(api, status) => error_answer(&api, status, err.should_retry).classify(),
            StripeError::Timeout => Outcome::Unknown(GatewayError::Timeout(self.timeout)),
            StripeError::ClientError(msg) | StripeError::ConfigError(msg) => {
                Outcome::Unknown(GatewayError::Transport(msg))
            }
            StripeError::JSONDeserialize(msg) => Outcome::Unknown(GatewayError::Unreadable(msg)),
        })
    }

    /// Measures, counts and (for refusals) reports the outcome of one call.
    fn settle(&self, call: &'static str, started: Instant, outcome: Outcome) -> Outcome {
        observe(call, outcome.label(), started);
        if let Outcome::Refused(refusal) = &outcome {
            metrics::counter!("payonce_gateway_refusals_total", "reason" => refusal.reason.as_str()).increment(1);
            tracing::error!(
                call,
                base_url = %self.base_url,
                reason = refusal.reason.as_str(),
                status = refusal.status,
                kind = %refusal.kind,
                code = refusal.code.as_deref(),
                message = %refusal.message,
                "the gateway refused payonce's request: check STRIPE_SECRET_KEY and STRIPE_API_BASE"
            );
        }
        outcome
    }
}

/// Records one call's latency by call and outcome.
fn observe(call: &'static str, outcome: &'static str, started: Instant) {
    let elapsed = started.elapsed();
    metrics::histogram!("payonce_gateway_request_duration_seconds", "call" => call, "outcome" => outcome)
        .record(elapsed.as_secs_f64());
    tracing::debug!(call, outcome, elapsed_ms = elapsed.as_millis() as u64, "gateway call");
}

/// How far along a found PaymentIntent is, to pick the answer among several.
fn rank(outcome: &Outcome) -> u8 {
    match outcome {
        Outcome::Refused(_) | Outcome::Unknown(_) => 0,
        Outcome::Pending { .. } => 1,
        Outcome::Authorized { .. } => 2,
        Outcome::Declined(_) | Outcome::Canceled { .. } => 3,
        Outcome::Succeeded { .. } => 4,
    }
}

/// A body as one of async-stripe's types.
fn parse<T: miniserde::Deserialize>(body: &Bytes) -> Result<T, GatewayError> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|text| miniserde::json::from_str(text).ok())
        .ok_or_else(|| GatewayError::Unreadable("the body is not the object Stripe documents".into()))
}

/// The outcome of a body that should be a PaymentIntent. `next_action` is passed on as Stripe
/// sent it, so it is read from the raw JSON rather than re-encoded.
fn intent_outcome(body: &Bytes) -> Outcome {
    let intent: PaymentIntent = match parse(body) {
        Ok(intent) => intent,
        Err(unreadable) => return Outcome::Unknown(unreadable),
    };
    let next_action = match intent.next_action {
        Some(_) => serde_json::from_slice::<Value>(body).map_or(Value::Null, |raw| raw["next_action"].clone()),
        None => Value::Null,
    };
    classify_intent(&intent, next_action)
}

/// The outcome of a body that should be a refund.
fn refund_outcome(body: &Bytes) -> RefundOutcome {
    match parse::<Refund>(body) {
        Ok(refund) => {
            RefundOutcome::of_refund(refund.id.as_str(), refund.status.as_deref(), refund.failure_reason.as_deref())
        }
        Err(unreadable) => RefundOutcome::Unknown(unreadable),
    }
}

/// The outcomes of the PaymentIntents a search found.
fn search_outcomes(body: &Bytes) -> Result<Vec<Outcome>, Outcome> {
    let list: SearchList<PaymentIntent> = parse(body).map_err(Outcome::Unknown)?;
    let raw: Value = serde_json::from_slice(body).unwrap_or_default();
    Ok(list
        .data
        .iter()
        .enumerate()
        .map(|(i, intent)| classify_intent(intent, raw["data"][i]["next_action"].clone()))
        .collect())
}

/// The outcome a PaymentIntent means (from any source: an answer, a search, a webhook event),
/// with its `next_action` as Stripe sent it.
pub fn classify_intent(intent: &PaymentIntent, next_action: Value) -> Outcome {
    IntentAnswer {
        id: intent.id.as_str(),
        status: intent.status.as_str(),
        amount_capturable: intent.amount_capturable,
        amount_received: intent.amount_received,
        next_action: Some(next_action),
        last_payment_error: intent.last_payment_error.as_deref().map(|error| error_answer(error, 0, None)),
    }
    .classify()
}

/// `should_retry`: the answer's `Stripe-Should-Retry`, if any.
fn error_answer(api: &ApiErrors, status: u16, should_retry: Option<bool>) -> ErrorAnswer<'_> {
    ErrorAnswer {
        status,
        kind: api.type_.as_str(),
        code: api.code.as_ref().map(|code| code.as_str()),
        decline_code: api.decline_code.as_deref(),
        param: api.param.as_deref(),
        message: api.message.as_deref().unwrap_or_default(),
        payment_intent: api.payment_intent.as_ref().map(|pi| pi.id.as_str()),
        should_retry,
    }
}

/// How payments reach the gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Real (or external) Stripe. `None` starts the built-in simulator.
    pub stripe: Option<StripeConfig>,
    /// Where the built-in simulator listens when it is started (port 0: any free port).
    pub simulator_addr: SocketAddr,
    /// The deadline of one gateway call.
    pub timeout: Duration,
    /// `STRIPE_WEBHOOK_SECRET`: the signing secret of payonce's webhook endpoint at Stripe. With
    /// the built-in simulator, payonce registers its own endpoint and uses the secret it gets.
    pub webhook_secret: Option<Secret>,
}

/// A Stripe account, or anything that speaks its API.
#[derive(Debug, Clone)]
pub struct StripeConfig {
    pub secret_key: Secret,
    /// `STRIPE_API_BASE`; Stripe's own when `None`.
    pub api_base: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payment's downstream key is a function of its id (the request's identity), fits
    /// Stripe's 255-character limit, and names the payment back; an older payonce's payment (a
    /// random v7 id) keeps the key of its key row, as it was sent.
    #[test]
    fn downstream_key_follows_the_identity() {
        let fingerprint = crate::idempotency::Fingerprint::of("POST", "/v1/payments", &serde_json::json!({}));
        let payment = crate::idempotency::identity::identity(Uuid::now_v7(), "k", &fingerprint, 0);
        let key_row = Uuid::now_v7();
        assert_eq!(downstream_key(payment, key_row), downstream_key(payment, Uuid::now_v7()));
        assert!(downstream_key(payment, key_row).len() <= 255);
        assert_eq!(key_of_downstream(&downstream_key(payment, key_row)), Some(payment));
        let legacy = Uuid::now_v7();
        assert_eq!(key_of_downstream(&downstream_key(legacy, key_row)), Some(key_row));
        assert_eq!(key_of_downstream("payonce-charge-xyz"), None);
        assert_eq!(key_of_downstream(&payment.simple().to_string()), None);
    }

    /// A refund's downstream key names it back, and is never read as a charge's (nor the other
    /// way round).
    #[test]
    fn refund_keys_round_trip_and_do_not_cross() {
        let fingerprint = crate::idempotency::Fingerprint::of("POST", "/v1/refunds", &serde_json::json!({}));
        let id = crate::idempotency::identity::identity(Uuid::now_v7(), "k", &fingerprint, 0);
        let key_row = Uuid::now_v7();
        assert_eq!(key_of_refund(&refund_key(id, key_row)), Some(id));
        assert_eq!(key_of_downstream(&refund_key(id, key_row)), None);
        assert_eq!(key_of_refund(&downstream_key(id, key_row)), None);
        assert_eq!(key_of_refund("payonce-refund-xyz"), None);
    }
}
