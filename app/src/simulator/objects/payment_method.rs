//! The PaymentMethod (<https://docs.stripe.com/api/payment_methods/object>), as a card error
//! carries it, and the charge's view of it (`payment_method_details`), both built from the test
//! payment method's instrument: its card (brand, last 4 digits, funding, country) or US bank
//! account, as Stripe's test numbers have them.

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::Null;
use super::charge::BillingDetails;

/// A card network, as Stripe spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Brand {
    Visa,
    Mastercard,
    Amex,
    Discover,
}

/// What a test payment method pays with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Instrument {
    Card { brand: Brand, last4: &'static str, funding: &'static str, country: &'static str },
    UsBankAccount { last4: &'static str, routing_number: &'static str },
}

impl Instrument {
    /// The payment method's `type`: `card` or `us_bank_account`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Card { .. } => "card",
            Self::UsBankAccount { .. } => "us_bank_account",
        }
    }
}

/// The bank behind every test bank account.
const TEST_BANK: &str = "STRIPE TEST BANK";

/// Stripe's fingerprint of a card or account number: the same for every use of the same test
/// payment method, different between them.
fn fingerprint(payment_method: &str) -> String {
    let digest = Sha256::digest(payment_method.as_bytes());
    hex::encode(&digest[..8])
}

/// The PaymentMethod object.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PaymentMethod {
    /// The test payment method as sent (`pm_card_visa`): Stripe would mint a `pm_…` id from
    /// the alias; the simulator keeps the alias, as on the PaymentIntent.
    pub id: String,
    pub object: &'static str,
    pub billing_details: BillingDetails,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card: Option<CardPaymentMethod>,
    pub created: i64,
    pub customer: Null,
    pub livemode: bool,
    pub metadata: BTreeMap<String, String>,
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub us_bank_account: Option<UsBankAccountPaymentMethod>,
}

/// What a PaymentMethod and a charge both say of a card.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Card {
    pub brand: Brand,
    pub country: &'static str,
    pub exp_month: i64,
    pub exp_year: i64,
    pub fingerprint: String,
    pub funding: &'static str,
    pub last4: &'static str,
}

impl Card {
    fn new(
        payment_method: &str,
        brand: Brand,
        last4: &'static str,
        funding: &'static str,
        country: &'static str,
    ) -> Self {
        // Stripe's test cards are valid (their declines are simulated): until the end of next year.
        let exp_year = i64::from(time::OffsetDateTime::now_utc().year()) + 1;
        Self { brand, country, exp_month: 12, exp_year, fingerprint: fingerprint(payment_method), funding, last4 }
    }
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct CardPaymentMethod {
    #[serde(flatten)]
    pub card: Card,
    pub checks: CardChecks,
    pub generated_from: Null,
    pub networks: Networks,
    pub three_d_secure_usage: ThreeDSecureUsage,
    pub wallet: Null,
}

/// The checks of the card's details; a PaymentMethod's are not run yet, a charge's passed.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct CardChecks {
    pub address_line1_check: Null,
    pub address_postal_code_check: Null,
    pub cvc_check: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Networks {
    pub available: Vec<Brand>,
    pub preferred: Null,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct ThreeDSecureUsage {
    pub supported: bool,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct UsBankAccountPaymentMethod {
    pub account_holder_type: &'static str,
    pub account_type: &'static str,
    pub bank_name: &'static str,
    pub financial_connections_account: Null,
    pub fingerprint: String,
    pub last4: &'static str,
    pub networks: BankNetworks,
    pub routing_number: &'static str,
    pub status_details: Null,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct BankNetworks {
    pub preferred: &'static str,
    pub supported: Vec<&'static str>,
}

impl PaymentMethod {
    pub fn new(id: &str, instrument: Instrument, created: i64) -> Self {
        let (card, us_bank_account) = match instrument {
            Instrument::Card { brand, last4, funding, country } => {
                let card = CardPaymentMethod {
                    card: Card::new(id, brand, last4, funding, country),
                    checks: CardChecks {
                        address_line1_check: Null,
                        address_postal_code_check: Null,
                        cvc_check: "unchecked",
                    },
                    generated_from: Null,
                    networks: Networks { available: vec![brand], preferred: Null },
                    three_d_secure_usage: ThreeDSecureUsage { supported: true },
                    wallet: Null,
                };
                (Some(card), None)
            }
            Instrument::UsBankAccount { last4, routing_number } => {
                let account = UsBankAccountPaymentMethod {
                    account_holder_type: "individual",
                    account_type: "checking",
                    bank_name: TEST_BANK,
                    financial_connections_account: Null,
                    fingerprint: fingerprint(id),
                    last4,
                    networks: BankNetworks { preferred: "ach", supported: vec!["ach"] },
                    routing_number,
                    status_details: Null,
                };
                (None, Some(account))
            }
        };
        Self {
            id: id.to_owned(),
            object: "payment_method",
            billing_details: BillingDetails::default(),
            card,
            created,
            customer: Null,
            livemode: false,
            metadata: BTreeMap::new(),
            kind: instrument.kind(),
            us_bank_account,
        }
    }
}

/// A charge's `payment_method_details`: what was charged, as the charge saw it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PaymentMethodDetails {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub card: Option<CardDetails>,
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub us_bank_account: Option<UsBankAccountDetails>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct CardDetails {
    #[serde(flatten)]
    pub card: Card,
    pub checks: CardChecks,
    pub installments: Null,
    pub mandate: Null,
    pub network: Brand,
    pub network_token: Null,
    /// How the customer authenticated, for a charge that needed 3-D Secure.
    pub three_d_secure: Option<ThreeDSecure>,
    pub wallet: Null,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct ThreeDSecure {
    pub authentication_flow: &'static str,
    pub result: &'static str,
    pub result_reason: Null,
    pub version: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct UsBankAccountDetails {
    pub account_holder_type: &'static str,
    pub account_type: &'static str,
    pub bank_name: &'static str,
    pub fingerprint: String,
    pub last4: &'static str,
    pub routing_number: &'static str,
}

impl PaymentMethodDetails {
    /// `payment_method` charged with `instrument`; `authenticated`: after 3-D Secure.
    pub fn new(payment_method: &str, instrument: Instrument, authenticated: bool) -> Self {
        match instrument {
            Instrument::Card { brand, last4, funding, country } => {
                let three_d_secure = authenticated.then_some(ThreeDSecure {
                    authentication_flow: "challenge",
                    result: "authenticated",
                    result_reason: Null,
                    version: "2.2.0",
                });
                let card = CardDetails {
                    card: Card::new(payment_method, brand, last4, funding, country),
                    checks: CardChecks {
                        address_line1_check: Null,
                        address_postal_code_check: Null,
                        cvc_check: "pass",
                    },
                    installments: Null,
                    mandate: Null,
                    network: brand,
                    network_token: Null,
                    three_d_secure,
                    wallet: Null,
                };
                Self { card: Some(card), kind: "card", us_bank_account: None }
            }
            Instrument::UsBankAccount { last4, routing_number } => {
                let account = UsBankAccountDetails {
                    account_holder_type: "individual",
                    account_type: "checking",
                    bank_name: TEST_BANK,
                    fingerprint: fingerprint(payment_method),
                    last4,
                    routing_number,
                };
                Self { card: None, kind: "us_bank_account", us_bank_account: Some(account) }
            }
        }
    }
}
