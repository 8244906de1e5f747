//! The end of a run: the summary table (or its JSON form) and the verdict.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::audit::Audit;
use crate::capture_audit::{self, CaptureAudit};
use crate::cli::{Cli, ScenarioName, Settings};
use crate::refund_audit::RefundAudit;
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
    /// refund-storm: the refund ledger against the answers and payonce's payments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_audit: Option<RefundAudit>,
    /// capture-storm: the answers, payonce's payments and the ledger, per authorization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_audit: Option<CaptureAudit>,
    /// `pass`, or `fail` with the reasons.
    pub verdict: Verdict,
}

#[derive(Debug, Serialize)]
pub struct Verdict {
    pub passed: bool,
    pub reasons: Vec<String>,
}

impl Report {
    pub fn new(
        cli: &Cli,
        run: &Run,
        elapsed: Duration,
        audit: Audit,
        refund_audit: Option<RefundAudit>,
        capture_audit: Option<CaptureAudit>,
    ) -> Self {
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
        if let Some(refund_audit) = &refund_audit {
            reasons.extend(refund_audit.violations());
        }
        if let Some(capture_audit) = &capture_audit {
            reasons.extend(capture_audit.violations());
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
            refund_audit,
            capture_audit,
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
            ScenarioName::RefundStorm => {
                format!("{} payments, {} duplicates per refund key", settings.payments, settings.duplicates)
            }
            ScenarioName::CaptureStorm => format!(
                "{} payments, {} keys × {} duplicates per storm",
                settings.payments, settings.keys, settings.duplicates
            ),
            ScenarioName::Failover => format!(
                "{} duplicates per key, each kept until a 201 (at most {} attempts), then replayed",
                settings.duplicates, settings.max_attempts
            ),
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
        let believed = match self.scenario {
            ScenarioName::CaptureStorm => "(authorizations whose capture got a 200)",
            _ => "(keys that got a 201)",
        };
        writeln!(f, "    payments believed succeeded    {:>9}   {believed}", a.believed_succeeded)?;
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
        if let Some(r) = &self.refund_audit {
            write_refund_audit(f, r)?;
        }
        if let Some(c) = &self.capture_audit {
            write_capture_audit(f, c, s)?;
        }
        writeln!(f)?;
        if self.verdict.passed { writeln!(f, "PASS") } else { writeln!(f, "FAIL: {}", self.verdict.reasons.join("; ")) }
    }
}

/// refund-storm's figures, and the first few of each violation.
fn write_refund_audit(f: &mut fmt::Formatter<'_>, r: &RefundAudit) -> fmt::Result {
    writeln!(f)?;
    writeln!(f, "  refund audit (simulator refund ledger, payonce's answers and payments)")?;
    writeln!(f, "    payments refunded              {:>9}   {} paid in all", r.payments, r.paid_total)?;
    writeln!(f, "    refund keys                    {:>9}", r.keys)?;
    writeln!(
        f,
        "    … answered 201                 {:>9}   {} refunded by the answers",
        r.keys_refunded, r.refunded_answered
    )?;
    writeln!(f, "    … answered 409 exceeds payment {:>9}", r.keys_exceeded)?;
    writeln!(f, "    … with no final answer         {:>9}", r.keys_unsettled)?;
    writeln!(
        f,
        "    refunds in the ledger          {:>9}   {} refunded at the gateway",
        r.ledger_refunds, r.refunded_ledger
    )?;
    writeln!(f, "    payments refunded in full      {:>9}", r.payments_refunded_in_full)?;
    writeln!(f, "    over-refunded (answers)        {:>9}   must be 0", r.over_refunded_answered.len())?;
    writeln!(f, "    over-refunded (ledger)         {:>9}   must be 0", r.over_refunded_ledger.len())?;
    writeln!(f, "    payonce's sum not the ledger's {:>9}   must be 0", r.payonce_disagrees.len())?;
    writeln!(f, "    201 without a gateway refund   {:>9}   must be 0", r.refunded_without_gateway_refund.len())?;
    writeln!(f, "    keys refunded more than once   {:>9}   must be 0", r.refunded_more_than_once.len())?;
    writeln!(f, "    201 naming another refund      {:>9}   must be 0", r.other_gateway_refund.len())?;
    writeln!(f, "    409 exceeds yet refunded       {:>9}   must be 0", r.exceeded_but_refunded.len())?;
    writeln!(
        f,
        "    refunds no client saw a 201 for{:>9}   (clients with no final answer; not an error)",
        r.unconfirmed
    )?;
    let lists = [
        ("OVER-REFUNDED", &r.over_refunded_answered),
        ("OVER-REFUNDED AT THE GATEWAY", &r.over_refunded_ledger),
        ("AMOUNT_REFUNDED NOT THE LEDGER'S", &r.payonce_disagrees),
        ("NO GATEWAY REFUND", &r.refunded_without_gateway_refund),
        ("REFUNDED TWICE", &r.refunded_more_than_once),
        ("OTHER GATEWAY REFUND", &r.other_gateway_refund),
        ("EXCEEDED YET REFUNDED", &r.exceeded_but_refunded),
    ];
    for (what, list) in lists {
        for item in list.iter().take(10) {
            writeln!(f, "    {what} {item}")?;
        }
    }
    Ok(())
}

/// capture-storm's figures, its checks, and the first few of each violation.
fn write_capture_audit(f: &mut fmt::Formatter<'_>, c: &CaptureAudit, s: &Summary) -> fmt::Result {
    writeln!(f)?;
    writeln!(f, "  capture audit (answers, payonce's payments, simulator ledger)")?;
    writeln!(
        f,
        "    payments authorized            {:>9}   {} authorized in all",
        c.payments_authorized, c.amount_authorized
    )?;
    writeln!(
        f,
        "    … stormed                      {:>9}   {:.1} storms/s over the run",
        c.payments_stormed,
        c.payments_stormed as f64 / s.elapsed_secs
    )?;
    writeln!(
        f,
        "    settle keys                    {:>9}   {} capturing, {} cancelling",
        c.keys, c.capture_keys, c.cancel_keys
    )?;
    writeln!(f, "    … answered 200                 {:>9}   one per payment settled", c.keys_settled)?;
    writeln!(f, "    … answered 409 not capturable  {:>9}   another key settled it first", c.keys_refused)?;
    writeln!(
        f,
        "    200s fresh / replayed          {:>9}   {} replayed (duplicates, and each key resent after the storm)",
        c.answered_200_fresh, c.answered_200_replayed
    )?;
    writeln!(
        f,
        "    payments captured (answers)    {:>9}   {} captured by the answers",
        c.payments_captured, c.amount_captured_answers
    )?;
    writeln!(f, "    payments canceled (answers)    {:>9}", c.payments_canceled)?;
    writeln!(f, "    payments left authorized       {:>9}   (not stormed, or no key settled)", c.payments_unsettled)?;
    writeln!(
        f,
        "    captures in the ledger         {:>9}   {} captured at the gateway",
        c.ledger_captures, c.amount_captured_ledger
    )?;
    writeln!(f, "    keys resent / reused (422)     {:>9}   {} reused", c.resent, c.reuse_probes)?;
    let unavailable = s.answers.other.get("503 unavailable").copied().unwrap_or(0);
    writeln!(f, "    503 with Retry-After           {:>9}   (honest: retried with the key)", unavailable)?;
    writeln!(
        f,
        "    5xx other than 503             {:>9}   must be 0",
        capture_audit::server_errors(&s.answers.other)
    )?;
    let checks = c.checks();
    for check in &checks {
        writeln!(f, "    {:<31}{:>9}   must be 0", check.row, check.found.len())?;
    }
    for check in &checks {
        for item in check.found.iter().take(10) {
            writeln!(f, "    {} {item}", check.tag)?;
        }
    }
    Ok(())
}
