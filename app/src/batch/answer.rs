//! What one answer of `POST /v1/payments` means for a row: a final outcome, a retry, or the end
//! of the run. The table in docs/batch.md ("What each answer means") is this file.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

/// The problem types (after `https://payonce.dev/problems/`) that decide a row (docs/errors.md).
const KEY_REUSED: &str = "idempotency-key-reused";
const ABANDONED: &str = "payment-abandoned";
const PROBLEM_BASE: &str = "https://payonce.dev/problems/";

/// A row's outcome. Only the first four leave nothing to do, and `Pending` only until the payment
/// settles: the run follows it (`batch::follow`) and replaces it by `Charged`, `Replayed` or
/// `Failed`, unless the wait ends first (or `--no-wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// 201, not replayed: this run created the payment and it succeeded.
    Charged,
    /// 201 replayed: an earlier run (or a concurrent one) charged it; not charged again.
    Replayed,
    /// 202: the gateway has not settled it (a bank debit processing, a card awaiting 3-D Secure).
    /// The key's final answer (never charged again), but not the payment's: after following it,
    /// a row still pending means its outcome is not known yet (exit 4).
    Pending,
    /// 402: declined by the issuer or refused by the gateway. Final; a failure only with
    /// `--fail-on-decline`.
    Declined,
    /// 202, then the payment failed at the gateway (a bank debit that did not settle, a 3-D
    /// Secure authentication that failed): not charged. Always a failure: the run had reported
    /// the row as accepted, and the money is not coming.
    Failed,
    /// 422 `idempotency-key-reused`: the row's content differs from what this batch sent for it
    /// before. Never charged; the file or the batch id is wrong.
    Changed,
    /// 400 or another 4xx: the server refused the request itself (the key was not used).
    Rejected,
    /// 502 `payment-abandoned`: payonce confirmed that no charge was made. Final.
    Abandoned,
    /// No final answer before the row's deadline (409, 503, 5xx, the network): the key may be in
    /// flight or reconciling. A re-run resumes it, and never charges twice.
    Unresolved,
    /// The run stopped before the row was sent.
    NotSent,
}

impl Outcome {
    /// The name in the results file and the summary.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charged => "charged",
            Self::Replayed => "replayed",
            Self::Pending => "pending",
            Self::Declined => "declined",
            Self::Failed => "failed",
            Self::Changed => "changed",
            Self::Rejected => "rejected",
            Self::Abandoned => "abandoned",
            Self::Unresolved => "unresolved",
            Self::NotSent => "not_sent",
        }
    }

    /// Whether the row counts against exit code 0.
    pub fn is_failure(self, fail_on_decline: bool) -> bool {
        match self {
            Self::Charged | Self::Replayed | Self::Pending => false,
            Self::Declined => fail_on_decline,
            Self::Failed | Self::Changed | Self::Rejected | Self::Abandoned | Self::Unresolved | Self::NotSent => true,
        }
    }

    /// Every outcome, in the order of their declaration (their index in counts).
    pub const ALL: [Outcome; 10] = [
        Self::Charged,
        Self::Replayed,
        Self::Pending,
        Self::Declined,
        Self::Failed,
        Self::Changed,
        Self::Rejected,
        Self::Abandoned,
        Self::Unresolved,
        Self::NotSent,
    ];
}

/// What the run knows about a row once it is done with it: a line of the results file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowResult {
    pub outcome: Outcome,
    /// The last HTTP status received, if any.
    pub status: Option<u16>,
    /// `pay_…`, when the answer named one.
    pub payment_id: Option<String>,
    /// The payment's status (`succeeded`, `processing`, `requires_action`, `failed`).
    pub payment_status: Option<String>,
    /// Whether the answer carried `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// Why, in a few words: the decline code, the problem's detail, the last error.
    pub detail: String,
}

impl RowResult {
    /// A row the run never sent.
    pub fn not_sent(why: &str) -> Self {
        Self {
            outcome: Outcome::NotSent,
            status: None,
            payment_id: None,
            payment_status: None,
            replayed: false,
            detail: why.to_owned(),
        }
    }

    /// A row given up on, after `last` (the last answer or error).
    pub fn unresolved(status: Option<u16>, last: String) -> Self {
        Self {
            outcome: Outcome::Unresolved,
            status,
            payment_id: None,
            payment_status: None,
            replayed: false,
            detail: last,
        }
    }
}

/// What to do after one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The row is done.
    Final(RowResult),
    /// Send the same request again (same key: always safe), no sooner than `after` when the server
    /// said so (`Retry-After`); `why` is kept for the results file if the row is given up on.
    Retry { status: Option<u16>, after: Option<Duration>, why: String },
    /// No row can succeed: stop the run (bad API key, a URL that is not payonce's).
    Abort(String),
}

/// Reads one HTTP answer to a row's `POST /v1/payments`.
pub fn classify(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Answer {
    let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let replayed = headers.get("idempotent-replayed").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    let code = status.as_u16();
    let problem_type = json["type"].as_str().and_then(|t| t.strip_prefix(PROBLEM_BASE)).unwrap_or("");
    let detail = json["detail"].as_str().unwrap_or_default();
    let text = |s: &str| Some(s.to_owned()).filter(|s| !s.is_empty());
    let done = |outcome, payment_id: Option<String>, payment_status: Option<String>, detail: String| {
        Answer::Final(RowResult { outcome, status: Some(code), payment_id, payment_status, replayed, detail })
    };
    match code {
        // payonce answers a new payment 201 and replays it 201; a 200 would be the same answer.
        200 | 201 => done(
            if replayed { Outcome::Replayed } else { Outcome::Charged },
            json["id"].as_str().and_then(text),
            json["status"].as_str().and_then(text),
            String::new(),
        ),
        202 => done(
            Outcome::Pending,
            json["id"].as_str().and_then(text),
            json["status"].as_str().and_then(text),
            "pending at the gateway: see GET /v1/payments/{id}".to_owned(),
        ),
        402 => {
            let why = [json["code"].as_str(), json["decline_code"].as_str()].into_iter().flatten().collect::<Vec<_>>();
            done(
                Outcome::Declined,
                json["payment"].as_str().and_then(text),
                Some("failed".to_owned()),
                if why.is_empty() { problem_type.to_owned() } else { why.join("/") },
            )
        }
        422 if problem_type == KEY_REUSED => done(
            Outcome::Changed,
            None,
            None,
            "the row differs from what this batch sent for its row_id before; not charged".to_owned(),
        ),
        401 | 403 => Answer::Abort(format!("the API refused the API key ({code}): {detail}")),
        404 | 405 => {
            Answer::Abort(format!("{code} from POST /v1/payments: is --api-url the address of a payonce server?"))
        }
        502 if problem_type == ABANDONED => {
            done(Outcome::Abandoned, json["payment"].as_str().and_then(text), None, detail.to_owned())
        }
        // In flight, being reconciled, a gateway or database outage, a slow body, a bug: the
        // same key again is always safe, and the server says when (Retry-After).
        408 | 409 | 429 | 500..=599 => Answer::Retry {
            status: Some(code),
            after: retry_after(headers),
            why: format!("{code} {}", if problem_type.is_empty() { "no problem type" } else { problem_type }),
        },
        _ => done(Outcome::Rejected, None, None, rejected_detail(code, problem_type, detail, &json)),
    }
}

/// A transport error (connection refused or reset, a timeout): retried, with backoff.
pub fn transport(err: &reqwest::Error) -> Answer {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else {
        "connection failed"
    };
    // reqwest's Display is "error sending request for url (…)"; the deepest source says what
    // happened ("Connection refused (os error 111)").
    let mut cause: &dyn std::error::Error = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    Answer::Retry { status: None, after: None, why: format!("{kind}: {cause}") }
}

/// The `Retry-After` header, in seconds (payonce never sends an HTTP date).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers.get("retry-after")?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs))
}

/// A 400's detail, with the fields it names.
fn rejected_detail(code: u16, problem_type: &str, detail: &str, json: &Value) -> String {
    let fields: Vec<String> = json["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| format!("{} {}", e["field"].as_str().unwrap_or("?"), e["detail"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    let mut out = format!("{code} {problem_type}");
    if !detail.is_empty() {
        out.push_str(": ");
        out.push_str(detail);
    }
    if !fields.is_empty() {
        out.push_str(" (");
        out.push_str(&fields.join("; "));
        out.push(')');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (reqwest::header::HeaderName::from_static(k), HeaderValue::from_static(v))).collect()
    }

    fn final_of(status: u16, pairs: &[(&'static str, &'static str)], body: &str) -> RowResult {
        match classify(StatusCode::from_u16(status).unwrap(), &headers(pairs), body.as_bytes()) {
            Answer::Final(result) => result,
            other => panic!("{status}: not final: {other:?}"),
        }
    }

    /// Every final answer, read as docs/batch.md says.
    #[test]
    fn final_answers() {
        let payment = r#"{"id": "pay_1", "status": "succeeded"}"#;
        let new = final_of(201, &[], payment);
        assert_eq!((new.outcome, new.replayed, new.payment_id.as_deref()), (Outcome::Charged, false, Some("pay_1")));
        let replay = final_of(201, &[("idempotent-replayed", "true")], payment);
        assert_eq!((replay.outcome, replay.replayed), (Outcome::Replayed, true));
        let pending = final_of(202, &[("idempotent-replayed", "true")], r#"{"id": "pay_2", "status": "processing"}"#);
        assert_eq!((pending.outcome, pending.payment_status.as_deref()), (Outcome::Pending, Some("processing")));
        assert!(pending.replayed, "a pending replay is still pending, and says it was replayed");
        let declined = final_of(
            402,
            &[],
            r#"{"type": "https://payonce.dev/problems/card-declined", "payment": "pay_3", "code": "card_declined", "decline_code": "insufficient_funds"}"#,
        );
        assert_eq!(
            (declined.outcome, declined.detail.as_str()),
            (Outcome::Declined, "card_declined/insufficient_funds")
        );
        assert_eq!(declined.payment_id.as_deref(), Some("pay_3"));
        let changed = final_of(422, &[], r#"{"type": "https://payonce.dev/problems/idempotency-key-reused"}"#);
        assert_eq!(changed.outcome, Outcome::Changed);
        let rejected = final_of(
            400,
            &[],
            r#"{"type": "https://payonce.dev/problems/invalid-request", "detail": "bad", "errors": [{"field": "amount", "detail": "too big"}]}"#,
        );
        assert_eq!(
            (rejected.outcome, rejected.detail.as_str()),
            (Outcome::Rejected, "400 invalid-request: bad (amount too big)")
        );
        let abandoned = final_of(502, &[], r#"{"type": "https://payonce.dev/problems/payment-abandoned"}"#);
        assert_eq!(abandoned.outcome, Outcome::Abandoned);
    }

    /// 409, 503 and 5xx are retried after Retry-After; 401 and 404 end the run.
    #[test]
    fn retries_and_aborts() {
        let in_flight = classify(
            StatusCode::CONFLICT,
            &headers(&[("retry-after", "3")]),
            br#"{"type": "https://payonce.dev/problems/idempotency-key-in-use"}"#,
        );
        assert_eq!(
            in_flight,
            Answer::Retry {
                status: Some(409),
                after: Some(Duration::from_secs(3)),
                why: "409 idempotency-key-in-use".into()
            }
        );
        for status in [500, 502, 503, 504] {
            let answer = classify(StatusCode::from_u16(status).unwrap(), &HeaderMap::new(), b"<html>");
            assert!(matches!(answer, Answer::Retry { after: None, .. }), "{status}: {answer:?}");
        }
        assert!(matches!(classify(StatusCode::UNAUTHORIZED, &HeaderMap::new(), b"{}"), Answer::Abort(_)));
        assert!(matches!(classify(StatusCode::NOT_FOUND, &HeaderMap::new(), b""), Answer::Abort(_)));
    }

    #[test]
    fn failures_for_the_exit_code() {
        let failing: Vec<_> = Outcome::ALL.into_iter().filter(|o| o.is_failure(false)).collect();
        assert_eq!(
            failing,
            [
                Outcome::Failed,
                Outcome::Changed,
                Outcome::Rejected,
                Outcome::Abandoned,
                Outcome::Unresolved,
                Outcome::NotSent
            ]
        );
        assert!(Outcome::Declined.is_failure(true));
        assert!(!Outcome::Pending.is_failure(true));
        for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, i, "ALL is in the order of the declaration");
        }
    }
}
