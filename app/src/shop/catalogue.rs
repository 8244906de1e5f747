//! What the demo shop sells, and the test cards it offers.

/// A product of the fixed catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    /// The URL slug, and the `product` metadata of its payments.
    pub id: &'static str,
    pub name: &'static str,
    pub blurb: &'static str,
    /// In cents.
    pub amount: i64,
    pub currency: &'static str,
}

pub const PRODUCTS: &[Product] = &[
    Product {
        id: "mug",
        name: "Exactly-once mug",
        blurb: "Holds one coffee. Never two, however hard you click.",
        amount: 1200,
        currency: "usd",
    },
    Product {
        id: "tee",
        name: "Idempotency T-shirt",
        blurb: "Same shirt on every retry.",
        amount: 2500,
        currency: "usd",
    },
    Product {
        id: "stickers",
        name: "Fencing-token sticker pack",
        blurb: "Five stickers, monotonically increasing.",
        amount: 400,
        currency: "usd",
    },
];

/// A Stripe test card the checkout offers, so a workshop can show every outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestCard {
    /// The Stripe test PaymentMethod.
    pub payment_method: &'static str,
    pub label: &'static str,
    pub hint: &'static str,
}

pub const CARDS: &[TestCard] = &[
    TestCard { payment_method: "pm_card_visa", label: "Visa 4242", hint: "succeeds" },
    TestCard { payment_method: "pm_card_chargeDeclined", label: "Declined card", hint: "the issuer declines it" },
    TestCard {
        payment_method: "pm_card_chargeDeclinedInsufficientFunds",
        label: "Insufficient funds",
        hint: "declined for lack of funds",
    },
];

pub fn product(id: &str) -> Option<&'static Product> {
    PRODUCTS.iter().find(|p| p.id == id)
}

pub fn card(payment_method: &str) -> Option<&'static TestCard> {
    CARDS.iter().find(|c| c.payment_method == payment_method)
}
