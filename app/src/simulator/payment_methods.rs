//! Stripe's test payment methods: which ids exist, and what confirming with each one does.
//!
//! The ids are Stripe's own test aliases (<https://docs.stripe.com/testing#cards>), so code
//! written against the simulator behaves the same against Stripe's test mode. Any other id is
//! unknown, exactly as a mistyped id is on Stripe.

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

impl CardBehaviour {
    /// The payment method's `type`, as a PaymentIntent's `payment_method_types` lists it.
    pub fn payment_method_type(self) -> &'static str {
        match self {
            Self::BankDebit(_) => "us_bank_account",
            _ => "card",
        }
    }
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

/// Every payment method id the simulator knows.
const TEST_PAYMENT_METHODS: &[(&str, CardBehaviour)] = &[
    ("pm_card_visa", CardBehaviour::Succeeds),
    ("pm_card_visa_debit", CardBehaviour::Succeeds),
    ("pm_card_mastercard", CardBehaviour::Succeeds),
    ("pm_card_mastercard_debit", CardBehaviour::Succeeds),
    ("pm_card_amex", CardBehaviour::Succeeds),
    ("pm_card_discover", CardBehaviour::Succeeds),
    ("pm_card_chargeDeclined", declined("generic_decline", DECLINED)),
    ("pm_card_chargeDeclinedInsufficientFunds", declined("insufficient_funds", "Your card has insufficient funds.")),
    ("pm_card_chargeDeclinedFraudulent", declined("fraudulent", DECLINED)),
    ("pm_card_chargeDeclinedLostCard", declined("lost_card", DECLINED)),
    ("pm_card_chargeDeclinedStolenCard", declined("stolen_card", DECLINED)),
    ("pm_card_threeDSecure2Required", CardBehaviour::RequiresAuthentication),
    ("pm_card_authenticationRequired", CardBehaviour::RequiresAuthentication),
    ("pm_usBankAccount_success", CardBehaviour::BankDebit(None)),
    (
        "pm_usBankAccount_accountClosed",
        CardBehaviour::BankDebit(Some(Decline {
            code: "account_closed",
            decline_code: "account_closed",
            message: "The customer's bank account has been closed.",
        })),
    ),
    (
        "pm_card_chargeDeclinedExpiredCard",
        CardBehaviour::Declines(Decline {
            code: "expired_card",
            decline_code: "expired_card",
            message: "Your card has expired.",
        }),
    ),
];

/// The behaviour of a test payment method, or `None` if no such payment method exists.
pub(crate) fn lookup(id: &str) -> Option<CardBehaviour> {
    TEST_PAYMENT_METHODS.iter().find(|(known, _)| *known == id).map(|(_, behaviour)| *behaviour)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The aliases payonce's tests rely on behave as on Stripe; others do not exist.
    #[test]
    fn known_test_cards() {
        assert_eq!(lookup("pm_card_visa"), Some(CardBehaviour::Succeeds));
        let Some(CardBehaviour::Declines(decline)) = lookup("pm_card_chargeDeclinedExpiredCard") else {
            panic!("the expired card declines");
        };
        assert_eq!((decline.code, decline.decline_code), ("expired_card", "expired_card"));
        assert_eq!(lookup("pm_card_threeDSecure2Required"), Some(CardBehaviour::RequiresAuthentication));
        let Some(CardBehaviour::BankDebit(Some(failure))) = lookup("pm_usBankAccount_accountClosed") else {
            panic!("the closed account fails later");
        };
        assert_eq!(failure.code, "account_closed");
        assert_eq!(lookup("pm_usBankAccount_success").map(CardBehaviour::payment_method_type), Some("us_bank_account"));
        assert_eq!(lookup("pm_card_unknown"), None);
        assert_eq!(lookup("pm_card_Visa"), None, "ids are case-sensitive");
    }
}
