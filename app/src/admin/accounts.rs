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
//! learns nothing and costs no hashing. An attempt is counted before its password is checked
//! ([`admit`]), so simultaneous attempts cannot all slip under the limit.
//!
//! Password checks are bounded too ([`verify`]): a few at a time, whatever the number of
//! addresses they come from, so that a flood of sign-ins costs waiting, not memory.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use argon2::password_hash::PasswordHasher;
use argon2::password_hash::phc::PasswordHash;
use argon2::{Algorithm, Argon2, Block, Params, Version};
use sqlx::PgPool;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;
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

/// What checking a password found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It is `name`'s password.
    Right,
    /// It is not (or there is no such operator).
    Wrong,
    /// No check could start within the wait: too many are running.
    Busy,
}

/// Whether `password` is the password of operator `name`. At most `turns`' permits of checks run
/// at once (each holds argon2's 19 MiB for tens of milliseconds of CPU); a check that cannot
/// start within `wait` is not made, and the answer is [`Verdict::Busy`].
pub async fn verify(
    pool: &PgPool,
    turns: &Arc<Semaphore>,
    wait: Duration,
    name: &str,
    password: &str,
) -> sqlx::Result<Verdict> {
    let stored =
        sqlx::query_scalar!("select password_hash from admins where name = $1", name).fetch_optional(pool).await?;
    let known = stored.is_some();
    let stored = stored.unwrap_or_else(|| DECOY.clone());
    let Ok(Ok(turn)) = tokio::time::timeout(wait, turns.clone().acquire_owned()).await else {
        return Ok(Verdict::Busy);
    };
    let password = password.to_owned();
    let matches = tokio::task::spawn_blocking(move || {
        // The turn ends with the check, not with the request: a client that hangs up does not
        // free a turn while its check still runs.
        let _turn = turn;
        password.len() <= MAX_PASSWORD_BYTES && matches(password.as_bytes(), &stored)
    })
    .await
    .unwrap_or(false);
    Ok(if known && matches { Verdict::Right } else { Verdict::Wrong })
}

/// argon2's working memory (19 MiB per check with the default parameters), kept from one check
/// to the next. At most as many checks run at once as [`verify`]'s turns allow, so at most that
/// many buffers ever exist: the memory of password checks is fixed, not left to the allocator
/// (a buffer freed on one of the many blocking threads stays in that thread's arena, and a burst
/// of checks spread over them once kept hundreds of MiB resident).
static MEMORY: Mutex<Vec<Vec<Block>>> = Mutex::new(Vec::new());

/// Whether `password` hashes to the PHC string `stored`: argon2's own verification, computed in
/// a buffer from [`MEMORY`].
fn matches(password: &[u8], stored: &str) -> bool {
    let Ok(hash) = PasswordHash::new(stored) else { return false };
    let (Some(salt), Some(expected)) = (&hash.salt, &hash.hash) else { return false };
    let (Ok(algorithm), Ok(params)) = (Algorithm::try_from(hash.algorithm.as_str()), Params::try_from(&hash)) else {
        return false;
    };
    let Ok(version) = hash.version.map_or(Ok(Version::default()), Version::try_from) else { return false };
    let buffers = || MEMORY.lock().unwrap_or_else(PoisonError::into_inner);
    let mut memory = buffers().pop().unwrap_or_default();
    memory.resize(params.block_count(), Block::new());
    let mut computed = vec![0u8; expected.len()];
    let hashed = Argon2::new(algorithm, version, params).hash_password_into_with_memory(
        password,
        salt,
        &mut computed,
        &mut memory[..],
    );
    // What is kept for the next check holds nothing of this one.
    memory.fill(Block::new());
    buffers().push(memory);
    hashed.is_ok() && bool::from(computed.as_slice().ct_eq(expected.as_bytes()))
}

/// A sign-in attempt the rate limit let through. It is already recorded as a failure: a right
/// password clears it ([`clear_failures`]), a wrong one leaves it, a check that never ran takes
/// it back ([`cancel`]).
#[derive(Debug)]
pub struct Attempt {
    id: i64,
}

/// What the rate limit says about a new attempt.
#[derive(Debug)]
pub enum Admission {
    Admitted(Attempt),
    /// Blocked for this long (until the oldest counting failure leaves the window).
    Refused {
        retry_after: Duration,
    },
}

/// Admits a sign-in attempt of `name` from `client_ip`, or refuses it, *before* its password is
/// checked. The attempt is recorded as a failure in the same statement that counts, and the
/// attempts of one address are admitted one at a time (a transaction-scoped advisory lock on the
/// address, held for the two statements only): a burst of simultaneous guesses therefore counts
/// each other, and no more of them are checked than the limits allow.
pub async fn admit(pool: &PgPool, name: &str, client_ip: &str) -> sqlx::Result<Admission> {
    let mut tx = pool.begin().await?;
    sqlx::query("select pg_advisory_xact_lock(hashtextextended('payonce.admin_login:' || $1, 0))")
        .bind(client_ip)
        .execute(&mut *tx)
        .await?;
    // Blocked while the Nth most recent failure is still inside the window; free when it leaves.
    let row = sqlx::query!(
        r#"
        with forget as (
            delete from admin_login_failures where failed_at < now() - $3 * interval '1 second'
        ),
        blocked as (
            select ceil(extract(epoch from greatest(
                (select failed_at from admin_login_failures
                  where name = $1 and client_ip = $2 and failed_at > now() - $3 * interval '1 second'
                  order by failed_at desc offset $4 limit 1),
                (select failed_at from admin_login_failures
                  where client_ip = $2 and failed_at > now() - $3 * interval '1 second'
                  order by failed_at desc offset $5 limit 1)
            ) + $3 * interval '1 second' - now()))::int8 as retry_after
        ),
        admitted as (
            insert into admin_login_failures (name, client_ip)
            select $1, $2 from blocked where retry_after is null
            returning id
        )
        select (select retry_after from blocked) as retry_after, (select id from admitted) as id
        "#,
        name,
        client_ip,
        WINDOW.as_secs_f64(),
        MAX_FAILURES_PER_PAIR - 1,
        MAX_FAILURES_PER_ADDRESS - 1,
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(match (row.id, row.retry_after) {
        (Some(id), _) => Admission::Admitted(Attempt { id }),
        (None, secs) => Admission::Refused { retry_after: Duration::from_secs(secs.unwrap_or(1).max(1) as u64) },
    })
}

/// Takes back an attempt whose password was never checked (the checks were busy).
pub async fn cancel(pool: &PgPool, attempt: Attempt) -> sqlx::Result<()> {
    sqlx::query!("delete from admin_login_failures where id = $1", attempt.id).execute(pool).await?;
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

    /// A hash verifies its password and no other, with argon2's own verification and with ours
    /// (which reuses its memory); a malformed hash verifies nothing.
    #[test]
    fn hashes_verify() {
        use argon2::password_hash::PasswordVerifier;
        let stored = hash("correct horse battery").unwrap();
        let parsed = PasswordHash::new(&stored).unwrap();
        assert!(stored.starts_with("$argon2id$"));
        assert!(Argon2::default().verify_password(b"correct horse battery", &parsed).is_ok());
        assert!(Argon2::default().verify_password(b"correct horse batterz", &parsed).is_err());
        for _ in 0..2 {
            assert!(matches(b"correct horse battery", &stored));
            assert!(!matches(b"correct horse batterz", &stored));
        }
        let other_params = Argon2::new(Algorithm::Argon2i, Version::V0x10, Params::new(8, 1, 1, Some(16)).unwrap())
            .hash_password(b"pw")
            .unwrap()
            .to_string();
        assert!(matches(b"pw", &other_params) && !matches(b"pX", &other_params));
        assert!(!matches(b"pw", "$argon2id$v=19$m=8,t=1,p=1$bm9zYWx0$") && !matches(b"pw", "not a hash"));
    }
}
