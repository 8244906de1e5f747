//! The end of a run: the summary table (or its JSON form) and the verdict.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::audit::Audit;
use crate::cli::{Cli, ScenarioName, Settings};
use crate::scenario::Run;
use crate::stats::{Latency, Summary};

/// Everything a run found, serialisable as the `--json` output.
#[derive(Debug, Serialize)]
pub struct Report {
    pub scenario: ScenarioName,
    pub run_id: String,
    pub targets: Vec<String>,
    pub settings: Settings,
    pub stats: Summary,
    pub audit: Audit,
    /// `pass`, or `fail` with the reasons.
    pub verdict: Verdict,
}

#[derive(Debug, Serialize)]
pub struct Verdict {
    pub passed: bool,
    pub reasons: Vec<String>,
}

impl Report {
    pub fn new(cli: &Cli, run: &Run, elapsed: Duration, audit: Audit) -> Self {
        let stats = run.stats.summary(elapsed);
        let mut reasons = Vec::new();
        if !audit.double_charged.is_empty() {
            reasons.push(format!("{} key(s) charged more than once", audit.double_charged.len()));
        }
        if !audit.missing.is_empty() {
            reasons.push(format!("{} payment(s) answered 201 but not charged", audit.missing.len()));
        }
        if !audit.mismatched.is_empty() {
            reasons.push(format!(
                "{} payment(s) answered with another PaymentIntent than charged",
                audit.mismatched.len()
            ));
        }
        if stats.unexpected > 0 {
            reasons.push(format!("{} unexpected answer(s)", stats.unexpected));
        }
        if let Some(payments) = &stats.payments
            && payments.given_up > 0
        {
            reasons.push(format!("{} payment(s) given up after {} attempts", payments.given_up, cli.max_attempts));
        }
        if stats.requests == 0 {
            reasons.push("no request was sent".into());
        }
        Self {
            scenario: cli.scenario,
            run_id: run.run_id.clone(),
            targets: run.api.targets().to_vec(),
            settings: run.settings.clone(),
            stats,
            audit,
            verdict: Verdict { passed: reasons.is_empty(), reasons },
        }
    }

    pub fn passed(&self) -> bool {
        self.verdict.passed
    }
}

fn latency_cells(latency: &Latency) -> String {
    format!(
        "p50 {:>8.2} ms   p95 {:>8.2} ms   p99 {:>8.2} ms   max {:>8.2} ms   (n={})",
        latency.p50_ms, latency.p95_ms, latency.p99_ms, latency.max_ms, latency.count
    )
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        let a = &self.audit;
        let settings = &self.settings;
        let scenario_knobs = match self.scenario {
            ScenarioName::DoubleSubmit => format!("{} duplicates per key", settings.duplicates),
            ScenarioName::RetryStorm => format!(
                "client timeout {} ms, at most {} attempts",
                settings.client_timeout.as_millis(),
                settings.max_attempts
            ),
            ScenarioName::Mixed => format!("mix {}/{}/{}", settings.mix.new, settings.mix.replay, settings.mix.reuse),
            ScenarioName::NewPayments | ScenarioName::Replays | ScenarioName::Unprotected => "closed loop".to_owned(),
        };
        writeln!(f)?;
        writeln!(
            f,
            "payonce-loadtest {}: {} worker(s), {}, {} target(s): {}",
            self.scenario.as_str(),
            settings.concurrency,
            scenario_knobs,
            self.targets.len(),
            self.targets.join(", ")
        )?;
        writeln!(f, "run id {}, {:.2} s", self.run_id, s.elapsed_secs)?;
        writeln!(f)?;
        writeln!(f, "  requests               {:>9}   {:.1}/s", s.requests, s.throughput)?;
        writeln!(f, "    201 created          {:>9}", s.answers.created)?;
        writeln!(f, "    201 replayed         {:>9}", s.answers.replayed)?;
        writeln!(f, "    409 in flight        {:>9}", s.answers.in_flight)?;
        writeln!(f, "    422 key reused       {:>9}", s.answers.key_reused)?;
        writeln!(f, "    other                {:>9}", s.answers.other.values().sum::<u64>())?;
        for (label, count) in &s.answers.other {
            writeln!(f, "      {label:<19}{count:>9}")?;
        }
        writeln!(f, "  unexpected             {:>9}", s.unexpected)?;
        for (reason, count) in &s.unexpected_by_reason {
            writeln!(f, "      {count:>6}  {reason}")?;
        }
        writeln!(f)?;
        match &s.latency {
            Some(latency) => writeln!(f, "  latency (answered)     {}", latency_cells(latency))?,
            None => writeln!(f, "  latency (answered)     no answers")?,
        }
        for (label, latency) in &s.latency_by_answer {
            writeln!(f, "    {label:<20} {}", latency_cells(latency))?;
        }
        if let Some(p) = &s.payments {
            writeln!(f)?;
            writeln!(f, "  payments completed     {:>9}   given up {}", p.completed, p.given_up)?;
            writeln!(
                f,
                "  retries                {:>9}   attempts avg {:.2}, max {}",
                p.retries, p.attempts_avg, p.attempts_max
            )?;
            if let Some(latency) = &p.time_to_success {
                writeln!(f, "  time to success        {}", latency_cells(latency))?;
            }
        }
        writeln!(f)?;
        writeln!(f, "  audit (simulator ledger, keys of this run)")?;
        writeln!(f, "    charges in the ledger          {:>9}", a.charges)?;
        writeln!(f, "    keys charged                   {:>9}", a.keys_charged)?;
        writeln!(f, "    keys charged more than once    {:>9}", a.double_charged.len())?;
        writeln!(f, "    payments believed succeeded    {:>9}   (keys that got a 201)", a.believed_succeeded)?;
        writeln!(f, "    … with no charge               {:>9}", a.missing.len())?;
        writeln!(f, "    … with another PaymentIntent   {:>9}", a.mismatched.len())?;
        writeln!(f, "    charges no client saw a 201 for{:>9}   (clients that gave up; not an error)", a.unconfirmed)?;
        for double in a.double_charged.iter().take(10) {
            writeln!(
                f,
                "    DOUBLE CHARGE {} (customer {}): {}",
                double.key,
                double.customer,
                double.charges.join(", ")
            )?;
        }
        for key in a.missing.iter().take(10) {
            writeln!(f, "    MISSING CHARGE {key}")?;
        }
        for key in a.mismatched.iter().take(10) {
            writeln!(f, "    OTHER PAYMENTINTENT {key}")?;
        }
        writeln!(f)?;
        if self.verdict.passed { writeln!(f, "PASS") } else { writeln!(f, "FAIL: {}", self.verdict.reasons.join("; ")) }
    }
}
