//! What the run shows while it runs, on stderr: a progress bar on a terminal, otherwise a plain
//! line every few seconds (a CI log or a cron mail is not a terminal, and a bar's redraws would
//! be noise there).

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::answer::Outcome;

/// Seconds between two plain progress lines.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Counts of the rows done so far, by outcome.
pub struct Progress {
    total: u64,
    counts: [AtomicU64; Outcome::ALL.len()],
    started: Instant,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Progress over `total` rows; a bar when stderr is a terminal.
    pub fn new(total: usize) -> Arc<Self> {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} rows  {per_sec:.0}  eta {eta}  {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        Arc::new(Self { total: total as u64, counts: Default::default(), started: Instant::now(), bar })
    }

    /// A row is done.
    pub fn record(&self, outcome: Outcome) {
        self.counts[outcome as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// How many rows ended with `outcome`.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.counts[outcome as usize].load(Ordering::Relaxed)
    }

    /// Rows done.
    pub fn done(&self) -> u64 {
        Outcome::ALL.into_iter().map(|o| self.count(o)).sum()
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Shows progress until `finished` resolves, then clears the bar.
    pub async fn show(self: Arc<Self>, finished: impl std::future::Future<Output = ()>) {
        let every = if self.bar.is_some() { Duration::from_millis(250) } else { LINE_EVERY };
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tokio::pin!(finished);
        loop {
            tokio::select! {
                () = &mut finished => break,
                _ = ticks.tick() => match &self.bar {
                    Some(bar) => bar.set_message(self.counts_line()),
                    None => eprintln!("{}", self.plain_line()),
                },
            }
        }
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    /// `charged 10 | replayed 2 | …`: the outcomes seen so far (failures summed).
    fn counts_line(&self) -> String {
        let failed: u64 =
            [Outcome::Failed, Outcome::Changed, Outcome::Rejected, Outcome::Abandoned, Outcome::Unresolved]
                .into_iter()
                .map(|o| self.count(o))
                .sum();
        format!(
            "charged {} | replayed {} | pending {} | declined {} | failed {}",
            self.count(Outcome::Charged),
            self.count(Outcome::Replayed),
            self.count(Outcome::Pending),
            self.count(Outcome::Declined),
            failed
        )
    }

    /// The line printed when stderr is not a terminal.
    fn plain_line(&self) -> String {
        let elapsed = self.elapsed().as_secs_f64();
        let done = self.done();
        format!(
            "[{elapsed:7.1}s] {done}/{} rows ({:.0}%), {:.0} rows/s | {}",
            self.total,
            100.0 * done as f64 / self.total.max(1) as f64,
            done as f64 / elapsed.max(0.001),
            self.counts_line()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_outcome() {
        let progress = Progress::new(4);
        progress.record(Outcome::Charged);
        progress.record(Outcome::Replayed);
        progress.record(Outcome::Changed);
        progress.record(Outcome::Unresolved);
        assert_eq!(progress.done(), 4);
        assert_eq!(progress.counts_line(), "charged 1 | replayed 1 | pending 0 | declined 0 | failed 2");
        assert!(progress.plain_line().contains("4/4 rows (100%)"), "{}", progress.plain_line());
    }
}
