//! The Charge (<https://docs.stripe.com/api/charges/object>): what a confirmation creates, what a
//! refund is taken from. Its `amount_refunded`/`refunded` are how a PaymentIntent's refunds show;
//! its `outcome` is the network's (or Radar's) answer; its `payment_method_details` what was
//! charged.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Null;
use super::payment_method::{Instrument, PaymentMethodDetails};

/// `pending` while a bank debit is processing; `succeeded` once authorized, whether captured
/// or not (Stripe's status of an authorization held for a later capture).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ChargeStatus {
    Pending,
    Succeeded,
    Failed,
}

/// Stripe's `billing_details`: a required object, with nothing the simulator collects.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct BillingDetails {
    pub address: Address,
    pub email: Null,
    pub name: Null,
    pub phone: Null,
}

/// An address Stripe knows nothing of: every line `null`, as Stripe renders it.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Address {
    pub city: Null,
    pub country: Null,
    pub line1: Null,
    pub line2: Null,
    pub postal_code: Null,
    pub state: Null,
}

/// The charge's `outcome`: whether the network (or Radar) authorised it, and why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ChargeOutcome {
    /// `do_not_try_again` for a card reported lost or stolen.
    pub advice_code: Option<&'static str>,
    pub network_advice_code: Null,
    pub network_decline_code: Null,
    /// `approved_by_network`, `declined_by_network` or `not_sent_to_network` (Radar blocked it).
    pub network_status: &'static str,
    /// The decline code, or Radar's `highest_risk_level`; `null` when authorised.
    pub reason: Option<&'static str>,
    pub risk_level: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk_score: Option<i64>,
    pub seller_message: String,
    /// `authorized`, `issuer_declined` or `blocked`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl ChargeOutcome {
    /// Authorised. Radar does not assess bank debits.
    pub fn authorized(instrument: Instrument) -> Self {
        let card = matches!(instrument, Instrument::Card { .. });
        Self {
            advice_code: None,
            network_advice_code: Null,
            network_decline_code: Null,
            network_status: "approved_by_network",
            reason: None,
            risk_level: if card { "normal" } else { "not_assessed" },
            risk_score: card.then_some(32),
            seller_message: "Payment complete.".to_owned(),
            kind: "authorized",
        }
    }

    /// Declined with `decline_code`: by the issuer, or (`fraudulent`) blocked by Radar before it
    /// reached the network, as Stripe's always-blocked test card is. `message` is the bank's, for a
    /// bank debit.
    pub fn declined(instrument: Instrument, decline_code: &'static str, message: &str) -> Self {
        let card = matches!(instrument, Instrument::Card { .. });
        match decline_code {
            "fraudulent" => Self {
                network_status: "not_sent_to_network",
                reason: Some("highest_risk_level"),
                risk_level: "highest",
                risk_score: Some(95),
                seller_message: "Stripe blocked this payment as too risky.".to_owned(),
                kind: "blocked",
                ..Self::authorized(instrument)
            },
            _ if !card => Self {
                network_status: "declined_by_network",
                reason: Some(decline_code),
                seller_message: message.to_owned(),
                kind: "issuer_declined",
                ..Self::authorized(instrument)
            },
            _ => Self {
                advice_code: matches!(decline_code, "lost_card" | "stolen_card").then_some("do_not_try_again"),
                network_status: "declined_by_network",
                reason: Some(decline_code),
                seller_message: match decline_code {
                    "generic_decline" => "The bank did not return any further details with this decline.".to_owned(),
                    code => format!("The bank returned the decline code `{code}`."),
                },
                kind: "issuer_declined",
                ..Self::authorized(instrument)
            },
        }
    }
}

/// What Stripe's statement shows for the simulator's "account".
const STATEMENT_DESCRIPTOR: &str = "PAYONCE SIMULATOR";

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Charge {
    /// `ch_` + 24 alphanumerics.
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    /// What was captured: `amount` for a charge captured at once, what a capture took, else 0
    /// (an authorization, a failed charge).
    pub amount_captured: i64,
    /// The sum of the charge's refunds.
    pub amount_refunded: i64,
    pub application: Null,
    pub application_fee: Null,
    pub application_fee_amount: Null,
    /// The simulator keeps no balance: there are no balance transactions.
    pub balance_transaction: Null,
    pub billing_details: BillingDetails,
    pub calculated_statement_descriptor: &'static str,
    /// False while the charge is only an authorization (and after it was released or expired).
    pub captured: bool,
    pub created: i64,
    pub currency: String,
    pub customer: Null,
    pub description: Option<String>,
    pub disputed: bool,
    pub failure_balance_transaction: Null,
    /// For a failed charge, e.g. `card_declined` or `account_closed`.
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    /// Stripe's `{}` when nobody reported fraud.
    pub fraud_details: BTreeMap<String, String>,
    pub livemode: bool,
    pub metadata: BTreeMap<String, String>,
    pub on_behalf_of: Null,
    pub outcome: ChargeOutcome,
    pub paid: bool,
    pub payment_intent: String,
    pub payment_method: String,
    pub payment_method_details: PaymentMethodDetails,
    pub receipt_email: Null,
    pub receipt_number: Null,
    /// The simulator sends no receipts.
    pub receipt_url: Null,
    /// True once `amount_refunded == amount`.
    pub refunded: bool,
    pub review: Null,
    pub shipping: Null,
    pub source_transfer: Null,
    pub statement_descriptor: Null,
    pub statement_descriptor_suffix: Null,
    pub status: ChargeStatus,
    pub transfer_data: Null,
    pub transfer_group: Null,
    /// The instrument charged (for the refund's destination and the outcome of a later failure).
    #[serde(skip)]
    pub instrument: Instrument,
}

impl Charge {
    /// A new charge for a confirmation with `payment_method` (paying with `instrument`), in
    /// `status` (`pending` for one whose outcome comes later: [`Self::authorize`] or
    /// [`Self::succeed`] it then); `authenticated`: the customer went through 3-D Secure.
    pub fn new(
        intent: &super::PaymentIntent,
        payment_method: &str,
        instrument: Instrument,
        status: ChargeStatus,
        authenticated: bool,
    ) -> Self {
        let mut charge = Self {
            id: super::new_id("ch"),
            object: "charge",
            amount: intent.amount,
            amount_captured: 0,
            amount_refunded: 0,
            application: Null,
            application_fee: Null,
            application_fee_amount: Null,
            balance_transaction: Null,
            billing_details: BillingDetails::default(),
            calculated_statement_descriptor: STATEMENT_DESCRIPTOR,
            captured: false,
            created: super::now(),
            currency: intent.currency.clone(),
            customer: Null,
            description: intent.description.clone(),
            disputed: false,
            failure_balance_transaction: Null,
            failure_code: None,
            failure_message: None,
            fraud_details: BTreeMap::new(),
            livemode: false,
            metadata: intent.metadata.clone(),
            on_behalf_of: Null,
            outcome: ChargeOutcome::authorized(instrument),
            paid: false,
            payment_intent: intent.id.clone(),
            payment_method: payment_method.to_owned(),
            payment_method_details: PaymentMethodDetails::new(payment_method, instrument, authenticated),
            receipt_email: Null,
            receipt_number: Null,
            receipt_url: Null,
            refunded: false,
            review: Null,
            shipping: Null,
            source_transfer: Null,
            statement_descriptor: Null,
            statement_descriptor_suffix: Null,
            status,
            transfer_data: Null,
            transfer_group: Null,
            instrument,
        };
        if status == ChargeStatus::Succeeded {
            charge.succeed();
        }
        charge
    }

    /// Authorized and captured at once: the money moved.
    pub fn succeed(&mut self) {
        self.authorize();
        self.capture(self.amount);
    }

    /// Authorized for a later capture: `succeeded` and `paid` (Stripe's words for an
    /// authorization), not captured.
    pub fn authorize(&mut self) {
        self.status = ChargeStatus::Succeeded;
        self.paid = true;
    }

    /// `amount` of the authorization was captured (the rest released, not refunded).
    pub fn capture(&mut self, amount: i64) {
        self.captured = true;
        self.amount_captured = amount;
    }

    /// Declined (or, for a bank debit, returned) with `code`/`decline_code`.
    pub fn fail(&mut self, code: &str, decline_code: &'static str, message: &str) {
        self.status = ChargeStatus::Failed;
        self.failure_code = Some(code.to_owned());
        self.failure_message = Some(message.to_owned());
        self.outcome = ChargeOutcome::declined(self.instrument, decline_code, message);
    }

    /// What is left to refund.
    pub fn refundable(&self) -> i64 {
        self.amount_captured - self.amount_refunded
    }
}
