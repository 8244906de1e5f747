//! The schema, read from the database a server migrated: what it promises beyond single queries.

use crate::helpers::TestApp;

/// The tables that would be *reference tables* if payonce were distributed by customer (docs/ha.md,
/// "Past one primary"): small, read everywhere, replicated to every node.
const REFERENCE_TABLES: &[&str] =
    &["customers", "admins", "admin_login_failures", "lab_runs", "_sqlx_migrations", "tower_sessions.session"];

/// Every other table grows with the customers' traffic and would be distributed by `customer_id`
/// (Citus: one shard per range of customers, a key's statements on one shard). That is only
/// possible, with the database still enforcing each uniqueness, if each of its primary and unique
/// keys includes `customer_id`. A new table, or a new unique index, that breaks this fails here.
/// A partitioned table is judged by its own keys (its partitions' are copies of them).
#[tokio::test]
async fn every_table_could_be_distributed_by_customer() {
    let app = TestApp::spawn().await;
    let keys: Vec<(String, String, Vec<String>)> = sqlx::query_as(
        r#"
        select case when n.nspname = 'public' then c.relname else n.nspname || '.' || c.relname end,
               i.indexrelid::regclass::text,
               array(select a.attname::text from unnest(i.indkey) as k(attnum)
                     join pg_attribute a on a.attrelid = c.oid and a.attnum = k.attnum)
        from pg_index i
        join pg_class c on c.oid = i.indrelid
        join pg_namespace n on n.oid = c.relnamespace
        where i.indisunique and c.relkind in ('r', 'p') and not c.relispartition
          and n.nspname not in ('pg_catalog', 'information_schema', 'pg_toast')
        order by 1, 2
        "#,
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let tables: std::collections::BTreeSet<&str> = keys.iter().map(|(table, ..)| table.as_str()).collect();
    for distributed in ["idempotency_keys", "idempotency_events", "payments", "refunds", "webhook_events"] {
        assert!(tables.contains(distributed), "{distributed} is gone: update docs/ha.md and this test");
    }
    let breaking: Vec<String> = keys
        .iter()
        .filter(|(table, ..)| !REFERENCE_TABLES.contains(&table.as_str()))
        .filter(|(.., columns)| !columns.iter().any(|column| column == "customer_id"))
        .map(|(table, index, columns)| format!("{table}: {index} ({})", columns.join(", ")))
        .collect();
    assert!(breaking.is_empty(), "keys without customer_id on tables that grow per customer: {breaking:#?}");
}

/// The history tables are partitioned by day on their time column, with no default partition
/// (docs/expiry.md, "Retention"): a day goes whole, detached concurrently; and their keys, which
/// must hold the partition key, still hold `customer_id` and the id that makes a row unique.
#[tokio::test]
async fn the_history_tables_are_partitioned_by_day() {
    let app = TestApp::spawn().await;
    for (table, column, key) in [
        ("idempotency_events", "created_at", "id, customer_id, created_at"),
        ("webhook_events", "created", "id, customer_id, created"),
    ] {
        let (strategy, partition_key, primary_key, default): (String, String, String, bool) = sqlx::query_as(
            r#"
            select p.partstrat::text, pg_get_partkeydef(p.partrelid),
                   (select string_agg(a.attname, ', ' order by k.n)
                    from pg_index i
                    cross join lateral unnest(i.indkey) with ordinality as k(attnum, n)
                    join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum
                    where i.indrelid = p.partrelid and i.indisprimary),
                   p.partdefid <> 0
            from pg_partitioned_table p
            where p.partrelid = $1::text::regclass
            "#,
        )
        .bind(table)
        .fetch_one(&app.db)
        .await
        .unwrap_or_else(|err| panic!("{table} is not partitioned: {err}"));
        assert_eq!(strategy, "r", "{table}");
        assert_eq!(partition_key, format!("RANGE ({column})"), "{table}");
        assert_eq!(primary_key, key, "{table}");
        assert!(!default, "{table} has a default partition: its days could not be detached concurrently");
    }
}
