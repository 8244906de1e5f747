//! The database: the connection pool, the migrations, and the zero-config local PostgreSQL.

pub mod local;

use std::path::PathBuf;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::secret::Secret;
use local::{LocalPostgres, LocalPostgresError};

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// The database the zero-config cluster serves payonce from.
const LOCAL_DATABASE: &str = "payonce";

/// How long a request waits for a pooled connection (or, while the database is unreachable, for
/// a new one to connect) before answering 503. Short, so that an outage turns into quick, honest
/// errors instead of requests piling up; long enough to ride out a burst that fills the pool.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// An open database, and the local server behind it if payonce started one.
pub struct Database {
    pub pool: PgPool,
    /// Where the dashboard's read-only pages read (`PAYONCE_READ_REPLICA_URL`, else `pool`).
    pub reads: Reads,
    local: Option<LocalPostgres>,
}

/// Where the dashboard's read-only views (the overview, a payment's page) read: a replica when
/// `PAYONCE_READ_REPLICA_URL` names one, else the primary. Every claim and every read of a key
/// (the API's, and the dashboard's keys pages, whose actions are fenced by what they show) goes
/// to the primary: a key looked up on a replica that lags is the classic double charge, the retry
/// not seeing the first request's key (docs/strategies.md). So does the gateway audit, which
/// compares the ledger with the payments as they are now.
#[derive(Clone)]
pub struct Reads {
    pool: PgPool,
    replica: bool,
}

impl Reads {
    /// Reads on the primary itself.
    pub fn primary(pool: PgPool) -> Self {
        Self { pool, replica: false }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// How far behind the primary the replica is, in seconds (`None` when reading the primary):
    /// zero when it has replayed all it received, else the age of the last transaction it
    /// replayed.
    pub async fn lag(&self) -> sqlx::Result<Option<f64>> {
        if !self.replica {
            return Ok(None);
        }
        sqlx::query_scalar(
            "select case when pg_last_wal_receive_lsn() is not distinct from pg_last_wal_replay_lsn() then 0
                         else coalesce(extract(epoch from now() - pg_last_xact_replay_timestamp())::float8, 0) end",
        )
        .fetch_one(&self.pool)
        .await
        .map(Some)
    }
}

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Local(#[from] LocalPostgresError),
    #[error("could not connect to the database: {0}")]
    Connect(#[source] sqlx::Error),
    #[error("could not apply the migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl Database {
    /// Connects to `DATABASE_URL`, or starts (or reuses) the local PostgreSQL, and applies the
    /// migrations.
    pub async fn open(config: &DatabaseConfig) -> Result<Self, OpenError> {
        let (url, local) = match &config.url {
            Some(url) => (url.expose().to_owned(), None),
            None => {
                let local = LocalPostgres::start(&config.local_dir.join("postgres")).await?;
                (local.url(LOCAL_DATABASE), Some(local))
            }
        };
        let opened = async {
            if let Some(local) = &local {
                create_database_if_missing(local).await.map_err(OpenError::Connect)?;
            }
            let pool = connect_and_migrate(&url, config).await?;
            let reads = match &config.read_replica_url {
                None => Reads::primary(pool.clone()),
                Some(replica) => {
                    let options: PgConnectOptions = replica.expose().parse().map_err(OpenError::Connect)?;
                    // A few connections for the dashboard; lazily, so that a replica that is down
                    // fails the pages that read it, never the API.
                    let pool = PgPoolOptions::new()
                        .max_connections(config.pool_size.clamp(1, 4))
                        .acquire_timeout(ACQUIRE_TIMEOUT)
                        .connect_lazy_with(options.application_name("payonce-reads").options(session_settings(config)));
                    Reads { pool, replica: true }
                }
            };
            Ok((pool, reads))
        };
        match opened.await {
            Ok((pool, reads)) => Ok(Self { pool, reads, local }),
            Err(err) => {
                // Leave no server behind that nobody will stop.
                if let Some(local) = local
                    && let Err(stop_err) = local.stop().await
                {
                    tracing::warn!(error = %stop_err, "could not stop the local PostgreSQL");
                }
                Err(err)
            }
        }
    }

    /// The URL of payonce's database on the local PostgreSQL under `local_dir`, on the port it
    /// remembers, without starting anything (`payonce db url`); `None` before its first start.
    pub fn local_url(local_dir: &std::path::Path) -> Option<String> {
        LocalPostgres::remembered_url(&local_dir.join("postgres"), LOCAL_DATABASE)
    }

    /// Starts the local PostgreSQL under `local_dir` if it is not running (on the port it
    /// remembers), creates payonce's database if needed, and returns its URL; the server is left
    /// running (`payonce db start`).
    pub async fn start_local(local_dir: &std::path::Path) -> Result<String, OpenError> {
        let local = LocalPostgres::start(&local_dir.join("postgres")).await?;
        create_database_if_missing(&local).await.map_err(OpenError::Connect)?;
        Ok(local.url(LOCAL_DATABASE))
    }

    /// Stops the local PostgreSQL under `local_dir`, whoever started it (`payonce db stop`).
    pub async fn stop_local(local_dir: &std::path::Path, immediate: bool) -> Result<(), OpenError> {
        Ok(LocalPostgres::stop_folder(&local_dir.join("postgres"), immediate).await?)
    }

    /// Closes the pool and stops the local PostgreSQL if this process started it.
    pub async fn close(self) {
        self.pool.close().await;
        self.reads.pool.close().await;
        if let Some(local) = self.local
            && let Err(err) = local.stop().await
        {
            tracing::warn!(error = %err, "could not stop the local PostgreSQL");
        }
    }
}

async fn connect_and_migrate(url: &str, config: &DatabaseConfig) -> Result<PgPool, OpenError> {
    let options: PgConnectOptions = url.parse().map_err(OpenError::Connect)?;
    let options = options.application_name("payonce");
    // Migrations run on a connection of their own, without the pool's timeouts: a migration may
    // rightly take long, and sqlx serialises concurrent migrators with an advisory lock that a
    // second server starting at the same time must be able to wait for.
    let mut migrator = PgConnection::connect_with(&options).await.map_err(OpenError::Connect)?;
    let migrated = MIGRATOR.run(&mut migrator).await;
    // The coming days' partitions of the history tables, before anything writes a row there: a
    // deployment that ran no sweeper for a while must not start with its days missing.
    let days = match migrated {
        Ok(()) => crate::retention::add_days_ahead(&mut migrator).await.map_err(OpenError::Connect),
        Err(err) => Err(err.into()),
    };
    let _ = migrator.close().await;
    days?;
    connect(options, config).await.map_err(OpenError::Connect)
}

/// A pool of up to `config.pool_size` connections, each with the session settings payonce's
/// statements are written for. A connection opened before this process last met a read-only
/// server ([`ReadOnlySeen`]) is closed instead of handed out: after a failover, connections that
/// reached the old primary (now a standby) give way to new ones, which reach the new primary.
async fn connect(options: PgConnectOptions, config: &DatabaseConfig) -> sqlx::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(config.pool_size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .before_acquire(|_, meta| Box::pin(async move { Ok(!READ_ONLY_SEEN.retires(meta.age)) }))
        .connect_with(options.options(session_settings(config)))
        .await
}

/// When this process last had a write refused by a read-only server (SQLSTATE 25006): its
/// connection reached a node that a failover had just demoted to a standby (or a standby behind a
/// load balancer that has not noticed yet). Every connection older than that is suspect: the
/// pool retires them on their next acquire, so it heals without a restart, whatever sits between
/// payonce and the database (HAProxy also cuts such sessions: docs/ha.md).
pub struct ReadOnlySeen {
    /// Milliseconds since [`Self::epoch`] when it was last seen, plus one (0: never).
    at: std::sync::atomic::AtomicU64,
    epoch: std::sync::OnceLock<std::time::Instant>,
}

static READ_ONLY_SEEN: ReadOnlySeen =
    ReadOnlySeen { at: std::sync::atomic::AtomicU64::new(0), epoch: std::sync::OnceLock::new() };

impl ReadOnlySeen {
    fn since_epoch(&self) -> Duration {
        self.epoch.get_or_init(std::time::Instant::now).elapsed()
    }

    fn note(&self) {
        let now = u64::try_from(self.since_epoch().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        self.at.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a connection of this age was opened before the last read-only refusal.
    fn retires(&self, age: Duration) -> bool {
        match self.at.load(std::sync::atomic::Ordering::Relaxed) {
            0 => false,
            at => age > self.since_epoch().saturating_sub(Duration::from_millis(at - 1)),
        }
    }
}

/// Set at connection start (the startup packet's `options`), so they hold from the first
/// statement and override whatever the database or role defaults to.
fn session_settings(config: &DatabaseConfig) -> [(&'static str, String); 3] {
    [
        // The claim (INSERT … ON CONFLICT, then a look at the existing row) and every fenced
        // update are written for READ COMMITTED: under REPEATABLE READ a concurrent conflicting
        // claim fails with a serialization error (40001) instead of seeing the winner's row.
        // (A space in `options` separates arguments unless escaped, and sqlx does not escape.)
        ("default_transaction_isolation", r"read\ committed".to_owned()),
        ("statement_timeout", config.statement_timeout.as_millis().to_string()),
        ("lock_timeout", config.lock_timeout.as_millis().to_string()),
    ]
}

/// What a database error means for the request that met it. One classification, shared by the
/// API's problems and the pages' error pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The database is unreachable, starting, shutting down, out of resources, or (mid-failover)
    /// a standby that refuses writes. Nothing is wrong with the request: retry later.
    Unavailable,
    /// A statement or a lock wait ran out of time (`statement_timeout`, `lock_timeout`), or lost
    /// a deadlock: the database is busy. Retry later.
    Busy,
    /// The database refused a value (SQLSTATE class 22, data exception: a NUL byte in text, a
    /// number out of range, …). The same request fails the same way every time.
    BadData,
    /// Anything else: a bug.
    Bug,
}

impl Failure {
    /// The classification of `err`. A read-only refusal (25006) is also noted, so that the pool
    /// retires the connections that may lead to the demoted server ([`ReadOnlySeen`]).
    pub fn of(err: &sqlx::Error) -> Self {
        match err {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => Self::Unavailable,
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // 57014: canceled (statement_timeout); 55P03: lock_not_available (lock_timeout);
                // 40P01: deadlock detected; 40001: serialization failure.
                Some("57014" | "55P03" | "40P01" | "40001") => Self::Busy,
                // 25006: read_only_sql_transaction, a write that reached a standby: mid-failover.
                Some("25006") => {
                    READ_ONLY_SEEN.note();
                    Self::Unavailable
                }
                // Class 08: connection exception; 57P0x: the server is shutting down or starting
                // up; class 53: insufficient resources (e.g. too many connections).
                Some(code) if code.starts_with("08") || code.starts_with("57P0") || code.starts_with("53") => {
                    Self::Unavailable
                }
                Some(code) if code.starts_with("22") => Self::BadData,
                _ => Self::Bug,
            },
            _ => Self::Bug,
        }
    }
}

/// Whether PostgreSQL can store `text` in a `text` or `jsonb` column: not if it holds a NUL
/// character (text refuses the byte, jsonb the `\u0000` escape). Other characters are fine in a
/// UTF-8 database, and a lone surrogate cannot reach a Rust string.
pub fn can_store(text: &str) -> bool {
    !text.contains('\0')
}

async fn create_database_if_missing(local: &LocalPostgres) -> sqlx::Result<()> {
    let mut admin = sqlx::PgConnection::connect(&local.url("postgres")).await?;
    let exists: bool = sqlx::query_scalar("select exists (select 1 from pg_database where datname = $1)")
        .bind(LOCAL_DATABASE)
        .fetch_one(&mut admin)
        .await?;
    if !exists {
        // Two processes may race here; the loser's "already exists" is success too.
        match sqlx::query(&format!("create database {LOCAL_DATABASE}")).execute(&mut admin).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(err)) if matches!(err.code().as_deref(), Some("42P04" | "23505")) => {}
            Err(err) => return Err(err),
        }
    }
    admin.close().await
}

/// Where the data lives.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `DATABASE_URL`. When absent, a private PostgreSQL is started under `local_dir`.
    pub url: Option<Secret>,
    /// The folder of the zero-config PostgreSQL (its data lives in `local_dir/postgres`).
    pub local_dir: PathBuf,
    /// The most connections the pool opens.
    pub pool_size: u32,
    /// `statement_timeout` of every pooled connection (zero: none). Below the gateway timeout, so
    /// that a stuck statement ends as a 503 long before a client gives up.
    pub statement_timeout: Duration,
    /// `lock_timeout` of every pooled connection (zero: none): a statement waiting this long for
    /// a lock gives up, so waiters cannot drain the pool behind one long lock.
    pub lock_timeout: Duration,
    /// `PAYONCE_READ_REPLICA_URL`: a standby the dashboard's read-only pages may read from, with
    /// its lag shown. Never used for a key's claim or read, nor any write (docs/ha.md).
    pub read_replica_url: Option<Secret>,
}
