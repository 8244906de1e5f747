//! The Stripe simulator's control routes: `PUT /_sim/faults`, `GET /_sim/charges` and
//! `GET /_sim/refunds`; and, for capture-storm's self-test, a charge made at the simulator
//! directly, behind payonce's back.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

/// One successful charge in the simulator's ledger (the fields the audit reads).
#[derive(Debug, Clone, Deserialize)]
pub struct Charge {
    /// `pi_…`
    pub payment_intent: String,
    /// The downstream idempotency key payonce sent (`payonce-charge-…`).
    pub idempotency_key: Option<String>,
    /// What moved: the whole amount, or what a capture took of an authorization.
    pub amount: i64,
    /// `payonce_customer`, `payonce_idempotency_key`, `payonce_payment`, and the client's own.
    pub metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Ledger {
    charges: Vec<Charge>,
}

/// One refund in the simulator's ledger (the fields the refund audit reads).
#[derive(Debug, Clone, Deserialize)]
pub struct Refund {
    /// The gateway's refund id (`re_…`).
    pub refund: String,
    /// The PaymentIntent whose charge it refunded.
    pub payment_intent: String,
    pub amount: i64,
    /// `payonce_refund`, `payonce_idempotency_key`, `payonce_payment`, `payonce_customer`, and
    /// the client's own.
    pub metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RefundLedger {
    refunds: Vec<Refund>,
}

pub struct Simulator {
    http: reqwest::Client,
    base: String,
}

impl Simulator {
    pub fn new(http: reqwest::Client, base: &str) -> Self {
        Self { http, base: base.trim_end_matches('/').to_owned() }
    }

    /// Replaces the faults; the simulator's refusal (an invalid rate, a typo) is an error.
    pub async fn set_faults(&self, faults: &Value) -> Result<(), String> {
        let url = format!("{}/_sim/faults", self.base);
        let response = self.http.put(&url).json(faults).send().await.map_err(|err| format!("PUT {url}: {err}"))?;
        if !response.status().is_success() {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(format!("the simulator refused the faults {faults}: {status} {body}"));
        }
        Ok(())
    }

    pub async fn clear_faults(&self) -> Result<(), String> {
        self.set_faults(&json!({})).await
    }

    /// Every successful charge since the simulator started (or was reset).
    pub async fn charges(&self) -> Result<Vec<Charge>, String> {
        let url = format!("{}/_sim/charges", self.base);
        let response = self.http.get(&url).send().await.map_err(|err| format!("GET {url}: {err}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: {}", response.status()));
        }
        let ledger: Ledger = response.json().await.map_err(|err| format!("GET {url}: not a ledger: {err}"))?;
        Ok(ledger.charges)
    }

    /// capture-storm's self-test (`--inject-double-capture`): a second movement of money for an
    /// authorization, as a payonce that captured twice would leave in the ledger. Stripe captures
    /// a PaymentIntent once, so it is a new PaymentIntent of `amount`, charged at once, under the
    /// authorization's metadata (`payonce_idempotency_key`, `payonce_payment`, …). Any test key
    /// is accepted by the simulator; `secret_key` is the one it is made under.
    pub async fn charge_behind_payonce(
        &self,
        secret_key: &str,
        amount: i64,
        metadata: &BTreeMap<String, String>,
    ) -> Result<String, String> {
        let url = format!("{}/v1/payment_intents", self.base);
        let mut form: Vec<(String, String)> = [
            ("amount", amount.to_string()),
            ("currency", "usd".to_owned()),
            ("payment_method", "pm_card_visa".to_owned()),
            ("payment_method_types[]", "card".to_owned()),
            ("confirm", "true".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        form.extend(metadata.iter().map(|(name, value)| (format!("metadata[{name}]"), value.clone())));
        let response = self
            .http
            .post(&url)
            .bearer_auth(secret_key)
            .form(&form)
            .send()
            .await
            .map_err(|err| format!("POST {url}: {err}"))?;
        let status = response.status();
        let intent: Value = response.json().await.map_err(|err| format!("POST {url}: not JSON: {err}"))?;
        match (status.is_success(), intent["status"].as_str(), intent["id"].as_str()) {
            (true, Some("succeeded"), Some(id)) => Ok(id.to_owned()),
            _ => Err(format!("POST {url}: the simulator did not charge: {status} {intent}")),
        }
    }

    /// Every refund since the simulator started (or was reset).
    pub async fn refunds(&self) -> Result<Vec<Refund>, String> {
        let url = format!("{}/_sim/refunds", self.base);
        let response = self.http.get(&url).send().await.map_err(|err| format!("GET {url}: {err}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: {}", response.status()));
        }
        let ledger: RefundLedger = response.json().await.map_err(|err| format!("GET {url}: not a ledger: {err}"))?;
        Ok(ledger.refunds)
    }
}
