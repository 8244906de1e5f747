//! `/admin/gateway`: while the gateway is a simulator, its faults (to stage an incident) and the
//! double-charge audit (to prove none happened): payments compared with the simulator's ledger.

use std::collections::{BTreeMap, HashMap};
use std::sync::PoisonError;

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use uuid::Uuid;

use super::queries;
use super::{Chrome, Operator, parse_customer};
use crate::payments::PaymentId;
use crate::simulator::{Charge, Faults};
use crate::state::AppState;
use crate::web::flash::Flash;
use crate::web::format::filters;
use crate::web::money;
use crate::web::page::{self, WebError};
use crate::web::simulator::{Charges, SimulatorError};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/gateway", get(show))
        .route("/admin/gateway/faults", post(set_faults))
        .route("/admin/gateway/reset", post(reset))
}

/// `POST /admin/gateway/reset`, in workshop mode only: the simulator forgets everything (its
/// ledger, objects, faults) and every key and payment is deleted, so the next exercise starts
/// from nothing.
async fn reset(State(state): State<AppState>, operator: Operator) -> Result<Response, WebError> {
    if !state.web.config.workshop {
        return Err(WebError::NotFound);
    }
    let message = match state.web.simulator.reset().await {
        Ok(()) => {
            state.engine.workshop_reset(&operator.name).await?;
            Flash::success(
                "Reset: the simulator's ledger is empty and every key and payment is deleted (customers and \
                 operators stay; the simulator keeps its webhook endpoints). Other servers may replay an \
                 answer they remember for up to 10 seconds.",
            )
        }
        Err(err) => Flash::error(format!("Nothing was reset: {err}.")),
    };
    operator.flash(message).await?;
    Ok(Redirect::to("/admin/gateway").into_response())
}

/// How many rows of each audit finding are listed (all are counted).
const LISTED: usize = 50;

#[derive(Template)]
#[template(path = "admin/gateway.html")]
struct GatewayPage {
    chrome: Chrome,
    /// Workshop mode: the reset button is shown.
    workshop: bool,
    base_url: String,
    /// `None` when the gateway is not a simulator.
    faults: Option<FaultsView>,
    audit: Option<Audit>,
}

/// The faults as the form shows them (empty strings for "not set").
struct FaultsView {
    latency_ms: u64,
    jitter_ms: u64,
    fail_rate: f64,
    timeout_rate: f64,
    timeout_hold_ms: u64,
    drop_after_charge_rate: f64,
    payment_method: String,
    next_calls: String,
    seed: String,
    /// Whether any fault is injected.
    active: bool,
}

impl From<Faults> for FaultsView {
    fn from(f: Faults) -> Self {
        let active = f.latency_ms > 0
            || f.jitter_ms > 0
            || f.fail_rate > 0.0
            || f.timeout_rate > 0.0
            || f.drop_after_charge_rate > 0.0;
        Self {
            latency_ms: f.latency_ms,
            jitter_ms: f.jitter_ms,
            fail_rate: f.fail_rate,
            timeout_rate: f.timeout_rate,
            timeout_hold_ms: f.timeout_hold_ms,
            drop_after_charge_rate: f.drop_after_charge_rate,
            payment_method: f.payment_method.unwrap_or_default(),
            next_calls: f.next_calls.map(|n| n.to_string()).unwrap_or_default(),
            seed: f.seed.map(|n| n.to_string()).unwrap_or_default(),
            active,
        }
    }
}

/// The double-charge audit.
struct Audit {
    charges: usize,
    /// (customer, client key) pairs charged at least once.
    keys_charged: usize,
    /// Keys charged more than once: the thing that must never happen.
    doubles: Vec<DoubleCharge>,
    doubles_total: usize,
    /// Keys paid again after their key expired: one charge per key row, as designed.
    again: Vec<PaidAgain>,
    again_total: usize,
    /// Charges whose payment payonce does not record as succeeded (reconcile these).
    unmatched: Vec<Unmatched>,
    unmatched_total: usize,
    /// Succeeded payments with no charge in the ledger (e.g. the simulator was reset).
    uncharged: Vec<String>,
    uncharged_total: queries::Tally,
    /// Charges without payonce's metadata (made by another client of the simulator).
    foreign: usize,
}

struct DoubleCharge {
    customer: String,
    key: String,
    /// The key's page, while the key exists.
    link: Option<String>,
    count: usize,
    payment_intents: String,
    total: String,
}

struct PaidAgain {
    customer: String,
    key: String,
    count: usize,
    payment_intents: String,
}

struct Unmatched {
    payment_intent: String,
    payment: String,
    amount: String,
    /// What payonce says about the payment.
    local: String,
}

/// `GET /admin/gateway`.
async fn show(State(state): State<AppState>, operator: Operator) -> Result<Response, WebError> {
    let sim = &state.web.simulator;
    let (faults, audit) = match sim.faults().await {
        Ok(faults) => {
            let charges = sim.charges().await.map_err(|err| WebError::Internal(err.to_string()))?;
            (Some(FaultsView::from(faults)), Some(audit(&state, &charges).await?))
        }
        Err(_) => (None, None),
    };
    let page = GatewayPage {
        workshop: state.web.config.workshop,
        base_url: state.gateway.base_url().to_owned(),
        faults,
        audit,
        chrome: operator.chrome(&state, "gateway").await?,
    };
    page::render(StatusCode::OK, &page)
}

/// Compares the ledger with the payments.
async fn audit(state: &AppState, ledger: &Charges) -> Result<Audit, WebError> {
    let pool = state.engine.pool();
    let charges = ledger.charges.as_slice();
    fn meta<'a>(c: &'a Charge, name: &str) -> Option<&'a str> {
        c.metadata.get(name).map(String::as_str)
    }
    // Charges per (customer, client key): more than one is a double charge.
    let mut per_key: BTreeMap<(&str, &str), Vec<&Charge>> = BTreeMap::new();
    let mut foreign = 0;
    for charge in charges {
        match (meta(charge, "payonce_customer"), meta(charge, "payonce_idempotency_key")) {
            (Some(customer), Some(key)) => per_key.entry((customer, key)).or_default().push(charge),
            _ => foreign += 1,
        }
    }
    // A key charged more than once is a double charge, unless there is positive evidence that
    // the customer paid again on purpose after the key expired (an operator's Expire, or the
    // TTL): each charge a payment of its own, and every payment but (at most) one with its key
    // reaped and its tombstone kept. The mere absence of a key is no evidence (the lab's
    // payments have none): a double charge is never classified away.
    let repeated: Vec<Uuid> = per_key
        .values()
        .filter(|charges| charges.len() > 1)
        .flatten()
        .filter_map(|c| PaymentId::parse(meta(c, "payonce_payment")?))
        .map(|id| id.0)
        .collect();
    let known: HashMap<Uuid, queries::AuditedPayment> =
        queries::payments_by_id(pool, &repeated).await?.into_iter().map(|p| (p.id, p)).collect();
    let paid_again = |charges: &[&Charge]| {
        let payments: Vec<Option<&queries::AuditedPayment>> = charges
            .iter()
            .map(|c| meta(c, "payonce_payment").and_then(PaymentId::parse).and_then(|id| known.get(&id.0)))
            .collect();
        let mut ids: Vec<Uuid> = payments.iter().flatten().map(|p| p.id).collect();
        ids.sort_unstable();
        ids.dedup();
        let all_distinct_and_known = payments.iter().all(Option::is_some) && ids.len() == charges.len();
        let unexplained = payments.iter().flatten().filter(|p| !p.expired).count();
        all_distinct_and_known && unexplained <= 1
    };
    let (again, doubles): (Vec<_>, Vec<_>) =
        per_key.iter().filter(|(_, charges)| charges.len() > 1).partition(|(_, charges)| paid_again(charges));
    let again_total = again.len();
    let again = again
        .into_iter()
        .take(LISTED)
        .map(|((customer, key), charges)| PaidAgain {
            customer: customer.to_string(),
            key: key.to_string(),
            count: charges.len(),
            payment_intents: charges.iter().map(|c| c.payment_intent.as_str()).collect::<Vec<_>>().join(", "),
        })
        .collect();
    let doubles_total = doubles.len();
    let wanted: Vec<(Uuid, String)> = doubles
        .iter()
        .take(LISTED)
        .filter_map(|((customer, key), _)| Some((parse_customer(customer)?, key.to_string())))
        .collect();
    let (customers, keys): (Vec<Uuid>, Vec<String>) = wanted.into_iter().unzip();
    let links: HashMap<(Uuid, String), Uuid> =
        queries::key_ids(pool, &customers, &keys).await?.into_iter().map(|k| ((k.customer_id, k.key), k.id)).collect();
    let doubles = doubles
        .into_iter()
        .take(LISTED)
        .map(|((customer, key), charges)| DoubleCharge {
            link: parse_customer(customer)
                .and_then(|id| links.get(&(id, key.to_string())))
                .map(|id| format!("/admin/keys/{id}")),
            customer: customer.to_string(),
            key: key.to_string(),
            count: charges.len(),
            payment_intents: charges.iter().map(|c| c.payment_intent.as_str()).collect::<Vec<_>>().join(", "),
            total: money(charges.iter().map(|c| c.amount).sum(), &charges[0].currency),
        })
        .collect();

    // Every charge should belong to a payment payonce records as succeeded. The database is asked
    // about those not confirmed by an earlier load, and answers for those it does not record as
    // succeeded (a status, or none at all).
    let charged: Vec<Uuid> =
        charges.iter().filter_map(|c| PaymentId::parse(meta(c, "payonce_payment")?)).map(|id| id.0).collect();
    let of = format!("ledger {} of {}", ledger.ledger, queries::payments_incarnation(pool).await?);
    let unconfirmed: Vec<Uuid> = {
        let mut confirmed = state.web.confirmed.lock().unwrap_or_else(PoisonError::into_inner);
        let valid = confirmed.valid_for(&of);
        charged.iter().filter(|id| !valid.contains(id)).copied().collect()
    };
    let not_succeeded: HashMap<Uuid, Option<String>> =
        queries::charged_but_not_succeeded(pool, &unconfirmed).await?.into_iter().collect();
    {
        let mut confirmed = state.web.confirmed.lock().unwrap_or_else(PoisonError::into_inner);
        if confirmed.of == of {
            confirmed.ids.extend(unconfirmed.iter().filter(|id| !not_succeeded.contains_key(id)));
        }
    }
    let unmatched_all: Vec<Unmatched> = charges
        .iter()
        .filter_map(|c| {
            let payment = meta(c, "payonce_payment")?;
            let status = match PaymentId::parse(payment) {
                Some(id) => not_succeeded.get(&id.0)?.as_deref(),
                None => None,
            };
            let local = match status {
                Some("pending") => "pending (may still be finishing)".to_owned(),
                Some(status) => format!("{status}: charged although payonce recorded a failure"),
                None => "no such payment".to_owned(),
            };
            Some(Unmatched {
                payment_intent: c.payment_intent.clone(),
                payment: payment.to_owned(),
                amount: money(c.amount, &c.currency),
                local,
            })
        })
        .collect();
    let unmatched_total = unmatched_all.len();
    let (uncharged, uncharged_total) = queries::succeeded_without_charge(pool, &charged, LISTED as i64).await?;
    Ok(Audit {
        again,
        again_total,
        charges: charges.len(),
        keys_charged: per_key.len(),
        doubles,
        doubles_total,
        unmatched: unmatched_all.into_iter().take(LISTED).collect(),
        unmatched_total,
        uncharged: uncharged.into_iter().map(|id| PaymentId(id).to_string()).collect(),
        uncharged_total,
        foreign,
    })
}

/// The faults form. Numbers arrive as text so that a typo is reported, not a 422 from axum.
#[derive(Deserialize)]
struct FaultsForm {
    #[serde(default)]
    action: String,
    #[serde(default)]
    latency_ms: String,
    #[serde(default)]
    jitter_ms: String,
    #[serde(default)]
    fail_rate: String,
    #[serde(default)]
    timeout_rate: String,
    #[serde(default)]
    timeout_hold_ms: String,
    #[serde(default)]
    drop_after_charge_rate: String,
    #[serde(default)]
    payment_method: String,
    #[serde(default)]
    next_calls: String,
    #[serde(default)]
    seed: String,
}

impl FaultsForm {
    /// An empty field is "not set": the field's value in `Faults::default()`.
    fn faults(&self) -> Result<Faults, String> {
        fn opt<T: std::str::FromStr>(field: &str, value: &str) -> Result<Option<T>, String> {
            let value = value.trim();
            if value.is_empty() {
                return Ok(None);
            }
            value.parse().map(Some).map_err(|_| format!("{field}: {value:?} is not a number"))
        }
        let defaults = Faults::default();
        Ok(Faults {
            latency_ms: opt("latency_ms", &self.latency_ms)?.unwrap_or(defaults.latency_ms),
            jitter_ms: opt("jitter_ms", &self.jitter_ms)?.unwrap_or(defaults.jitter_ms),
            fail_rate: opt("fail_rate", &self.fail_rate)?.unwrap_or(defaults.fail_rate),
            timeout_rate: opt("timeout_rate", &self.timeout_rate)?.unwrap_or(defaults.timeout_rate),
            timeout_hold_ms: opt("timeout_hold_ms", &self.timeout_hold_ms)?.unwrap_or(defaults.timeout_hold_ms),
            drop_after_charge_rate: opt("drop_after_charge_rate", &self.drop_after_charge_rate)?
                .unwrap_or(defaults.drop_after_charge_rate),
            payment_method: Some(self.payment_method.trim().to_owned()).filter(|pm| !pm.is_empty()),
            next_calls: opt("next_calls", &self.next_calls)?,
            seed: opt("seed", &self.seed)?,
            // The panel does not set webhook faults or scope faults to operations.
            ..defaults
        })
    }
}

/// `POST /admin/gateway/faults`: set the faults, or clear them all (`action=clear`).
async fn set_faults(
    State(state): State<AppState>,
    operator: Operator,
    Form(form): Form<FaultsForm>,
) -> Result<Response, WebError> {
    let faults = if form.action == "clear" { Ok(Faults::default()) } else { form.faults() };
    let message = match faults {
        Err(problem) => Flash::error(format!("Faults not changed: {problem}.")),
        Ok(faults) => match state.web.simulator.set_faults(&faults).await {
            Ok(_) => {
                tracing::info!(operator = operator.name, ?faults, "gateway faults changed");
                if faults == Faults::default() {
                    Flash::success("All faults cleared: the simulator behaves normally.")
                } else {
                    Flash::success("Faults updated: the next gateway calls will feel them.")
                }
            }
            Err(SimulatorError::Refused(message)) => {
                Flash::error(format!("The simulator refused the faults: {message}"))
            }
            Err(err) => Flash::error(format!("Faults not changed: {err}.")),
        },
    };
    operator.flash(message).await?;
    Ok(Redirect::to("/admin/gateway").into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> FaultsForm {
        let body: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
        serde_urlencoded::from_str(&body).unwrap()
    }

    /// Empty fields mean "not set"; typos are reported by field.
    #[test]
    fn faults_form_parses() {
        let faults = form(&[("latency_ms", "250"), ("fail_rate", "0.5"), ("next_calls", "")]).faults().unwrap();
        assert_eq!(faults, Faults { latency_ms: 250, fail_rate: 0.5, ..Faults::default() });
        let err = form(&[("latency_ms", "fast")]).faults().unwrap_err();
        assert!(err.contains("latency_ms"), "{err}");
    }
}
