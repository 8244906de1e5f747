//! Stripe's test payment methods: which ids exist, what each one pays with (the card or bank
//! account behind Stripe's test number) and what confirming with it does.
//!
//! The ids are Stripe's own test aliases (<https://docs.stripe.com/testing#cards>), so code
//! written against the simulator behaves the same against Stripe's test mode. Any other id is
//! unknown, exactly as a mistyped id is on Stripe.

use super::objects::{Brand, Instrument};

/// What confirming a PaymentIntent with a test payment method does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CardBehaviour {
    /// The charge succeeds.
    Succeeds,
    /// The issuer declines: a 402 `card_error`.
    Declines(Decline),
    /// The card requires 3-D Secure: `requires_action` until the customer authenticates
    /// (`POST /_sim/payment_intents/{id}/authenticate`).
    RequiresAuthentication,
    /// A US bank debit: `processing`, then (after the processing knob) it succeeds, or fails
    /// with this failure.
    BankDebit(Option<Decline>),
}

/// One of Stripe's test payment methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TestPaymentMethod {
    pub behaviour: CardBehaviour,
    pub instrument: Instrument,
}

/// A decline, with Stripe's codes and customer-facing message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Decline {
    /// Stripe's error `code`: `card_declined`, or a more specific one such as `expired_card`.
    pub code: &'static str,
    /// The issuer's reason: `generic_decline`, `insufficient_funds`, …
    pub decline_code: &'static str,
    pub message: &'static str,
}

const fn declined(decline_code: &'static str, message: &'static str) -> CardBehaviour {
    CardBehaviour::Declines(Decline { code: "card_declined", decline_code, message })
}

const DECLINED: &str = "Your card was declined.";

const fn card(brand: Brand, last4: &'static str, funding: &'static str) -> Instrument {
    Instrument::Card { brand, last4, funding, country: "US" }
}

const fn visa(last4: &'static str) -> Instrument {
    card(Brand::Visa, last4, "credit")
}

const fn bank(last4: &'static str) -> Instrument {
    Instrument::UsBankAccount { last4, routing_number: "110000000" }
}

/// Every payment method id the simulator knows, with the last digits of Stripe's test number.
const TEST_PAYMENT_METHODS: &[(&str, CardBehaviour, Instrument)] = &[
    ("pm_card_visa", CardBehaviour::Succeeds, visa("4242")),
    ("pm_card_visa_debit", CardBehaviour::Succeeds, card(Brand::Visa, "5556", "debit")),
    ("pm_card_mastercard", CardBehaviour::Succeeds, card(Brand::Mastercard, "4444", "credit")),
    ("pm_card_mastercard_debit", CardBehaviour::Succeeds, card(Brand::Mastercard, "8210", "debit")),
    ("pm_card_amex", CardBehaviour::Succeeds, card(Brand::Amex, "0005", "credit")),
    ("pm_card_discover", CardBehaviour::Succeeds, card(Brand::Discover, "1117", "credit")),
    ("pm_card_chargeDeclined", declined("generic_decline", DECLINED), visa("0002")),
    (
        "pm_card_chargeDeclinedInsufficientFunds",
        declined("insufficient_funds", "Your card has insufficient funds."),
        visa("9995"),
    ),
    ("pm_card_chargeDeclinedFraudulent", declined("fraudulent", DECLINED), visa("0019")),
    ("pm_card_chargeDeclinedLostCard", declined("lost_card", DECLINED), visa("9987")),
    ("pm_card_chargeDeclinedStolenCard", declined("stolen_card", DECLINED), visa("9979")),
    ("pm_card_threeDSecure2Required", CardBehaviour::RequiresAuthentication, visa("3220")),
    ("pm_card_authenticationRequired", CardBehaviour::RequiresAuthentication, visa("3184")),
    ("pm_usBankAccount_success", CardBehaviour::BankDebit(None), bank("6789")),
    (
        "pm_usBankAccount_accountClosed",
        CardBehaviour::BankDebit(Some(Decline {
            code: "account_closed",
            decline_code: "account_closed",
            message: "The customer's bank account has been closed.",
        })),
        bank("1113"),
    ),
    (
        "pm_card_chargeDeclinedExpiredCard",
        CardBehaviour::Declines(Decline {
            code: "expired_card",
            decline_code: "expired_card",
            message: "Your card has expired.",
        }),
        visa("0069"),
    ),
];

/// A test payment method, or `None` if no such payment method exists.
pub(crate) fn lookup(id: &str) -> Option<TestPaymentMethod> {
    TEST_PAYMENT_METHODS
        .iter()
        .find(|(known, ..)| *known == id)
        .map(|&(_, behaviour, instrument)| TestPaymentMethod { behaviour, instrument })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn behaviour(id: &str) -> Option<CardBehaviour> {
        lookup(id).map(|method| method.behaviour)
    }

    /// The aliases payonce's tests rely on behave as on Stripe; others do not exist.
    #[test]
    fn known_test_cards() {
        assert_eq!(behaviour("pm_card_visa"), Some(CardBehaviour::Succeeds));
        let Some(CardBehaviour::Declines(decline)) = behaviour("pm_card_chargeDeclinedExpiredCard") else {
            panic!("the expired card declines");
        };
        assert_eq!((decline.code, decline.decline_code), ("expired_card", "expired_card"));
        assert_eq!(behaviour("pm_card_threeDSecure2Required"), Some(CardBehaviour::RequiresAuthentication));
        let Some(CardBehaviour::BankDebit(Some(failure))) = behaviour("pm_usBankAccount_accountClosed") else {
            panic!("the closed account fails later");
        };
        assert_eq!(failure.code, "account_closed");
        assert_eq!(lookup("pm_usBankAccount_success").map(|method| method.instrument.kind()), Some("us_bank_account"));
        assert_eq!(
            lookup("pm_card_visa").map(|method| method.instrument),
            Some(Instrument::Card { brand: Brand::Visa, last4: "4242", funding: "credit", country: "US" })
        );
        assert_eq!(lookup("pm_card_unknown"), None);
        assert_eq!(lookup("pm_card_Visa"), None, "ids are case-sensitive");
    }
}
