//! `/admin/lab`: the claim-strategy lab for a class (docs/strategies.md). Pick a strategy (or all
//! four), the keys, the duplicates per key, the gateway's latency and one or two servers; Run
//! fires every request at the same instant and shows what happened: charges per key (double
//! charges in red, with their keys), the answers (201 / 409 / 422 / 5xx), p99, and the timeline
//! of one raced key (who won, what the losers got). Runs are stored in `lab_runs` and listed, so a
//! class can compare them. Only in lab mode (`payonce serve --lab`), with the simulator as gateway
//! (its ledger is the ground truth).
//!
//! A run is driven inside this process, through the same `idempotent::execute_with` as
//! `/lab/{strategy}/v1/payments`. "Two servers" is a second, independent stack in this process on
//! the same database: its own connection pool, engine (replay cache, lease owner name) and Redis
//! connection, which is everything two payonce processes do not share. For two real processes,
//! use `loadtest/strategies.sh`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Barrier;
use uuid::Uuid;

use super::{Chrome, Operator};
use crate::http::idempotent;
use crate::idempotency::{Engine, EventLog, IdempotencyKey};
use crate::lab::Claims;
use crate::lab::{Lab, Strategy};
use crate::operations::Op;
use crate::payments::CreatePayment;
use crate::simulator::Faults;
use crate::state::AppState;
use crate::web::flash::Flash;
use crate::web::format::{self, filters};
use crate::web::page::{self, WebError};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/lab", get(show))
        .route("/admin/lab/runs", post(start))
        .route("/admin/lab/runs/{id}", get(run_page))
}

/// The most requests one run may fire at once.
const MAX_REQUESTS: u32 = 2000;
/// Runs listed on the Lab page.
const LISTED: i64 = 20;
/// Rows of "charges per key" shown per strategy (every double charge is shown).
const KEYS_SHOWN: usize = 20;

/// What a run was asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Params {
    /// A strategy's name, or `all`.
    strategy: String,
    keys: u32,
    duplicates: u32,
    latency_ms: u64,
    servers: u8,
}

impl Params {
    fn strategies(&self) -> Vec<Strategy> {
        Strategy::parse(&self.strategy).map_or_else(|| Strategy::ALL.to_vec(), |s| vec![s])
    }

    /// The gateway's latency, as the pages write durations.
    fn latency(&self) -> String {
        format::ms(self.latency_ms as f64)
    }
}

/// The Run form; numbers arrive as text so that a typo is reported, not a 422 from axum.
#[derive(Deserialize)]
struct RunForm {
    #[serde(default)]
    strategy: String,
    #[serde(default)]
    keys: String,
    #[serde(default)]
    duplicates: String,
    #[serde(default)]
    latency_ms: String,
    #[serde(default)]
    servers: String,
}

impl RunForm {
    fn params(&self) -> Result<Params, String> {
        fn number<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
            field: &str,
            value: &str,
            min: T,
            max: T,
        ) -> Result<T, String> {
            match value.trim().parse::<T>() {
                Ok(n) if n >= min && n <= max => Ok(n),
                _ => Err(format!("{field} must be a number from {min} to {max}")),
            }
        }
        let strategy = self.strategy.trim();
        if strategy != "all" && Strategy::parse(strategy).is_none() {
            return Err(format!("{strategy:?} is not a strategy"));
        }
        let params = Params {
            strategy: strategy.to_owned(),
            keys: number("keys", &self.keys, 1, 200)?,
            duplicates: number("duplicates per key", &self.duplicates, 2, 50)?,
            latency_ms: number("gateway latency", &self.latency_ms, 0, 5000)?,
            servers: number("servers", &self.servers, 1, 2)?,
        };
        if params.keys * params.duplicates > MAX_REQUESTS {
            return Err(format!("keys × duplicates may be at most {MAX_REQUESTS}"));
        }
        Ok(params)
    }
}

/// One strategy's part of a run's result, as stored in `lab_runs.result`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StrategyResult {
    strategy: String,
    requests: usize,
    /// Fresh 201s: the requests that did the work.
    created: usize,
    replayed: usize,
    conflict: usize,
    reused: usize,
    server_errors: usize,
    other: usize,
    p99_ms: f64,
    elapsed_ms: f64,
    /// Charges in the ledger for the run's keys under this strategy.
    charges: usize,
    keys: usize,
    double_charged: Vec<KeyCharges>,
    charges_per_key: Vec<KeyCharges>,
    /// The raced key whose timeline is shown (the first double-charged one, else the first).
    timeline_key: String,
    timeline: Vec<Step>,
}

impl StrategyResult {
    fn safe(&self) -> bool {
        self.double_charged.is_empty()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct KeyCharges {
    key: String,
    charges: usize,
}

/// One request of the raced key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    server: u8,
    start_ms: f64,
    end_ms: f64,
    status: u16,
    replayed: bool,
    /// The PaymentIntent a 201 named: two different ones for one key are a double charge.
    payment_intent: Option<String>,
}

impl Step {
    fn answer(&self) -> String {
        match (self.status, self.replayed) {
            (201, false) => "201 created: did the work".into(),
            (201, true) => "201 replayed".into(),
            (409, _) => "409 in flight".into(),
            (422, _) => "422 key reused".into(),
            (status, _) => status.to_string(),
        }
    }
}

#[derive(Template)]
#[template(path = "admin/lab.html")]
struct LabPage {
    chrome: Chrome,
    enabled: bool,
    simulator: bool,
    strategies: Vec<&'static str>,
    runs: Vec<RunRow>,
}

struct RunRow {
    id: Uuid,
    started_at: String,
    started_by: String,
    params: String,
    state: String,
    double_charged: usize,
}

#[derive(Template)]
#[template(path = "admin/lab_run.html")]
struct RunPage {
    chrome: Chrome,
    id: Uuid,
    state: String,
    error: Option<String>,
    params: Params,
    started_at: String,
    results: Vec<StrategyResult>,
}

/// `GET /admin/lab`: the form and the runs.
async fn show(State(state): State<AppState>, operator: Operator) -> Result<Response, WebError> {
    let rows = sqlx::query!(
        r#"
        select id, started_by, params, state, result, started_at
        from lab_runs order by id desc limit $1
        "#,
        LISTED,
    )
    .fetch_all(state.engine.pool())
    .await?;
    let runs = rows
        .into_iter()
        .map(|r| {
            let results: Vec<StrategyResult> =
                r.result.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default();
            RunRow {
                id: r.id,
                started_at: crate::web::clock(r.started_at),
                started_by: r.started_by,
                params: serde_json::from_value::<Params>(r.params).map(|p| describe(&p)).unwrap_or_default(),
                state: r.state,
                double_charged: results.iter().map(|s| s.double_charged.len()).sum(),
            }
        })
        .collect();
    let page = LabPage {
        enabled: state.lab.is_lab(),
        simulator: state.web.simulator.is_active().await,
        strategies: Strategy::ALL.iter().map(|s| s.as_str()).collect(),
        runs,
        chrome: operator.chrome(&state, "lab").await?,
    };
    page::render(StatusCode::OK, &page)
}

fn describe(p: &Params) -> String {
    format!(
        "{}: {} keys × {} at once, gateway {}, {} server{}",
        p.strategy,
        format::count(p.keys),
        format::count(p.duplicates),
        p.latency(),
        p.servers,
        if p.servers == 1 { "" } else { "s" }
    )
}

/// `POST /admin/lab/runs`: store the run, start it, show it.
async fn start(
    State(state): State<AppState>,
    operator: Operator,
    Form(form): Form<RunForm>,
) -> Result<Response, WebError> {
    let refused = if !state.lab.is_lab() {
        Some("the Lab runs only on a server in lab mode (payonce serve --lab)".to_owned())
    } else if !state.web.simulator.is_active().await {
        Some("the Lab needs the simulator as gateway: its ledger is what proves a double charge".to_owned())
    } else {
        None
    };
    let params = match refused.map_or_else(|| form.params(), Err) {
        Ok(params) => params,
        Err(why) => {
            operator.flash(Flash::error(format!("Run not started: {why}."))).await?;
            return Ok(Redirect::to("/admin/lab").into_response());
        }
    };
    let id = Uuid::now_v7();
    sqlx::query!(
        "insert into lab_runs (id, started_by, params) values ($1, $2, $3)",
        id,
        operator.name,
        serde_json::to_value(&params).unwrap_or_default(),
    )
    .execute(state.engine.pool())
    .await?;
    tracing::info!(operator = operator.name, run = %id, params = describe(&params), "lab run started");
    tokio::spawn(drive(state, id, params));
    Ok(Redirect::to(&format!("/admin/lab/runs/{id}")).into_response())
}

/// `GET /admin/lab/runs/{id}`: a run, live while it runs.
async fn run_page(
    State(state): State<AppState>,
    operator: Operator,
    Path(id): Path<String>,
) -> Result<Response, WebError> {
    let id = Uuid::try_parse(&id).map_err(|_| WebError::NotFound)?;
    let run = sqlx::query!("select params, state, result, error, started_at from lab_runs where id = $1", id)
        .fetch_optional(state.engine.pool())
        .await?
        .ok_or(WebError::NotFound)?;
    let page = RunPage {
        id,
        state: run.state,
        error: run.error,
        params: serde_json::from_value(run.params).map_err(|err| WebError::Internal(err.to_string()))?,
        started_at: crate::web::clock(run.started_at),
        results: run.result.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default(),
        chrome: operator.chrome(&state, "lab").await?,
    };
    page::render(StatusCode::OK, &page)
}

/// Runs a stored run to its end and records how it ended.
async fn drive(state: AppState, id: Uuid, params: Params) {
    let pool = state.engine.pool().clone();
    let (run_state, error) = match run(&state, id, &params).await {
        Ok(()) => ("finished", None),
        Err(err) => {
            tracing::warn!(run = %id, error = %err, "lab run failed");
            ("failed", Some(err))
        }
    };
    let stored = sqlx::query!(
        "update lab_runs set state = $2, error = $3, finished_at = now() where id = $1",
        id,
        run_state,
        error,
    )
    .execute(&pool)
    .await;
    if let Err(err) = stored {
        tracing::warn!(run = %id, error = %err, "could not record the end of a lab run");
    }
}

async fn run(state: &AppState, id: Uuid, params: &Params) -> Result<(), String> {
    let pool = state.engine.pool();
    let customer_id = lab_customer(pool).await.map_err(|err| format!("no lab customer: {err}"))?;
    let mut servers = vec![state.clone()];
    if params.servers == 2 {
        servers.push(second_server(state));
    }
    let sim = &state.web.simulator;
    let before = sim.faults().await.map_err(|err| err.to_string())?;
    sim.set_faults(&Faults { latency_ms: params.latency_ms, ..Faults::default() })
        .await
        .map_err(|err| err.to_string())?;
    let tag = id.simple().to_string()[24..].to_owned();
    let mut results = Vec::new();
    let mut outcome = Ok(());
    for strategy in params.strategies() {
        match storm(&servers, strategy, customer_id, &tag, params).await {
            Ok(result) => results.push(result),
            Err(err) => {
                outcome = Err(err);
                break;
            }
        }
        // Live: the page shows each strategy as soon as it is done.
        let stored =
            sqlx::query!("update lab_runs set result = $2 where id = $1", id, json!(results)).execute(pool).await;
        if let Err(err) = stored {
            outcome = Err(err.to_string());
            break;
        }
    }
    let _ = sim.set_faults(&before).await;
    if servers.len() == 2 {
        servers[1].engine.pool().close().await;
    }
    outcome
}

/// The customer the dashboard's runs pay as.
async fn lab_customer(pool: &sqlx::PgPool) -> Result<Uuid, String> {
    let found = sqlx::query_scalar!("select id from customers where name = 'lab' order by created_at limit 1")
        .fetch_optional(pool)
        .await
        .map_err(|err| err.to_string())?;
    match found {
        Some(id) => Ok(id),
        None => crate::customers::create(pool, "lab").await.map(|(c, _)| c.id).map_err(|err| err.to_string()),
    }
}

/// A second stack on the same database: its own pool, engine and lab (Redis connection).
fn second_server(state: &AppState) -> AppState {
    let pool = state.engine.pool();
    let second = sqlx::postgres::PgPoolOptions::new()
        .max_connections(pool.options().get_max_connections())
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone());
    let (events, _writer) = EventLog::spawn(second.clone());
    let mut other = state.services();
    other.engine = Engine::new(second, state.engine.settings(), events);
    other.lab = Arc::new(Lab::new(state.lab.settings().clone()));
    other.owner = Arc::from(format!("{}:lab-second", state.owner));
    AppState::new(other)
}

/// Every request of one strategy released at the same instant; the answers, then the ledger.
async fn storm(
    servers: &[AppState],
    strategy: Strategy,
    customer_id: Uuid,
    tag: &str,
    params: &Params,
) -> Result<StrategyResult, String> {
    let body: CreatePayment =
        serde_json::from_value(json!({"amount": 4200, "currency": "usd", "payment_method": "pm_card_visa"}))
            .map_err(|err| err.to_string())?;
    let request = body.validate().map_err(|_| "the lab's payment does not validate".to_owned())?;
    let prefix = format!("lab-{tag}-{strategy}-");
    let keys: Vec<String> = (0..params.keys).map(|n| format!("{prefix}{n}")).collect();
    let total = (params.keys * params.duplicates) as usize;
    let barrier = Arc::new(Barrier::new(total));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for (n, key) in keys.iter().enumerate() {
        for d in 0..params.duplicates as usize {
            let server = (n * params.duplicates as usize + d) % servers.len();
            let state = servers[server].clone();
            let key = IdempotencyKey::new(key.clone()).map_err(|err| err.to_string())?;
            let op = idempotent::operation(Op::Payment, customer_id, key, &request).map_err(|err| err.to_string())?;
            let barrier = barrier.clone();
            tasks.push((
                n,
                tokio::spawn(async move {
                    barrier.wait().await;
                    let start = started.elapsed();
                    let outcome = idempotent::execute_with(&state, Claims::of(strategy), Op::Payment, op).await;
                    let (status, replayed, body) = match outcome {
                        Ok(answer) => (answer.stored.status.as_u16(), answer.replayed, Some(answer.stored.body)),
                        Err(err) => (err.into_response().status().as_u16(), false, None),
                    };
                    let payment_intent = body
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                        .and_then(|v| v["payment_intent"].as_str().map(str::to_owned));
                    Step {
                        server: server as u8 + 1,
                        start_ms: ms(start),
                        end_ms: ms(started.elapsed()),
                        status,
                        replayed,
                        payment_intent,
                    }
                }),
            ));
        }
    }
    let mut steps: Vec<(usize, Step)> = Vec::with_capacity(total);
    for (n, task) in tasks {
        steps.push((n, task.await.map_err(|err| format!("a request task failed: {err}"))?));
    }
    let elapsed = started.elapsed();

    let ledger = servers[0].web.simulator.charges().await.map_err(|err| err.to_string())?;
    let mut per_key: Vec<KeyCharges> = keys.iter().map(|k| KeyCharges { key: k.clone(), charges: 0 }).collect();
    let mut charges = 0;
    for charge in ledger.charges.iter() {
        let Some(key) = charge.metadata.get("payonce_idempotency_key") else { continue };
        if let Some(n) = key.strip_prefix(&prefix).and_then(|n| n.parse::<usize>().ok())
            && let Some(slot) = per_key.get_mut(n)
        {
            slot.charges += 1;
            charges += 1;
        }
    }
    let double_charged: Vec<KeyCharges> = per_key.iter().filter(|k| k.charges > 1).cloned().collect();
    let raced = double_charged.first().map_or(0, |k| k.key[prefix.len()..].parse().unwrap_or(0));
    let mut timeline: Vec<Step> = steps.iter().filter(|(n, _)| *n == raced).map(|(_, s)| s.clone()).collect();
    timeline.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    let mut latencies: Vec<f64> = steps.iter().map(|(_, s)| s.end_ms - s.start_ms).collect();
    latencies.sort_by(f64::total_cmp);
    let count = |f: &dyn Fn(&Step) -> bool| steps.iter().filter(|(_, s)| f(s)).count();
    Ok(StrategyResult {
        strategy: strategy.as_str().to_owned(),
        requests: total,
        created: count(&|s| s.status == 201 && !s.replayed),
        replayed: count(&|s| s.status == 201 && s.replayed),
        conflict: count(&|s| s.status == 409),
        reused: count(&|s| s.status == 422),
        server_errors: count(&|s| s.status >= 500),
        other: count(&|s| ![201, 409, 422].contains(&s.status) && s.status < 500),
        p99_ms: percentile(&latencies, 0.99),
        elapsed_ms: ms(elapsed),
        charges,
        keys: keys.len(),
        double_charged,
        charges_per_key: per_key.into_iter().take(KEYS_SHOWN).collect(),
        timeline_key: keys[raced].clone(),
        timeline,
    })
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> RunForm {
        let body: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
        serde_urlencoded::from_str(&body).unwrap()
    }

    /// The form's bounds, and typos reported by field.
    #[test]
    fn run_form_parses() {
        let ok = [("strategy", "all"), ("keys", "10"), ("duplicates", "5"), ("latency_ms", "200"), ("servers", "2")];
        let params = form(&ok).params().unwrap();
        assert_eq!(params.strategies().len(), 4);
        assert_eq!(params.servers, 2);
        let one =
            form(&[("strategy", "redis"), ("keys", "1"), ("duplicates", "2"), ("latency_ms", "0"), ("servers", "1")]);
        assert_eq!(one.params().unwrap().strategies(), vec![Strategy::Redis]);
        for (field, value) in
            [("keys", "0"), ("duplicates", "1"), ("servers", "3"), ("latency_ms", "fast"), ("strategy", "optimistic")]
        {
            let mut pairs = ok.to_vec();
            pairs.retain(|(f, _)| *f != field);
            pairs.push((field, value));
            assert!(form(&pairs).params().is_err(), "{field}={value}");
        }
        let too_many =
            [("strategy", "all"), ("keys", "200"), ("duplicates", "50"), ("latency_ms", "0"), ("servers", "1")];
        assert!(form(&too_many).params().unwrap_err().contains("at most"));
    }

    /// A run's page writes its times with one decimal at most, whatever float noise the
    /// subtraction that made them left (it once printed `326.09999999999997 ms`), and its counts
    /// with thousands separators.
    #[test]
    fn run_page_rounds_its_times() {
        let step = Step {
            server: 1,
            start_ms: 0.7,
            end_ms: 326.799_999_999_999_95,
            status: 201,
            replayed: false,
            payment_intent: None,
        };
        let result = StrategyResult {
            strategy: "on-conflict".into(),
            requests: 2000,
            created: 1000,
            replayed: 0,
            conflict: 1000,
            reused: 0,
            server_errors: 0,
            other: 0,
            p99_ms: 326.099_999_999_999_97,
            elapsed_ms: 1234.56,
            charges: 1000,
            keys: 1000,
            double_charged: Vec::new(),
            charges_per_key: Vec::new(),
            timeline_key: "k".into(),
            timeline: vec![step],
        };
        let page = RunPage {
            chrome: Chrome {
                operator: "alice".into(),
                csrf: String::new(),
                flashes: Vec::new(),
                current: "lab",
                simulator: true,
                htmx: "",
                refusal: None,
                strategy: None,
                replica: None,
            },
            id: Uuid::nil(),
            state: "finished".into(),
            error: None,
            params: Params { strategy: "on-conflict".into(), keys: 1000, duplicates: 2, latency_ms: 200, servers: 1 },
            started_at: "12:00:00".into(),
            results: vec![result],
        };
        let html = page.render().unwrap();
        for shown in ["326.1 ms", "326.8 ms", "0.7 ms", "1,234.6 ms", "gateway 200 ms", "1,000 for 1,000 keys"] {
            assert!(html.contains(shown), "{shown:?}:\n{html}");
        }
        assert!(!html.contains("326.09") && !html.contains("326.79"), "{html}");
    }

    #[test]
    fn percentiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&values, 1.0), 100.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
    }
}
