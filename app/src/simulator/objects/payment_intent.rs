//! The PaymentIntent (<https://docs.stripe.com/api/payment_intents/object>).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::simulator::error::ErrorObject;

/// Where a PaymentIntent is in its lifecycle; see
/// <https://docs.stripe.com/payments/paymentintents/lifecycle>. (No manual capture, no cancel.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// No payment method yet, or the last attempt failed.
    RequiresPaymentMethod,
    /// Has a payment method but was created without `confirm=true`.
    RequiresConfirmation,
    /// The customer must act (3-D Secure): see `next_action`.
    RequiresAction,
    /// Confirmed; the money is moving (a bank debit) and the outcome comes later.
    Processing,
    /// Charged: `amount_received == amount` and `latest_charge` is the charge.
    Succeeded,
}

impl Status {
    /// The status as Stripe spells it (also the request log's outcome label and the search
    /// value of `status:'…'`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequiresPaymentMethod => "requires_payment_method",
            Self::RequiresConfirmation => "requires_confirmation",
            Self::RequiresAction => "requires_action",
            Self::Processing => "processing",
            Self::Succeeded => "succeeded",
        }
    }
}

/// `automatic_payment_methods`, rendered as Stripe does (`allow_redirects` shown once enabled).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct AutomaticPaymentMethods {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_redirects: Option<&'static str>,
}

/// A PaymentIntent as Stripe serialises it (what async-stripe needs, plus the fields a developer
/// looks at first). Fields marked `skip` are the simulator's own bookkeeping.
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
    /// As sent (or defaulted: enabled, when no `payment_method_types` were given).
    pub automatic_payment_methods: Option<AutomaticPaymentMethods>,
    pub canceled_at: Option<i64>,
    pub cancellation_reason: Option<String>,
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
    pub customer: Option<String>,
    pub description: Option<String>,
    /// Why the last attempt failed, until a new attempt replaces it.
    pub last_payment_error: Option<ErrorObject>,
    /// The charge made by the last confirmation (pending, successful or failed).
    pub latest_charge: Option<String>,
    /// Always false: the simulator is test mode only.
    pub livemode: bool,
    pub metadata: BTreeMap<String, String>,
    /// What the customer must do while `requires_action` (Stripe's `use_stripe_sdk` or
    /// `redirect_to_url`).
    pub next_action: Option<serde_json::Value>,
    /// The test payment method id exactly as sent (Stripe would mint a `pm_…` id from the
    /// `pm_card_…` alias; keeping the alias makes the ledger readable). Detached after a failure.
    pub payment_method: Option<String>,
    pub payment_method_types: Vec<String>,
    pub receipt_email: Option<String>,
    pub setup_future_usage: Option<String>,
    pub status: Status,
    /// The `Idempotency-Key` of the create call: a charge made later (a bank debit settling, a
    /// 3-D Secure authentication) is entered in the ledger under it.
    #[serde(skip)]
    pub created_with_key: Option<String>,
    /// The payment method the last confirmation used, kept after Stripe detaches it.
    #[serde(skip)]
    pub confirmed_with: Option<String>,
}

impl PaymentIntent {
    /// The confirmation (or its later settlement) charged the payment method.
    pub fn succeed(&mut self, charge: &str) {
        self.status = Status::Succeeded;
        self.amount_received = self.amount;
        self.latest_charge = Some(charge.to_owned());
        self.last_payment_error = None;
        self.next_action = None;
    }

    /// The attempt failed: Stripe detaches the payment method and asks for a new one.
    pub fn fail(&mut self, charge: Option<&str>, error: ErrorObject) {
        self.status = Status::RequiresPaymentMethod;
        if let Some(charge) = charge {
            self.latest_charge = Some(charge.to_owned());
        }
        self.last_payment_error = Some(error);
        self.payment_method = None;
        self.next_action = None;
    }
}
