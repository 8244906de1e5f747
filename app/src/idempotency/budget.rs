//! How often, and for how long, a key may be tried: the budget that holds on every path.
//!
//! Every path that takes a key over (a client's retry on the claim path, the sweeper) counts
//! against the same budget, with the same backoff, computed by the database in one place: the
//! SQL functions `payonce_backoff`, `idempotency_exhausted` and `idempotency_retry_at` (migration
//! `20261210000001_outcomes.sql`). The exponent of the backoff is bounded, so no count of attempts
//! can make it overflow. docs/lifecycle.md ("The budget") tells the whole policy.

use std::time::Duration;

use super::secs;

/// Waiting between two attempts on the same key: `base`, `base`, `2·base`, `4·base`, … up to
/// `cap` after the lease ended (`payonce_backoff`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay before the first and second retries; doubled for each further one.
    pub base: Duration,
    /// The longest delay between two retries, and the interval at which a key whose budget is
    /// spent is reconciled.
    pub cap: Duration,
}

/// The retry budget of a key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// How many holders a key may have (the first counts) before clients may no longer take it
    /// over; after that only the sweeper does, every `backoff.cap`, to reconcile it.
    pub max_attempts: i32,
    pub backoff: Backoff,
    /// The longest wait between two look-ups of a pending payment (`requires_action`,
    /// `processing`), which is reconciled with the same backoff from `backoff.base`. Webhooks
    /// usually settle such payments first; this is the safety net when they do not arrive.
    pub pending_cap: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            max_attempts: 12,
            backoff: Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(60) },
            pending_cap: Duration::from_secs(600),
        }
    }
}

/// Stripe forgets an idempotency key 24 hours after its first use.
pub const STRIPE_KEY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long the gateway remembers a downstream key, as payonce counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Horizon {
    /// No create call is sent for a key older than this (measured from the key's creation, which
    /// precedes its first downstream call); after it, payonce only looks payments up. Must stay
    /// under [`STRIPE_KEY_RETENTION`], with room for the gateway timeout and clock drift.
    pub downstream_key_ttl: Duration,
    /// How long after the last possible create call an empty search by metadata is believed:
    /// Stripe's search index lags behind its writes.
    pub search_settle: Duration,
}

impl Default for Horizon {
    fn default() -> Self {
        Self { downstream_key_ttl: Duration::from_secs(23 * 60 * 60), search_settle: Duration::from_secs(60 * 60) }
    }
}

impl Horizon {
    /// Refuses a horizon Stripe does not honour.
    pub fn check(&self) -> Result<(), String> {
        if self.downstream_key_ttl >= STRIPE_KEY_RETENTION || self.downstream_key_ttl.is_zero() {
            return Err(format!(
                "PAYONCE_DOWNSTREAM_KEY_TTL_SECS is {} s; it must be between 1 and {} (under 24 hours): Stripe forgets an \
                 idempotency key 24 hours after its first use, and a create call sent after that could charge twice",
                self.downstream_key_ttl.as_secs(),
                STRIPE_KEY_RETENTION.as_secs() - 1,
            ));
        }
        Ok(())
    }
}

/// The budget as the SQL functions take it: `(max_attempts, horizon_secs, base_secs, cap_secs)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqlBudget {
    pub max_attempts: i32,
    pub horizon: f64,
    pub base: f64,
    pub cap: f64,
}

impl SqlBudget {
    pub fn new(budget: &Budget, horizon: &Horizon) -> Self {
        Self {
            max_attempts: budget.max_attempts,
            horizon: secs(horizon.downstream_key_ttl),
            base: secs(budget.backoff.base),
            cap: secs(budget.backoff.cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The horizon must stay under Stripe's 24 hours.
    #[test]
    fn horizon_under_a_day() {
        assert!(Horizon::default().check().is_ok());
        let at = |secs| Horizon { downstream_key_ttl: Duration::from_secs(secs), ..Horizon::default() };
        assert!(at(86_399).check().is_ok());
        let err = at(86_400).check().unwrap_err();
        assert!(err.contains("PAYONCE_DOWNSTREAM_KEY_TTL_SECS") && err.contains("24 hours"), "{err}");
        assert!(at(0).check().is_err());
    }
}
