//! payonce-loadtest: drives payonce servers with double submits, retry storms, mixed traffic or
//! refund storms, then audits the Stripe simulator's ledger: however the requests raced, every
//! key must be charged at most once, every payment a client was told succeeded must have been
//! charged, and no payment refunded beyond what it charged.
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
//!   failover       keys kept until final while the database fails over, then replayed byte for byte
//! stats        counts by answer, unexpected answers, latency percentiles
//! simulator    the simulator's control routes: faults, the charge and refund ledgers
//! audit        the ledger grouped by (customer, key), compared with what the clients believe
//! refund_audit refund-storm: the refund ledger against the answers and payonce's payments
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
use crate::cli::{Cli, ScenarioName};
use crate::client::Api;
use crate::progress::Progress;
use crate::refund_audit::RefundAudit;
use crate::report::Report;
use crate::scenario::Run;
use crate::simulator::Simulator;

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
    let charges = simulator.charges().await?;
    let audit = Audit::new(&run.run_id, &charges, &run.believed());
    let refund_audit = match cli.scenario {
        ScenarioName::RefundStorm => Some(audit_refunds(&run, &simulator).await?),
        _ => None,
    };
    let report = Report::new(&cli, &run, elapsed, audit, refund_audit);
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
