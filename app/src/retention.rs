//! Bounded retention of the two history tables: the key events (`idempotency_events`) and the
//! webhook inbox (`webhook_events`). Both are partitioned by day (UTC) on their time column
//! (migrations/20261231000101_retention.sql); a day past the retention goes whole, in O(1):
//! its partition is detached and dropped, never emptied by a `delete` of its rows.
//!
//! The sweeper calls [`maintain`] on every pass; opening the database ([`crate::db`]) calls
//! [`add_days_ahead`] after the migrations. Both make the coming days' partitions ([`DAYS_AHEAD`]): there is no default
//! partition (it would forbid a concurrent detach), so a row whose day has no partition could
//! not be written. An expired day is detached `CONCURRENTLY`, which takes no lock that an insert
//! or a read waits for; it waits itself for the transactions that may still see the partition.
//!
//! Any number of sweepers may run this at once: the one that takes a session advisory lock does
//! the work, the others skip it for this pass. A sweeper that died between detach and drop
//! leaves a detached (or detach-pending) table, which the next pass finishes and drops.

use std::time::Instant;

use sqlx::pool::PoolConnection;
use sqlx::{Executor, PgConnection, PgPool, Postgres};

/// The partitioned history tables, each partitioned by day on a `timestamptz` column.
pub const TABLES: [&str; 2] = ["idempotency_events", "webhook_events"];

/// How many days after today have their partitions made in advance: the time a deployment may
/// run with no sweeper (and no server start) before a history row finds no day to go in.
pub const DAYS_AHEAD: i32 = 7;

/// How many days before today have their partitions made too (when missing: a new database, or
/// one that had none): a webhook event is redelivered for up to 3 days with its first `created`,
/// and must find its day in the inbox from the first day payonce runs.
pub const DAYS_BEHIND: i32 = 3;

/// The shortest retention accepted, in days: Stripe redelivers a webhook event for up to 3 days,
/// and the inbox must remember its id at least that long to apply it once (docs/expiry.md).
pub const MIN_DAYS: u32 = 3;

/// The retention payonce ships with, in days: as long as Stripe keeps events (30 days), so
/// that even an event resent by hand from Stripe's dashboard is found in the inbox.
pub const DEFAULT_DAYS: u32 = 30;

/// The advisory lock of the maintenance (an arbitrary constant: "payonce retention").
const LOCK: i64 = 0x7061_796f_6e63_6552;

/// What one maintenance did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Maintained {
    /// Partitions made for the coming days.
    pub created: u64,
    /// Expired partitions detached and dropped (by name).
    pub dropped: Vec<String>,
    /// Another sweeper held the maintenance: this one did nothing.
    pub skipped: bool,
}

/// Makes the partitions of today, the [`DAYS_BEHIND`] days before it and the [`DAYS_AHEAD`] days
/// after it that do not exist yet, for
/// every history table. Returns how many it made. If another session holds the maintenance, it
/// does nothing: that one makes the days first.
pub async fn add_days_ahead(conn: &mut PgConnection) -> sqlx::Result<u64> {
    if !try_lock(conn).await? {
        return Ok(0);
    }
    let created = add_days_ahead_on(conn).await;
    if let Err(err) = sqlx::query_scalar!("select pg_advisory_unlock($1)", LOCK).fetch_one(&mut *conn).await {
        tracing::warn!(error = %err, "could not release the retention lock");
    }
    created
}

/// One maintenance: make the coming days, then detach and drop every day whose end is more than
/// `retention_days` ago. Returns what it did; `skipped` when another sweeper was doing it.
pub async fn maintain(pool: &PgPool, retention_days: u32) -> sqlx::Result<Maintained> {
    let mut conn = pool.acquire().await?;
    if !try_lock(&mut conn).await? {
        return Ok(Maintained { skipped: true, ..Maintained::default() });
    }
    let started = Instant::now();
    let done = maintain_on(&mut conn, retention_days).await;
    unlock(conn).await;
    let done = done?;
    if !done.dropped.is_empty() || done.created > 0 {
        metrics::counter!("payonce_history_partitions_dropped_total").increment(done.dropped.len() as u64);
        tracing::info!(
            created = done.created,
            dropped = ?done.dropped,
            secs = started.elapsed().as_secs_f64(),
            "history partitions maintained"
        );
    }
    Ok(done)
}

async fn maintain_on(conn: &mut PgConnection, retention_days: u32) -> sqlx::Result<Maintained> {
    let created = add_days_ahead_on(conn).await?;
    let mut dropped = Vec::new();
    for table in TABLES {
        for expired in expired(conn, table, retention_days).await? {
            drop_partition(conn, table, &expired).await?;
            dropped.push(expired.name);
        }
    }
    Ok(Maintained { created, dropped, skipped: false })
}

/// Takes the maintenance's session advisory lock if no other session holds it.
async fn try_lock(conn: &mut PgConnection) -> sqlx::Result<bool> {
    sqlx::query_scalar!(r#"select pg_try_advisory_lock($1) as "taken!""#, LOCK).fetch_one(&mut *conn).await
}

/// Releases the lock; if even that fails, the connection is closed (which releases it) rather
/// than returned to the pool holding it.
async fn unlock(mut conn: PoolConnection<Postgres>) {
    if let Err(err) = sqlx::query_scalar!("select pg_advisory_unlock($1)", LOCK).fetch_one(&mut *conn).await {
        tracing::warn!(error = %err, "could not release the retention lock; closing its connection");
        conn.close_on_drop();
    }
}

async fn add_days_ahead_on(conn: &mut PgConnection) -> sqlx::Result<u64> {
    let mut created = 0;
    for table in TABLES {
        let made = sqlx::query_scalar!(
            r#"
            select payonce_add_daily_partitions($1, (now() at time zone 'UTC')::date - $2::int4,
                                                (now() at time zone 'UTC')::date + $3::int4) as "made!"
            "#,
            table,
            DAYS_BEHIND,
            DAYS_AHEAD,
        )
        .fetch_one(&mut *conn)
        .await?;
        created += u64::try_from(made).unwrap_or(0);
    }
    Ok(created)
}

/// A partition (or a table that was one) of a history table, past the retention.
struct Expired {
    name: String,
    /// Still a partition: attached, or detach-pending after an interrupted concurrent detach.
    attached: bool,
    pending: bool,
}

/// The days of `table` that ended more than `retention_days` ago, attached or left behind by an
/// interrupted maintenance, oldest first.
async fn expired(conn: &mut PgConnection, table: &str, retention_days: u32) -> sqlx::Result<Vec<Expired>> {
    sqlx::query_as!(
        Expired,
        r#"
        select c.relname::text as "name!", c.relispartition as "attached!",
               coalesce(i.inhdetachpending, false) as "pending!"
        from pg_class c
        left join pg_inherits i on i.inhrelid = c.oid
        where c.relkind = 'r'
          and c.relnamespace = (select relnamespace from pg_class where oid = $1::text::regclass)
          and c.relname ~ ('^' || $1 || '_p[0-9]{8}$')
          and (i.inhparent is null or i.inhparent = $1::text::regclass)
          and (to_date(right(c.relname, 8), 'YYYYMMDD') + 1)::timestamp at time zone 'UTC'
              <= now() - $2 * interval '1 day'
        order by c.relname
        "#,
        table,
        f64::from(retention_days),
    )
    .fetch_all(&mut *conn)
    .await
}

/// Detaches `partition` from `table` without a lock that readers or writers wait for, then
/// drops it. Neither statement may run in a transaction block (nor does it here).
async fn drop_partition(conn: &mut PgConnection, table: &str, partition: &Expired) -> sqlx::Result<()> {
    let name = &partition.name;
    let detach = if partition.pending {
        Some(format!(r#"alter table "{table}" detach partition "{name}" finalize"#))
    } else if partition.attached {
        Some(format!(r#"alter table "{table}" detach partition "{name}" concurrently"#))
    } else {
        None
    };
    // Sent unprepared (no arguments: the simple query protocol), outside any transaction.
    if let Some(detach) = detach {
        conn.execute(detach.as_str()).await?;
    }
    conn.execute(format!(r#"drop table if exists "{name}""#).as_str()).await?;
    tracing::info!(table, partition = name, "expired history partition dropped");
    Ok(())
}
