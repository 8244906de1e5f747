//! At scale, no request path and no dashboard page reads a table that grows from end to end.
//!
//! A database is filled with enough history (loadtest/scale/fill.sql, the same rows
//! loadtest/scale.sh measures with) that the planner reads a table whole only when no index serves
//! a query, then every query the API's requests, the webhooks and the dashboard's pages run is
//! EXPLAINed with realistic parameters: a Seq Scan on a table that grows fails the test, naming
//! the query.
//!
//! The SQL is not copied here: it is read from `.sqlx/`, where the query macros' own text is kept
//! (the build uses it offline, so a query changed without `.ci/sqlx-prepare` does not compile),
//! and each text is checked to appear verbatim in `app/src/`. A case names its query by a
//! fragment that must match exactly one of them; every query on a growing table must be a case
//! or be listed in [`NOT_EXPLAINED`] with the reason. Each EXPLAIN is of a statement prepared with
//! the parameters' types and executed with their values: the plan PostgreSQL makes for those
//! values, as for a query's first executions on a connection.
//!
//! From the sixth execution on, PostgreSQL may instead keep a generic plan, made once for any
//! values, when its estimated cost is no higher than the custom plans' had been. The dashboard's
//! queries (a filter that may be null) should not qualify: planned for any value, they are
//! estimated far dearer (their generic plans read the keys table whole). The reaper's delete did
//! qualify, and read the whole keys table that way (below).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sqlx::{Connection, PgConnection};

use crate::helpers::TestDatabase;

/// The tables that grow with the traffic (and their partitions, named after them).
const GROWING: &[&str] = &["idempotency_keys", "idempotency_events", "payments", "refunds", "webhook_events"];

/// How many keys' worth of history the test database gets: enough that a table read whole costs
/// the planner thousands of pages, and filled in seconds.
const FILL_KEYS: i64 = 100_000;

/// Queries on growing tables that are not EXPLAINed, and why.
const NOT_EXPLAINED: &[(&str, &str)] = &[
    ("truncate idempotency_events", "the workshop's reset: empties the tables on purpose"),
    (
        "from idempotency_finish($1, $2, $3,",
        "a function call: its statements are inside idempotency_finish, by primary key",
    ),
    ("insert into idempotency_events (key_id, customer_id, kind, lease_token, detail)\n        values", "an insert"),
    ("select * from unnest($1::uuid[]", "an insert"),
    ("insert into idempotency_events (key_id, customer_id, kind, detail) values", "an insert"),
    ("insert into payments (id, customer_id, amount, currency, payment_method, description, metadata)\n", "an insert"),
    ("insert into webhook_events (id, type, created, effect, customer_id)", "an insert"),
    ("with done as (\n            update lab_keys", "the lab's store: its own table by primary key, then an insert"),
    ("pg_relation_filenode('payments')", "the audit's look at which payments table answers: catalogs, no row of it"),
];

/// A query's text and its parameters' types, as `.sqlx/` describes it.
struct Described {
    sql: String,
    types: Vec<String>,
}

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// Every query macro's text and parameter types.
fn described() -> Vec<Described> {
    let mut queries = Vec::new();
    for entry in std::fs::read_dir(repository().join(".sqlx")).expect(".sqlx/ (run .ci/sqlx-prepare)") {
        let path = entry.unwrap().path();
        let json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let types = json["describe"]["parameters"]["Left"]
            .as_array()
            .map(|types| types.iter().map(|t| pg_type(t.as_str().unwrap())).collect())
            .unwrap_or_default();
        queries.push(Described { sql: json["query"].as_str().unwrap().to_owned(), types });
    }
    queries
}

/// sqlx's name of a parameter type as PostgreSQL's (`UuidArray` is `uuid[]`).
fn pg_type(sqlx: &str) -> String {
    match sqlx.strip_suffix("Array") {
        Some(element) => format!("{}[]", pg_type(element)),
        None => sqlx.to_lowercase(),
    }
}

/// The source of the crate, for checking that a described query is one the code holds.
fn sources() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                out.push_str(&std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = String::new();
    walk(&repository().join("app/src"), &mut out);
    out
}

/// The relations a plan reads with a sequential scan.
fn seq_scans(plan: &Value, found: &mut Vec<String>) {
    if plan["Node Type"] == "Seq Scan" {
        found.push(plan["Relation Name"].as_str().unwrap_or("?").to_owned());
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        seq_scans(child, found);
    }
}

/// Whether `relation` is a growing table or one of its partitions.
fn grows(relation: &str) -> bool {
    GROWING.iter().any(|table| relation == *table || relation.starts_with(&format!("{table}_")))
}

/// The plan of `sql` for `params` (SQL literals), as `explain (<options>, format json)` gives it:
/// of a statement prepared with the parameters' types, as a query's first executions are planned.
async fn explain(db: &mut PgConnection, options: &str, sql: &str, types: &[String], params: &[String]) -> Value {
    let prepare = if types.is_empty() {
        format!("prepare scale_q as {sql}")
    } else {
        format!("prepare scale_q({}) as {sql}", types.join(", "))
    };
    sqlx::raw_sql(&prepare).execute(&mut *db).await.unwrap_or_else(|err| panic!("{err}: {sql}"));
    let execute = if params.is_empty() {
        "execute scale_q".to_owned()
    } else {
        format!("execute scale_q({})", params.join(", "))
    };
    let explained: Result<Value, _> =
        sqlx::query_scalar(&format!("explain ({options}format json) {execute}")).fetch_one(&mut *db).await;
    sqlx::raw_sql("deallocate scale_q").execute(&mut *db).await.unwrap();
    explained.unwrap_or_else(|err| panic!("{err}: {execute}"))
}

/// Fewer rows than this in a day's partition, and reading it whole is the cheaper plan.
const SMALL: i64 = 1_000;

/// The growing tables a query's plan reads whole, for `params` (SQL literals).
async fn full_scans(db: &mut PgConnection, sql: &str, types: &[String], params: &[String]) -> Vec<String> {
    let plan = explain(db, "", sql, types, params).await;
    let mut found = Vec::new();
    seq_scans(&plan[0]["Plan"], &mut found);
    found.retain(|relation| grows(relation));
    // A day's partition of the history that holds nothing yet (the days made ahead, a quiet day),
    // or only a few hundred rows, is read whole for less than an index costs, and the planner
    // rightly scans it: only a partition with more rows counts. The fill spreads its history over
    // the last 7 days from now, so its oldest day holds the minutes before now's time of day: a
    // few dozen rows just before midnight (UTC), where this check once failed on a plan that
    // switches to the index as the day fills up.
    let mut scanned = Vec::new();
    for relation in found {
        let partition: bool = sqlx::query_scalar("select relispartition from pg_class where oid = $1::regclass")
            .bind(&relation)
            .fetch_one(&mut *db)
            .await
            .unwrap();
        let small = partition
            && sqlx::query_scalar::<_, i64>(&format!(
                "select count(*) from (select from \"{relation}\" limit {SMALL}) rows"
            ))
            .fetch_one(&mut *db)
            .await
            .unwrap()
                < SMALL;
        if !small {
            scanned.push(relation);
        }
    }
    scanned
}

/// A SQL literal of `value`.
fn lit(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Real rows of the filled database, as SQL literals, for the cases' parameters.
struct Samples(BTreeMap<&'static str, String>);

impl Samples {
    async fn read(db: &mut PgConnection) -> Self {
        let picks: &[(&'static str, &str)] = &[
            (
                "key_id",
                "select id::text from idempotency_keys where state = 'completed' and route = '/v1/payments' order by id desc offset 1000 limit 1",
            ),
            (
                "stuck_id",
                "select id::text from idempotency_keys where state = 'processing' and locked_until <= now() limit 1",
            ),
            (
                "tomb_id",
                "select key_id::text from idempotency_events where kind = 'expired' order by key_id desc offset 100 limit 1",
            ),
            ("refund_key_id", "select key_id::text from refunds order by key_id desc offset 100 limit 1"),
            ("refund_id", "select id::text from refunds order by key_id desc offset 100 limit 1"),
            ("gateway_refund", "select gateway_refund_id from refunds order by key_id desc offset 100 limit 1"),
            ("webhook_id", "select id from webhook_events order by received_at desc offset 100 limit 1"),
        ];
        let mut values = BTreeMap::new();
        for (name, sql) in picks {
            let value: String = sqlx::query_scalar(sql).fetch_one(&mut *db).await.unwrap();
            values.insert(*name, lit(&value));
        }
        let key_id = values["key_id"].clone();
        let of_key: &[(&'static str, &str)] = &[
            ("customer_id", "select customer_id::text from idempotency_keys where id = $1::uuid"),
            ("key", "select key from idempotency_keys where id = $1::uuid"),
            ("payment_id", "select id::text from payments where key_id = $1::uuid"),
            ("payment_intent", "select gateway_payment_intent_id from payments where key_id = $1::uuid"),
        ];
        let key_id = key_id.trim_matches('\'').to_owned();
        for (name, sql) in of_key {
            let value: String = sqlx::query_scalar(sql).bind(&key_id).fetch_one(&mut *db).await.unwrap();
            values.insert(*name, lit(&value));
        }
        // What the gateway audit asks about after a load test: thousands of charged payments.
        let charged: String = sqlx::query_scalar(
            "select '{' || string_agg(id::text, ',') || '}' from
             (select id from payments where key_id is not null order by key_id desc limit 5000) newest",
        )
        .fetch_one(&mut *db)
        .await
        .unwrap();
        values.insert("charged", format!("{}::uuid[]", lit(&charged)));
        let prefix = &values["key"][1..values["key"].len() - 4];
        values.insert("prefix", format!("'{}%'", prefix.replace('_', "\\_")));
        Self(values)
    }

    /// `$name` replaced by the sample, in each parameter.
    fn fill(&self, params: &[&str]) -> Vec<String> {
        params
            .iter()
            .map(|param| {
                let mut param = (*param).to_owned();
                for (name, value) in self.0.iter().rev() {
                    param = param.replace(&format!("${name}"), value);
                }
                param
            })
            .collect()
    }
}

/// One query and the parameters a request or a page gives it: SQL literals, `$name` for a
/// [`Samples`] value.
struct Case {
    name: &'static str,
    /// A fragment of its text that no other query has.
    needle: &'static str,
    params: Vec<&'static str>,
}

fn case(name: &'static str, needle: &'static str, params: &[&'static str]) -> Case {
    Case { name, needle, params: params.to_vec() }
}

/// The query the case `name` EXPLAINs, and the case (its parameters).
fn case_query(name: &str) -> (Described, Case) {
    let case = cases().into_iter().find(|case| case.name == name).unwrap_or_else(|| panic!("no case {name:?}"));
    let query = described().into_iter().find(|query| query.sql.contains(case.needle)).unwrap();
    (query, case)
}

/// Every query on a growing table the request paths, the sweeper and the dashboard run.
fn cases() -> Vec<Case> {
    // The budget: max attempts, horizon, backoff base and cap.
    const B: [&str; 4] = ["10", "86400.0", "1.0", "60.0"];
    let mut cases = vec![
        // The API: claim, replay, the lease, the finish.
        case(
            "claim",
            "on conflict (customer_id, key) do nothing",
            &[
                "gen_random_uuid()",
                "$customer_id",
                "$key",
                "'POST'",
                "'/v1/payments'",
                "sha256('x'::bytea)",
                "'{}'",
                "'owner'",
                "30.0",
                "86400.0",
                B[0],
                B[1],
                B[2],
                B[3],
                "'started'",
            ],
        ),
        case(
            "reclaim",
            "with reclaimed as (\n                update idempotency_keys",
            &["$stuck_id", "1", "'owner'", "30.0", B[0], B[1], B[2], B[3], "$customer_id"],
        ),
        case(
            "replay's stored response",
            "where customer_id = $1 and key = $2 and route = $3",
            &["$customer_id", "$key", "'/v1/payments'"],
        ),
        case(
            "heartbeat",
            "set locked_until = now() + $3 * interval '1 second', updated_at = now()",
            &["$stuck_id", "1", "30.0", "$customer_id"],
        ),
        case(
            "release",
            "with released as (\n                update idempotency_keys\n                   set locked_until = now()",
            &["$stuck_id", "1", "'gateway timeout'", "null", B[0], B[1], B[2], B[3], "$customer_id"],
        ),
        case(
            "advance",
            "with advanced as (",
            &["$stuck_id", "1", "'started'", "'payment_created'", "null", "$customer_id"],
        ),
        // Payments.
        case(
            "payment created",
            "on conflict (id, customer_id) do nothing\n            returning created_at",
            &[
                "gen_random_uuid()",
                "$customer_id",
                "$stuck_id",
                "1000",
                "'usd'",
                "'pm_card_visa'",
                "null",
                "'{}'",
                "1",
                "'pay_x'",
                "'automatic'",
            ],
        ),
        case(
            "payment finished",
            "where p.key_id = finished.key_id",
            &[
                "$key_id",
                "1",
                "201",
                "'[]'",
                "'\\x7b7d'",
                "'succeeded'",
                "$payment_intent",
                "null",
                "null",
                "null",
                "null",
                "1.0",
                "600.0",
                "0",
                "$customer_id",
            ],
        ),
        case(
            "payment failed",
            "with failed as (\n            update idempotency_keys",
            &["$stuck_id", "1", "502", "'{}'", "'\\x00'", "'no charge'", "$customer_id"],
        ),
        case(
            "lab payment's outcome",
            "set status = $2, gateway_payment_intent_id = $3,",
            &["$payment_id", "'succeeded'", "$payment_intent", "null", "null", "null"],
        ),
        case("payment by key", "from payments\n        where key_id = $1\n", &["$key_id"]),
        case(
            "payment by id",
            "amount_captured, created_at\n        from payments\n        where id = $1 and customer_id = $2",
            &["$payment_id", "$customer_id"],
        ),
        case(
            "payments list",
            "(created_at, id) < (select created_at, id from payments where id = $2)",
            &["$customer_id", "$payment_id", "11"],
        ),
        case(
            "payment moved (webhook, reconcile)",
            "with before as (\n            select id, status, key_id",
            &[
                "$payment_id",
                "'succeeded'",
                "$payment_intent",
                "null",
                "null",
                "null",
                "null",
                "now()",
                "1.0",
                "60.0",
                "'webhook'",
                "'{}'",
                "0",
                "1000",
            ],
        ),
        case(
            "payment webhook target",
            "where id = $1 or gateway_payment_intent_id = $2 or id = $3 or key_id = $3",
            &["$payment_id", "$payment_intent", "null", "'succeeded'", "now()"],
        ),
        case("payment reconcile soon", "update payments set reconcile_at = now() where id = $1", &["$payment_id"]),
        case(
            "payments due",
            "select id from payments\n            where reconcile_at <= now()",
            &["50", "1.0", "60.0"],
        ),
        // Captures.
        case(
            "capture claim",
            "with target as (",
            &["$payment_id", "$customer_id", "'capture'", "$stuck_id", "null", "'capture_created'", "1", "'pay_x'"],
        ),
        case(
            "settlement never made, released",
            "update payments set settlement = null, settled_by = null",
            &["$payment_id"],
        ),
        // Refunds.
        case(
            "refund's payment",
            "exists (select from refunds where id = $3)",
            &["$payment_id", "$customer_id", "$refund_id"],
        ),
        case(
            "refund reserved",
            "with reserved as (",
            &[
                "gen_random_uuid()",
                "$customer_id",
                "$payment_id",
                "100",
                "$stuck_id",
                "null",
                "'{}'",
                "1",
                "'re_x'",
                "'pay_x'",
                "null",
            ],
        ),
        case(
            "refund finished",
            "where key_id = $1 and status = 'pending'",
            &["$refund_key_id", "'succeeded'", "$gateway_refund", "null", "null", "1.0", "60.0"],
        ),
        case(
            "refund by key (recovery)",
            "select status, gateway_refund_id, failure_code, failure_message from refunds where key_id = $1",
            &["$refund_key_id"],
        ),
        case("refund by key", "from refunds r join payments p on p.id = r.payment_id", &["$refund_key_id"]),
        case(
            "refund by id",
            "from refunds\n        where id = $1 and customer_id = $2\n",
            &["$refund_id", "$customer_id"],
        ),
        case(
            "refunds list",
            "(created_at, id) < (select created_at, id from refunds where id = $3)",
            &["$customer_id", "$payment_id", "null", "11"],
        ),
        case(
            "refund moved",
            "reversed_at = case when status = 'succeeded'",
            &["$refund_id", "'succeeded'", "$gateway_refund", "null", "null"],
        ),
        case(
            "refund webhook target",
            "from refunds\n        where id = $1 or gateway_refund_id = $2",
            &["$refund_id", "$gateway_refund", "null"],
        ),
        case(
            "refund webhook's payment",
            "from payments p left join refunds r on r.payment_id = p.id",
            &["$payment_intent", "$refund_key_id"],
        ),
        case("refund status for update", "select status from refunds where id = $1 for update", &["$refund_id"]),
        case("refunds due", "select id from refunds\n            where reconcile_at <= now()", &["50", "1.0", "60.0"]),
        // The webhook inbox.
        case(
            "inbox effect",
            "update webhook_events set effect = $2",
            &["$webhook_id", "'applied'", "$payment_id", "null", "$key_id", "$customer_id", "now()"],
        ),
        case("inbox's key", "from webhook_events\n        where id = $1 and created = $2", &["$webhook_id", "now()"]),
        // The sweeper and the operator's actions.
        case("sweeper: abandoned keys", "with abandoned as (", &["'sweeper'", "50", B[0], B[1], B[2], B[3], "30.0"]),
        case("reaper", "with doomed as (", &["500"]),
        case(
            "operator release",
            "locked_until <= now()\n                returning id, customer_id, lease_token, recovery_point",
            &["$stuck_id", "1", "'operator:alice'"],
        ),
        case(
            "operator expire",
            "with expired as (\n                delete from idempotency_keys",
            &["$key_id", "1", "'operator:alice'"],
        ),
        case("operator's look at a key", "coalesce(locked_until > now(), false)", &["$key_id"]),
        // The dashboard.
        case("overview counts", "as \"in_flight!\"", &["10001"]),
        case(
            "overview chart",
            "floor(extract(epoch from created_at)::float8",
            &["array['claimed', 'replayed', 'conflict', 'mismatch', 'reclaimed']", "30.0", "30", "null"],
        ),
        case("refusal banner", "where kind = 'refused' and created_at", &["300.0"]),
        case(
            "search by payment or PaymentIntent id",
            "select key_id as \"key_id!\" from payments",
            &["$payment_id", "null", "null"],
        ),
        case(
            "search by PaymentIntent id",
            "select key_id as \"key_id!\" from payments",
            &["null", "$payment_intent", "null"],
        ),
        case("search by refund id", "select key_id as \"key_id!\" from payments", &["null", "null", "$refund_id"]),
        case("key page", "k.request,\n", &["$key_id", B[0], B[1], B[2], B[3]]),
        case("key page: tombstone", "e.detail->>'by' as by", &["$tomb_id", "'/v1/refunds'", "'/v1/payments'"]),
        case(
            "key page: timeline",
            "from idempotency_events where key_id = $1\n        order by id desc limit 500",
            &["$key_id"],
        ),
        case("payment page", "p.capture_method, p.amount_captured", &["$payment_id"]),
        case("payment page: refunds", "where r.payment_id = $1", &["$payment_id"]),
        case(
            "gateway audit: repeated payments",
            "as \"expired!\"\n        from payments p",
            &["array[$payment_id]::uuid[]"],
        ),
        case(
            "gateway audit: charged but not succeeded",
            "(select p.status from payments p where p.id = c.id)",
            &["$charged"],
        ),
        case("gateway audit: uncharged", "count(*) over () as \"counted!\"", &["$charged", "50", "10001"]),
        case(
            "gateway audit: key links",
            "join unnest($1::uuid[], $2::text[])",
            &["array[$customer_id]::uuid[]", "array[$key]::text[]"],
        ),
    ];
    // The keys table and its count: every status, each filter, the search, both cursors.
    let statuses = ["null", "'in_flight'", "'stuck'", "'completed'", "'failed'", "'expired'"];
    let searches = [("null", "'{}'"), ("$prefix", "'{}'"), ("'pay\\_%'", "array[$key_id]::uuid[]")];
    for status in statuses {
        for (prefix, ids) in searches {
            let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
            let name = leak(format!("keys table, state {status}, search {prefix}"));
            cases.push(Case {
                name,
                needle: "with live as (",
                params: vec![
                    status,
                    "null",
                    prefix,
                    "null",
                    "null",
                    "26",
                    B[0],
                    B[1],
                    B[2],
                    B[3],
                    "null",
                    "'/v1/refunds'",
                    "'/v1/payments'",
                    ids,
                ],
            });
            cases.push(Case {
                name: leak(format!("keys count, state {status}, search {prefix}")),
                needle: "+ (select count(*) from (",
                params: vec![status, "null", prefix, "null", ids, "10001"],
            });
        }
    }
    for (name, before, after) in
        [("keys table, older page", "$key_id", "null"), ("keys table, newer page", "null", "$key_id")]
    {
        cases.push(Case {
            name,
            needle: "with live as (",
            params: vec![
                "null",
                "null",
                "null",
                before,
                after,
                "26",
                B[0],
                B[1],
                B[2],
                B[3],
                "null",
                "'/v1/refunds'",
                "'/v1/payments'",
                "'{}'",
            ],
        });
    }
    for route in ["'/v1/refunds'", "'/v1/payments'"] {
        cases.push(Case {
            name: "keys table, an operation and a customer",
            needle: "with live as (",
            params: vec![
                "null",
                "$customer_id",
                "null",
                "null",
                "null",
                "26",
                B[0],
                B[1],
                B[2],
                B[3],
                route,
                "'/v1/refunds'",
                "'/v1/payments'",
                "'{}'",
            ],
        });
        cases.push(Case {
            name: "keys count, an operation",
            needle: "+ (select count(*) from (",
            params: vec!["null", "null", "null", route, "'{}'", "10001"],
        });
    }
    cases
}

/// The fill script's statements, for a test connection (psql's meta-commands left out).
fn fill_script() -> String {
    let script = std::fs::read_to_string(repository().join("loadtest/scale/fill.sql")).unwrap();
    script.lines().filter(|line| !line.starts_with('\\')).collect::<Vec<_>>().join("\n")
}

/// Adds `keys` keys' worth of history to a migrated database (loadtest/scale/fill.sql).
pub(crate) async fn fill(url: &str, keys: i64) {
    let mut db = PgConnection::connect(url).await.unwrap();
    sqlx::raw_sql(&format!("set payonce.fill_keys = {keys}")).execute(&mut db).await.unwrap();
    sqlx::raw_sql(&fill_script()).execute(&mut db).await.unwrap();
}

/// A migrated test database with `keys` keys' history, and a connection to it (the database is
/// dropped with the first).
async fn filled(keys: i64) -> (TestDatabase, PgConnection) {
    let database = TestDatabase::create().await;
    payonce::db::MIGRATOR.run(&database.pool).await.unwrap();
    fill(&database.url, keys).await;
    let db = PgConnection::connect(&database.url).await.unwrap();
    (database, db)
}

/// Every query of the request paths, the sweeper and the dashboard, EXPLAINed against a hundred
/// thousand keys' history, reads the tables that grow through an index.
#[tokio::test]
async fn no_query_reads_a_growing_table_whole() {
    let (_database, mut db) = filled(FILL_KEYS).await;
    let samples = Samples::read(&mut db).await;

    // The control: a predicate no index serves is caught, so the tables are big enough for the
    // planner to prefer reading them whole, and the check below sees it when it does.
    let unindexed = "select id from idempotency_keys where response_status = 599 and key like '%7'";
    assert_eq!(full_scans(&mut db, unindexed, &[], &[]).await, ["idempotency_keys"], "the control must be caught");

    let source = sources();
    let queries = described();
    for query in &queries {
        // Raw strings hold it verbatim; a plain string literal escapes its quotes.
        let live = source.contains(&query.sql) || source.contains(&query.sql.replace('"', "\\\""));
        assert!(live, ".sqlx/ holds a query the code no longer has (run .ci/sqlx-prepare):\n{}", query.sql);
    }
    let mut failures = Vec::new();
    let mut explained = vec![false; queries.len()];
    for case in cases() {
        let matching: Vec<usize> = (0..queries.len()).filter(|&i| queries[i].sql.contains(case.needle)).collect();
        let [index] = matching[..] else {
            failures.push(format!("{}: {} queries contain {:?}", case.name, matching.len(), case.needle));
            continue;
        };
        explained[index] = true;
        let query = &queries[index];
        let params = samples.fill(&case.params);
        assert_eq!(params.len(), query.types.len(), "{}: parameters", case.name);
        let scanned = full_scans(&mut db, &query.sql, &query.types, &params).await;
        if !scanned.is_empty() {
            failures.push(format!("{}: Seq Scan on {}", case.name, scanned.join(", ")));
        }
    }
    // Every query on a growing table is a case or is excused.
    for (query, explained) in queries.iter().zip(explained) {
        let touches = GROWING.iter().any(|table| query.sql.contains(table));
        let excused = NOT_EXPLAINED.iter().any(|(needle, _)| query.sql.contains(needle));
        if touches && !explained && !excused {
            failures.push(format!("not EXPLAINed (add a case or a reason):\n{}", query.sql));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // And a case fails when its index goes: without idempotency_keys_failed, the Failed filter's
    // count reads the keys table whole.
    let count = queries.iter().find(|q| q.sql.contains("+ (select count(*) from (")).unwrap();
    let params = samples.fill(&["'failed'", "null", "null", "null", "'{}'", "10001"]);
    sqlx::raw_sql("begin; drop index idempotency_keys_failed").execute(&mut db).await.unwrap();
    let scanned = full_scans(&mut db, &count.sql, &count.types, &params).await;
    sqlx::raw_sql("rollback").execute(&mut db).await.unwrap();
    assert_eq!(scanned, ["idempotency_keys"], "a missing index must be caught");

    // Reading along an index is no better when the whole index is read. A search that matches
    // no tombstone is answered by the search indexes only if the planner knows how few of a day's
    // tombstones a prefix matches: each day's partition has the statistics of a tombstone's
    // client key for that (migrations 20261231000201 and 20261231000301). Without them it expects
    // 0.5 % of them to match any prefix, and from a million keys on it walks every tombstone in
    // key order to find a page of 26 (the three searches: 420-480 ms at ten million keys).
    let days: Vec<String> = sqlx::query_scalar(
        "select c.relname::text from pg_inherits i join pg_class c on c.oid = i.inhrelid
         where i.inhparent = 'idempotency_events'::regclass and c.reltuples > 1000",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert!(days.len() >= 5, "the fill spreads its history over days: {days:?}");
    for day in days {
        let sql = format!("select from {day} where kind = 'expired' and detail->>'key' like 'no-such-key%'");
        let plan = explain(&mut db, "", &sql, &[], &[]).await;
        let expected = plan[0]["Plan"]["Plan Rows"].as_f64().unwrap();
        assert!(expected <= 2.0, "{day}: the planner expects {expected} tombstones to match a prefix none has");
    }
}

/// The reaper runs its delete every few seconds on the same pooled connections, so PostgreSQL
/// soon weighs a generic plan for it, in which `limit $1` is guessed to keep a tenth of the expired
/// keys. When it took one (a million keys expiring at once, loadtest/reaper.sh), each 500-key batch
/// joined its keys by reading the whole table: 0.6 to 0.9 s a batch instead of 20 ms, and the
/// backlog reaped at 470 to 750 keys/s instead of 3 000. Looked up by an array of their ids, the
/// keys are found by the primary key in either plan.
#[tokio::test]
async fn the_reapers_generic_plan_finds_the_keys_by_their_ids() {
    let database = crate::retention::database().await;
    database.customer("acme").await;
    // Enough expired keys that a tenth of them is cheaper to join by reading the table.
    crate::retention::expired_keys(&database.pool, "acme", 50_000).await;
    let mut db = PgConnection::connect(&database.url).await.unwrap();
    sqlx::raw_sql("analyze idempotency_keys").execute(&mut db).await.unwrap();
    let reap = described().into_iter().find(|query| query.sql.contains("with doomed as (")).unwrap();
    for mode in ["auto", "force_generic_plan"] {
        sqlx::raw_sql(&format!("set plan_cache_mode = {mode}")).execute(&mut db).await.unwrap();
        let scanned = full_scans(&mut db, &reap.sql, &reap.types, &["500".to_owned()]).await;
        assert!(scanned.is_empty(), "plan_cache_mode {mode}: Seq Scan on {scanned:?}");
    }
}

/// A function that returns rows is estimated at a thousand of them unless it says otherwise. The
/// payment's finish (every new payment's last statement) joins the key `idempotency_finish`
/// returns, at most one, to its payment: planned for a thousand keys, the join read the payments
/// table whole until it held some 60 000 rows, where looking a thousand keys up by the index
/// became the cheaper guess. So a new payment cost more the more payments there were, and a
/// hundred thousand keys' history, where the other queries are EXPLAINed, does not show it.
#[tokio::test]
async fn the_payments_finish_finds_its_payment_by_key_at_any_size() {
    let (_database, mut db) = filled(10_000).await;
    let samples = Samples::read(&mut db).await;
    let (finish, case) = case_query("payment finished");
    let scanned = full_scans(&mut db, &finish.sql, &finish.types, &samples.fill(&case.params)).await;
    assert!(scanned.is_empty(), "10 000 keys' history: Seq Scan on {scanned:?}");
}

/// How a plan reads the keys table: each node on it or on one of its indexes.
fn key_reads(plan: &Value, found: &mut Vec<String>) {
    let on_keys = plan["Relation Name"] == "idempotency_keys"
        || plan["Index Name"].as_str().is_some_and(|index| index.starts_with("idempotency_keys"));
    if on_keys && plan["Node Type"] != "ModifyTable" {
        found.push(format!("{} {}", plan["Node Type"].as_str().unwrap(), plan["Index Name"].as_str().unwrap_or("")));
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        key_reads(child, found);
    }
}

/// Every fenced write of a key on a new payment's way (the finish, inside `idempotency_finish`; the
/// heartbeat; a phase's advance; the release after an error; the give-up; a retry's reclaim of a
/// lease that ran out) finds the key by its whole primary key, (id, customer_id): a unique index
/// matched in full is one row whatever the statistics say. By its id alone, on a table autovacuum
/// had not analysed yet (every new database, for a minute or more: the benchmarks' whole run), the
/// key was guessed at a few dozen rows and found by intersecting the primary key with
/// `idempotency_keys_processing`, walking that index's entries of every key finished since the last
/// vacuum: ~700 buffers per finish instead of a dozen. The plans are generic (any values), as
/// PL/pgSQL and a pooled connection's sixth execution may keep them.
#[tokio::test]
async fn fenced_writes_find_their_key_by_its_primary_key_without_statistics() {
    let (_database, mut db) = filled(2_000).await;
    sqlx::raw_sql(
        "delete from pg_statistic where starelid = 'idempotency_keys'::regclass;
         set plan_cache_mode = force_generic_plan",
    )
    .execute(&mut db)
    .await
    .unwrap();

    // The finish's own statement, from the function's source, its arguments as parameters.
    let source: String = sqlx::query_scalar("select prosrc from pg_proc where proname = 'idempotency_finish'")
        .fetch_one(&mut db)
        .await
        .unwrap();
    let (_, statement) = source.split_once("return query").expect("idempotency_finish returns a query");
    let mut statement = statement.rsplit_once(';').unwrap().0.to_owned();
    let arguments = [
        ("p_key", "uuid"),
        ("p_customer", "uuid"),
        ("p_token", "int8"),
        ("p_failed", "bool"),
        ("p_status", "int2"),
        ("p_headers", "jsonb"),
        ("p_body", "bytea"),
        ("p_detail", "jsonb"),
    ];
    for (n, (name, _)) in arguments.iter().enumerate() {
        statement = statement.replace(name, &format!("${}", n + 1));
    }
    let mut statements = vec![(
        "idempotency_finish".to_owned(),
        statement,
        arguments.iter().map(|(_, ty)| (*ty).to_owned()).collect::<Vec<_>>(),
    )];
    // The engine's own fenced writes, as the request paths' cases name them.
    for name in ["heartbeat", "advance", "release", "payment failed", "reclaim"] {
        let (query, _) = case_query(name);
        statements.push((name.to_owned(), query.sql, query.types));
    }
    let mut failures = Vec::new();
    for (name, sql, types) in statements {
        let nulls = vec!["null".to_owned(); types.len()];
        let plan = explain(&mut db, "", &sql, &types, &nulls).await;
        let mut reads = Vec::new();
        key_reads(&plan[0]["Plan"], &mut reads);
        if reads != ["Index Scan idempotency_keys_pkey"] {
            failures.push(format!("{name}: {reads:?}"));
        }
    }
    assert!(failures.is_empty(), "not by the primary key alone:\n{}", failures.join("\n"));
}

/// The check reads nested plans: a Seq Scan under a join or a subplan is found, on a table or
/// on one of its partitions, and a small reference table's is not held against a query.
#[test]
fn seq_scans_are_found_at_any_depth() {
    let plan = serde_json::json!({
        "Node Type": "Nested Loop",
        "Plans": [
            {"Node Type": "Index Scan", "Relation Name": "idempotency_keys"},
            {"Node Type": "Hash", "Plans": [{"Node Type": "Seq Scan", "Relation Name": "idempotency_events_2026_12"}]},
            {"Node Type": "Seq Scan", "Relation Name": "customers"},
        ]
    });
    let mut found = Vec::new();
    seq_scans(&plan, &mut found);
    assert_eq!(found, ["idempotency_events_2026_12", "customers"]);
    found.retain(|relation| grows(relation));
    assert_eq!(found, ["idempotency_events_2026_12"]);
}
