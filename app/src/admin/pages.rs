//! The overview, the keys table, one key's page, and the operator's actions on it.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use uuid::Uuid;

use super::chart::{self, Series};
use super::queries::{self, Counts, Cursor, KeyFilter};
use super::{Chrome, Operator, parse_customer};
use crate::customers::CustomerId;
use crate::idempotency::StoredResponse;
use crate::idempotency::operator::{ActionResult, Refusal};
use crate::operations::Op;
use crate::payments::store;
use crate::refunds;
use crate::state::AppState;
use crate::web::flash::Flash;
use crate::web::format::filters;
use crate::web::page::{self, WebError};
use crate::web::{ago, clock, money, rfc3339};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/admin", get(overview))
        .route("/admin/keys", get(keys))
        .route("/admin/keys/{id}", get(key))
        .route("/admin/keys/{id}/release", post(release))
        .route("/admin/keys/{id}/expire", post(expire))
}

/// Width of one point of the outcomes chart, and how many points it has (15 minutes).
const BUCKET_SECS: u32 = 30;
const BUCKETS: u32 = 30;
/// Rows per page of the keys table.
const PAGE_SIZE: i64 = 25;

/// The people's name of a dashboard status.
fn status_label(status: &str) -> &'static str {
    match status {
        "in_flight" => "In flight",
        "stuck" => "Stuck",
        "completed" => "Completed",
        "failed" => "Failed",
        "expired" => "Expired",
        _ => "Unknown",
    }
}

/// A key's badge (CSS classes, label): its status refined by its stored answer (a 402 is a
/// decline, a 202 a payment still pending at the gateway: neither is a green "Completed") and,
/// while in flight, by whether its holder still shows signs of life.
fn badge(status: &str, response_status: Option<i16>, silent: bool) -> (String, &'static str) {
    match (status, response_status) {
        ("completed", Some(402)) => ("completed declined".to_owned(), "Completed · declined"),
        ("completed", Some(202)) => ("completed pending".to_owned(), "Completed · pending"),
        ("in_flight", _) if silent => ("in_flight silent".to_owned(), "In flight · holder silent"),
        _ => (status.to_owned(), status_label(status)),
    }
}

/// How the dashboard reads a processing key's lease. Its holder heartbeats every third of the
/// lease it took ([`crate::idempotency::Lease::hold`]), read from the row itself (the holder's
/// setting, not this server's); one that missed a beat and a half is silent.
#[derive(Clone, Copy)]
struct Liveness {
    /// This server's lease, for a row that does not tell.
    fallback: f64,
}

impl Liveness {
    fn of(state: &AppState) -> Self {
        Self { fallback: state.engine.settings().lease.as_secs_f64() }
    }

    /// How often the holder of a lease of `held` seconds heartbeats.
    fn beat(self, held: Option<f64>) -> f64 {
        held.filter(|held| *held > 0.0).unwrap_or(self.fallback) / 3.0
    }

    /// Whether a live lease's holder has gone quiet (crashed, killed, frozen): its lease still
    /// runs, but nothing is renewing it.
    fn silent(self, remaining: Option<f64>, heartbeat_age: Option<f64>, held: Option<f64>) -> bool {
        let beat = self.beat(held);
        matches!((remaining, heartbeat_age), (Some(left), Some(age)) if left > 0.0 && age > beat * 1.5 + 1.0)
    }

    /// How the lease looks now: "live, 42 s left · heartbeat 3 s ago", "holder silent …",
    /// "lapsed 3 s ago", or "—" for a final key.
    fn text(self, remaining: Option<f64>, heartbeat_age: Option<f64>, held: Option<f64>) -> String {
        let beat = heartbeat_age.map(|age| format!(" · heartbeat {}", ago(age))).unwrap_or_default();
        match remaining {
            Some(secs) if secs > 0.0 && self.silent(remaining, heartbeat_age, held) => format!(
                "holder silent for {} (it heartbeats every {} s): taken over when its lease runs out, in {} s",
                heartbeat_age.map(|age| format!("{} s", age.floor() as i64)).unwrap_or_default(),
                self.beat(held).round() as i64,
                secs.ceil() as i64,
            ),
            Some(secs) if secs > 0.0 => format!("live, {} s left{beat}", secs.ceil() as i64),
            Some(secs) => format!("lapsed {}{beat}", ago(-secs)),
            None => "—".to_owned(),
        }
    }
}

/// Why a stuck key is stuck, and what happens next: how its last holder let go, its attempts
/// against the budget, and when it may be taken again.
fn stuck_why(
    last_transition: Option<&str>,
    heartbeat_age: Option<f64>,
    attempts: i32,
    max_attempts: i32,
    exhausted: bool,
    next_attempt: Option<f64>,
) -> String {
    let cause = match last_transition {
        Some(t) if t.starts_with("released") => {
            let reason = t.split_once(": ").map_or("no reason recorded", |(_, reason)| reason);
            format!("its holder gave it back ({reason})")
        }
        Some(t) if t.starts_with("lease_lost") => "its holder found its lease taken over and stopped".to_owned(),
        _ => format!(
            "its holder stopped without a word (crashed, killed or cut off){}",
            heartbeat_age.map(|age| format!(": last heard from {}", ago(age))).unwrap_or_default()
        ),
    };
    let budget = if exhausted {
        format!("attempts {attempts}/{max_attempts}, budget spent: only the sweeper takes it now, to ask the gateway")
    } else {
        format!("attempts {attempts}/{max_attempts}")
    };
    let next = match next_attempt {
        Some(secs) if secs > 0.0 => format!("next attempt in {} s (backoff)", secs.ceil() as i64),
        _ => "next attempt: now, by the next client retry or sweeper pass".to_owned(),
    };
    format!("Stuck because {cause}; {budget}; {next}.")
}

// ---------------------------------------------------------------------------------------------
// Overview

#[derive(Template)]
#[template(path = "admin/overview.html")]
struct OverviewPage {
    chrome: Chrome,
    counts: Counts,
    /// Where the counts stop.
    cap: i64,
    chart: String,
    legend: Vec<LegendEntry>,
    /// The chart's numbers: one row per point, newest first.
    rows: Vec<(String, Vec<i64>)>,
    minutes: u32,
}

struct LegendEntry {
    label: &'static str,
    class: &'static str,
    dash: &'static str,
    total: i64,
}

/// `GET /admin`.
async fn overview(State(state): State<AppState>, operator: Operator) -> Result<Response, WebError> {
    // Counts and a chart: a replica's view, a moment old, is good enough ([`crate::db::Reads`]).
    let pool = state.reads.pool();
    let counts = queries::counts(pool).await?;
    let mut series = chart::outcome_series(BUCKETS as usize);
    let kinds: Vec<&str> = series.iter().map(|s| s.kind).collect();
    // The page's chrome asks a replica how far behind it is (once): the chart's settled buckets
    // allow for it.
    let chrome = operator.chrome(&state, "overview").await?;
    let lag_secs = chrome.replica.as_ref().map_or(0.0, |replica| replica.behind_secs);
    let settled = || state.web.settled.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let from = settled().through.map(|through| through + 1);
    let read = queries::outcome_buckets(pool, &kinds, BUCKET_SECS, BUCKETS.into(), from, lag_secs).await?;
    chart::fill(&mut series, &mut settled(), from, read);
    let rows = (0..BUCKETS as usize)
        .rev()
        .map(|i| {
            let ago_secs = (BUCKETS as usize - 1 - i) as u32 * BUCKET_SECS;
            let label = if ago_secs == 0 {
                "last 30 s".to_owned()
            } else {
                format!("{ago_secs}–{} s ago", ago_secs + BUCKET_SECS)
            };
            (label, series.iter().map(|s: &Series| s.values[i]).collect())
        })
        .collect();
    let page = OverviewPage {
        chart: chart::svg(&series, BUCKET_SECS),
        legend: series
            .iter()
            .map(|s| LegendEntry { label: s.label, class: s.class, dash: s.dash, total: s.total() })
            .collect(),
        rows,
        minutes: BUCKETS * BUCKET_SECS / 60,
        counts,
        cap: queries::COUNT_CAP,
        chrome,
    };
    page::render(StatusCode::OK, &page)
}

// ---------------------------------------------------------------------------------------------
// Keys table

#[derive(Template)]
#[template(path = "admin/keys.html")]
struct KeysPage {
    chrome: Chrome,
    rows: Vec<KeyRowView>,
    /// How many keys match, counted to [`queries::COUNT_CAP`].
    total: queries::Tally,
    q: String,
    /// (value, label, selected) for the status filter.
    statuses: Vec<(&'static str, &'static str, bool)>,
    /// (value, label, selected) for the operation filter.
    operations: Vec<(&'static str, &'static str, bool)>,
    /// (value, name, selected) for the customer filter.
    customers: Vec<(String, String, bool)>,
    /// This page's URL, which the live refresh reloads.
    url: String,
    newer: Option<String>,
    older: Option<String>,
    /// The first page, when this is not it.
    newest: Option<String>,
}

struct KeyRowView {
    id: String,
    key: String,
    /// `payment`, `refund`: what the key was used for (its route).
    operation: String,
    customer: String,
    status: String,
    /// The badge's CSS classes.
    badge: String,
    status_label: &'static str,
    /// Why a stuck key is stuck; empty otherwise.
    why: String,
    recovery_point: String,
    attempts: i32,
    token: i64,
    owner: String,
    created: String,
    created_iso: String,
    age: String,
    lease: String,
    response: String,
}

#[derive(Deserialize, Default)]
struct KeysQuery {
    #[serde(default)]
    state: String,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    customer: String,
    #[serde(default)]
    q: String,
    #[serde(default)]
    before: String,
    #[serde(default)]
    after: String,
}

impl KeysQuery {
    /// The URL of the keys table with this query's filters and the given cursor.
    fn url(&self, cursor: Option<(&str, Uuid)>) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        let filters =
            [("state", &self.state), ("operation", &self.operation), ("customer", &self.customer), ("q", &self.q)];
        for (name, value) in filters {
            if !value.is_empty() {
                query.append_pair(name, value);
            }
        }
        if let Some((name, id)) = cursor {
            query.append_pair(name, &id.to_string());
        }
        let query = query.finish();
        if query.is_empty() { "/admin/keys".to_owned() } else { format!("/admin/keys?{query}") }
    }
}

/// `GET /admin/keys`.
async fn keys(
    State(state): State<AppState>,
    operator: Operator,
    Query(query): Query<KeysQuery>,
) -> Result<Response, WebError> {
    let pool = state.engine.pool();
    let status = queries::STATUSES.iter().find(|(value, _)| *value == query.state).map(|(value, _)| *value);
    let operation = Op::named(&query.operation);
    let customer = parse_customer(&query.customer);
    let search = query.q.trim();
    let search = if search.is_empty() { None } else { Some(queries::search(pool, search).await?) };
    let filter = KeyFilter {
        status: status.map(str::to_owned),
        customer,
        search,
        route: operation.map(|op| op.route().to_owned()),
    };
    let cursor = match (Uuid::try_parse(&query.before), Uuid::try_parse(&query.after)) {
        (Ok(before), _) => Cursor::Before(before),
        (_, Ok(after)) => Cursor::After(after),
        _ => Cursor::Newest,
    };
    let settings = state.engine.settings();
    let budget = queries::BudgetParams::of(&settings);
    let live = Liveness::of(&state);
    let result = queries::keys(pool, &filter, cursor, PAGE_SIZE, budget).await?;
    let total = queries::count_keys(pool, &filter).await?;
    let first = result.rows.first().map(|row| row.id);
    let last = result.rows.last().map(|row| row.id);
    let rows = result
        .rows
        .into_iter()
        .map(|row| {
            let silent = live.silent(row.lease_remaining_secs, row.heartbeat_age_secs, row.held_secs);
            let (badge, status_label) = badge(&row.status, row.response_status, silent);
            KeyRowView {
                id: row.id.to_string(),
                key: row.key,
                operation: operation_of(&row.route).to_owned(),
                customer: row.customer_name,
                why: if row.status == "stuck" {
                    stuck_why(
                        row.last_transition.as_deref(),
                        row.heartbeat_age_secs,
                        row.attempts,
                        budget.max_attempts,
                        row.exhausted.unwrap_or(false),
                        row.next_attempt_secs,
                    )
                } else {
                    String::new()
                },
                badge,
                status_label,
                status: row.status,
                recovery_point: row.recovery_point,
                attempts: row.attempts,
                token: row.lease_token,
                owner: row.lease_owner.unwrap_or_default(),
                created: clock(row.created_at),
                created_iso: rfc3339(row.created_at),
                age: ago(row.age_secs),
                lease: live.text(row.lease_remaining_secs, row.heartbeat_age_secs, row.held_secs),
                response: row.response_status.map(|s| s.to_string()).unwrap_or_default(),
            }
        })
        .collect();
    let customers = queries::customers(pool)
        .await?
        .into_iter()
        .map(|c| (CustomerId(c.id).to_string(), c.name, Some(c.id) == customer))
        .collect();
    let page = KeysPage {
        rows,
        total,
        q: query.q.clone(),
        statuses: queries::STATUSES.iter().map(|(value, label)| (*value, *label, Some(*value) == status)).collect(),
        operations: Op::ALL.iter().map(|op| (op.name(), op.label(), operation == Some(*op))).collect(),
        customers,
        url: query.url(match cursor {
            Cursor::Newest => None,
            Cursor::Before(id) => Some(("before", id)),
            Cursor::After(id) => Some(("after", id)),
        }),
        newer: result.has_newer.then_some(first).flatten().map(|id| query.url(Some(("after", id)))),
        older: result.has_older.then_some(last).flatten().map(|id| query.url(Some(("before", id)))),
        newest: (!matches!(cursor, Cursor::Newest)).then(|| query.url(None)),
        chrome: operator.chrome(&state, "keys").await?,
    };
    page::render(StatusCode::OK, &page)
}

// ---------------------------------------------------------------------------------------------
// One key

#[derive(Template)]
#[template(path = "admin/key.html")]
struct KeyPage {
    chrome: Chrome,
    id: String,
    key: Option<KeyView>,
    /// What remains of the key once it expired.
    tombstone: Option<TombstoneView>,
    payment: Option<PaymentView>,
    /// `payment`, `refund` (or an unknown route): which of `payment` and `refund` is shown.
    operation: String,
    refund: Option<RefundFacts>,
    /// What the page says when a refund key has no refund row.
    refund_missing: &'static str,
    events: Vec<EventView>,
}

struct KeyView {
    key: String,
    customer: String,
    customer_id: String,
    method: String,
    route: String,
    fingerprint: String,
    request: String,
    status: String,
    badge: String,
    status_label: &'static str,
    /// Why a stuck key is stuck; empty otherwise.
    why: String,
    /// When its holder last wrote it; empty for final keys.
    heartbeat: String,
    /// A live lease that nobody renews: no countdown that would call it "live".
    silent: bool,
    recovery_point: String,
    attempts: i32,
    max_attempts: i32,
    token: i64,
    owner: String,
    /// RFC 3339 deadline of the lease; empty for final keys.
    locked_until: String,
    /// Seconds left on the lease when the page was rendered, for the live countdown.
    remaining: String,
    lease: String,
    response_status: String,
    response_headers: Vec<String>,
    response_body: String,
    created: String,
    completed: String,
    expires: String,
}

struct TombstoneView {
    key: String,
    customer: String,
    customer_id: String,
    /// How it ended: "Completed · declined", "Failed", …
    outcome: &'static str,
    badge: String,
    response_status: String,
    attempts: String,
    by: String,
    expired_at: String,
}

struct PaymentView {
    id: String,
    amount: String,
    /// An authorization's captured amount (`"capture": "manual"`); empty for automatic capture.
    captured: String,
    payment_method: String,
    status: String,
    payment_intent: String,
    failure: String,
}

/// The refund a refund key made.
struct RefundFacts {
    id: String,
    amount: String,
    status: &'static str,
    gateway_refund: String,
    /// The payment it refunds (`pay_…`), linked to its page.
    payment: String,
    reason: String,
    /// `operator:<name>` for a refund made from the dashboard; empty for the customer's own.
    by: String,
    failure: String,
    created: String,
}

struct EventView {
    at: String,
    at_iso: String,
    kind: String,
    token: String,
    detail: String,
}

/// Pretty JSON for people; anything else as (lossy) text.
fn pretty(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|json| serde_json::to_string_pretty(&json).ok())
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

/// `GET /admin/keys/{id}`. A key that no longer exists still shows its timeline.
async fn key(State(state): State<AppState>, operator: Operator, Path(id): Path<String>) -> Result<Response, WebError> {
    let id = Uuid::try_parse(&id).map_err(|_| WebError::NotFound)?;
    let pool = state.engine.pool();
    let settings = state.engine.settings();
    let budget = queries::BudgetParams::of(&settings);
    let live = Liveness::of(&state);
    let key = queries::key(pool, id, budget).await?;
    let events = queries::events_of(pool, id).await?;
    if key.is_none() && events.is_empty() {
        return Err(WebError::NotFound);
    }
    let tombstone = match key {
        Some(_) => None,
        None => queries::tombstone(pool, id).await?,
    };
    // A refund key's refund (refunds keep their key's id, so it outlives the key).
    let refund = refunds::store::find_by_key(pool, id).await?;
    // The key's route says what it was for; a key known only from its events is a refund's if a
    // refund was made under it.
    let route = match (&key, &tombstone) {
        (Some(k), _) => k.route.clone(),
        (None, Some(t)) => t.route.clone(),
        (None, None) if refund.is_some() => refunds::ROUTE.to_owned(),
        (None, None) => crate::payments::ROUTE.to_owned(),
    };
    // A capture's or a cancel's key is about the payment its request names, which its first
    // write's event names too (and outlives the key).
    let customer = key.as_ref().map(|k| k.customer_id).or(tombstone.as_ref().map(|t| t.customer_id));
    let settled = match Op::of_route(&route) {
        Some(Op::Capture | Op::Cancel) => key
            .as_ref()
            .and_then(|k| k.request["payment"].as_str().map(str::to_owned))
            .or_else(|| events.iter().find_map(|e| e.detail["payment"].as_str().map(str::to_owned)))
            .and_then(|id| crate::payments::PaymentId::parse(&id)),
        _ => None,
    };
    let tombstone = tombstone.map(|t| {
        let (badge, outcome) = badge(t.state.as_deref().unwrap_or("expired"), t.response_status, false);
        TombstoneView {
            key: t.key.unwrap_or_default(),
            customer: t.customer_name.unwrap_or_else(|| "(deleted customer)".to_owned()),
            customer_id: CustomerId(t.customer_id).to_string(),
            outcome,
            badge,
            response_status: t.response_status.map(|s| s.to_string()).unwrap_or_default(),
            attempts: t.attempts.map(|a| a.to_string()).unwrap_or_default(),
            by: t.by.unwrap_or_else(|| "the reaper, at the end of its retention".to_owned()),
            expired_at: rfc3339(t.expired_at),
        }
    });
    let operation = operation_of(&route).to_owned();
    // Who asked for it: the refund's first write names an operator on its event.
    let by = events
        .iter()
        .find(|e| e.kind == crate::refunds::REFUND_CREATED.as_str())
        .and_then(|e| e.detail.get("by")?.as_str())
        .unwrap_or_default()
        .to_owned();
    let refund = refund.map(|(r, _)| RefundFacts {
        id: r.id.to_string(),
        amount: money(r.amount, &r.currency),
        status: r.status.as_str(),
        gateway_refund: r.gateway_refund.unwrap_or_default(),
        payment: r.payment_id.to_string(),
        reason: r.reason.unwrap_or_default(),
        by,
        failure: r.failure.map(|(code, message)| format!("{message} ({code})")).unwrap_or_default(),
        created: rfc3339(r.created_at),
    });
    let refund_missing = match &key {
        Some(k) if k.recovery_point == "started" => "yet: the key is at started, before the refund row is written",
        Some(_) => "yet",
        None => "remains: the key ended before a refund row was written",
    };
    let payment = match (settled, customer) {
        (Some(payment), Some(customer)) => store::find(pool, customer, payment).await?,
        _ if route == refunds::ROUTE => None,
        _ => store::find_by_key(pool, id).await?,
    };
    let payment = payment.map(|p| PaymentView {
        id: p.id.to_string(),
        amount: money(p.amount, &p.currency),
        captured: match p.manual_capture {
            true => {
                format!("{} (of {} authorized)", money(p.amount_captured, &p.currency), money(p.amount, &p.currency))
            }
            false => String::new(),
        },
        payment_method: p.payment_method,
        status: p.status.as_str().to_owned(),
        payment_intent: p.payment_intent.unwrap_or_default(),
        failure: p.failure.map(|f| f.message).unwrap_or_default(),
    });
    let key = key.map(|k| {
        // The same decoding a replay uses; a final row it cannot read is shown as such.
        let stored =
            StoredResponse::from_columns(k.response_status, k.response_headers.as_ref(), k.response_body.clone());
        let (response_headers, response_body) = match (&stored, k.response_status) {
            (Some(stored), _) => (
                stored
                    .headers
                    .iter()
                    .map(|(name, value)| format!("{name}: {}", value.to_str().unwrap_or("?")))
                    .collect(),
                pretty(&stored.body),
            ),
            (None, Some(_)) => (Vec::new(), "(unreadable: this version cannot decode the stored response)".to_owned()),
            (None, None) => (Vec::new(), String::new()),
        };
        let silent = live.silent(k.lease_remaining_secs, k.heartbeat_age_secs, k.held_secs);
        let (badge, status_label) = badge(&k.status, k.response_status, silent);
        KeyView {
            why: if k.status == "stuck" {
                stuck_why(
                    k.last_transition.as_deref(),
                    k.heartbeat_age_secs,
                    k.attempts,
                    budget.max_attempts,
                    k.exhausted.unwrap_or(false),
                    k.next_attempt_secs,
                )
            } else {
                String::new()
            },
            heartbeat: k.heartbeat_age_secs.map(ago).unwrap_or_default(),
            silent,
            max_attempts: budget.max_attempts,
            key: k.key,
            customer: k.customer_name,
            customer_id: CustomerId(k.customer_id).to_string(),
            method: k.method,
            route: k.route,
            fingerprint: hex::encode(&k.fingerprint),
            request: serde_json::to_string_pretty(&k.request).unwrap_or_default(),
            badge,
            status_label,
            status: k.status,
            recovery_point: k.recovery_point,
            attempts: k.attempts,
            token: k.lease_token,
            owner: k.lease_owner.unwrap_or_default(),
            locked_until: k.locked_until.map(rfc3339).unwrap_or_default(),
            remaining: k.lease_remaining_secs.map(|secs| format!("{secs:.1}")).unwrap_or_default(),
            lease: live.text(k.lease_remaining_secs, k.heartbeat_age_secs, k.held_secs),
            response_status: k.response_status.map(|s| s.to_string()).unwrap_or_default(),
            response_headers,
            response_body,
            created: rfc3339(k.created_at),
            completed: k.completed_at.map(rfc3339).unwrap_or_default(),
            expires: rfc3339(k.expires_at),
        }
    });
    let events = events
        .into_iter()
        .map(|e| EventView {
            at: clock(e.created_at),
            at_iso: rfc3339(e.created_at),
            kind: e.kind,
            token: e.lease_token.map(|t| t.to_string()).unwrap_or_default(),
            detail: if e.detail.as_object().is_some_and(|o| o.is_empty()) {
                String::new()
            } else {
                e.detail.to_string()
            },
        })
        .collect();
    let page = KeyPage {
        id: id.to_string(),
        key,
        tombstone,
        payment,
        operation,
        refund,
        refund_missing,
        events,
        chrome: operator.chrome(&state, "keys").await?,
    };
    page::render(StatusCode::OK, &page)
}

/// The form of both actions: the token the operator saw (the fence).
#[derive(Deserialize)]
struct ActionForm {
    lease_token: i64,
}

/// `POST /admin/keys/{id}/release`.
async fn release(state: State<AppState>, operator: Operator, id: Path<Uuid>, form: Form<ActionForm>) -> Response {
    act(state, operator, id, form, Action::Release).await.into_response()
}

/// `POST /admin/keys/{id}/expire`.
async fn expire(state: State<AppState>, operator: Operator, id: Path<Uuid>, form: Form<ActionForm>) -> Response {
    act(state, operator, id, form, Action::Expire).await.into_response()
}

/// The operator's two actions on a key.
enum Action {
    Release,
    Expire,
}

/// Runs an action through the engine's fenced statement, tells the operator what happened, and
/// goes back to the key's page.
async fn act(
    State(state): State<AppState>,
    operator: Operator,
    Path(id): Path<Uuid>,
    Form(form): Form<ActionForm>,
    action: Action,
) -> Result<Response, WebError> {
    let (seen, by) = (form.lease_token, operator.name.as_str());
    let message = match action {
        Action::Release => outcome_message(
            state.engine.operator_release(id, seen, by).await?,
            seen,
            "only a stuck key can be released",
            format!(
                "Released the key: its token went from {seen} to {}, fencing off the old holder. The next retry or the \
                 sweeper resumes it.",
                seen + 1
            ),
        ),
        Action::Expire => outcome_message(
            state.engine.operator_expire(id, seen, by).await?,
            seen,
            "only a completed or failed key can be expired; a processing key still has work to finish",
            "Expired the key. What it created (its payment or refund) stays; the same Idempotency-Key is now a new request.".to_owned(),
        ),
    };
    operator.flash(message).await?;
    Ok(Redirect::to(&format!("/admin/keys/{id}")).into_response())
}

/// What to tell the operator about a fenced action.
fn outcome_message(result: ActionResult, seen: i64, wrong_state: &str, done: String) -> Flash {
    match result {
        Ok(()) => Flash::success(done),
        Err(Refusal::Gone) => Flash::warning("Nothing was done: the key no longer exists (it expired)."),
        Err(Refusal::Superseded { now }) => Flash::warning(format!(
            "Nothing was done: the key changed since you looked (you saw token {seen}, it is now {now}): a client \
             retry, the sweeper or another operator got there first. Check the key again."
        )),
        Err(Refusal::WrongState { state }) => {
            Flash::warning(format!("Nothing was done: the key is {state} now, and {wrong_state}."))
        }
    }
}

/// The operation of a key recorded on `route` (its registry name), or the route itself for one
/// this version does not know.
fn operation_of(route: &str) -> &str {
    match Op::of_route(route) {
        Some(op) => op.name(),
        None => route,
    }
}
