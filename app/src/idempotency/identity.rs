//! What survives the database forgetting: a request's identity, derived from what the client sent.
//!
//! A key row can be lost: a restore from a backup taken before it, or a failover to a standby that
//! had not received it. The client's retry then claims the key afresh, and whatever payonce sends
//! the gateway must still make it answer "already done" rather than charge again. Stripe replays a
//! request only for the same `Idempotency-Key` *and the same parameters* (other parameters under
//! one key are an `idempotency_error`), so both must be functions of the client's request alone,
//! never of a row id the database may have forgotten.
//!
//! The identity is a UUID (version 8, the RFC 9562 layout for application-defined ids) taken
//! from SHA-256 of the customer, the client's key, the request's fingerprint (method, route and
//! canonical body) and a *generation*. An operation names its resource with it (`pay_…`,
//! `ref_…`), and the downstream key and metadata follow from that id: a restored database rebuilds
//! the same resource, under the same id, from the gateway's replay.
//!
//! The generation tells apart the times one request is made *on purpose* after its key was
//! forgotten on purpose: once a key expired (or an operator expired it), the same request is a new
//! one, and must not be a replay. Generation 0 is tried first; if its resource exists, the engine
//! moves on to 1, and so on ([`super::Begun::Taken`]). So the generation is never stored: it is
//! the first one whose resource the database does not hold. When the database forgot a resource,
//! the generation falls back to it, and the gateway replays it: the rule errs towards a replay,
//! never towards a second charge (docs/expiry.md).

use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::Fingerprint;

/// The most generations of one request the engine tries before giving up on a key: each needs
/// the same request made again after its key expired.
pub const MAX_GENERATIONS: u32 = 1_000;

/// The identity of generation `generation` of a request: the id of the resource it makes.
pub fn identity(customer_id: Uuid, client_key: &str, fingerprint: &Fingerprint, generation: u32) -> Uuid {
    let mut hasher = Sha256::new();
    hasher.update(b"payonce identity v1\n");
    hasher.update(customer_id.as_bytes());
    // Length-prefixed: no two (key, fingerprint) pairs hash the same bytes.
    hasher.update((client_key.len() as u64).to_be_bytes());
    hasher.update(client_key.as_bytes());
    hasher.update(fingerprint.as_bytes());
    hasher.update(generation.to_be_bytes());
    let digest: [u8; 32] = hasher.finalize().into();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// Whether `id` is an identity (version 8), rather than a random id an older payonce gave a
/// resource (version 7): those resources keep their old downstream keys.
pub fn is_identity(id: Uuid) -> bool {
    id.get_version_num() == 8
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fingerprint(amount: i64) -> Fingerprint {
        Fingerprint::of("POST", "/v1/payments", &json!({"amount": amount, "currency": "usd"}))
    }

    /// The same request always has the same identity; anything else the client sent, and the
    /// generation, make another.
    #[test]
    fn identity_is_a_function_of_the_request() {
        let (alice, bob) = (Uuid::now_v7(), Uuid::now_v7());
        let id = identity(alice, "order-1", &fingerprint(100), 0);
        assert_eq!(id, identity(alice, "order-1", &fingerprint(100), 0));
        assert!(is_identity(id));
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        for other in [
            identity(bob, "order-1", &fingerprint(100), 0),
            identity(alice, "order-2", &fingerprint(100), 0),
            identity(alice, "order-1", &fingerprint(200), 0),
            identity(alice, "order-1", &fingerprint(100), 1),
        ] {
            assert_ne!(id, other);
        }
        assert!(!is_identity(Uuid::now_v7()));
    }
}
