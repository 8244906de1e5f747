//! Stripe's idempotency semantics, per API key and `Idempotency-Key`
//! (<https://docs.stripe.com/api/idempotent_requests>):
//!
//! - the first request with a key *claims* it; the claim is held while the request executes;
//! - once execution has begun, its result (success or decline) is *saved* and every later
//!   request with the same key and the same parameters gets it back, with
//!   `Idempotent-Replayed: true`;
//! - the same key with other parameters (method, path or form, in any order) is a 400
//!   `idempotency_error`; while the claim is held, any request with the key is a 409
//!   `idempotency_key_in_use`;
//! - a request that never reached execution (validation error, injected outage) saves nothing,
//!   and its claim is released so the key can be used again;
//! - the same key on another route counts as other parameters (400).
//!
//! Unlike Stripe, saved results never expire (Stripe keeps them for 24 hours): the simulator's
//! state lives as long as the process, or until `POST /_sim/reset`.

use std::collections::HashMap;

use super::response::SavedResponse;

/// What identifies "the same request" for a key: the route (every idempotent route is a `POST`)
/// and the sorted form pairs. The same key on another route is "other parameters".
pub(crate) type Fingerprint = (&'static str, Vec<(String, String)>);

#[derive(Debug)]
enum Entry {
    InFlight { fingerprint: Fingerprint },
    Saved { fingerprint: Fingerprint, response: SavedResponse },
}

/// What to do with a request that carries an `Idempotency-Key`.
#[derive(Debug)]
pub(crate) enum Begin {
    /// The key is now claimed for this request: execute it.
    Execute,
    /// The key has a saved result for these parameters: answer with it.
    Replay(SavedResponse),
    /// Another request with this key is executing: 409.
    InUse,
    /// The key was first used with other parameters: 400.
    Mismatch,
}

/// The keys of one API key (Stripe scopes idempotency keys per account).
///
/// A key in flight belongs to the one request that claimed it (its `execution::Claim`): nobody
/// else can replace its entry (a reset replaces the whole store, and the state's epoch keeps the
/// old request out).
#[derive(Debug, Default)]
pub(crate) struct Keys {
    entries: HashMap<String, Entry>,
}

impl Keys {
    /// Decides what to do with a request, claiming the key if it is new.
    pub fn begin(&mut self, key: &str, fingerprint: Fingerprint) -> Begin {
        match self.entries.get(key) {
            // Stripe answers 409 even if the parameters differ: the first request's outcome is
            // not known yet, and it is the more useful error for a client that retried too soon.
            Some(Entry::InFlight { .. }) => Begin::InUse,
            Some(Entry::Saved { fingerprint: saved, response }) => {
                if *saved == fingerprint {
                    Begin::Replay(response.clone())
                } else {
                    Begin::Mismatch
                }
            }
            None => {
                self.entries.insert(key.to_owned(), Entry::InFlight { fingerprint });
                Begin::Execute
            }
        }
    }

    /// Saves the result of the request that claimed `key`.
    pub fn save(&mut self, key: &str, response: SavedResponse) {
        if let Some(Entry::InFlight { fingerprint }) = self.entries.remove(key) {
            self.entries.insert(key.to_owned(), Entry::Saved { fingerprint, response });
        }
    }

    /// Frees `key` if it is still in flight.
    pub fn release(&mut self, key: &str) {
        if matches!(self.entries.get(key), Some(Entry::InFlight { .. })) {
            self.entries.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Bytes;
    use axum::http::StatusCode;

    use super::*;

    fn fingerprint(params: &[(&str, &str)]) -> Fingerprint {
        ("/v1/payment_intents", params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    }

    fn saved() -> SavedResponse {
        SavedResponse::new(StatusCode::OK, Bytes::from_static(b"{}"), "ok")
    }

    /// Claim → in use → saved → replay or mismatch; a saved result is never released.
    #[test]
    fn key_lifecycle() {
        let mut keys = Keys::default();
        let a = fingerprint(&[("amount", "1")]);
        let b = fingerprint(&[("amount", "2")]);
        assert!(matches!(keys.begin("k", a.clone()), Begin::Execute));
        assert!(matches!(keys.begin("k", a.clone()), Begin::InUse));
        assert!(matches!(keys.begin("k", b.clone()), Begin::InUse));
        keys.save("k", saved());
        assert!(matches!(keys.begin("k", a.clone()), Begin::Replay(_)));
        assert!(matches!(keys.begin("k", b), Begin::Mismatch));
        keys.release("k");
        assert!(matches!(keys.begin("k", a), Begin::Replay(_)), "a saved result stays");
    }

    /// A released claim frees the key for a new execution.
    #[test]
    fn release_frees_the_key() {
        let mut keys = Keys::default();
        let a = fingerprint(&[("amount", "1")]);
        assert!(matches!(keys.begin("k", a.clone()), Begin::Execute));
        keys.release("k");
        assert!(matches!(keys.begin("k", a), Begin::Execute));
    }
}
