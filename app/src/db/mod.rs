//! The database: the connection pool, the migrations, and the zero-config local PostgreSQL.

pub mod local;

use std::time::Duration;

use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::DatabaseConfig;
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
    local: Option<LocalPostgres>,
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
            connect_and_migrate(&url, config.pool_size).await
        };
        match opened.await {
            Ok(pool) => Ok(Self { pool, local }),
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

    /// Closes the pool and stops the local PostgreSQL if this process started it.
    pub async fn close(self) {
        self.pool.close().await;
        if let Some(local) = self.local
            && let Err(err) = local.stop().await
        {
            tracing::warn!(error = %err, "could not stop the local PostgreSQL");
        }
    }
}

async fn connect_and_migrate(url: &str, size: u32) -> Result<PgPool, OpenError> {
    let pool = connect(url, size).await.map_err(OpenError::Connect)?;
    MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// A pool of up to `size` connections.
async fn connect(url: &str, size: u32) -> sqlx::Result<PgPool> {
    let options: PgConnectOptions = url.parse()?;
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.application_name("payonce"))
        .await
}

async fn create_database_if_missing(local: &LocalPostgres) -> sqlx::Result<()> {
    use sqlx::Connection;
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
