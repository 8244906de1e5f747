//! Final answers this process has recently replayed, kept for a few seconds, so that a retry storm
//! on a finished key is answered without a database round trip.
//!
//! Caching is safe because a final answer never changes. The one way it stops being the answer is
//! the key's deletion (expiry by the reaper, or an operator's "expire now"), so an entry lives at
//! most [`TTL`] and never past the key's `expires_at`, and an operator's expiry in this process
//! removes it at once. A server that did not perform the expiry may replay the key for up to
//! [`TTL`] more: `docs/expiry.md` states it. The checks are the same as on the database path
//! (scope, then fingerprint), made against the cached row.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{Fingerprint, StoredResponse};

/// The longest an answer is replayed from memory before the database is asked again.
pub const TTL: Duration = Duration::from_secs(10);
/// The most keys remembered; beyond that, expired entries go, and if none had, all of them.
const CAPACITY: usize = 10_000;

/// What a replay needs to know about a final key.
#[derive(Debug, Clone)]
pub struct Final {
    pub key_id: Uuid,
    pub method: String,
    pub route: String,
    pub fingerprint: Fingerprint,
    pub response: StoredResponse,
}

/// The cache, keyed by (customer, client key) like the table.
#[derive(Default)]
pub struct ReplayCache {
    entries: Mutex<HashMap<(Uuid, String), (Final, Instant)>>,
}

impl ReplayCache {
    /// The cached final answer of a key, if still valid.
    pub fn get(&self, customer_id: Uuid, key: &str) -> Option<Final> {
        let entries = self.lock();
        let (entry, until) = entries.get(&(customer_id, key.to_owned()))?;
        (Instant::now() < *until).then(|| entry.clone())
    }

    /// Remembers a final answer for [`TTL`], or until the key expires if that is sooner.
    pub fn put(&self, customer_id: Uuid, key: &str, entry: Final, expires_in: Duration) {
        let until = Instant::now() + TTL.min(expires_in);
        let mut entries = self.lock();
        if entries.len() >= CAPACITY {
            let now = Instant::now();
            entries.retain(|_, (_, until)| now < *until);
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert((customer_id, key.to_owned()), (entry, until));
    }

    /// Forgets a key (it was just deleted in this process).
    pub fn forget(&self, key_id: Uuid) {
        self.lock().retain(|_, (entry, _)| entry.key_id != key_id);
    }

    /// Forgets every key (the workshop's reset deleted them all).
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(Uuid, String), (Final, Instant)>> {
        // Plain data: a panic elsewhere cannot leave it half-updated.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn entry(key_id: Uuid) -> Final {
        Final {
            key_id,
            method: "POST".into(),
            route: "/v1/payments".into(),
            fingerprint: Fingerprint::of("POST", "/v1/payments", &serde_json::json!({})),
            response: StoredResponse::new(StatusCode::CREATED, "application/json", None, b"{}".to_vec()),
        }
    }

    /// Entries are per (customer, key), expire with the key, and can be forgotten.
    #[test]
    fn remembers_until_expiry_or_forgotten() {
        let cache = ReplayCache::default();
        let (alice, bob, id) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        cache.put(alice, "k", entry(id), Duration::from_secs(60));
        assert_eq!(cache.get(alice, "k").map(|e| e.key_id), Some(id));
        assert!(cache.get(bob, "k").is_none(), "another customer's key is another key");
        cache.forget(id);
        assert!(cache.get(alice, "k").is_none());
        cache.put(alice, "k", entry(id), Duration::ZERO);
        assert!(cache.get(alice, "k").is_none(), "never past the key's own expiry");
    }
}
