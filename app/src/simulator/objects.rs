//! The objects the simulator returns, shaped like Stripe's JSON, and Stripe-like ids.
//!
//! Only the PaymentIntent is a full object. async-stripe parses responses strictly: a
//! PaymentIntent must carry `amount`, `amount_capturable`, `amount_received`, `capture_method`,
//! `confirmation_method`, `created`, `currency`, `id`, `livemode`, `metadata`,
//! `payment_method_types` and `status`, or the call fails with a deserialisation error.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use serde::Serialize;

use super::error::ErrorObject;
use super::form::{AutomaticPaymentMethods, CreateParams};

/// Where a PaymentIntent is in its lifecycle. The simulator reaches only these three; see
/// <https://docs.stripe.com/payments/paymentintents/lifecycle>.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// No payment method yet, or the last attempt was declined.
    RequiresPaymentMethod,
    /// Has a payment method but was created without `confirm=true`.
    RequiresConfirmation,
    /// Charged: `amount_received == amount` and `latest_charge` is the charge.
    Succeeded,
}

impl Status {
    /// The status as Stripe spells it (also the request log's outcome label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequiresPaymentMethod => "requires_payment_method",
            Self::RequiresConfirmation => "requires_confirmation",
            Self::Succeeded => "succeeded",
        }
    }
}

/// A PaymentIntent as Stripe serialises it (the subset async-stripe needs, plus the fields a
/// developer looks at first).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PaymentIntent {
    /// `pi_` + 24 alphanumerics.
    pub id: String,
    /// Always `"payment_intent"`: Stripe tags every object with its type.
    pub object: &'static str,
    /// In the currency's smallest unit (cents for `usd`).
    pub amount: i64,
    /// Always 0: the simulator captures automatically, so nothing is left to capture.
    pub amount_capturable: i64,
    /// `amount` once succeeded, else 0.
    pub amount_received: i64,
    /// Echoes `automatic_payment_methods[…]` when it was sent.
    pub automatic_payment_methods: Option<AutomaticPaymentMethods>,
    /// `automatic` or `automatic_async` (Stripe's current default).
    pub capture_method: &'static str,
    /// `{id}_secret_{…}`: what a browser would use to confirm; unused by the simulator.
    pub client_secret: String,
    /// Always `automatic`.
    pub confirmation_method: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// Lowercase ISO code, as Stripe returns it.
    pub currency: String,
    pub description: Option<String>,
    /// Why the last confirmation failed (a decline), until a new attempt replaces it.
    pub last_payment_error: Option<ErrorObject>,
    /// The charge made by the last confirmation (successful or failed).
    pub latest_charge: Option<String>,
    /// Always false: the simulator is test mode only.
    pub livemode: bool,
    pub metadata: BTreeMap<String, String>,
    /// The test payment method id exactly as sent (Stripe would mint a `pm_…` id from the
    /// `pm_card_…` alias; keeping the alias makes the ledger readable).
    pub payment_method: Option<String>,
    pub payment_method_types: &'static [&'static str],
    pub status: Status,
}

impl PaymentIntent {
    /// A new, unconfirmed PaymentIntent for `params`.
    pub fn new(params: &CreateParams, created: i64) -> Self {
        let id = new_id("pi");
        let status = match params.payment_method {
            Some(_) => Status::RequiresConfirmation,
            None => Status::RequiresPaymentMethod,
        };
        Self {
            client_secret: format!("{id}_secret_{}", random_alphanumeric(25)),
            id,
            object: "payment_intent",
            amount: params.amount,
            amount_capturable: 0,
            amount_received: 0,
            automatic_payment_methods: params.automatic_payment_methods.clone(),
            capture_method: params.capture_method,
            confirmation_method: "automatic",
            created,
            currency: params.currency.clone(),
            description: params.description.clone(),
            last_payment_error: None,
            latest_charge: None,
            livemode: false,
            metadata: params.metadata.clone(),
            payment_method: params.payment_method.clone(),
            payment_method_types: &["card"],
            status,
        }
    }

    /// The confirmation charged the card.
    pub fn succeed(&mut self, charge: &str) {
        self.status = Status::Succeeded;
        self.amount_received = self.amount;
        self.latest_charge = Some(charge.to_owned());
        self.last_payment_error = None;
    }

    /// The confirmation was declined: Stripe detaches the payment method and asks for a new one.
    pub fn decline(&mut self, charge: &str, error: ErrorObject) {
        self.status = Status::RequiresPaymentMethod;
        self.latest_charge = Some(charge.to_owned());
        self.last_payment_error = Some(error);
        self.payment_method = None;
    }
}

/// A Stripe-like id: `prefix_` + 24 alphanumerics, e.g. `pi_3PqLk2…`.
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_alphanumeric(24))
}

fn random_alphanumeric(len: usize) -> String {
    // Ids only need to be unique, not unguessable: 62^24 makes a collision practically impossible.
    std::iter::repeat_with(fastrand::alphanumeric).take(len).collect()
}

/// Unix seconds, as Stripe's `created` fields.
pub(crate) fn now() -> i64 {
    // A clock before 1970 is a broken machine, not a client error; 0 keeps the simulator serving.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

/// Serialises one of the simulator's own response types.
pub(crate) fn to_json(value: &impl Serialize) -> Bytes {
    // Only our own structs reach this (string keys, no floats that could be NaN), for which
    // serde_json cannot fail; a failure would be a bug in this module, not in a request.
    Bytes::from(serde_json::to_vec(value).expect("simulator objects always serialise to JSON"))
}
