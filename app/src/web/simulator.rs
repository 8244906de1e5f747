//! The simulator's control API (`/_sim/…`, [`crate::simulator`]), as the dashboard's gateway
//! panel uses it. It works for the built-in simulator and for an external `payonce stripe-sim`
//! alike, because both answer on the gateway's base URL. Against real Stripe the probe finds
//! nothing and the panel stays hidden.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::simulator::{Charge, Faults};

/// How long one control call may take; the simulator answers these from memory.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How long a probe's answer is trusted, so that rendering pages does not probe every time.
const PROBE_TTL: Duration = Duration::from_secs(5);

/// A client of the control API. Cheap to clone.
#[derive(Clone)]
pub struct SimulatorControl {
    client: reqwest::Client,
    /// The gateway's base URL (ending in `/`); `None` when it is HTTPS (real Stripe, or anything
    /// else that is not a local simulator: this client speaks plain HTTP only).
    base: Option<Arc<str>>,
    /// The last probe: when, and whether the simulator answered.
    probed: Arc<Mutex<Option<(Instant, bool)>>>,
    /// The ledger's charges this server has seen ([`Self::charges`]).
    seen: Arc<tokio::sync::Mutex<Seen>>,
}

/// The simulator's charges, in order, and which ledger they are of.
pub struct Charges {
    /// The ledger's id: another one is another ledger (a reset, a restarted simulator).
    pub ledger: String,
    pub charges: Arc<Vec<Charge>>,
}

/// The charges of one ledger, as far as this server has read it.
#[derive(Default)]
struct Seen {
    /// The ledger's id ("" before the first read).
    ledger: String,
    charges: Arc<Vec<Charge>>,
}

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum SimulatorError {
    #[error("the gateway is not a payonce simulator")]
    NotASimulator,
    #[error("the simulator could not be reached: {0}")]
    Unreachable(#[from] reqwest::Error),
    /// The simulator refused the request, with its own explanation.
    #[error("{0}")]
    Refused(String),
}

/// `GET /_sim/charges?from=N`.
#[derive(Deserialize)]
struct LedgerPage {
    /// Which ledger: another id is another ledger (a reset, a restarted simulator).
    #[serde(default)]
    ledger: String,
    /// How many charges the ledger holds.
    total: usize,
    /// Those after the first N.
    charges: Vec<Charge>,
}

#[derive(Deserialize)]
struct Envelope {
    error: EnvelopeError,
}

#[derive(Deserialize)]
struct EnvelopeError {
    message: String,
}

impl SimulatorControl {
    pub fn new(gateway_base_url: &str) -> Self {
        let base = gateway_base_url.starts_with("http://").then(|| Arc::from(gateway_base_url));
        let client = reqwest::Client::builder().timeout(TIMEOUT).build().unwrap_or_default();
        Self { client, base, probed: Arc::default(), seen: Arc::default() }
    }

    /// Whether the gateway is a simulator: `GET {base}_sim/faults` answers 200. Cached briefly.
    pub async fn is_active(&self) -> bool {
        let cached = *self.probed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, active)) = cached
            && at.elapsed() < PROBE_TTL
        {
            return active;
        }
        let active = self.faults().await.is_ok();
        *self.probed.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), active));
        active
    }

    fn url(&self, path: &str) -> Result<String, SimulatorError> {
        let base = self.base.as_deref().ok_or(SimulatorError::NotASimulator)?;
        Ok(format!("{base}{path}"))
    }

    /// The faults in force.
    pub async fn faults(&self) -> Result<Faults, SimulatorError> {
        let response = self.client.get(self.url("_sim/faults")?).send().await?;
        if !response.status().is_success() {
            return Err(SimulatorError::NotASimulator);
        }
        Ok(response.json().await?)
    }

    /// Replaces the faults; the simulator's own message when it refuses them.
    pub async fn set_faults(&self, faults: &Faults) -> Result<Faults, SimulatorError> {
        let response = self.client.put(self.url("_sim/faults")?).json(faults).send().await?;
        if response.status().is_success() {
            return Ok(response.json().await?);
        }
        let status = response.status();
        let message = match response.json::<Envelope>().await {
            Ok(envelope) => envelope.error.message,
            Err(_) => format!("the simulator answered {status}"),
        };
        Err(SimulatorError::Refused(message))
    }

    /// Makes the simulator forget everything (`POST {base}_sim/reset`).
    pub async fn reset(&self) -> Result<(), SimulatorError> {
        let response = self.client.post(self.url("_sim/reset")?).send().await?;
        if !response.status().is_success() {
            return Err(SimulatorError::Refused(format!("the simulator answered {}", response.status())));
        }
        Ok(())
    }

    /// Every successful charge in the simulator's ledger, in order. The first call reads the
    /// whole ledger; later ones only the charges made since (`?from=N`), added to those this
    /// server kept: the audit costs what is new, not the whole ledger on every load (tens of
    /// megabytes of JSON after a load test). A new ledger id (a reset, a restarted simulator)
    /// reads it all again. The charges are kept as first read: a later refund's
    /// `amount_refunded` is not in them.
    pub async fn charges(&self) -> Result<Charges, SimulatorError> {
        // One reader at a time: a second page load waits for the first one's read and uses it.
        let mut seen = self.seen.lock().await;
        let from = seen.charges.len();
        let page = self.ledger_from(from).await?;
        let continues =
            !page.ledger.is_empty() && page.ledger == seen.ledger && page.total == from + page.charges.len();
        if continues {
            if !page.charges.is_empty() {
                Arc::make_mut(&mut seen.charges).extend(page.charges);
            }
        } else {
            let page = if from == 0 { page } else { self.ledger_from(0).await? };
            *seen = Seen { ledger: page.ledger, charges: Arc::new(page.charges) };
        }
        Ok(Charges { ledger: seen.ledger.clone(), charges: Arc::clone(&seen.charges) })
    }

    async fn ledger_from(&self, from: usize) -> Result<LedgerPage, SimulatorError> {
        let response = self.client.get(self.url(&format!("_sim/charges?from={from}"))?).send().await?;
        if !response.status().is_success() {
            return Err(SimulatorError::NotASimulator);
        }
        Ok(response.json().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTPS gateway (real Stripe) is never probed: the panel stays hidden, offline.
    #[tokio::test]
    async fn real_stripe_is_not_a_simulator() {
        let control = SimulatorControl::new("https://api.stripe.com/");
        assert!(!control.is_active().await);
        assert!(matches!(control.charges().await, Err(SimulatorError::NotASimulator)));
    }
}
