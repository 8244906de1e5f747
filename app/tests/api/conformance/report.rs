//! The conformance report: every recorded exchange checked (the spec's checks, Stripe's headers
//! and error members), counted per kind of request and answer.

use std::collections::BTreeMap;
use std::fmt;

use axum::http::Method;
use serde_json::Value;

use super::recorder::{Answer, Exchange};
use super::spec::Spec;

/// What the whole surface must have produced, so that a flow that silently stops running cannot
/// make the test pass: request kinds sent through async-stripe, and answer kinds of the simulator.
const EXPECTED_REQUESTS: &[&str] = &[
    "POST /v1/payment_intents",
    "GET /v1/payment_intents/{intent}",
    "GET /v1/payment_intents/search",
    "POST /v1/refunds",
    "GET /v1/refunds/{refund}",
    "GET /v1/refunds",
    "POST /v1/webhook_endpoints",
    "POST /v1/payment_intents/{intent}/capture",
    "POST /v1/payment_intents/{intent}/cancel",
];
const EXPECTED_ANSWERS: &[&str] = &[
    "POST /v1/payment_intents → 200",
    "POST /v1/payment_intents → 400",
    "POST /v1/payment_intents → 402",
    "POST /v1/payment_intents → 409",
    "POST /v1/payment_intents → 500",
    "GET /v1/payment_intents → 200",
    "GET /v1/payment_intents/{intent} → 200",
    "GET /v1/payment_intents/{intent} → 404",
    "GET /v1/payment_intents/search → 200",
    "GET /v1/payment_intents/search → 400",
    "POST /v1/payment_intents/{intent}/capture → 200",
    "POST /v1/payment_intents/{intent}/capture → 400",
    "POST /v1/payment_intents/{intent}/capture → 404",
    "POST /v1/payment_intents/{intent}/cancel → 200",
    "POST /v1/payment_intents/{intent}/cancel → 400",
    "POST /v1/payment_intents/{intent}/cancel → 404",
    "POST /v1/refunds → 200",
    "POST /v1/refunds → 400",
    "GET /v1/refunds → 200",
    "GET /v1/refunds/{refund} → 200",
    "GET /v1/charges/{charge} → 200",
    "GET /v1/charges/{charge} → 404",
    "POST /v1/webhook_endpoints → 200",
    "GET /v1/webhook_endpoints → 200",
    "GET /v1/webhook_endpoints/{webhook_endpoint} → 200",
    "DELETE /v1/webhook_endpoints/{webhook_endpoint} → 200",
    "GET /v1/events → 200",
    "GET /v1/events/{id} → 200",
    "GET /v1/events → 401",
    "(no operation) → 404",
    "webhook payment_intent.succeeded",
    "webhook payment_intent.payment_failed",
    "webhook payment_intent.processing",
    "webhook payment_intent.requires_action",
    "webhook payment_intent.amount_capturable_updated",
    "webhook payment_intent.canceled",
    "webhook charge.succeeded",
    "webhook charge.failed",
    "webhook charge.pending",
    "webhook charge.captured",
    "webhook charge.expired",
    "webhook charge.refunded",
    "webhook refund.created",
    "webhook refund.updated",
    "webhook refund.failed",
];

/// What was checked, per kind of request or answer, and what violates the description.
pub struct Report {
    provenance: String,
    requests: BTreeMap<String, Kind>,
    answers: BTreeMap<String, Kind>,
}

#[derive(Default)]
struct Kind {
    seen: usize,
    /// Each distinct problem and how many times it occurred.
    problems: BTreeMap<String, usize>,
}

impl Kind {
    fn note(&mut self, problems: impl IntoIterator<Item = String>) {
        self.seen += 1;
        for problem in problems {
            *self.problems.entry(problem).or_default() += 1;
        }
    }

    fn instances(&self) -> usize {
        self.problems.values().sum()
    }
}

impl Report {
    pub fn of(spec: &Spec, api: &[Exchange], hooks: &[Exchange]) -> Self {
        let mut report =
            Self { provenance: spec.provenance.clone(), requests: BTreeMap::new(), answers: BTreeMap::new() };
        for exchange in api.iter().filter(|exchange| exchange.path.starts_with("/v1/")) {
            let template = spec.template(&exchange.method, &exchange.path);
            // payonce's gateway client (async-stripe's requests over payonce's transport), or
            // async-stripe's own client (`Stripe/v1 RustBindings/…`) for the calls payonce's
            // gateway does not make yet.
            let from_gateway = exchange
                .request_header("user-agent")
                .is_some_and(|agent| agent.contains("async-stripe") || agent.contains("RustBindings"));
            if from_gateway {
                let kind = template.clone().unwrap_or_else(|| format!("{} {}", exchange.method, exchange.path));
                let problems = spec.check_request(
                    &exchange.method,
                    &exchange.path,
                    exchange.query.as_deref(),
                    &exchange.request_body,
                );
                report.requests.entry(kind).or_default().note(problems);
            }
            let Some(answer) = &exchange.answer else {
                let kind = format!("{} → (connection broken)", template.as_deref().unwrap_or("(no operation)"));
                report.answers.entry(kind).or_default().note([]);
                continue;
            };
            let kind = format!("{} → {}", template.as_deref().unwrap_or("(no operation)"), answer.status.as_u16());
            let mut problems = headers(exchange, answer);
            problems.extend(error_members(answer));
            if template.is_some() {
                problems.extend(spec.check_answer(
                    &exchange.method,
                    &exchange.path,
                    answer.status.as_u16(),
                    &answer.body,
                ));
            }
            report.answers.entry(kind).or_default().note(problems);
        }
        for delivery in hooks {
            let event: Value = serde_json::from_slice(&delivery.request_body).unwrap_or_default();
            let kind = format!("webhook {}", event["type"].as_str().unwrap_or("(no type)"));
            let mut problems = spec.check_event(&delivery.request_body);
            if !delivery.request_header("stripe-signature").is_some_and(|s| s.starts_with("t=") && s.contains(",v1=")) {
                problems.push("no Stripe-Signature".into());
            }
            report.answers.entry(kind).or_default().note(problems);
        }
        report
    }

    pub fn is_clean(&self) -> bool {
        let covered = EXPECTED_REQUESTS.iter().all(|kind| self.requests.contains_key(*kind))
            && EXPECTED_ANSWERS.iter().all(|kind| self.answers.contains_key(*kind));
        covered && self.requests.values().chain(self.answers.values()).all(|kind| kind.problems.is_empty())
    }
}

/// The headers Stripe sends, as its libraries read them.
fn headers(exchange: &Exchange, answer: &Answer) -> Vec<String> {
    let mut problems = Vec::new();
    let request_id = answer.header("request-id").unwrap_or_default();
    if !request_id.starts_with("req_") {
        problems.push(format!("Request-Id is {request_id:?}"));
    }
    if answer.header("stripe-version").is_none_or(str::is_empty) {
        problems.push("no Stripe-Version".into());
    }
    if exchange.method == Method::POST
        && let Some(key) = exchange.request_header("idempotency-key")
        && answer.header("idempotency-key") != Some(key)
    {
        problems.push("the Idempotency-Key is not echoed".into());
    }
    let original = answer.header("original-request").unwrap_or_default();
    if answer.header("idempotent-replayed") == Some("true") {
        if !original.starts_with("req_") || original == request_id {
            problems.push(format!("a replay's Original-Request is {original:?}"));
        }
    } else if !original.is_empty() && original != request_id {
        problems.push("a first answer's Original-Request names another request".into());
    }
    let retryable = answer.status.is_server_error() || matches!(answer.status.as_u16(), 409 | 429);
    if retryable && answer.header("stripe-should-retry") != Some("true") {
        problems.push("a retryable error without Stripe-Should-Retry: true".into());
    }
    problems
}

/// The members of Stripe's error objects that the spec leaves optional but Stripe always sends.
fn error_members(answer: &Answer) -> Vec<String> {
    if answer.status.is_success() {
        return Vec::new();
    }
    let body: Value = serde_json::from_slice(&answer.body).unwrap_or_default();
    let error = &body["error"];
    let mut problems = Vec::new();
    if !error["request_log_url"].as_str().is_some_and(|url| url.contains("req_")) {
        problems.push("error: no request_log_url".into());
    }
    if error["code"].is_string() && !error["doc_url"].as_str().is_some_and(|url| url.starts_with("https://")) {
        problems.push("error: a code without doc_url".into());
    }
    if error["type"] == "card_error" {
        for member in ["payment_intent", "payment_method", "charge", "decline_code"] {
            if error[member].is_null() {
                problems.push(format!("card error: no {member}"));
            }
        }
    }
    problems
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "conformance with {}", self.provenance)?;
        for (title, kinds, expected) in [
            ("requests sent through async-stripe", &self.requests, EXPECTED_REQUESTS),
            ("answers", &self.answers, EXPECTED_ANSWERS),
        ] {
            let bad = kinds.values().filter(|kind| !kind.problems.is_empty()).count();
            let instances: usize = kinds.values().map(Kind::instances).sum();
            let exchanges: usize = kinds.values().map(|kind| kind.seen).sum();
            writeln!(
                f,
                "{title}: {exchanges} in {} kinds; {bad} kinds violate the spec ({instances} instances)",
                kinds.len()
            )?;
            for (name, kind) in kinds {
                let mark = if kind.problems.is_empty() { "ok " } else { "BAD" };
                writeln!(f, "  {mark} {name} ({} seen, {} problems)", kind.seen, kind.instances())?;
                for (problem, count) in &kind.problems {
                    writeln!(f, "        {count:>3} × {problem}")?;
                }
            }
            for missing in expected.iter().filter(|kind| !kinds.contains_key(**kind)) {
                writeln!(f, "  MISSING {missing} (no flow produced it)")?;
            }
        }
        Ok(())
    }
}
