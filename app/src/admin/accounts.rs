//! Operators: their passwords, and the rate limit on failed logins.
//!
//! Passwords are hashed with argon2id (the `argon2` crate's defaults: 19 MiB, 2 passes, OWASP's
//! recommendation) into a PHC string that carries its own salt and parameters. Hashing and
//! verifying run on the blocking pool: each takes tens of milliseconds of CPU on purpose.
//!
//! The rate limit lives in the database (`admin_login_failures`), so it holds however many
//! servers share it: at most [`MAX_FAILURES_PER_PAIR`] failures for one name from one address,
//! and [`MAX_FAILURES_PER_ADDRESS`] for any names from one address, in [`WINDOW`]. Past that the
//! login answers 429 with `Retry-After` *before* looking at the password, so a blocked attacker
//! learns nothing and costs no hashing.

use std::sync::LazyLock;
use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use sqlx::PgPool;
use uuid::Uuid;

/// Failed logins for one name from one address before the login is refused.
pub const MAX_FAILURES_PER_PAIR: i64 = 5;
/// Failed logins from one address, whatever the names, before the login is refused.
pub const MAX_FAILURES_PER_ADDRESS: i64 = 20;
/// How long a failure counts.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// The shortest password `payonce admins create` accepts.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// The longest: argon2 would take any length, but nobody types more, and a huge one is a DoS.
const MAX_PASSWORD_BYTES: usize = 1024;

/// Why an operator could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(
        "an admin name is 1 to 64 characters: lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
    )]
    InvalidName,
    #[error("the password must be at least {MIN_PASSWORD_CHARS} characters long")]
    PasswordTooShort,
    #[error("the password must be at most {MAX_PASSWORD_BYTES} bytes long")]
    PasswordTooLong,
    #[error("an admin named {0:?} already exists")]
    Exists(String),
    #[error("could not hash the password: {0}")]
    Hash(String),
    #[error(transparent)]
    Database(sqlx::Error),
}

/// Whether `name` is a valid operator name (the `admins.name` check, in Rust).
pub fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    first_ok
        && name.len() <= 64
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
}

/// Creates an operator.
pub async fn create(pool: &PgPool, name: &str, password: &str) -> Result<Uuid, CreateError> {
    if !valid_name(name) {
        return Err(CreateError::InvalidName);
    }
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(CreateError::PasswordTooShort);
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(CreateError::PasswordTooLong);
    }
    let password = password.to_owned();
    let hash = tokio::task::spawn_blocking(move || hash(&password))
        .await
        .map_err(|err| CreateError::Hash(err.to_string()))??;
    let id = Uuid::now_v7();
    let inserted = sqlx::query!(
        "insert into admins (id, name, password_hash) values ($1, $2, $3) on conflict (name) do nothing",
        id,
        name,
        hash,
    )
    .execute(pool)
    .await
    .map_err(CreateError::Database)?;
    if inserted.rows_affected() == 0 {
        return Err(CreateError::Exists(name.to_owned()));
    }
    Ok(id)
}

fn hash(password: &str) -> Result<String, CreateError> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|hash| hash.to_string())
        .map_err(|err| CreateError::Hash(err.to_string()))
}

/// A hash of a random password: verified against when the name does not exist, so that a
/// wrong name takes as long as a wrong password and timing does not reveal which names exist.
static DECOY: LazyLock<String> = LazyLock::new(|| {
    let mut random = [0u8; 32];
    let _ = getrandom::fill(&mut random);
    hash(&hex::encode(random)).unwrap_or_default()
});

/// Whether `password` is the password of operator `name`.
pub async fn verify(pool: &PgPool, name: &str, password: &str) -> sqlx::Result<bool> {
    let stored =
        sqlx::query_scalar!("select password_hash from admins where name = $1", name).fetch_optional(pool).await?;
    let known = stored.is_some();
    let stored = stored.unwrap_or_else(|| DECOY.clone());
    let password = password.to_owned();
    let matches = tokio::task::spawn_blocking(move || {
        password.len() <= MAX_PASSWORD_BYTES
            && PasswordHash::new(&stored)
                .is_ok_and(|hash| Argon2::default().verify_password(password.as_bytes(), &hash).is_ok())
    })
    .await
    .unwrap_or(false);
    Ok(known && matches)
}

/// How long until `name` may try again from `client_ip`; `None` if it may now.
pub async fn blocked_for(pool: &PgPool, name: &str, client_ip: &str) -> sqlx::Result<Option<Duration>> {
    // Blocked while the Nth most recent failure is still inside the window; free when it leaves.
    let secs = sqlx::query_scalar!(
        r#"
        select ceil(extract(epoch from greatest(
            (select failed_at from admin_login_failures
              where name = $1 and client_ip = $2 and failed_at > now() - $3 * interval '1 second'
              order by failed_at desc offset $4 limit 1),
            (select failed_at from admin_login_failures
              where client_ip = $2 and failed_at > now() - $3 * interval '1 second'
              order by failed_at desc offset $5 limit 1)
        ) + $3 * interval '1 second' - now()))::int8 as retry_after
        "#,
        name,
        client_ip,
        WINDOW.as_secs_f64(),
        MAX_FAILURES_PER_PAIR - 1,
        MAX_FAILURES_PER_ADDRESS - 1,
    )
    .fetch_one(pool)
    .await?;
    Ok(secs.map(|secs| Duration::from_secs(secs.max(1) as u64)))
}

/// Records a failed login (and forgets failures too old to matter).
pub async fn record_failure(pool: &PgPool, name: &str, client_ip: &str) -> sqlx::Result<()> {
    sqlx::query!(
        r#"
        with forget as (
            delete from admin_login_failures where failed_at < now() - $3 * interval '1 second'
        )
        insert into admin_login_failures (name, client_ip) values ($1, $2)
        "#,
        name,
        client_ip,
        WINDOW.as_secs_f64(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Forgets the failures of a name from an address after it signed in.
pub async fn clear_failures(pool: &PgPool, name: &str, client_ip: &str) -> sqlx::Result<()> {
    sqlx::query!("delete from admin_login_failures where name = $1 and client_ip = $2", name, client_ip)
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names follow the `admins.name` check.
    #[test]
    fn names() {
        for good in ["alice", "ops-1", "a", "j.doe_2"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "Alice", "-ops", "a b", "é", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    /// A hash verifies its password and no other.
    #[test]
    fn hashes_verify() {
        let stored = hash("correct horse battery").unwrap();
        let parsed = PasswordHash::new(&stored).unwrap();
        assert!(stored.starts_with("$argon2id$"));
        assert!(Argon2::default().verify_password(b"correct horse battery", &parsed).is_ok());
        assert!(Argon2::default().verify_password(b"correct horse batterz", &parsed).is_err());
    }
}
