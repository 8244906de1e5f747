//! `payonce batch charge`: the real binary against a real server and the simulator. A batch
//! killed with SIGKILL and run again charges every row exactly once (the simulator's ledger says
//! so); two runs at once charge each row once; a bad file sends nothing; a changed row is
//! reported and never charged; declines and pending payments are final answers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::helpers::{Options, TestApp};

/// A server whose 409s say "retry in 1-2 s" (Retry-After is at most the gateway timeout), so
/// that the runs racing each other do not wait long.
async fn app() -> TestApp {
    TestApp::spawn_with(Options { gateway_timeout: Duration::from_secs(2), ..Default::default() }).await
}

/// A scratch folder for one test's files, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("payonce-batch-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A batch file of `rows` rows `r0000`…, each paid with `pm_card_visa`, amount 100 + i.
fn visa_rows(rows: usize) -> String {
    let mut csv = String::from("row_id,amount,currency,payment_method,description\n");
    for i in 0..rows {
        csv.push_str(&format!("r{i:04},{},usd,pm_card_visa,row {i}\n", 100 + i));
    }
    csv
}

/// `payonce batch charge FILE` against `app`, with extra arguments.
fn batch(app: &TestApp, api_key: &str, file: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_payonce"));
    command
        .args(["batch", "charge"])
        .arg(file)
        .args(extra)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PAYONCE_API_URL", format!("http://{}", app.addr))
        .env("PAYONCE_API_KEY", api_key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs it to its end (off the runtime's threads: the server runs on them).
async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run payonce batch")).await.unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The count on the summary line of `outcome` (`  replayed   12   …`).
fn summary_count(output: &Output, outcome: &str) -> usize {
    let text = stdout(output);
    let line = text
        .lines()
        .find(|line| line.split_whitespace().next() == Some(outcome))
        .unwrap_or_else(|| panic!("no {outcome} line in the summary:\n{text}\n{}", stderr(output)));
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a count")
}

/// The results file as (row_id, key, status, payment_id, payment_status, replayed, outcome, detail).
fn results(path: &Path) -> Vec<[String; 8]> {
    let mut reader = csv::Reader::from_path(path).expect("a results file");
    assert_eq!(
        reader.headers().unwrap().iter().collect::<Vec<_>>(),
        ["row_id", "key", "http_status", "payment_id", "payment_status", "replayed", "outcome", "detail"]
    );
    reader
        .records()
        .map(|record| {
            let record = record.unwrap();
            std::array::from_fn(|i| record[i].to_owned())
        })
        .collect()
}

/// The default batch id: the first 16 hex digits of the file's SHA-256.
fn content_batch_id(file: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(file).unwrap()))[..16].to_owned()
}

/// Asserts that each of `rows` rows of `batch_id` was charged exactly once, with its amount, and
/// that nothing else was.
async fn assert_each_row_charged_once(app: &TestApp, batch_id: &str, rows: usize) {
    let charges = app.charges().await;
    let mut per_key = std::collections::BTreeMap::<String, Vec<i64>>::new();
    for charge in &charges {
        let key = charge["metadata"]["payonce_idempotency_key"].as_str().unwrap_or_default().to_owned();
        per_key.entry(key).or_default().push(charge["amount"].as_i64().unwrap());
    }
    for i in 0..rows {
        let key = format!("batch:{batch_id}:r{i:04}");
        assert_eq!(per_key.remove(&key), Some(vec![100 + i as i64]), "row r{i:04}: exactly one charge, of its amount");
    }
    assert!(per_key.is_empty(), "charges of no row: {per_key:?}");
    assert_eq!(app.count("payments").await, rows as i64);
}

/// The nightly job that dies halfway: SIGKILL mid-run, run again, every row charged once, and
/// the second run reports the first run's work as replays.
#[tokio::test]
async fn a_batch_killed_and_run_again_charges_every_row_once() {
    const ROWS: usize = 120;
    let app = app().await;
    let api_key = app.customer("nightly").await;
    let scratch = Scratch::new();
    let file = scratch.write("nightly.csv", &visa_rows(ROWS));
    let batch_id = content_batch_id(&file);
    // A gateway slow enough for the kill to land mid-way.
    app.set_faults(json!({"latency_ms": 40})).await;

    let mut first = batch(&app, &api_key, &file, &["--concurrency", "4"]).spawn().unwrap();
    let started = Instant::now();
    while app.count("payments").await < (ROWS / 3) as i64 {
        assert!(first.try_wait().unwrap().is_none(), "the first run ended before it could be killed");
        assert!(started.elapsed() < Duration::from_secs(60), "the first run makes no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().unwrap(); // SIGKILL: no summary, no results file, nothing flushed
    first.wait().unwrap();
    // The server finishes what was in flight when the client died.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let charged_before = app.charges().await.len();
    assert!((ROWS / 3..ROWS).contains(&charged_before), "killed mid-way: {charged_before} of {ROWS} charged");

    app.set_faults(json!({})).await;
    let out = scratch.path("results.csv");
    let second = run(batch(&app, &api_key, &file, &["--out", out.to_str().unwrap()])).await;
    assert_eq!(second.status.code(), Some(0), "{}\n{}", stdout(&second), stderr(&second));
    assert_each_row_charged_once(&app, &batch_id, ROWS).await;

    let (charged, replayed) = (summary_count(&second, "charged"), summary_count(&second, "replayed"));
    assert_eq!(replayed, charged_before, "the first run's charges come back as replays:\n{}", stdout(&second));
    assert_eq!(charged + replayed, ROWS);
    let lines = results(&out);
    assert_eq!(lines.len(), ROWS);
    for (i, [row_id, key, status, payment_id, payment_status, replayed, outcome, _]) in lines.iter().enumerate() {
        assert_eq!(row_id, &format!("r{i:04}"), "in the file's order");
        assert_eq!(key, &format!("batch:{batch_id}:r{i:04}"));
        assert_eq!((status.as_str(), payment_status.as_str()), ("201", "succeeded"));
        assert!(payment_id.starts_with("pay_"));
        assert_eq!(outcome, if replayed == "true" { "replayed" } else { "charged" });
    }

    // A third run: nothing left to do, all replays, still one charge per row.
    let third = run(batch(&app, &api_key, &file, &[])).await;
    assert_eq!(third.status.code(), Some(0), "{}", stderr(&third));
    assert_eq!((summary_count(&third, "charged"), summary_count(&third, "replayed")), (0, ROWS));
    assert_each_row_charged_once(&app, &batch_id, ROWS).await;
}

/// Two runs of the same file at the same time: one charge per row, and for each row exactly
/// one of the two runs reports it charged.
#[tokio::test]
async fn two_runs_at_once_charge_each_row_once() {
    const ROWS: usize = 60;
    let app = app().await;
    let api_key = app.customer("twice").await;
    let scratch = Scratch::new();
    let file = scratch.write("twice.csv", &visa_rows(ROWS));
    let batch_id = content_batch_id(&file);
    app.set_faults(json!({"latency_ms": 20})).await;

    let (out_a, out_b) = (scratch.path("a.csv"), scratch.path("b.csv"));
    let a = batch(&app, &api_key, &file, &["--out", out_a.to_str().unwrap()]);
    let b = batch(&app, &api_key, &file, &["--out", out_b.to_str().unwrap()]);
    let (a, b) = tokio::join!(run(a), run(b));
    for output in [&a, &b] {
        assert_eq!(output.status.code(), Some(0), "{}\n{}", stdout(output), stderr(output));
    }
    assert_each_row_charged_once(&app, &batch_id, ROWS).await;
    let (a, b) = (results(&out_a), results(&out_b));
    for (row_a, row_b) in a.iter().zip(&b) {
        let outcomes = [row_a[6].as_str(), row_b[6].as_str()];
        assert!(
            outcomes == ["charged", "replayed"] || outcomes == ["replayed", "charged"],
            "row {}: {outcomes:?}",
            row_a[0]
        );
        assert_eq!(row_a[3], row_b[3], "both runs name the same payment");
    }
}

/// A file with bad rows: every problem reported with its line, exit 2, nothing sent.
#[tokio::test]
async fn a_file_with_bad_rows_sends_nothing() {
    let app = app().await;
    let api_key = app.customer("bad").await;
    let scratch = Scratch::new();
    let file = scratch.write(
        "bad.csv",
        "row_id,amount,currency,payment_method\n\
         ok-1,100,usd,pm_card_visa\n\
         ok-2,12.50,usd,pm_card_visa\n\
         ok-3,100,usd,pm_card_visa\n\
         ok-1,100,usd,pm_card_visa\n\
         ok-4,100,dollars,pm_card_visa\n\
         ok-5,-1,usd,pm_card_visa\n",
    );
    let out = scratch.path("results.csv");
    let output = run(batch(&app, &api_key, &file, &["--out", out.to_str().unwrap()])).await;
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let errors = stderr(&output);
    for needle in [
        "bad.csv:line 3: amount \"12.50\"",
        "bad.csv:line 5: row_id \"ok-1\" is already used on line 2",
        "bad.csv:line 6: currency",
        "bad.csv:line 7: amount \"-1\"",
        "nothing was sent",
    ] {
        assert!(errors.contains(needle), "{needle:?} not in:\n{errors}");
    }
    assert!(!out.exists(), "no results file");
    assert_eq!(app.count("idempotency_keys").await, 0, "not one request reached the server");
    assert!(app.charges().await.is_empty());
}

/// A row edited after the batch ran: its key answers 422, it is reported as changed and never
/// charged with the new amount; the others replay.
#[tokio::test]
async fn a_changed_row_is_reported_and_not_charged() {
    let app = app().await;
    let api_key = app.customer("edited").await;
    let scratch = Scratch::new();
    let file = scratch.write("march.csv", &visa_rows(5));
    let first = run(batch(&app, &api_key, &file, &["--batch-id", "march"])).await;
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));

    // Someone "fixes" row r0002's amount and runs the same batch again.
    let edited = visa_rows(5).replace("r0002,102,", "r0002,9999,");
    std::fs::write(&file, edited).unwrap();
    let out = scratch.path("results.csv");
    let second = run(batch(&app, &api_key, &file, &["--batch-id", "march", "--out", out.to_str().unwrap()])).await;
    assert_eq!(second.status.code(), Some(1), "{}\n{}", stdout(&second), stderr(&second));
    assert_eq!((summary_count(&second, "replayed"), summary_count(&second, "changed")), (4, 1));
    assert!(stdout(&second).contains("line 4 row_id \"r0002\": changed"), "{}", stdout(&second));
    let lines = results(&out);
    assert_eq!((lines[2][2].as_str(), lines[2][6].as_str()), ("422", "changed"));
    assert_each_row_charged_once(&app, "march", 5).await;
}

/// Declines are final answers (not failures, or exit 1 with --fail-on-decline), replayed as
/// declines; a pending bank debit not followed (`--no-wait`) is pending: not a failure, not
/// charged again, and not final yet (exit 4).
#[tokio::test]
async fn declines_and_pending_payments_are_final_answers() {
    let app = app().await;
    let api_key = app.customer("mixed").await;
    let scratch = Scratch::new();
    let file = scratch.write(
        "mixed.csv",
        "row_id,amount,currency,payment_method\n\
         paid,100,usd,pm_card_visa\n\
         declined,200,usd,pm_card_chargeDeclinedInsufficientFunds\n\
         debit,300,usd,pm_usBankAccount_success\n",
    );
    let out = scratch.path("results.csv");
    let first = run(batch(&app, &api_key, &file, &["--no-wait", "--out", out.to_str().unwrap()])).await;
    assert_eq!(
        first.status.code(),
        Some(4),
        "declines are reported, not failures; the debit is pending:\n{}",
        stdout(&first)
    );
    assert_eq!(
        [summary_count(&first, "charged"), summary_count(&first, "declined"), summary_count(&first, "pending")],
        [1, 1, 1]
    );
    let lines = results(&out);
    assert_eq!(
        (lines[1][2].as_str(), lines[1][4].as_str(), lines[1][6].as_str(), lines[1][7].as_str()),
        ("402", "failed", "declined", "card_declined/insufficient_funds")
    );
    assert_eq!((lines[2][2].as_str(), lines[2][4].as_str(), lines[2][6].as_str()), ("202", "processing", "pending"));

    let strict = run(batch(&app, &api_key, &file, &["--fail-on-decline", "--no-wait"])).await;
    assert_eq!(strict.status.code(), Some(1), "{}", stdout(&strict));
    assert!(stdout(&strict).contains("row_id \"declined\": declined"), "{}", stdout(&strict));
    assert!(stdout(&strict).contains("(1 replayed)"), "the decline is the key's stored answer: {}", stdout(&strict));
    let declined_key = format!("batch:{}:declined", content_batch_id(&file));
    assert!(app.charges_for(&declined_key).await.is_empty(), "a decline moves no money");
    assert_eq!(app.count("payments").await, 3, "the re-run created nothing");
}

/// A wrong API key is found before the first row, and nothing is sent.
#[tokio::test]
async fn a_wrong_api_key_stops_before_the_first_row() {
    let app = app().await;
    let scratch = Scratch::new();
    let file = scratch.write("rows.csv", &visa_rows(3));
    let output = run(batch(&app, "po_not_a_key", &file, &[])).await;
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(stderr(&output).contains("refused the API key"), "{}", stderr(&output));
    assert_eq!(app.count("idempotency_keys").await, 0);
}

/// The payment behind a row of `batch_id`: its status and failure code in the database.
async fn payment_of(app: &TestApp, batch_id: &str, row_id: &str) -> (String, Option<String>) {
    sqlx::query_as(
        "select status, failure_code from payments where metadata->>'batch_id' = $1 and metadata->>'batch_row_id' = $2",
    )
    .bind(batch_id)
    .bind(row_id)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Issue 21, item 6: a bank debit answered 202 `processing` that then fails is not reported as
/// pending with exit 0. The batch follows each pending payment (`GET /v1/payments/{id}`) until it
/// is final: the summary, the results file and the exit code say the debit failed, the other
/// debit succeeded, and the database and the gateway's ledger agree. A re-run gets 202 replays,
/// follows them too, and tells the same truth without charging anything again.
#[tokio::test]
async fn a_bank_debit_that_fails_after_202_is_reported_failed() {
    // The built-in simulator (its webhooks settle the debits 500 ms after their 202), and a
    // sweeper that looks pending payments up.
    let app = crate::pending::app_looking_up_after(Duration::from_millis(50)).await;
    let api_key = app.customer("debits").await;
    let scratch = Scratch::new();
    let file = scratch.write(
        "debits.csv",
        "row_id,amount,currency,payment_method\n\
         card,100,usd,pm_card_visa\n\
         debit-ok,200,usd,pm_usBankAccount_success\n\
         debit-closed,300,usd,pm_usBankAccount_accountClosed\n",
    );
    let batch_id = content_batch_id(&file);
    let key = |row: &str| format!("batch:{batch_id}:{row}");
    let out = scratch.path("results.csv");

    for run_number in 1..=2 {
        let replayed = run_number == 2;
        let output = run(batch(&app, &api_key, &file, &["--out", out.to_str().unwrap()])).await;
        let (text, log) = (stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(1), "run {run_number}: the failed debit fails the run:\n{text}\n{log}");
        assert_eq!(summary_count(&output, "failed"), 1, "{text}");
        assert_eq!(summary_count(&output, "pending"), 0, "nothing is left pending: {text}");
        let (charged, replays) = if replayed { (0, 2) } else { (2, 0) };
        assert_eq!(
            (summary_count(&output, "charged"), summary_count(&output, "replayed")),
            (charged, replays),
            "{text}"
        );
        assert!(text.contains("line 4 row_id \"debit-closed\": failed"), "{text}");
        assert!(text.contains("account_closed"), "{text}");
        assert!(log.contains("following 2 pending payment"), "progress on stderr:\n{log}");

        let lines = results(&out);
        let line = |row: &str| lines.iter().find(|line| line[0] == row).unwrap().clone();
        let [_, _, status, payment_id, payment_status, was_replayed, outcome, detail] = line("debit-closed");
        assert_eq!(
            (status.as_str(), payment_status.as_str(), outcome.as_str()),
            ("202", "failed", "failed"),
            "the key's answer (202), the payment's final status"
        );
        assert_eq!(was_replayed, replayed.to_string(), "run {run_number}: the 202 is replayed on the re-run");
        assert!(payment_id.starts_with("pay_") && detail.contains("account_closed"), "{detail}");
        let [_, _, status, _, payment_status, was_replayed, outcome, _] = line("debit-ok");
        assert_eq!(
            (status.as_str(), payment_status.as_str(), outcome.as_str(), was_replayed.as_str()),
            ("202", "succeeded", if replayed { "replayed" } else { "charged" }, replayed.to_string().as_str())
        );

        // The database and the ledger say the same.
        assert_eq!(payment_of(&app, &batch_id, "debit-closed").await, ("failed".into(), Some("account_closed".into())));
        assert_eq!(payment_of(&app, &batch_id, "debit-ok").await, ("succeeded".into(), None));
        assert!(app.charges_for(&key("debit-closed")).await.is_empty(), "the failed debit moved no money");
        assert_eq!(app.charges_for(&key("debit-ok")).await.len(), 1);
        assert_eq!(app.charges_for(&key("card")).await.len(), 1);
        assert_eq!(app.count("payments").await, 3, "the re-run created nothing");
    }
}

/// A payment still pending when `--wait-timeout` ends is reported pending with exit 4 (not 0:
/// its outcome is not known yet); `--no-wait` does not follow at all and says the same; a re-run
/// once the debit settled tells its outcome. The exit codes are in `--help`.
#[tokio::test]
async fn a_payment_still_pending_after_the_wait_is_exit_4() {
    let app = crate::pending::app_looking_up_after(Duration::from_millis(50)).await;
    app.ledger.set_settings(json!({"processing_ms": 4000, "webhook_retry_base_ms": 50})).await;
    let api_key = app.customer("slow").await;
    let scratch = Scratch::new();
    let file =
        scratch.write("slow.csv", "row_id,amount,currency,payment_method\nslow,500,usd,pm_usBankAccount_success\n");
    let out = scratch.path("results.csv");

    for flags in [&["--wait-timeout", "1"][..], &["--no-wait"]] {
        let output = run(batch(&app, &api_key, &file, &[flags, &["--out", out.to_str().unwrap()]].concat())).await;
        let (text, log) = (stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(4), "{flags:?}: still pending:\n{text}\n{log}");
        assert_eq!(summary_count(&output, "pending"), 1, "{text}");
        assert!(text.contains("PENDING"), "{text}");
        let [_, _, status, _, payment_status, _, outcome, _] = results(&out)[0].clone();
        assert_eq!((status.as_str(), payment_status.as_str(), outcome.as_str()), ("202", "processing", "pending"));
    }
    // Once it settled, a re-run follows the replayed 202 to its end.
    let batch_id = content_batch_id(&file);
    let started = Instant::now();
    while payment_of(&app, &batch_id, "slow").await.0 != "succeeded" {
        assert!(started.elapsed() < Duration::from_secs(20), "the debit never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let output = run(batch(&app, &api_key, &file, &[])).await;
    assert_eq!(output.status.code(), Some(0), "{}\n{}", stdout(&output), stderr(&output));
    assert_eq!((summary_count(&output, "replayed"), summary_count(&output, "pending")), (1, 0));

    let help = Command::new(env!("CARGO_BIN_EXE_payonce")).args(["batch", "charge", "--help"]).output().unwrap();
    let help = stdout(&help);
    for needle in ["--wait-timeout", "--no-wait", "Exit codes", "4 "] {
        assert!(help.contains(needle), "{needle:?} not in --help:\n{help}");
    }
}
