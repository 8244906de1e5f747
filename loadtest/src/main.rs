//! payonce-loadtest: drives payonce servers with double submits, retry storms, mixed traffic,
//! refund storms or capture storms, then audits the Stripe simulator's ledger: however the
//! requests raced, every key must be charged at most once, every payment a client was told
//! succeeded must have been charged, no payment refunded beyond what it charged, and no
//! authorization settled (captured or canceled) more than once.
//!
//! # Layout
//!
//! ```text
//! cli          the command line: targets, scenario, budget, knobs
//! client       the payonce API as a client sees it: one POST /v1/payments → an Answer
//! scenario     the shared run (budget, stats, what the clients believe) and one module per scenario:
//!   double_submit  one key, N requests released together by a barrier, over every target
//!   retry_storm    short client timeouts, retries with the same key, Retry-After and jittered backoff
//!   mixed          new keys, replays and reused keys with another payload (70/25/5)
//!   refund_storm   a few payments, then many keys × duplicates refunding overlapping parts of them
//!   capture_storm  authorizations, each then captured and canceled by many keys × duplicates at once
//!   failover       keys kept until final while the database fails over, then replayed byte for byte
//! stats        counts by answer, unexpected answers, latency percentiles
//! simulator    the simulator's control routes: faults, the charge and refund ledgers
//! audit        the ledger grouped by (customer, key), compared with what the clients believe
//! refund_audit refund-storm: the refund ledger against the answers and payonce's payments
//! capture_audit capture-storm: the answers, payonce's payments and the ledger, per authorization
//! progress     the live progress line on stderr
//! report       the summary table and its JSON form
//! ```
//!
//! # Data flow
//!
//! ```text
//! cli ─► set faults ─► workers ──► client ──► payonce servers ──► simulator (ledger)
//!                        │            └─► stats (+ progress line)       │
//!                        └─► what the clients believe ─► audit ◄────────┘ ─► report, exit code
//! ```

mod audit;
mod capture_audit;
mod cli;
mod client;
mod progress;
mod refund_audit;
mod report;
mod scenario;
mod simulator;
mod stats;

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;

use crate::audit::Audit;
use crate::capture_audit::CaptureAudit;
use crate::cli::{Cli, ScenarioName};
use crate::client::Api;
use crate::progress::Progress;
use crate::refund_audit::RefundAudit;
use crate::report::Report;
use crate::scenario::Run;
use crate::simulator::{Charge, Simulator};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("payonce-loadtest: {err}");
            ExitCode::from(2)
        }
    }
}

/// Runs the scenario, audits, reports. `Ok(false)` when the run found a problem.
async fn run(cli: Cli) -> Result<bool, String> {
    let settings = cli.settings()?;
    let http = client::http_client()?;
    let simulator = Simulator::new(http.clone(), &cli.sim_url);
    let faults = cli.faults()?;
    if let Some(faults) = &faults {
        simulator.set_faults(faults).await?;
    }

    let api = Api::new(http, cli.targets.clone(), cli.api_key.clone(), cli.strategy.as_deref());
    let run = Arc::new(Run::new(cli.scenario, api, settings));
    let stop = run.clone();
    let ctrl_c = tokio::spawn(async move {
        // Ctrl-C stops starting new operations; those in flight finish, then the audit runs.
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.budget.stop();
        }
    });
    let progress = cli.show_progress().then(|| Progress::start(run.clone()));
    let started = Instant::now();
    let ran = scenario::run(run.clone()).await;
    let elapsed = started.elapsed();
    if let Some(progress) = progress {
        progress.stop().await;
    }
    ctrl_c.abort();

    if faults.is_some() {
        simulator.clear_faults().await?;
    }
    ran?;
    if cli.inject_double_capture {
        inject_double_capture(&run, &simulator).await?;
    }
    let charges = simulator.charges().await?;
    let audit = Audit::new(&run.run_id, &charges, &run.believed());
    let refund_audit = match cli.scenario {
        ScenarioName::RefundStorm => Some(audit_refunds(&run, &simulator).await?),
        _ => None,
    };
    let capture_audit = match cli.scenario {
        ScenarioName::CaptureStorm => Some(audit_captures(&run, &charges).await?),
        _ => None,
    };
    let report = Report::new(&cli, &run, elapsed, audit, refund_audit, capture_audit);
    let text = if cli.json {
        serde_json::to_string_pretty(&report).map_err(|err| err.to_string())? + "\n"
    } else {
        report.to_string()
    };
    // A reader that went away (`| head`) is not a failed run.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(format!("cannot print the report: {err}"));
        }
        _ => {}
    }
    Ok(report.passed())
}

/// refund-storm's audit: the refund ledger, and payonce's view of each payment now.
async fn audit_refunds(run: &Run, simulator: &Simulator) -> Result<RefundAudit, String> {
    let ledger = simulator.refunds().await?;
    let paid = run.refundable();
    let mut amount_refunded = HashMap::with_capacity(paid.len());
    for payment in paid {
        let shown = run.api.payment(&payment.id).await?;
        if let Some(amount) = shown["amount_refunded"].as_i64() {
            amount_refunded.insert(payment.id.clone(), amount);
        }
    }
    Ok(RefundAudit::new(&run.run_id, paid, &run.refund_keys(), &ledger, &amount_refunded))
}

/// capture-storm's audit: the storms' answers, payonce's view of each payment now (its database,
/// through `GET /v1/payments/{id}`), and the ledger.
async fn audit_captures(run: &Arc<Run>, charges: &[Charge]) -> Result<CaptureAudit, String> {
    let authorized = run.authorized();
    let mut shown = HashMap::with_capacity(authorized.len());
    // A few look-ups at a time: a long storm authorizes thousands of payments.
    for chunk in authorized.chunks(16) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|paid| {
                let (run, id) = (run.clone(), paid.id.clone());
                tokio::spawn(async move { run.api.payment(&id).await })
            })
            .collect();
        for task in tasks {
            let payment = task.await.map_err(|err| format!("a look-up failed: {err}"))??;
            // A payment payonce shows in a shape the runner cannot read is one it disagrees on.
            if let Ok(payment) = serde_json::from_value::<client::Payment>(payment) {
                shown.insert(payment.id.clone(), payment);
            }
        }
    }
    Ok(CaptureAudit::new(&run.run_id, authorized, &run.storms(), charges, &shown))
}

/// The self-test of `--inject-double-capture`: one captured payment's authorization charged a
/// second time at the simulator, under its metadata, so that the audit that follows must fail.
/// When no capture won a storm, an authorization is charged twice instead: two movements of money
/// for one authorization either way.
async fn inject_double_capture(run: &Run, simulator: &Simulator) -> Result<(), String> {
    let believed = run.believed();
    let paid = run
        .authorized()
        .iter()
        .find(|paid| believed.contains_key(&paid.key))
        .or_else(|| run.authorized().first())
        .ok_or("--inject-double-capture: no payment was authorized")?;
    let charges = simulator.charges().await?;
    let captured = charges.iter().find(|charge| charge.payment_intent == paid.payment_intent);
    let metadata = captured.map(|charge| charge.metadata.clone()).unwrap_or_else(|| {
        [("payonce_idempotency_key", &paid.key), ("payonce_payment", &paid.id)]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.clone()))
            .collect()
    });
    let amount = captured.map_or(paid.amount, |charge| charge.amount);
    for _ in 0..if captured.is_some() { 1 } else { 2 } {
        let intent = simulator.charge_behind_payonce("sk_test_loadtest_selftest", amount, &metadata).await?;
        eprintln!(
            "payonce-loadtest: self-test: {} ({}) charged {amount} again at the simulator, behind payonce, as {intent}",
            paid.id, paid.payment_intent
        );
    }
    Ok(())
}
