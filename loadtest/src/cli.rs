//! The command line. Flags that the k6 scripts read from the environment read the same variables
//! here (`BASE_URLS`, `API_KEY`, `SIM_URL`), so one shell setup serves both.

use std::io::IsTerminal;
use std::str::FromStr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde::Serialize;
use serde_json::{Value, json};

/// Drives payonce with double submits, retry storms, mixed traffic, refund storms or capture
/// storms, then audits the Stripe simulator's ledger. Exits 0 when every key was charged at most
/// once, every payment a client was told succeeded was charged, every answer was one the scenario
/// allows, (refund-storm) no payment was refunded beyond what it charged, with one gateway refund
/// per key answered 201, and (capture-storm) every authorization was settled at most once, a 200
/// capture being one ledger entry of what it captured and a 200 cancel none;
/// 1 otherwise;
/// 2 when the run could not be made.
#[derive(Debug, Parser)]
#[command(name = "payonce-loadtest", version, about, long_about = None)]
pub struct Cli {
    /// The scenario to run.
    #[arg(value_enum)]
    pub scenario: ScenarioName,

    /// A payonce server (repeat the flag, or separate with commas; requests go round-robin).
    #[arg(long = "target", env = "BASE_URLS", value_delimiter = ',', required = true, value_parser = base_url)]
    pub targets: Vec<String>,

    /// Aim at a claim strategy of a lab server (`payonce serve --lab`): requests go to
    /// `/lab/{strategy}/v1/payments` instead of `/v1/payments` (on-conflict, for-update, redis,
    /// check-then-insert). The k6 scripts read the same variable.
    #[arg(long, env = "STRATEGY", value_parser = ["on-conflict", "for-update", "redis", "check-then-insert"])]
    pub strategy: Option<String>,

    /// A customer's API key (`payonce customers create NAME` prints one).
    #[arg(long, env = "API_KEY", hide_env_values = true)]
    pub api_key: String,

    /// The Stripe simulator the servers charge through (its ledger is the audit's ground truth).
    #[arg(long, env = "SIM_URL", default_value = "http://127.0.0.1:12111", value_parser = base_url)]
    pub sim_url: String,

    /// Start new operations for this long (e.g. 10s, 500ms, 2m). Default: 10s unless --requests
    /// (capture-storm: until every payment authorized was stormed).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Start no new operation once this many requests were sent (operations in flight finish).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,

    /// Benchmark scenarios: send at this total rate (requests/s, shared by the workers) instead of
    /// as fast as answers come back. Latency then counts from each request's scheduled time, so a
    /// server that falls behind is not flattered by the client waiting for it.
    #[arg(long, value_parser = positive_rate)]
    pub rate: Option<f64>,

    /// Workers running operations concurrently.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// double-submit, refund-storm, capture-storm, failover: requests sent with each key at the
    /// same instant.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=1_000))]
    pub duplicates: u32,

    /// refund-storm: payments made first, which every key refunds part of. capture-storm:
    /// payments authorized first, each then settled by a storm of its own.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub payments: u32,

    /// capture-storm: distinct keys settling each payment at once, alternately capturing and
    /// cancelling it (each sent --duplicates times).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(2..=1_000))]
    pub keys: u32,

    /// capture-storm's self-test: after the storms, charge one captured payment's authorization
    /// a second time at the simulator, behind payonce's back, as a payonce that captured twice
    /// would. The audit must then fail the run (exit 1).
    #[arg(long)]
    pub inject_double_capture: bool,

    /// mixed: percentages of new keys / replays / reused keys with another payload.
    #[arg(long, default_value = "70/25/5")]
    pub mix: Mix,

    /// Give up on one request after this long [default: 400ms for retry-storm, 30s otherwise].
    #[arg(long, value_parser = parse_duration)]
    pub client_timeout: Option<Duration>,

    /// retry-storm, failover: attempts per payment before the client gives up.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub max_attempts: u32,

    /// retry-storm: a connection refused or reset is retried (with the same key) like a 503,
    /// instead of being unexpected: for runs that kill a server on purpose (loadtest/strategies.sh).
    #[arg(long)]
    pub retry_transport_errors: bool,

    /// Simulator faults for the run, as JSON for `PUT /_sim/faults`; cleared afterwards.
    /// [default: none, except retry-storm's slow and flaky gateway and capture-storm's slow
    /// captures and cancels; pass '{}' for none]
    #[arg(long)]
    pub faults: Option<String>,

    /// Show the progress line even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,

    /// Print the summary as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,

    /// failover: write every answer to this file as a JSON line (`at_ms`, `latency_ms`, `answer`,
    /// `key`), for measuring the unavailability window.
    #[arg(long)]
    pub timeline: Option<std::path::PathBuf>,
}

/// The scenarios and the benchmark's loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioName {
    /// Many clients send the same key at the same instant, for many keys.
    DoubleSubmit,
    /// Clients with short timeouts retry with the same key against a slow, flaky gateway.
    RetryStorm,
    /// New keys, replays and reused keys with another payload.
    Mixed,
    /// Many keys, each sent by many clients at once, refunding overlapping parts of a few payments.
    RefundStorm,
    /// Payments authorized (`"capture": "manual"`), then each settled by many keys at once,
    /// capturing and cancelling it, each key sent by many clients at once.
    CaptureStorm,
    /// Keys kept until they have a final answer while the database fails over (loadtest/failover.sh),
    /// then every acknowledged payment replayed byte for byte.
    Failover,
    /// Benchmark: every request a new key (closed loop).
    NewPayments,
    /// Benchmark: every worker replays its one finished payment (closed loop).
    Replays,
    /// Benchmark: `POST /bench/payments`, the handler without the idempotency layer (closed loop;
    /// needs `payonce serve --bench-routes`).
    Unprotected,
}

impl ScenarioName {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DoubleSubmit => "double-submit",
            Self::RetryStorm => "retry-storm",
            Self::Mixed => "mixed",
            Self::RefundStorm => "refund-storm",
            Self::CaptureStorm => "capture-storm",
            Self::Failover => "failover",
            Self::NewPayments => "new-payments",
            Self::Replays => "replays",
            Self::Unprotected => "unprotected",
        }
    }
}

/// The mixed scenario's proportions, in percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mix {
    pub new: u32,
    pub replay: u32,
    pub reuse: u32,
}

impl FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<u32> = s
            .split('/')
            .map(|p| p.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("{s:?}: expected NEW/REPLAY/REUSE percentages such as 70/25/5"))?;
        match parts[..] {
            [new, replay, reuse] if new + replay + reuse == 100 && new > 0 => Ok(Self { new, replay, reuse }),
            _ => Err(format!("{s:?}: three percentages adding up to 100, the first above 0 (e.g. 70/25/5)")),
        }
    }
}

/// What the scenarios need from the command line, with the per-scenario defaults resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    #[serde(serialize_with = "optional_secs")]
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    pub concurrency: u32,
    pub duplicates: u32,
    /// refund-storm, capture-storm: payments made (or authorized) first.
    pub payments: u32,
    /// capture-storm: keys settling each payment at once.
    pub keys: u32,
    /// Faults are set for the run (a 503 is then an answer some scenarios allow).
    pub faulty: bool,
    pub mix: Mix,
    #[serde(serialize_with = "secs")]
    pub client_timeout: Duration,
    pub max_attempts: u32,
    pub rate: Option<f64>,
    pub retry_transport_errors: bool,
    pub timeline: Option<std::path::PathBuf>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn optional_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

fn positive_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!("{value:?} is not a positive rate (requests per second)")),
    }
}

/// capture-storm's gateway when `--faults` is not given: captures and cancels take 50–150 ms, as
/// a real gateway's do, so that a key's duplicates arrive while it is in flight (409) and after
/// (a replay), not only before it is claimed. Authorizations are not slowed.
fn capture_storm_faults() -> Value {
    json!({
        "latency_ms": 50,
        "jitter_ms": 100,
        "operations": ["capture_payment_intent", "cancel_payment_intent"],
    })
}

/// retry-storm's gateway when `--faults` is not given: slow (200–600 ms), 10 % failures before
/// executing, 5 % held for 3 s then charged, 5 % charged then the connection dropped.
fn retry_storm_faults() -> Value {
    json!({
        "latency_ms": 200,
        "jitter_ms": 400,
        "fail_rate": 0.1,
        "timeout_rate": 0.05,
        "timeout_hold_ms": 3000,
        "drop_after_charge_rate": 0.05,
    })
}

impl Cli {
    pub fn settings(&self) -> Result<Settings, String> {
        let duration = match (self.duration, self.requests, self.scenario) {
            // A capture storm is as long as its payments take, unless told otherwise.
            (None, None, ScenarioName::CaptureStorm) => None,
            (None, None, _) => Some(Duration::from_secs(10)),
            (duration, _, _) => duration,
        };
        let client_timeout = self.client_timeout.unwrap_or(match self.scenario {
            ScenarioName::RetryStorm => Duration::from_millis(400),
            _ => Duration::from_secs(30),
        });
        if client_timeout.is_zero() {
            return Err("--client-timeout must be above zero".into());
        }
        if self.scenario == ScenarioName::RefundStorm && self.strategy.is_some() {
            return Err("--strategy aims payments at a lab strategy; refund-storm refunds through /v1/refunds".into());
        }
        if self.scenario == ScenarioName::CaptureStorm && self.strategy.is_some() {
            return Err(
                "--strategy aims payments at a lab strategy; capture-storm captures through /v1/payments".into()
            );
        }
        if self.inject_double_capture && self.scenario != ScenarioName::CaptureStorm {
            return Err("--inject-double-capture is capture-storm's self-test".into());
        }
        Ok(Settings {
            duration,
            requests: self.requests,
            concurrency: self.concurrency,
            duplicates: self.duplicates,
            payments: self.payments,
            keys: self.keys,
            faulty: self.faults()?.is_some(),
            mix: self.mix,
            client_timeout,
            max_attempts: self.max_attempts,
            rate: self.rate,
            retry_transport_errors: self.retry_transport_errors,
            timeline: self.timeline.clone(),
        })
    }

    /// The faults to set for the run, if any.
    pub fn faults(&self) -> Result<Option<Value>, String> {
        match (&self.faults, self.scenario) {
            (Some(text), _) => {
                let faults: Value = serde_json::from_str(text).map_err(|err| format!("--faults is not JSON: {err}"))?;
                Ok((faults != json!({})).then_some(faults))
            }
            (None, ScenarioName::RetryStorm) => Ok(Some(retry_storm_faults())),
            (None, ScenarioName::CaptureStorm) => Ok(Some(capture_storm_faults())),
            (None, _) => Ok(None),
        }
    }

    pub fn show_progress(&self) -> bool {
        self.progress || std::io::stderr().is_terminal()
    }
}

/// `http://host:port` with any trailing slash removed.
fn base_url(s: &str) -> Result<String, String> {
    let url = s.trim().trim_end_matches('/');
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("{s:?}: expected an http:// URL"));
    }
    Ok(url.to_owned())
}

/// `500ms`, `10s`, `2m`, `1m30s`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?}: expected a duration such as 500ms, 10s, 2m or 1m30s");
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').ok_or_else(bad)?;
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += Duration::from_secs_f64(value * unit);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations as the k6 scripts write them.
    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        for bad in ["", "10", "s", "10x", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    /// The mix must add up to 100.
    #[test]
    fn mixes() {
        assert_eq!("70/25/5".parse::<Mix>(), Ok(Mix { new: 70, replay: 25, reuse: 5 }));
        for bad in ["70/25", "70/25/10", "0/50/50", "a/b/c"] {
            assert!(bad.parse::<Mix>().is_err(), "{bad}");
        }
    }
}
