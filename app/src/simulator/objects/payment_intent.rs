//! The PaymentIntent (<https://docs.stripe.com/api/payment_intents/object>).

use std::collections::BTreeMap;

use serde::Serialize;

use super::Null;
use crate::simulator::error::ErrorObject;

/// Where a PaymentIntent is in its lifecycle; see
/// <https://docs.stripe.com/payments/paymentintents/lifecycle>.
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
    /// Authorized (`capture_method=manual`): the card is held for `amount_capturable`, nothing
    /// has moved until a capture.
    RequiresCapture,
    /// Charged: `amount_received` is what was charged (all of it, or what a capture took) and
    /// `latest_charge` is the charge.
    Succeeded,
    /// Canceled (by a cancel call, or an authorization that expired): final; an authorization
    /// it held is released.
    Canceled,
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
            Self::RequiresCapture => "requires_capture",
            Self::Succeeded => "succeeded",
            Self::Canceled => "canceled",
        }
    }
}

/// When the funds are captured (`capture_method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CaptureMethod {
    /// At once, the charge's outcome known synchronously.
    Automatic,
    /// At once (Stripe's default since 2024), the balance transaction made asynchronously.
    AutomaticAsync,
    /// Authorize now, capture later (`POST /v1/payment_intents/{id}/capture`).
    Manual,
}

impl CaptureMethod {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "automatic" => Some(Self::Automatic),
            "automatic_async" => Some(Self::AutomaticAsync),
            "manual" => Some(Self::Manual),
            _ => None,
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

/// Stripe's `payment_method_options`: the defaults of each payment method type allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct PaymentMethodOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card: Option<CardOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub us_bank_account: Option<UsBankAccountOptions>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct CardOptions {
    pub installments: Null,
    pub mandate_options: Null,
    pub network: Null,
    /// Stripe asks for 3-D Secure when the issuer requires it.
    pub request_three_d_secure: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct UsBankAccountOptions {
    pub verification_method: &'static str,
}

impl PaymentMethodOptions {
    fn of(types: &[String]) -> Self {
        let has = |kind: &str| types.iter().any(|allowed| allowed == kind);
        Self {
            card: has("card").then_some(CardOptions {
                installments: Null,
                mandate_options: Null,
                network: Null,
                request_three_d_secure: "automatic",
            }),
            us_bank_account: has("us_bank_account")
                .then_some(UsBankAccountOptions { verification_method: "automatic" }),
        }
    }
}

/// Stripe's `amount_details` of a PaymentIntent with no tip: `{"tip": {}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct AmountDetails {
    pub tip: Tip,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Tip {}

/// What a create call asks for: everything a new PaymentIntent is made of.
#[derive(Clone, Debug)]
pub(crate) struct Draft {
    pub amount: i64,
    pub currency: String,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub payment_method: Option<String>,
    pub capture_method: CaptureMethod,
    pub automatic_payment_methods: Option<AutomaticPaymentMethods>,
    pub payment_method_types: Vec<String>,
    /// Sent as `allowed_payment_method_types` (the newer name): shown under that name too.
    pub allowed_payment_method_types: bool,
    /// The create call's `Idempotency-Key`.
    pub created_with_key: Option<String>,
}

/// A PaymentIntent as Stripe serialises it. Fields marked `skip` are the simulator's own
/// bookkeeping.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PaymentIntent {
    /// `pi_` + 24 alphanumerics.
    pub id: String,
    /// Always `"payment_intent"`: Stripe tags every object with its type.
    pub object: &'static str,
    /// What was sent as `allowed_payment_method_types`, else `null`.
    pub allowed_payment_method_types: Option<Vec<String>>,
    /// In the currency's smallest unit (cents for `usd`).
    pub amount: i64,
    /// What a capture may take: the whole amount while `requires_capture`, else 0.
    pub amount_capturable: i64,
    pub amount_details: AmountDetails,
    /// What was charged once succeeded (`amount`, or what a capture took), else 0.
    pub amount_received: i64,
    pub application: Null,
    pub application_fee_amount: Null,
    /// As sent (or defaulted: enabled, when no `payment_method_types` were given).
    pub automatic_payment_methods: Option<AutomaticPaymentMethods>,
    /// When it was canceled (Unix seconds).
    pub canceled_at: Option<i64>,
    /// What the cancel call said (`abandoned`, `duplicate`, `fraudulent`,
    /// `requested_by_customer`, or `null`), or `expired` for an authorization that expired.
    pub cancellation_reason: Option<&'static str>,
    /// `automatic_async` (Stripe's current default), `automatic` or `manual`.
    pub capture_method: CaptureMethod,
    /// `{id}_secret_{…}`: what a browser would use to confirm; unused by the simulator.
    pub client_secret: String,
    /// Always `automatic`.
    pub confirmation_method: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// Lowercase ISO code, as Stripe returns it.
    pub currency: String,
    /// There are no customers.
    pub customer: Null,
    pub customer_account: Null,
    pub description: Option<String>,
    pub excluded_payment_method_types: Null,
    /// Why the last attempt failed, until a new attempt replaces it.
    pub last_payment_error: Option<ErrorObject>,
    /// The charge made by the last confirmation (pending, successful or failed).
    pub latest_charge: Option<String>,
    /// Always false: the simulator is test mode only.
    pub livemode: bool,
    pub managed_payments: Null,
    pub metadata: BTreeMap<String, String>,
    /// What the customer must do while `requires_action` (Stripe's `use_stripe_sdk` or
    /// `redirect_to_url`).
    pub next_action: Option<serde_json::Value>,
    pub on_behalf_of: Null,
    /// The test payment method id exactly as sent (Stripe would mint a `pm_…` id from the
    /// `pm_card_…` alias; keeping the alias makes the ledger readable). Detached after a failure.
    pub payment_method: Option<String>,
    pub payment_method_configuration_details: Null,
    pub payment_method_options: PaymentMethodOptions,
    pub payment_method_types: Vec<String>,
    /// Only cards awaiting a customer notification are `processing` with details.
    pub processing: Null,
    pub receipt_email: Null,
    pub review: Null,
    pub setup_future_usage: Null,
    pub shipping: Null,
    pub statement_descriptor: Null,
    pub statement_descriptor_suffix: Null,
    pub status: Status,
    pub transfer_data: Null,
    pub transfer_group: Null,
    /// The `Idempotency-Key` of the create call: a charge made later (a bank debit settling, a
    /// 3-D Secure authentication) is entered in the ledger under it.
    #[serde(skip)]
    pub created_with_key: Option<String>,
    /// The payment method the last confirmation used, kept after Stripe detaches it.
    #[serde(skip)]
    pub confirmed_with: Option<String>,
}

impl PaymentIntent {
    /// A new PaymentIntent: `requires_confirmation` with a payment method, else
    /// `requires_payment_method`.
    pub fn new(draft: Draft) -> Self {
        let id = super::new_id("pi");
        let status = match draft.payment_method {
            Some(_) => Status::RequiresConfirmation,
            None => Status::RequiresPaymentMethod,
        };
        Self {
            client_secret: format!("{id}_secret_{}", super::random_alphanumeric(25)),
            id,
            object: "payment_intent",
            allowed_payment_method_types: draft
                .allowed_payment_method_types
                .then(|| draft.payment_method_types.clone()),
            amount: draft.amount,
            amount_capturable: 0,
            amount_details: AmountDetails::default(),
            amount_received: 0,
            application: Null,
            application_fee_amount: Null,
            automatic_payment_methods: draft.automatic_payment_methods,
            canceled_at: None,
            cancellation_reason: None,
            capture_method: draft.capture_method,
            confirmation_method: "automatic",
            created: super::now(),
            currency: draft.currency,
            customer: Null,
            customer_account: Null,
            description: draft.description,
            excluded_payment_method_types: Null,
            last_payment_error: None,
            latest_charge: None,
            livemode: false,
            managed_payments: Null,
            metadata: draft.metadata,
            next_action: None,
            on_behalf_of: Null,
            payment_method: draft.payment_method,
            payment_method_configuration_details: Null,
            payment_method_options: PaymentMethodOptions::of(&draft.payment_method_types),
            payment_method_types: draft.payment_method_types,
            processing: Null,
            receipt_email: Null,
            review: Null,
            setup_future_usage: Null,
            shipping: Null,
            statement_descriptor: Null,
            statement_descriptor_suffix: Null,
            status,
            transfer_data: Null,
            transfer_group: Null,
            created_with_key: draft.created_with_key,
            confirmed_with: None,
        }
    }

    /// The confirmation (or its later settlement) charged the payment method.
    pub fn succeed(&mut self, charge: &str) {
        self.authorize(charge);
        self.capture(self.amount);
    }

    /// The confirmation authorized the payment method for a later capture (`capture_method=manual`):
    /// all of it is capturable.
    pub fn authorize(&mut self, charge: &str) {
        self.status = Status::RequiresCapture;
        self.amount_capturable = self.amount;
        self.latest_charge = Some(charge.to_owned());
        self.last_payment_error = None;
        self.next_action = None;
    }

    /// `amount` of the authorization was captured; the rest is released.
    pub fn capture(&mut self, amount: i64) {
        self.status = Status::Succeeded;
        self.amount_received = amount;
        self.amount_capturable = 0;
    }

    /// Canceled now, for `reason`: nothing more can be charged, an authorization is released.
    pub fn cancel(&mut self, reason: Option<&'static str>) {
        self.status = Status::Canceled;
        self.canceled_at = Some(super::now());
        self.cancellation_reason = reason;
        self.amount_capturable = 0;
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
