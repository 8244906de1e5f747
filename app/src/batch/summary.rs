//! The end of a run: the rows counted by outcome, the throughput, the rows that need someone's
//! attention, and the exit code.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use super::answer::{Outcome, RowResult};
use super::file::Row;
use super::key::BatchId;

/// The exit codes of `payonce batch charge` (docs/batch.md, "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every row has a final answer that is not a failure: charged, replayed, or declined (unless
    /// `--fail-on-decline`); every payment answered 202 was followed to its success.
    Ok = 0,
    /// Some rows are not done or need attention: failed (after a 202), changed, rejected,
    /// abandoned, unresolved (and declined with `--fail-on-decline`). A re-run resumes the
    /// unresolved ones. Wins over [`Exit::Pending`]: someone has to look either way.
    RowsFailed = 1,
    /// The file or the command line is invalid; nothing was sent.
    Invalid = 2,
    /// The run stopped before every row was sent: the API was unreachable or refused the API
    /// key, made no progress, or the run was interrupted. A re-run picks up where it stopped.
    Stopped = 3,
    /// Every row was sent and none needs attention, but some payments are still pending at the
    /// gateway (the wait ended, `--wait-timeout`, or `--no-wait`): their outcome is not known
    /// yet. A re-run later follows them (their keys replay the 202) and tells it.
    Pending = 4,
}

/// The exit codes, for `--help` (docs/batch.md has the same table).
pub const EXIT_CODES: &str = "\
Exit codes:
  0  every row has a final answer that is not a failure: charged, replayed, or declined (unless
     --fail-on-decline); every payment answered 202 was followed until it succeeded
  1  some rows need attention: failed (a 202 payment that then failed), changed, rejected,
     abandoned, unresolved, or declined with --fail-on-decline
  2  the file, the command line or --out's path is invalid: nothing was sent
  3  the run stopped before every row was sent (the API unreachable, the API key refused, no
     progress, interrupted): run it again
  4  every row was sent and none needs attention, but some payments are still pending at the
     gateway after --wait-timeout (or with --no-wait): run the batch again later to learn their
     outcome (their keys replay 202, and the run follows them)";

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// What one line of the summary says about an outcome.
fn meaning(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Charged => "201 (or 202, then succeeded): charged by this run",
        Outcome::Replayed => {
            "201 replayed (or 202 replayed, then succeeded): charged before (an earlier or concurrent run), \
             not charged again"
        }
        Outcome::Pending => "202: not final at the gateway yet; never charged again: run the batch later to follow it",
        Outcome::Declined => "402: declined, final",
        Outcome::Failed => "202, then failed at the gateway (a bank debit that did not settle): not charged",
        Outcome::Changed => "422: the row differs from what this batch sent for its row_id before; not charged",
        Outcome::Rejected => "400: refused by the server; not charged",
        Outcome::Abandoned => "502 payment-abandoned: payonce confirmed nothing was charged",
        Outcome::Unresolved => "no final answer in time (409, 503, network): run the batch again",
        Outcome::NotSent => "not sent: the run stopped first",
    }
}

/// The run's report.
pub struct Summary<'a> {
    pub batch: &'a BatchId,
    pub rows: &'a [Row],
    pub results: &'a [RowResult],
    pub elapsed: Duration,
    pub fail_on_decline: bool,
    /// Why the run stopped early, if it did.
    pub stopped: Option<String>,
}

/// Rows listed by name in the summary, at most.
const LISTED: usize = 20;

impl Summary<'_> {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.results.iter().filter(|r| r.outcome == outcome).count()
    }

    pub fn exit(&self) -> Exit {
        if self.stopped.is_some() {
            Exit::Stopped
        } else if self.results.iter().any(|r| r.outcome.is_failure(self.fail_on_decline)) {
            Exit::RowsFailed
        } else if self.count(Outcome::Pending) > 0 {
            Exit::Pending
        } else {
            Exit::Ok
        }
    }

    /// The text printed on stdout.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let secs = self.elapsed.as_secs_f64();
        let sent = self.results.iter().filter(|r| r.outcome != Outcome::NotSent).count();
        let _ = writeln!(
            out,
            "batch {} (keys batch:{}:<row_id>): {} rows in {secs:.2} s, {:.1} rows/s",
            self.batch,
            self.batch,
            self.rows.len(),
            sent as f64 / secs.max(0.001)
        );
        for outcome in Outcome::ALL {
            let n = self.count(outcome);
            let always = matches!(
                outcome,
                Outcome::Charged
                    | Outcome::Replayed
                    | Outcome::Pending
                    | Outcome::Declined
                    | Outcome::Failed
                    | Outcome::Unresolved
            );
            if n == 0 && !always {
                continue;
            }
            let replayed = match outcome {
                Outcome::Pending | Outcome::Declined | Outcome::Failed => {
                    let r = self.results.iter().filter(|r| r.outcome == outcome && r.replayed).count();
                    format!(" ({r} replayed)")
                }
                _ => String::new(),
            };
            let name = outcome.as_str().replace('_', " ");
            let _ = writeln!(out, "  {name:<11}{n:>9}   {}{replayed}", meaning(outcome));
        }
        let attention: Vec<(&Row, &RowResult)> = self
            .rows
            .iter()
            .zip(self.results)
            .filter(|(_, r)| r.outcome.is_failure(self.fail_on_decline) && r.outcome != Outcome::NotSent)
            .collect();
        let pending: Vec<(&Row, &RowResult)> =
            self.rows.iter().zip(self.results).filter(|(_, r)| r.outcome == Outcome::Pending).collect();
        for (row, result) in attention.iter().take(LISTED) {
            let _ = writeln!(
                out,
                "  line {} row_id {:?}: {}{} [{}]",
                row.line,
                row.row_id.as_str(),
                result.outcome.as_str(),
                if result.detail.is_empty() { String::new() } else { format!(": {}", result.detail) },
                crate::money::format(row.payment.amount, &row.payment.currency)
            );
        }
        if attention.len() > LISTED {
            let _ = writeln!(out, "  … and {} more (see --out)", attention.len() - LISTED);
        }
        for (row, result) in pending.iter().take(LISTED) {
            let _ = writeln!(out, "  line {} row_id {:?}: pending: {}", row.line, row.row_id.as_str(), result.detail);
        }
        if pending.len() > LISTED {
            let _ = writeln!(out, "  … and {} more pending (see --out)", pending.len() - LISTED);
        }
        let _ = match (self.exit(), &self.stopped) {
            (Exit::Stopped, Some(why)) => writeln!(out, "STOPPED: {why} (exit 3)"),
            (Exit::RowsFailed, _) => writeln!(out, "FAILED: {} row(s) need attention (exit 1)", attention.len()),
            (Exit::Pending, _) => writeln!(
                out,
                "PENDING: {} payment(s) not final at the gateway yet: run the batch again later to learn their \
                 outcome (exit 4)",
                pending.len()
            ),
            _ => writeln!(out, "OK (exit 0)"),
        };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::file;

    fn rows(n: usize) -> Vec<Row> {
        let mut csv = String::from("row_id,amount,currency,payment_method\n");
        for i in 0..n {
            csv.push_str(&format!("r{i},100,usd,pm_card_visa\n"));
        }
        file::parse(csv.as_bytes(), &BatchId::parse("b").unwrap()).unwrap()
    }

    fn result(outcome: Outcome) -> RowResult {
        RowResult {
            outcome,
            status: None,
            payment_id: None,
            payment_status: None,
            replayed: false,
            detail: "why".into(),
        }
    }

    /// Declines fail the run only when asked; a stopped run is exit 3 whatever its rows.
    #[test]
    fn exit_codes() {
        let batch = BatchId::parse("b").unwrap();
        let rows = rows(3);
        let results = [result(Outcome::Charged), result(Outcome::Declined), result(Outcome::Replayed)];
        let mut summary = Summary {
            batch: &batch,
            rows: &rows,
            results: &results,
            elapsed: Duration::from_secs(1),
            fail_on_decline: false,
            stopped: None,
        };
        assert_eq!(summary.exit(), Exit::Ok);
        assert!(summary.render().ends_with("OK (exit 0)\n"), "{}", summary.render());
        summary.fail_on_decline = true;
        assert_eq!(summary.exit(), Exit::RowsFailed);
        assert!(summary.render().contains("line 3 row_id \"r1\": declined: why [1.00 USD]"), "{}", summary.render());
        summary.stopped = Some("interrupted".into());
        assert_eq!(summary.exit(), Exit::Stopped);
        let changed = [result(Outcome::Replayed), result(Outcome::Changed), result(Outcome::Replayed)];
        let summary = Summary { results: &changed, fail_on_decline: false, stopped: None, ..summary };
        assert_eq!(summary.exit(), Exit::RowsFailed);
        let text = summary.render();
        assert!(text.contains("  replayed           2   201 replayed"), "{text}");
        assert!(text.contains("  changed            1   422"), "{text}");

        // A payment still pending: exit 4, listed; with a failure too, exit 1.
        let pending = [result(Outcome::Charged), result(Outcome::Pending), result(Outcome::Replayed)];
        let summary = Summary { results: &pending, ..summary };
        assert_eq!(summary.exit(), Exit::Pending);
        let text = summary.render();
        assert!(text.contains("line 3 row_id \"r1\": pending: why"), "{text}");
        assert!(text.ends_with("(exit 4)\n"), "{text}");
        let both = [result(Outcome::Failed), result(Outcome::Pending), result(Outcome::Replayed)];
        let summary = Summary { results: &both, ..summary };
        assert_eq!(summary.exit(), Exit::RowsFailed);
        assert!(summary.render().contains("line 2 row_id \"r0\": failed: why"), "{}", summary.render());
    }
}
