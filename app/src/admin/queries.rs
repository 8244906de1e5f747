//! What the dashboard shows, read straight from the engine's tables. Read-only: every write the
//! dashboard makes goes through the engine, [`crate::idempotency::operator`] for the actions on a
//! key and [`crate::http::refunds::execute`] (the API's own path) for a refund.
//!
//! A key's *status* on the dashboard refines its `state` column by its lease:
//!
//! | status      | rows                                                        |
//! |-------------|-------------------------------------------------------------|
//! | `in_flight` | `processing` and `locked_until > now()`: a worker holds it  |
//! | `stuck`     | `processing` and `locked_until <= now()`: lease lapsed, not yet resumed |
//! | `completed` | `completed`                                                 |
//! | `failed`    | `failed` (the gateway confirmed no charge)                  |
//! | `expired`   | deleted by the reaper or an operator; counted from `expired` events |

use serde_json::Value;
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

/// The statuses a key can be filtered by.
pub const STATUSES: [(&str, &str); 5] = [
    ("in_flight", "In flight"),
    ("stuck", "Stuck"),
    ("completed", "Completed"),
    ("failed", "Failed"),
    ("expired", "Expired"),
];

/// How far the dashboard counts: past it, a count says "10,000+". Counting stops there, so a
/// count costs at most this many index entries however large the tables grow.
pub const COUNT_CAP: i64 = 10_000;

/// A count that stops at [`COUNT_CAP`]: `capped` when there are more.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// The rows counted, at most [`COUNT_CAP`].
    pub count: i64,
    /// Whether more rows than that match.
    pub capped: bool,
}

impl Tally {
    /// `counted` rows from a count limited to `COUNT_CAP + 1` rows.
    pub fn of(counted: i64) -> Self {
        Self { count: counted.min(COUNT_CAP), capped: counted > COUNT_CAP }
    }

    /// Whether nothing matched.
    pub fn is_zero(self) -> bool {
        self.count == 0
    }

    /// Whether exactly one row matched (for "1 key match").
    pub fn is_one(self) -> bool {
        self.count == 1 && !self.capped
    }
}

impl std::fmt::Display for Tally {
    /// `1,234`, or `10,000+` past the cap.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let count = crate::web::format::count(self.count);
        if self.capped { write!(f, "{count}+") } else { f.write_str(&count) }
    }
}

/// Keys by status, each count capped ([`Tally`]), and the planner's estimate of all keys.
#[derive(Debug, Default)]
pub struct Counts {
    pub in_flight: Tally,
    pub stuck: Tally,
    pub completed: Tally,
    pub failed: Tally,
    /// Keys expired within the event retention (their tombstones).
    pub expired: Tally,
    /// `pg_class.reltuples` of the keys table: what the last ANALYZE (or autovacuum) counted,
    /// shown as "≈"; `None` before the table was ever analyzed.
    pub keys_estimate: Option<i64>,
}

/// The overview's counts. Each reads at most [`COUNT_CAP`] + 1 entries of an index that holds
/// only its rows (or, for the completed keys that are most keys, the primary key newest first):
/// none grows with the tables. The `order by` makes the planner walk the index rather than the
/// table.
pub async fn counts(pool: &PgPool) -> sqlx::Result<Counts> {
    let row = sqlx::query!(
        r#"
        select (select count(*) from (select from idempotency_keys
                                      where state = 'processing' and locked_until > now()
                                      order by locked_until limit $1) s) as "in_flight!",
               (select count(*) from (select from idempotency_keys
                                      where state = 'processing' and locked_until <= now()
                                      order by locked_until limit $1) s) as "stuck!",
               (select count(*) from (select from idempotency_keys where state = 'completed'
                                      order by id desc limit $1) s) as "completed!",
               (select count(*) from (select from idempotency_keys where state = 'failed'
                                      order by id desc limit $1) s) as "failed!",
               (select count(*) from (select from idempotency_events where kind = 'expired'
                                      order by key_id desc limit $1) s) as "expired!",
               (select reltuples::int8 from pg_class where oid = 'idempotency_keys'::regclass) as keys_estimate
        "#,
        COUNT_CAP + 1,
    )
    .fetch_one(pool)
    .await?;
    Ok(Counts {
        in_flight: Tally::of(row.in_flight),
        stuck: Tally::of(row.stuck),
        completed: Tally::of(row.completed),
        failed: Tally::of(row.failed),
        expired: Tally::of(row.expired),
        keys_estimate: row.keys_estimate.filter(|n| *n >= 0),
    })
}

/// Events of one kind in one bucket.
pub struct Bucketed {
    pub kind: String,
    /// The bucket: its start in Unix seconds divided by the bucket's width.
    pub bucket: i64,
    pub count: i64,
}

/// The outcome events counted by [`outcome_buckets`], and where the database's clock stands.
pub struct Buckets {
    /// The bucket `now()` falls in.
    pub now: i64,
    /// The last bucket that can no longer change: the one before the previous bucket, which
    /// ended 30–60 s ago by this database's clock, less the buckets a replica lags behind, so no
    /// transaction still open (an event is dated by its transaction's start) nor a replica still
    /// catching up adds to it.
    pub settled: i64,
    pub counted: Vec<Bucketed>,
}

/// Counts of `kinds` events per bucket of `bucket_secs` seconds aligned on the Unix epoch, from
/// bucket `from` (or `window` buckets back from now, whichever is later) to now: a read of the
/// `created_at` index that grows with the traffic of that time, never with the table. `lag_secs`:
/// how far behind the primary `pool` is ([`crate::db::Reads::lag`]; 0 on the primary).
pub async fn outcome_buckets(
    pool: &PgPool,
    kinds: &[&str],
    bucket_secs: u32,
    window: i64,
    from: Option<i64>,
    lag_secs: f64,
) -> sqlx::Result<Buckets> {
    let rows = sqlx::query!(
        r#"
        with counted as (
            select kind, floor(extract(epoch from created_at)::float8 / $2::float8)::int8 as bucket, count(*) as count
            from idempotency_events
            -- a bound known before the scan starts (no join: it prunes the days' partitions and
            -- ranges over the created_at index; as a join it took 50 ms at a million keys)
            where created_at >= to_timestamp(greatest(coalesce($4::int8, 0),
                                                      floor(extract(epoch from now())::float8 / $2)::int8 - $3::int8 + 1)
                                             * $2)
              and kind = any($1)
            group by 1, 2
        )
        select floor(extract(epoch from now())::float8 / $2)::int8 as "now_bucket!",
               kind as "kind?", bucket as "bucket?", count as "count?"
        from (select) clock left join counted on true
        "#,
        kinds as &[&str],
        f64::from(bucket_secs),
        window,
        from,
    )
    .fetch_all(pool)
    .await?;
    let now = rows.first().map_or(0, |r| r.now_bucket);
    // Whole buckets a replica is behind, rounded up: what it has not seen yet may still land there.
    let behind = (lag_secs.max(0.0) / f64::from(bucket_secs)).ceil() as i64;
    let settled = now - 2 - behind;
    let counted =
        rows.into_iter().filter_map(|r| Some(Bucketed { kind: r.kind?, bucket: r.bucket?, count: r.count? })).collect();
    Ok(Buckets { now, settled, counted })
}

/// One row of the keys table.
pub struct KeyRow {
    pub id: Uuid,
    pub key: String,
    pub customer_name: String,
    /// The route the key was claimed on: which operation it belongs to.
    pub route: String,
    pub status: String,
    pub recovery_point: String,
    pub lease_token: i64,
    pub lease_owner: Option<String>,
    pub attempts: i32,
    pub response_status: Option<i16>,
    pub created_at: OffsetDateTime,
    pub age_secs: f64,
    /// Seconds left on the lease (negative: lapsed that long ago); `None` for final keys.
    pub lease_remaining_secs: Option<f64>,
    /// Seconds since the holder last wrote the row (claim, heartbeat, release); processing keys.
    pub heartbeat_age_secs: Option<f64>,
    /// The lease its holder took at its last heartbeat (`locked_until - updated_at`): the holder's
    /// own setting, which says how often it heartbeats.
    pub held_secs: Option<f64>,
    /// Seconds until the key may be taken again (backoff); processing keys.
    pub next_attempt_secs: Option<f64>,
    /// The key's budget is spent: only the sweeper looks it up now.
    pub exhausted: Option<bool>,
    /// The last hand-over of the key: `released: <reason>`, `claimed`, `reclaimed`, …
    pub last_transition: Option<String>,
}

/// The budget the "why is it stuck" columns are computed with: this server's.
#[derive(Debug, Clone, Copy)]
pub struct BudgetParams {
    pub max_attempts: i32,
    pub horizon_secs: f64,
    pub base_secs: f64,
    pub cap_secs: f64,
}

impl BudgetParams {
    pub fn of(settings: &crate::idempotency::EngineSettings) -> Self {
        Self {
            max_attempts: settings.budget.max_attempts,
            horizon_secs: settings.horizon.downstream_key_ttl.as_secs_f64(),
            base_secs: settings.budget.backoff.base.as_secs_f64(),
            cap_secs: settings.budget.backoff.cap.as_secs_f64(),
        }
    }
}

/// What the keys table is filtered by.
#[derive(Debug, Default, Clone)]
pub struct KeyFilter {
    pub status: Option<String>,
    pub customer: Option<Uuid>,
    /// What the search box asked for.
    pub search: Option<Search>,
    /// Only keys of this route (an operation of the registry, [`crate::operations::Op`]).
    pub route: Option<String>,
}

/// The keys table's search, in what an index can answer: the beginning of a client key, and the
/// key behind a payment (`pay_…`), a PaymentIntent (`pi_…`) or a refund (`re_…`) named exactly.
/// Never a substring of the key, which no index serves: `%x%` reads every key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Search {
    /// A `like` pattern: the text typed, its `%`, `_` and `\` escaped, then `%`.
    pub prefix: String,
    /// The keys of the payments or refunds the text names (none when it names none).
    pub key_ids: Vec<Uuid>,
}

/// `text` as the beginning of a `like` pattern: its wildcards taken literally.
pub fn like_prefix(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 1);
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// The search for `text` (trimmed, not empty): a key prefix, and the keys of the payment, the
/// PaymentIntent or the refund it names.
pub async fn search(pool: &PgPool, text: &str) -> sqlx::Result<Search> {
    let payment = crate::payments::PaymentId::parse(text).map(|id| id.0);
    let refund = crate::refunds::RefundId::parse(text).map(|id| id.0);
    let payment_intent = text.starts_with("pi_").then_some(text);
    let key_ids = if payment.is_none() && refund.is_none() && payment_intent.is_none() {
        Vec::new()
    } else {
        key_ids_of(pool, payment, payment_intent, refund).await?
    };
    Ok(Search { prefix: like_prefix(text), key_ids })
}

/// The keys that made a payment (by id or PaymentIntent id) or a refund (by id).
pub async fn key_ids_of(
    pool: &PgPool,
    payment: Option<Uuid>,
    payment_intent: Option<&str>,
    refund: Option<Uuid>,
) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        r#"
        select key_id as "key_id!" from payments
        where key_id is not null
          and (($1::uuid is not null and id = $1) or ($2::text is not null and gateway_payment_intent_id = $2))
        union
        select key_id from refunds where $3::uuid is not null and id = $3
        "#,
        payment,
        payment_intent,
        refund,
    )
    .fetch_all(pool)
    .await
}

/// Where a page of the keys table starts.
#[derive(Debug, Clone, Copy)]
pub enum Cursor {
    /// The newest keys.
    Newest,
    /// Keys older than this one.
    Before(Uuid),
    /// Keys newer than this one (the page before).
    After(Uuid),
}

/// A page of keys, newest first (uuid v7 ids sort by creation time), and whether there are
/// older and newer ones beyond it.
pub struct KeyPage {
    pub rows: Vec<KeyRow>,
    pub has_older: bool,
    pub has_newer: bool,
}

/// A page of the keys table: the keys that exist, and the tombstones of expired ones (from their
/// `expired` events, which carry the client key and the final state since this version).
///
/// Paged by keyset: each side (keys, tombstones) is read newest first from the cursor along an
/// index in id order (the primary key, the failed keys' index, the tombstones' index; a search
/// or an in-flight filter reads its few rows by their own index and sorts them), at most a page
/// of each, and only the page's rows are then joined and computed. The filters are written so
/// that the plan made for the parameters given drops those not asked for (`$1 is null or …`
/// folds to true), which lets the planner pick the index that serves the rest.
pub async fn keys(
    pool: &PgPool,
    filter: &KeyFilter,
    cursor: Cursor,
    limit: i64,
    budget: BudgetParams,
) -> sqlx::Result<KeyPage> {
    let (before, after) = match cursor {
        Cursor::Newest => (None, None),
        Cursor::Before(id) => (Some(id), None),
        Cursor::After(id) => (None, Some(id)),
    };
    let (prefix, key_ids) = match &filter.search {
        Some(search) => (Some(search.prefix.as_str()), search.key_ids.as_slice()),
        None => (None, &[][..]),
    };
    // One extra row says whether the page has a neighbour in the direction of travel. A page
    // after a cursor is read oldest first (the rows just newer than it) and turned around below.
    let mut rows = sqlx::query_as!(
        KeyRow,
        r#"
        with live as (
            select k.id, null::int8 as event_id
            from idempotency_keys k
            where ($1::text is null
                   or ($1 = 'completed' and k.state = 'completed')
                   or ($1 = 'failed' and k.state = 'failed')
                   or ($1 = 'in_flight' and k.state = 'processing' and k.locked_until > now())
                   or ($1 = 'stuck' and k.state = 'processing' and k.locked_until <= now()))
              and ($2::uuid is null or k.customer_id = $2)
              and ($3::text is null or k.key like $3 or k.id = any($14))
              and ($11::text is null or k.route = $11)
              and ($4::uuid is null or k.id < $4)
              and ($5::uuid is null or k.id > $5)
            order by (case when $5::uuid is null then k.id end) desc, k.id
            limit $6
        ), tombstones as (
            -- A key deleted at its expiry (or by an operator) is listed as expired. Every
            -- tombstone names its route (migration 20261231000201 wrote it into older ones), so
            -- the Operation filter reads idempotency_events_tombstone_route in key order.
            select e.key_id as id, e.id as event_id
            from idempotency_events e
            where e.kind = 'expired'
              and ($1::text is null or $1 = 'expired')
              and ($2::uuid is null or e.customer_id = $2)
              and ($3::text is null or e.detail->>'key' like $3 or e.key_id = any($14))
              and ($11::text is null or e.detail->>'route' = $11)
              and ($4::uuid is null or e.key_id < $4)
              and ($5::uuid is null or e.key_id > $5)
            order by (case when $5::uuid is null then e.key_id end) desc, e.key_id
            limit $6
        ), page as (
            select * from (select * from live union all select * from tombstones) both_sides
            order by (case when $5::uuid is null then id end) desc, id
            limit $6
        ), shown as (
            select k.id, k.key, c.name as customer_name, k.route,
                   case when k.state = 'processing' and k.locked_until > now() then 'in_flight'
                        when k.state = 'processing' then 'stuck'
                        else k.state end as status,
                   k.recovery_point, k.lease_token, k.lease_owner, k.attempts, k.response_status,
                   k.created_at, extract(epoch from now() - k.created_at)::float8 as age_secs,
                   extract(epoch from k.locked_until - now())::float8 as lease_remaining_secs,
                   case when k.state = 'processing' then extract(epoch from now() - k.updated_at)::float8 end
                       as heartbeat_age_secs,
                   extract(epoch from k.locked_until - k.updated_at)::float8 as held_secs,
                   case when k.state = 'processing' then
                       extract(epoch from idempotency_retry_at(k.locked_until, k.attempts, k.created_at,
                                                               $7, $8, $9, $10) - now())::float8 end
                       as next_attempt_secs,
                   case when k.state = 'processing' then idempotency_exhausted(k.attempts, k.created_at, $7, $8) end
                       as exhausted,
                   case when k.state = 'processing' then (
                       select e.kind || coalesce(': ' || coalesce(e.detail->>'reason', e.detail->>'by'), '')
                       from idempotency_events e
                       where e.key_id = k.id and e.kind in ('claimed', 'reclaimed', 'released', 'lease_lost')
                       order by e.id desc limit 1) end as last_transition
            from page p
            join idempotency_keys k on k.id = p.id
            join customers c on c.id = k.customer_id
            where p.event_id is null
            union all
            select e.key_id, coalesce(e.detail->>'key', '(unknown: expired before payonce kept it)'),
                   coalesce(c.name, '(deleted customer)'),
                   coalesce(e.detail->>'route', (select $12::text from refunds r where r.key_id = e.key_id limit 1), $13::text),
                   'expired',
                   coalesce(e.detail->>'recovery_point', 'finished'), coalesce(e.lease_token, 0), null,
                   coalesce((e.detail->>'attempts')::int4, 0), (e.detail->>'response_status')::int2,
                   e.created_at - coalesce((e.detail->>'age_secs')::float8, 0) * interval '1 second',
                   extract(epoch from now() - e.created_at)::float8 + coalesce((e.detail->>'age_secs')::float8, 0),
                   null, null, null, null, null, null
            from page p
            join idempotency_events e on e.id = p.event_id
            left join customers c on c.id = e.customer_id
        )
        select id as "id!", key as "key!", customer_name as "customer_name!", route as "route!",
               status as "status!", recovery_point as "recovery_point!", lease_token as "lease_token!",
               lease_owner, attempts as "attempts!", response_status, created_at as "created_at!",
               age_secs as "age_secs!", lease_remaining_secs, heartbeat_age_secs, held_secs, next_attempt_secs, exhausted,
               last_transition
        from shown
        order by (case when $5::uuid is null then id end) desc, id
        "#,
        filter.status,
        filter.customer,
        prefix,
        before,
        after,
        limit + 1,
        budget.max_attempts,
        budget.horizon_secs,
        budget.base_secs,
        budget.cap_secs,
        filter.route,
        crate::refunds::ROUTE,
        crate::payments::ROUTE,
        key_ids,
    )
    .fetch_all(pool)
    .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let (has_older, has_newer) = match cursor {
        Cursor::Newest => (more, false),
        Cursor::Before(_) => (more, true),
        Cursor::After(_) => {
            rows.reverse();
            (true, more)
        }
    };
    Ok(KeyPage { rows, has_older, has_newer })
}

/// How many keys (and tombstones) `filter` matches, counted to [`COUNT_CAP`]: the same filters as
/// [`keys`], each side read along the same index, at most `COUNT_CAP + 1` entries each.
pub async fn count_keys(pool: &PgPool, filter: &KeyFilter) -> sqlx::Result<Tally> {
    let (prefix, key_ids) = match &filter.search {
        Some(search) => (Some(search.prefix.as_str()), search.key_ids.as_slice()),
        None => (None, &[][..]),
    };
    let counted = sqlx::query_scalar!(
        r#"
        select (select count(*) from (
                    select from idempotency_keys k
                    where ($1::text is null
                           or ($1 = 'completed' and k.state = 'completed')
                           or ($1 = 'failed' and k.state = 'failed')
                           or ($1 = 'in_flight' and k.state = 'processing' and k.locked_until > now())
                           or ($1 = 'stuck' and k.state = 'processing' and k.locked_until <= now()))
                      and ($2::uuid is null or k.customer_id = $2)
                      and ($3::text is null or k.key like $3 or k.id = any($5))
                      and ($4::text is null or k.route = $4)
                    order by k.id desc
                    limit $6) s)
             + (select count(*) from (
                    select from idempotency_events e
                    where e.kind = 'expired'
                      and ($1::text is null or $1 = 'expired')
                      and ($2::uuid is null or e.customer_id = $2)
                      and ($3::text is null or e.detail->>'key' like $3 or e.key_id = any($5))
                      and ($4::text is null or e.detail->>'route' = $4)
                    order by e.key_id desc
                    limit $6) s) as "count!"
        "#,
        filter.status,
        filter.customer,
        prefix,
        filter.route,
        key_ids,
        COUNT_CAP + 1,
    )
    .fetch_one(pool)
    .await?;
    Ok(Tally::of(counted))
}

/// A customer, for the filter's list.
pub struct CustomerOption {
    pub id: Uuid,
    pub name: String,
}

pub async fn customers(pool: &PgPool) -> sqlx::Result<Vec<CustomerOption>> {
    sqlx::query_as!(CustomerOption, "select id, name from customers order by name, id limit 500").fetch_all(pool).await
}

/// Everything about one key.
pub struct KeyDetail {
    pub key: String,
    pub customer_id: Uuid,
    pub customer_name: String,
    pub method: String,
    pub route: String,
    pub fingerprint: Vec<u8>,
    pub request: Value,
    pub status: String,
    pub recovery_point: String,
    pub lease_token: i64,
    pub lease_owner: Option<String>,
    pub locked_until: Option<OffsetDateTime>,
    pub lease_remaining_secs: Option<f64>,
    pub attempts: i32,
    pub response_status: Option<i16>,
    pub response_headers: Option<Value>,
    pub response_body: Option<Vec<u8>>,
    pub created_at: OffsetDateTime,
    pub completed_at: Option<OffsetDateTime>,
    pub expires_at: OffsetDateTime,
    /// As in [`KeyRow`]: processing keys only.
    pub heartbeat_age_secs: Option<f64>,
    pub held_secs: Option<f64>,
    pub next_attempt_secs: Option<f64>,
    pub exhausted: Option<bool>,
    pub last_transition: Option<String>,
}

pub async fn key(pool: &PgPool, id: Uuid, budget: BudgetParams) -> sqlx::Result<Option<KeyDetail>> {
    sqlx::query_as!(
        KeyDetail,
        r#"
        select k.key, k.customer_id, c.name as customer_name, k.method, k.route, k.fingerprint,
               k.request,
               case when k.state = 'processing' and k.locked_until > now() then 'in_flight'
                    when k.state = 'processing' then 'stuck'
                    else k.state end as "status!",
               k.recovery_point, k.lease_token, k.lease_owner, k.locked_until,
               extract(epoch from k.locked_until - now())::float8 as lease_remaining_secs,
               k.attempts, k.response_status, k.response_headers, k.response_body,
               k.created_at, k.completed_at, k.expires_at,
               case when k.state = 'processing' then extract(epoch from now() - k.updated_at)::float8 end
                   as heartbeat_age_secs,
               extract(epoch from k.locked_until - k.updated_at)::float8 as held_secs,
               case when k.state = 'processing' then
                   extract(epoch from idempotency_retry_at(k.locked_until, k.attempts, k.created_at,
                                                           $2, $3, $4, $5) - now())::float8 end
                   as next_attempt_secs,
               case when k.state = 'processing' then idempotency_exhausted(k.attempts, k.created_at, $2, $3) end
                   as exhausted,
               case when k.state = 'processing' then (
                   select e.kind || coalesce(': ' || coalesce(e.detail->>'reason', e.detail->>'by'), '')
                   from idempotency_events e
                   where e.key_id = k.id and e.kind in ('claimed', 'reclaimed', 'released', 'lease_lost')
                   order by e.id desc limit 1) end as last_transition
        from idempotency_keys k
        join customers c on c.id = k.customer_id
        where k.id = $1
        "#,
        id,
        budget.max_attempts,
        budget.horizon_secs,
        budget.base_secs,
        budget.cap_secs,
    )
    .fetch_optional(pool)
    .await
}

/// What remains of an expired key: its `expired` event (the tombstone).
pub struct Tombstone {
    /// The client's key; `None` for keys expired before the event kept it.
    pub key: Option<String>,
    pub customer_id: Uuid,
    pub customer_name: Option<String>,
    /// The state it ended in (`completed`, `failed`).
    pub state: Option<String>,
    pub response_status: Option<i16>,
    /// Who expired it: `operator:<name>`, or the reaper when `None`.
    pub by: Option<String>,
    pub attempts: Option<i32>,
    pub expired_at: OffsetDateTime,
    /// The route it was claimed on (for tombstones older than the route in them: a refund's if a
    /// refund was made under it).
    pub route: String,
}

pub async fn tombstone(pool: &PgPool, key_id: Uuid) -> sqlx::Result<Option<Tombstone>> {
    sqlx::query_as!(
        Tombstone,
        r#"
        select e.detail->>'key' as key, e.customer_id, c.name as "customer_name?",
               e.detail->>'state' as state, (e.detail->>'response_status')::int2 as response_status,
               e.detail->>'by' as by, (e.detail->>'attempts')::int4 as attempts, e.created_at as expired_at,
               coalesce(e.detail->>'route', (select $2::text from refunds r where r.key_id = e.key_id limit 1), $3::text)
                   as "route!"
        from idempotency_events e
        left join customers c on c.id = e.customer_id
        where e.key_id = $1 and e.kind = 'expired'
        order by e.id desc limit 1
        "#,
        key_id,
        crate::refunds::ROUTE,
        crate::payments::ROUTE,
    )
    .fetch_optional(pool)
    .await
}

/// One event of a key's timeline.
pub struct EventRow {
    pub kind: String,
    pub lease_token: Option<i64>,
    pub detail: Value,
    pub created_at: OffsetDateTime,
}

/// A key's events, oldest first (at most the last 500).
pub async fn events_of(pool: &PgPool, key_id: Uuid) -> sqlx::Result<Vec<EventRow>> {
    let mut events = sqlx::query_as!(
        EventRow,
        r#"
        select kind, lease_token, detail, created_at
        from idempotency_events where key_id = $1
        order by id desc limit 500
        "#,
        key_id,
    )
    .fetch_all(pool)
    .await?;
    events.reverse();
    Ok(events)
}

/// Payments by public id, for the double-charge audit: the payments of a key charged more than
/// once.
pub struct AuditedPayment {
    pub id: Uuid,
    /// Whether its key was reaped (expired, or an operator's Expire) and left its tombstone: the
    /// positive evidence that a later payment under the same client key was made on purpose. A
    /// payment with no key at all (the lab's) has none.
    pub expired: bool,
}

pub async fn payments_by_id(pool: &PgPool, ids: &[Uuid]) -> sqlx::Result<Vec<AuditedPayment>> {
    sqlx::query_as!(
        AuditedPayment,
        r#"
        select p.id,
               p.key_id is not null
               and not exists (select from idempotency_keys k where k.id = p.key_id and k.customer_id = p.customer_id)
               and exists (select from idempotency_events e where e.key_id = p.key_id and e.kind = 'expired')
                   as "expired!"
        from payments p
        where p.id = any($1)
        "#,
        ids,
    )
    .fetch_all(pool)
    .await
}

/// Of the payments charged at the gateway, those payonce does not record as succeeded: each
/// with its status, or `None` when there is no such payment (a database that forgot it). One
/// index probe per id, whatever the number of ids (as a join, a few thousand ids made the planner
/// read every payment: 250 ms at a million), and only the exceptions come back.
pub async fn charged_but_not_succeeded(pool: &PgPool, charged: &[Uuid]) -> sqlx::Result<Vec<(Uuid, Option<String>)>> {
    let rows = sqlx::query!(
        r#"
        select id as "id!", status
        from (select c.id, (select p.status from payments p where p.id = c.id) as status
              from unnest($1::uuid[]) as c(id)) charged
        where status is distinct from 'succeeded'
        "#,
        charged,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|row| (row.id, row.status)).collect())
}

/// Which payments table answers: the server (its address, port and start), the database (its
/// oid) and the table's storage (its file node, which a `TRUNCATE` or a `pg_restore --clean`
/// replaces). Another answer means another table, which may not hold what the last one held: a
/// restore, a failover onto a standby, a database created again.
pub async fn payments_incarnation(pool: &PgPool) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        r#"
        select format('%s:%s started %s, database %s, payments %s', coalesce(host(inet_server_addr()), 'socket'),
                      inet_server_port(), pg_postmaster_start_time(), d.oid,
                      pg_relation_filenode('payments')) as "incarnation!"
        from pg_database d where d.datname = current_database()
        "#
    )
    .fetch_one(pool)
    .await
}

/// Succeeded payments whose id is not among `charged` (at most `limit`, the newest keys' first),
/// and how many there are, counted to [`COUNT_CAP`]. Read along payments_key_id (key ids are
/// uuid v7, in time order; the lab's payments have no key and come first): never all payments.
pub async fn succeeded_without_charge(pool: &PgPool, charged: &[Uuid], limit: i64) -> sqlx::Result<(Vec<Uuid>, Tally)> {
    let rows = sqlx::query!(
        r#"
        select id as "id!", count(*) over () as "counted!"
        from (select id, key_id from payments
              where status = 'succeeded' and not (id = any($1))
              order by key_id desc nulls first
              limit $3) s
        order by key_id desc nulls first
        limit $2
        "#,
        charged,
        limit,
        COUNT_CAP + 1,
    )
    .fetch_all(pool)
    .await?;
    let total = Tally::of(rows.first().map_or(0, |row| row.counted));
    Ok((rows.into_iter().map(|row| row.id).collect(), total))
}

/// The key rows of (customer, client key) pairs, for linking the audit to key pages.
pub struct KeyRef {
    pub id: Uuid,
    pub customer_id: Uuid,
    pub key: String,
}

pub async fn key_ids(pool: &PgPool, customers: &[Uuid], keys: &[String]) -> sqlx::Result<Vec<KeyRef>> {
    sqlx::query_as!(
        KeyRef,
        r#"
        select k.id, k.customer_id, k.key
        from idempotency_keys k
        join unnest($1::uuid[], $2::text[]) as wanted(customer_id, key)
          on wanted.customer_id = k.customer_id and wanted.key = k.key
        "#,
        customers,
        keys,
    )
    .fetch_all(pool)
    .await
}

/// The gateway's latest refusal of payonce's own requests within the last `window_secs`, and
/// how many there were: the dashboard's banner, the same on every server since it is read from
/// the shared `refused` events.
pub struct RecentRefusal {
    pub message: String,
    pub reason: String,
    pub at: OffsetDateTime,
    pub count: i64,
}

pub async fn recent_refusal(pool: &PgPool, window_secs: f64) -> sqlx::Result<Option<RecentRefusal>> {
    sqlx::query_as!(
        RecentRefusal,
        r#"
        select coalesce(detail->>'message', '') as "message!", coalesce(detail->>'reason', '') as "reason!",
               created_at as at, count(*) over () as "count!"
        from idempotency_events
        where kind = 'refused' and created_at > now() - $1 * interval '1 second'
        order by created_at desc
        limit 1
        "#,
        window_secs,
    )
    .fetch_optional(pool)
    .await
}

/// A payment, whoever's it is, for its page.
pub struct PaymentDetail {
    pub id: Uuid,
    pub customer_id: Uuid,
    pub customer_name: String,
    /// The key that created it (kept after the key expired); `None` for the lab's payments.
    pub key_id: Option<Uuid>,
    /// That key's client key, while the key exists.
    pub client_key: Option<String>,
    pub amount: i64,
    /// Refunded or being refunded: the sum of its pending and succeeded refunds.
    pub amount_refunded: i64,
    pub currency: String,
    pub payment_method: String,
    pub description: Option<String>,
    pub status: String,
    pub payment_intent: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: OffsetDateTime,
    /// `automatic` or `manual` (authorize now, capture later).
    pub capture_method: String,
    /// The money that moved: what refunds may give back.
    pub amount_captured: i64,
    /// What an authorization may still capture.
    pub amount_capturable: i64,
    /// The one capture or cancel of an authorization (`capture`, `cancel`), and its key.
    pub settlement: Option<String>,
    pub settled_by: Option<Uuid>,
}

pub async fn payment(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<PaymentDetail>> {
    sqlx::query_as!(
        PaymentDetail,
        r#"
        select p.id, p.customer_id, c.name as customer_name, p.key_id, k.key as "client_key?", p.amount,
               p.amount_refunded, p.currency, p.payment_method, p.description, p.status,
               p.gateway_payment_intent_id as payment_intent, p.failure_message, p.created_at,
               p.capture_method, p.amount_captured, p.amount_capturable, p.settlement, p.settled_by
        from payments p
        join customers c on c.id = p.customer_id
        left join idempotency_keys k on k.id = p.key_id
        where p.id = $1
        "#,
        id,
    )
    .fetch_optional(pool)
    .await
}

/// One refund of a payment, for the payment's page.
pub struct PaymentRefund {
    pub id: Uuid,
    pub key_id: Uuid,
    /// Its key's client key, while the key exists (or from its tombstone once it expired).
    pub client_key: Option<String>,
    pub amount: i64,
    pub currency: String,
    pub reason: Option<String>,
    pub status: String,
    pub gateway_refund_id: Option<String>,
    pub failure_message: Option<String>,
    pub created_at: OffsetDateTime,
    /// When it failed after it had succeeded (the money came back to the merchant).
    pub reversed_at: Option<OffsetDateTime>,
    /// Who asked for it, from its `refund_created` event: `operator:<name>`, or `customer` for
    /// the customer's own; `None` once the event is gone (past the event retention).
    pub by: Option<String>,
    /// Until the sweeper next asks the gateway about it (zero or less: due now); `None` when no
    /// look-up is scheduled (final, or no gateway id yet).
    pub next_lookup_secs: Option<f64>,
    /// How many times the sweeper has asked the gateway about it.
    pub reconcile_attempts: i32,
}

/// A payment's refunds, newest first.
pub async fn refunds_of(pool: &PgPool, payment: Uuid) -> sqlx::Result<Vec<PaymentRefund>> {
    sqlx::query_as!(
        PaymentRefund,
        r#"
        select r.id, r.key_id,
               coalesce(k.key, (select e.detail->>'key' from idempotency_events e
                                where e.key_id = r.key_id and e.kind = 'expired' order by e.id desc limit 1))
                   as client_key,
               r.amount, r.currency, r.reason, r.status, r.gateway_refund_id, r.failure_message, r.created_at,
               r.reversed_at,
               (select coalesce(e.detail->>'by', 'customer') from idempotency_events e
                where e.key_id = r.key_id and e.kind = 'refund_created' order by e.id limit 1) as by,
               extract(epoch from r.reconcile_at - now())::float8 as next_lookup_secs, r.reconcile_attempts
        from refunds r
        left join idempotency_keys k on k.id = r.key_id
        where r.payment_id = $1
        order by r.created_at desc, r.id desc
        "#,
        payment,
    )
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count past the cap says so; below it, it is exact; "1 key" only when exactly one.
    #[test]
    fn tallies() {
        assert_eq!(Tally::of(0).to_string(), "0");
        assert!(Tally::of(0).is_zero() && !Tally::of(1).is_zero());
        assert_eq!(Tally::of(1_234).to_string(), "1,234");
        assert_eq!(Tally::of(COUNT_CAP).to_string(), "10,000");
        assert_eq!(Tally::of(COUNT_CAP + 1).to_string(), "10,000+");
        assert_eq!(Tally::of(COUNT_CAP * 3).to_string(), "10,000+", "two sides counted to the cap each");
        assert!(Tally::of(1).is_one() && !Tally::of(2).is_one());
    }

    /// The search's text is taken literally: its `%`, `_` and `\` match only themselves.
    #[test]
    fn like_prefixes() {
        assert_eq!(like_prefix("order-12"), "order-12%");
        assert_eq!(like_prefix("50%_off\\"), "50\\%\\_off\\\\%");
        assert_eq!(like_prefix(""), "%");
    }
}
