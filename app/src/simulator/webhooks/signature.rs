//! Stripe's webhook signature (<https://docs.stripe.com/webhooks#verify-manually>):
//! `Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<payload>">`, keyed with the
//! endpoint's whole `whsec_…` secret. Each attempt is signed anew with its own timestamp, so a
//! retry hours later still passes a receiver's 300 s tolerance.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The `Stripe-Signature` header value for `payload` sent at `timestamp`.
pub(crate) fn header(secret: &str, timestamp: i64, payload: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    format!("t={timestamp},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header async-stripe's own test helper builds for the same input: the two agree.
    #[test]
    fn agrees_with_async_stripe_webhook() {
        let payload = r#"{"id":"evt_1","object":"event"}"#;
        let expected = stripe_webhook::Webhook::generate_test_header(payload, "whsec_test", Some(1_700_000_000));
        assert_eq!(header("whsec_test", 1_700_000_000, payload.as_bytes()), expected);
    }
}
