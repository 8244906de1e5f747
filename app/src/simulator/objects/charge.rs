//! The Charge (<https://docs.stripe.com/api/charges/object>): what a confirmation creates, what a
//! refund is taken from. Its `amount_refunded`/`refunded` are how a PaymentIntent's refunds show.

use std::collections::BTreeMap;

use serde::Serialize;

/// `pending` while a bank debit is processing.
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
    pub address: Option<()>,
    pub email: Option<String>,
    pub name: Option<String>,
    pub phone: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Charge {
    /// `ch_` + 24 alphanumerics.
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    /// `amount` once succeeded (the simulator captures at once), else 0.
    pub amount_captured: i64,
    /// The sum of the charge's refunds.
    pub amount_refunded: i64,
    pub balance_transaction: Option<String>,
    pub billing_details: BillingDetails,
    pub captured: bool,
    pub created: i64,
    pub currency: String,
    pub customer: Option<String>,
    pub description: Option<String>,
    pub disputed: bool,
    /// For a failed charge, e.g. `card_declined` or `account_closed`.
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub livemode: bool,
    pub metadata: BTreeMap<String, String>,
    pub paid: bool,
    pub payment_intent: String,
    pub payment_method: Option<String>,
    pub receipt_url: Option<String>,
    /// True once `amount_refunded == amount`.
    pub refunded: bool,
    pub status: ChargeStatus,
}

impl Charge {
    /// A new charge for a confirmation, in `status`.
    pub fn new(
        id: String,
        intent: &super::PaymentIntent,
        payment_method: &str,
        status: ChargeStatus,
        created: i64,
    ) -> Self {
        let mut charge = Self {
            id,
            object: "charge",
            amount: intent.amount,
            amount_captured: 0,
            amount_refunded: 0,
            balance_transaction: None,
            billing_details: BillingDetails::default(),
            captured: false,
            created,
            currency: intent.currency.clone(),
            customer: None,
            description: intent.description.clone(),
            disputed: false,
            failure_code: None,
            failure_message: None,
            livemode: false,
            metadata: intent.metadata.clone(),
            paid: false,
            payment_intent: intent.id.clone(),
            payment_method: Some(payment_method.to_owned()),
            receipt_url: None,
            refunded: false,
            status,
        };
        if status == ChargeStatus::Succeeded {
            charge.succeed();
        }
        charge
    }

    pub fn succeed(&mut self) {
        self.status = ChargeStatus::Succeeded;
        self.paid = true;
        self.captured = true;
        self.amount_captured = self.amount;
    }

    pub fn fail(&mut self, code: &str, message: &str) {
        self.status = ChargeStatus::Failed;
        self.failure_code = Some(code.to_owned());
        self.failure_message = Some(message.to_owned());
    }

    /// What is left to refund.
    pub fn refundable(&self) -> i64 {
        self.amount_captured - self.amount_refunded
    }
}
