//! `payonce batch charge FILE.csv`: a bulk charge client of payonce's own HTTP API that can be
//! run again, after any crash, without charging anyone twice (docs/batch.md).
//!
//! ```text
//! file      the CSV, read and validated whole before the first request (line numbers, exit 2)
//! key       the batch id (the file's content hash by default) and each row's Idempotency-Key
//! runner    the workers: one POST /v1/payments per row, retried with the same key until final
//!   answer  what each HTTP answer means for a row: final outcome, retry, or stop the run
//! follow    the rows answered 202, followed (GET /v1/payments/{id}) until final or --wait-timeout
//! progress  the bar (or plain lines) on stderr while it runs
//! summary   the counts, the rows that need attention, and the exit code
//! results   --out: one line per row, written whole at the end
//! ```
//!
//! The order of a run: read and validate the file, derive the batch id, open the results file,
//! check the API (one GET), send the rows, follow the pending payments, write the results, print
//! the summary. Nothing is sent before the whole file is known to be valid.

pub mod answer;
pub mod file;
pub mod follow;
pub mod key;
pub mod progress;
pub mod results;
pub mod runner;
pub mod summary;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};

use self::key::BatchId;
use self::progress::Progress;
use self::results::ResultsFile;
use self::runner::{Runner, Settings, StartError, Stop};
use self::summary::{EXIT_CODES, Exit, Summary};

/// `payonce batch …`.
#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// Charge every row of a CSV file through the API, each exactly once however often the
    /// batch is run (a re-run after a crash replays what was done and finishes the rest).
    #[command(after_help = EXIT_CODES)]
    Charge(ChargeArgs),
}

#[derive(Debug, Args)]
pub struct ChargeArgs {
    /// The batch: a CSV file with a header and the columns row_id, amount (minor units),
    /// currency, payment_method, and optionally description, in any order.
    file: PathBuf,

    /// payonce's API.
    #[arg(long, env = "PAYONCE_API_URL", default_value = "http://127.0.0.1:3000")]
    api_url: String,

    /// The customer's API key (`po_…`, from `payonce customers create`).
    #[arg(long, env = "PAYONCE_API_KEY", hide_env_values = true)]
    api_key: String,

    /// Rows sent at once.
    #[arg(long, env = "PAYONCE_BATCH_CONCURRENCY", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    concurrency: u64,

    /// Write one line per row (row_id, key, HTTP status, payment id, payment status, replayed,
    /// outcome, detail) to this CSV file.
    #[arg(long)]
    out: Option<PathBuf>,

    /// The batch's id, part of every row's key. Default: the first 16 hex digits of the file's
    /// SHA-256, so that the same file is the same batch. Give the first run's id to resume it
    /// from an edited file.
    #[arg(long, value_parser = BatchId::parse)]
    batch_id: Option<BatchId>,

    /// Count declined rows as failures (exit 1).
    #[arg(long)]
    fail_on_decline: bool,

    /// Give a row up (unresolved: a re-run resumes it) when it has no final answer this many
    /// seconds after its first attempt.
    #[arg(long, env = "PAYONCE_BATCH_GIVE_UP_AFTER_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    give_up_after_secs: u64,

    /// Follow each payment answered 202 (a bank debit processing, a card awaiting 3-D Secure)
    /// with GET /v1/payments/{id} for at most this many seconds once every row is sent, until it
    /// succeeds or fails; one still pending then is reported as pending (exit 4).
    #[arg(long, value_name = "SECS", env = "PAYONCE_BATCH_WAIT_TIMEOUT_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    wait_timeout: u64,

    /// Do not follow the payments answered 202: report them as pending (exit 4) at once. Wins
    /// over --wait-timeout.
    #[arg(long)]
    no_wait: bool,

    /// Validate the file and print the batch id; send nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Runs a `payonce batch` command to its exit code.
pub async fn main(command: BatchCommand) -> ExitCode {
    match command {
        BatchCommand::Charge(args) => charge(args).await.into(),
    }
}

/// The longest one request may take: payonce answers within its gateway timeout (30 s by
/// default) plus its own statements; past this the attempt is retried with the same key.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(65);

async fn charge(args: ChargeArgs) -> Exit {
    let name = args.file.display();
    let bytes = match std::fs::read(&args.file) {
        Ok(bytes) => bytes,
        Err(err) => {
            eprintln!("payonce batch: cannot read {name}: {err}");
            return Exit::Invalid;
        }
    };
    let batch = args.batch_id.clone().unwrap_or_else(|| BatchId::from_content(&bytes));
    let rows: Arc<[file::Row]> = match file::parse(&bytes, &batch) {
        Ok(rows) => rows.into(),
        Err(problems) => {
            eprintln!("payonce batch: {name} is not a valid batch file; nothing was sent:");
            for problem in problems.iter().take(100) {
                eprintln!("  {name}:{problem}");
            }
            if problems.len() > 100 {
                eprintln!("  … and {} more", problems.len() - 100);
            }
            return Exit::Invalid;
        }
    };
    drop(bytes);
    eprintln!(
        "payonce batch: {name}: {} rows, batch {batch} (keys batch:{batch}:<row_id>){}",
        rows.len(),
        if args.batch_id.is_some() { "" } else { ", the file's content hash" }
    );
    if args.dry_run {
        println!("{batch}");
        return Exit::Ok;
    }
    let out = match args.out.as_deref().map(ResultsFile::create).transpose() {
        Ok(out) => out,
        Err(err) => {
            eprintln!("payonce batch: cannot write the results file: {err}");
            return Exit::Invalid;
        }
    };

    let settings = Settings {
        api_url: args.api_url.clone(),
        api_key: args.api_key.clone(),
        concurrency: args.concurrency as usize,
        give_up_after: Duration::from_secs(args.give_up_after_secs),
        request_timeout: REQUEST_TIMEOUT,
    };
    let started = match Runner::new(settings) {
        Ok(runner) => runner.preflight().await.map(|()| runner),
        Err(err) => Err(err),
    };
    let runner = match started {
        Ok(runner) => Arc::new(runner),
        Err(err) => {
            eprintln!("payonce batch: {err}; nothing was sent");
            if let Some(out) = out {
                out.discard();
            }
            return match err {
                StartError::Config(_) => Exit::Invalid,
                StartError::Unusable { .. } => Exit::Stopped,
            };
        }
    };

    let stop = Stop::default();
    let signals = tokio::spawn(stop_on_signals(stop.clone()));
    let progress = Progress::new(rows.len());
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let shown = tokio::spawn(progress.clone().show(async {
        let _ = finished.await;
    }));
    let mut results = runner.clone().run(&batch, rows.clone(), progress.clone(), stop.clone()).await;
    let _ = done.send(());
    let _ = shown.await;
    // Every row was sent unless the run stopped. A signal while following only ends the wait:
    // the rows still pending are reported as such, not as a run that stopped before its end.
    let stopped = stop.reason();
    if !args.no_wait && stopped.is_none() {
        let wait = Duration::from_secs(args.wait_timeout);
        follow::follow(&runner, &mut results, wait, args.concurrency as usize, &stop).await;
    }
    signals.abort();

    let summary = Summary {
        batch: &batch,
        rows: &rows,
        results: &results,
        elapsed: progress.elapsed(),
        fail_on_decline: args.fail_on_decline,
        stopped,
    };
    let mut exit = summary.exit();
    if let Some(out) = out {
        let path = args.out.as_deref().unwrap_or(std::path::Path::new("")).display();
        match out.write(&batch, &rows, &results) {
            Ok(()) => eprintln!("payonce batch: results written to {path}"),
            Err(err) => {
                eprintln!("payonce batch: cannot write the results to {path}: {err}");
                if exit == Exit::Ok {
                    exit = Exit::RowsFailed;
                }
            }
        }
    }
    print!("{}", summary.render());
    exit
}

/// SIGINT or SIGTERM: take no new row, let the rows in flight get their answer, then report.
/// A second signal ends the process at once (the re-run is as safe either way).
async fn stop_on_signals(stop: Stop) {
    for n in 0.. {
        signal().await;
        if n > 0 {
            eprintln!("payonce batch: stopped at once; run the batch again to finish it");
            std::process::exit(130);
        }
        eprintln!(
            "payonce batch: stopping: no new rows, no more following; waiting for the requests in flight (again to quit now)"
        );
        stop.request("interrupted: run the batch again to finish it");
    }
}

/// The next SIGINT or SIGTERM.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            _ => std::future::pending().await,
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
