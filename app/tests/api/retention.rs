//! Bounded retention and the reaper: the history tables keep whole days and lose whole days
//! (partitions, never a `delete`), and expired keys go in bounded batches that neither wait for
//! nor hold up a payment.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::time::Duration;

use payonce::idempotency::{Engine, EngineSettings, EventLog};
use payonce::retention::{self, DAYS_AHEAD};
use payonce::sweeper::{Sweeper, SweeperSettings};
use reqwest::StatusCode;
use sqlx::PgPool;

use crate::helpers::{TestApp, TestDatabase, new_key, payment};

/// A migrated database with no server (and so no sweeper of its own): the test is the only one
/// maintaining it, unless it races itself.
pub(crate) async fn database() -> TestDatabase {
    let database = TestDatabase::create().await;
    payonce::db::MIGRATOR.run(&database.pool).await.expect("migrate");
    database
}

/// The partitions of `table`, by name.
async fn partitions(db: &PgPool, table: &str) -> BTreeSet<String> {
    sqlx::query_scalar("select inhrelid::regclass::text from pg_inherits where inhparent = $1::text::regclass")
        .bind(table)
        .fetch_all(db)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// The partition name of the UTC day `days` from today.
async fn day(db: &PgPool, table: &str, days: i32) -> String {
    sqlx::query_scalar("select $1 || '_p' || to_char((now() at time zone 'UTC')::date + $2, 'YYYYMMDD')")
        .bind(table)
        .bind(days)
        .fetch_one(db)
        .await
        .unwrap()
}

/// Makes the days from `from` to `to` days from today (negative: past) for both tables.
async fn add_days(db: &PgPool, from: i32, to: i32) {
    for table in retention::TABLES {
        sqlx::query(
            "select payonce_add_daily_partitions($1, (now() at time zone 'UTC')::date + $2,
                                                 (now() at time zone 'UTC')::date + $3)",
        )
        .bind(table)
        .bind(from)
        .bind(to)
        .execute(db)
        .await
        .unwrap();
    }
}

/// An event of each history table dated `age_days` ago (fractions allowed).
async fn history_at(db: &PgPool, id: &str, age_days: f64) {
    sqlx::query(
        "insert into idempotency_events (key_id, customer_id, kind, detail, created_at)
         values (gen_random_uuid(), gen_random_uuid(), 'claimed', jsonb_build_object('id', $1::text),
                 now() - $2 * interval '1 day')",
    )
    .bind(id)
    .bind(age_days)
    .execute(db)
    .await
    .unwrap();
    sqlx::query(
        "insert into webhook_events (id, type, created, effect) values ($1, 'payment_intent.succeeded',
                 now() - $2 * interval '1 day', 'applied')",
    )
    .bind(id)
    .bind(age_days)
    .execute(db)
    .await
    .unwrap();
}

/// The ids of the history rows left, in each table.
async fn kept(db: &PgPool) -> (BTreeSet<String>, BTreeSet<String>) {
    let events = sqlx::query_scalar("select detail->>'id' from idempotency_events where detail ? 'id'")
        .fetch_all(db)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let inbox = sqlx::query_scalar("select id from webhook_events").fetch_all(db).await.unwrap().into_iter().collect();
    (events, inbox)
}

/// A retention of 30 days drops the days that ended more than 30 days ago, whole, from both
/// tables, and keeps every row younger than that (and the days to come).
#[tokio::test]
async fn retention_drops_whole_old_days_and_keeps_the_recent_ones() {
    let app = database().await;
    add_days(&app.pool, -45, 0).await;
    for (id, age) in [("45d", 45.0), ("31d", 31.0), ("29d", 29.0), ("1d", 1.0), ("now", 0.0)] {
        history_at(&app.pool, id, age).await;
    }
    let before: Vec<BTreeSet<String>> = futures_join(retention::TABLES.map(|table| partitions(&app.pool, table))).await;

    let done = maintain(&app.pool, 30).await;

    let recent: BTreeSet<String> = ["29d", "1d", "now"].map(String::from).into();
    assert_eq!(kept(&app.pool).await, (recent.clone(), recent));
    for (table, before) in retention::TABLES.into_iter().zip(before) {
        let after = partitions(&app.pool, table).await;
        let gone: BTreeSet<&String> = before.difference(&after).collect();
        // Days -45 .. -31 ended at least 30 days ago; day -30 ends within the coming day.
        let expected: BTreeSet<String> =
            futures_join((-45..=-31).map(|d| day(&app.pool, table, d))).await.into_iter().collect();
        assert_eq!(gone, expected.iter().collect(), "{table}");
        assert!(after.contains(&day(&app.pool, table, -30).await), "{table}: day -30 is not over yet");
        assert!(after.contains(&day(&app.pool, table, DAYS_AHEAD).await), "{table}: the days ahead are made");
        // Gone from the database, not only detached.
        for name in expected {
            let exists: Option<String> =
                sqlx::query_scalar("select to_regclass($1)::text").bind(&name).fetch_one(&app.pool).await.unwrap();
            assert_eq!(exists, None, "{name} was detached but not dropped");
        }
    }
    assert_eq!(done.dropped.len(), 2 * 15, "{done:?}");
    // Once is enough: nothing more to do.
    let again = maintain(&app.pool, 30).await;
    assert_eq!((again.created, again.dropped.len()), (0, 0), "{again:?}");
}

/// The coming days are made ahead: a day that is missing is made by the next maintenance, and a
/// row dated then finds it.
#[tokio::test]
async fn retention_makes_the_coming_days() {
    let app = database().await;
    for table in retention::TABLES {
        let last = day(&app.pool, table, DAYS_AHEAD).await;
        assert!(partitions(&app.pool, table).await.contains(&last), "the migration made {last}");
        sqlx::query(&format!("drop table {last}")).execute(&app.pool).await.unwrap();
    }

    let done = maintain(&app.pool, 30).await;

    assert_eq!(done.created, 2, "{done:?}");
    for table in retention::TABLES {
        assert!(partitions(&app.pool, table).await.contains(&day(&app.pool, table, DAYS_AHEAD).await));
    }
    history_at(&app.pool, "ahead", -f64::from(DAYS_AHEAD)).await;
    // Beyond the days made, a row has nowhere to go: that is why they are made ahead.
    let beyond = sqlx::query(
        "insert into idempotency_events (key_id, customer_id, kind, created_at)
         values (gen_random_uuid(), gen_random_uuid(), 'claimed', now() + interval '9 days')",
    )
    .execute(&app.pool)
    .await;
    assert!(beyond.unwrap_err().to_string().contains("no partition"));
}

/// Two sweepers maintaining at once: each expired day is dropped exactly once, neither fails,
/// and a table left detached by a maintenance that died halfway is dropped too.
#[tokio::test]
async fn retention_is_idempotent_when_two_sweepers_race() {
    let app = database().await;
    add_days(&app.pool, -40, 0).await;
    history_at(&app.pool, "old", 35.0).await;
    history_at(&app.pool, "new", 2.0).await;
    // A maintenance that died between the detach and the drop.
    let orphan = day(&app.pool, "idempotency_events", -40).await;
    sqlx::query(&format!("alter table idempotency_events detach partition {orphan}")).execute(&app.pool).await.unwrap();

    let (first, second) = tokio::join!(retention::maintain(&app.pool, 30), retention::maintain(&app.pool, 30));
    let (first, second) = (first.unwrap(), second.unwrap());
    let third = maintain(&app.pool, 30).await;

    let mut dropped: Vec<&String> = first.dropped.iter().chain(&second.dropped).chain(&third.dropped).collect();
    let total = dropped.len();
    dropped.sort();
    dropped.dedup();
    assert_eq!(dropped.len(), total, "a day dropped twice: {first:?} {second:?} {third:?}");
    // Days -40 .. -31 of both tables (the orphan among them).
    assert_eq!(total, 2 * 10, "{first:?} {second:?} {third:?}");
    assert!(dropped.contains(&&orphan));
    let new: BTreeSet<String> = ["new".to_owned()].into();
    assert_eq!(kept(&app.pool).await, (new.clone(), new));
}

/// One maintenance, which nothing else is doing.
async fn maintain(db: &PgPool, days: u32) -> retention::Maintained {
    let done = retention::maintain(db, days).await.unwrap();
    assert!(!done.skipped, "nothing else maintains this database");
    done
}

/// Awaits every future, in order.
async fn futures_join<T>(futures: impl IntoIterator<Item = impl std::future::Future<Output = T>>) -> Vec<T> {
    let mut out = Vec::new();
    for future in futures {
        out.push(future.await);
    }
    out
}

/// `n` final keys of the customer named `customer`, expired an hour ago, inserted by SQL.
pub(crate) async fn expired_keys(db: &PgPool, customer: &str, n: i64) {
    sqlx::query(
        r#"
        insert into idempotency_keys
            (id, customer_id, key, method, route, fingerprint, request, state, recovery_point,
             response_status, response_headers, response_body, completed_at, created_at, expires_at)
        select gen_random_uuid(), c.id, 'expired-' || i, 'POST', '/v1/payments', sha256(i::text::bytea),
               '{}', 'completed', 'finished', 201, '{}', '{}', now() - interval '25 hours',
               now() - interval '25 hours', now() - interval '1 hour'
        from customers c, generate_series(1, $2) as i
        where c.name = $1
        "#,
    )
    .bind(customer)
    .bind(n)
    .execute(db)
    .await
    .unwrap();
}

/// An engine of the test's own on `db`, to drive the reaper directly.
fn engine(db: &PgPool) -> Engine {
    Engine::new(db.clone(), EngineSettings::default(), EventLog::spawn(db.clone()).0)
}

async fn expired_left(db: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from idempotency_keys where expires_at <= now()").fetch_one(db).await.unwrap()
}

/// The reaper takes keys in batches of at most its limit, each one statement, and skips the rows
/// another transaction holds instead of waiting for them: with some expired keys locked, it still
/// deletes every other one (each leaving its tombstone), and the locked ones go once released.
#[tokio::test]
async fn the_reaper_deletes_in_bounded_batches_and_skips_what_is_locked() {
    let app = database().await;
    app.customer("acme").await;
    expired_keys(&app.pool, "acme", 2_000).await;
    let mut holder = app.pool.begin().await.unwrap();
    let held: Vec<uuid::Uuid> =
        sqlx::query_scalar("select id from idempotency_keys order by expires_at, id limit 10 for update")
            .fetch_all(&mut *holder)
            .await
            .unwrap();
    let reaper = engine(&app.pool);

    let mut batches = Vec::new();
    loop {
        let reaped = tokio::time::timeout(Duration::from_secs(30), reaper.reap_expired(300))
            .await
            .expect("the reaper waited for a locked row")
            .unwrap();
        batches.push(reaped);
        if reaped < 300 {
            break;
        }
    }

    assert!(batches.iter().all(|&batch| batch <= 300), "{batches:?}");
    assert_eq!(batches.iter().sum::<u64>(), 2_000 - 10, "{batches:?}");
    assert_eq!(expired_left(&app.pool).await, 10);
    let tombstones: i64 = sqlx::query_scalar("select count(*) from idempotency_events where kind = 'expired'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(tombstones, 2_000 - 10);
    holder.rollback().await.unwrap();
    assert_eq!(reaper.reap_expired(300).await.unwrap(), held.len() as u64);
    assert_eq!(expired_left(&app.pool).await, 0);
}

/// A sweeper of the test's own on `db`, reaping at `rate` keys per second at most (0: unpaced)
/// for four fifths of a pass of `interval`. Its gateway is never called: nothing here is
/// abandoned.
fn reaper_at(db: &TestDatabase, rate: u32, interval: Duration) -> Sweeper {
    let sweeping = SweeperSettings { interval, reap_rate: NonZeroU32::new(rate), ..SweeperSettings::default() };
    db.sweeper_paced("http://127.0.0.1:9", "reaper-test", EngineSettings::default(), Duration::from_secs(1), sweeping)
}

/// The reaper keeps to its rate: at 200 keys/s (batches of 20, one every 100 ms) a pass of a
/// 1 s interval reaps for 0.8 s, so it takes at most 8 batches of a 1 000-key backlog and leaves
/// the rest to the next passes; unpaced, a pass takes the rest at once.
#[tokio::test]
async fn the_reaper_keeps_to_its_rate() {
    let app = database().await;
    app.customer("acme").await;
    expired_keys(&app.pool, "acme", 1_000).await;

    let paced = reaper_at(&app, 200, Duration::from_secs(1)).sweep().await.reaped;
    assert!((20..=160).contains(&paced), "one paced pass reaped {paced} keys");
    assert_eq!(expired_left(&app.pool).await, 1_000 - paced as i64);

    let unpaced = reaper_at(&app, 0, Duration::from_secs(60)).sweep().await.reaped;
    assert_eq!(unpaced, 1_000 - paced);
    assert_eq!(expired_left(&app.pool).await, 0);
}

/// Shutdown during a paced reaping ends it at the next batch instead of waiting out the pass: at
/// 10 keys/s (a key every 100 ms) a 2 s pass would reap for 1.6 s, 16 keys; stopped once the
/// first key has gone, the sweeper reaps one or two more (at most 8 on a slow machine).
#[tokio::test]
async fn shutdown_cuts_a_paced_reaping_short() {
    let app = database().await;
    app.customer("acme").await;
    expired_keys(&app.pool, "acme", 1_000).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sweeper = tokio::spawn(reaper_at(&app, 10, Duration::from_secs(2)).run(async {
        let _ = stopped.await;
    }));
    while expired_left(&app.pool).await == 1_000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    stop.send(()).unwrap();
    sweeper.await.unwrap();

    let reaped = 1_000 - expired_left(&app.pool).await;
    assert!(reaped <= 8, "the pass went on reaping after the shutdown: {reaped} of 16 keys");
}

/// A payment for a fresh key is not held up by the reaper working through a large backlog: every
/// payment sent while it reaps is answered 201, and the backlog was still there when the last
/// one was answered (they ran during the reaping, not after it).
#[tokio::test]
async fn payments_complete_while_the_reaper_works_through_a_backlog() {
    let app = TestApp::spawn().await;
    let api_key = app.customer("acme").await;
    expired_keys(&app.db, "acme", 60_000).await;
    let reaper = engine(&app.db);
    let reaping = tokio::spawn(async move {
        let mut total = 0;
        loop {
            let reaped = reaper.reap_expired(500).await.unwrap();
            total += reaped;
            if reaped < 500 {
                return total;
            }
        }
    });
    while expired_left(&app.db).await == 60_000 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    for _ in 0..5 {
        let response = app.post_payment(&api_key, Some(&new_key()), &payment(700)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let left = expired_left(&app.db).await;

    assert!(left > 0, "the reaper finished before the payments: make the backlog larger");
    // (The server's own sweeper may have reaped some of them too.)
    assert!(reaping.await.unwrap() > 0);
    assert_eq!(expired_left(&app.db).await, 0);
}
