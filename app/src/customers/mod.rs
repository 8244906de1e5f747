//! Customers of the API and their keys.
//!
//! [`Authenticator`] checks the API key of every request. It remembers a successful check for
//! [`AUTH_CACHE_TTL`], so a retry storm or a replay benchmark does not pay a database round trip
//! per request for it. The price: a customer deleted from the database keeps working for up to
//! that long in each process (payonce has no key revocation yet; when it gets one, it should
//! clear the caches).

pub mod api_key;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use uuid::Uuid;

pub use api_key::ApiKey;

/// A customer's public id: `cus_` and the hex of its uuid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CustomerId(pub Uuid);

impl CustomerId {
    /// Reads `cus_` and 32 hex digits.
    pub fn parse(s: &str) -> Option<Self> {
        let hex = s.strip_prefix("cus_")?;
        (hex.len() == 32).then(|| Uuid::try_parse(hex).ok().map(Self)).flatten()
    }
}

impl std::fmt::Display for CustomerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cus_{}", self.0.simple())
    }
}

/// An authenticated customer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Customer {
    pub id: Uuid,
    pub name: String,
}

/// Why a customer could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("a customer name must be 1 to 200 characters")]
    InvalidName,
    #[error("the operating system's random number generator failed: {0}")]
    Random(getrandom::Error),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Creates a customer and returns it with its API key, the only time the key is ever visible.
pub async fn create(pool: &PgPool, name: &str) -> Result<(Customer, ApiKey), CreateError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(CreateError::InvalidName);
    }
    let key = ApiKey::generate().map_err(CreateError::Random)?;
    let id = Uuid::now_v7();
    let digest = key.digest();
    sqlx::query!(
        "insert into customers (id, name, api_key_lookup, api_key_sha256) values ($1, $2, $3, $4)",
        id,
        name,
        key.lookup(),
        digest.as_slice(),
    )
    .execute(pool)
    .await?;
    Ok((Customer { id, name: name.to_owned() }, key))
}

/// The customer whose API key was presented, if any.
pub async fn authenticate(pool: &PgPool, presented: &str) -> sqlx::Result<Option<Customer>> {
    let Some(lookup) = api_key::lookup_of(presented) else {
        return Ok(None);
    };
    let row = sqlx::query!("select id, name, api_key_sha256 from customers where api_key_lookup = $1", lookup)
        .fetch_optional(pool)
        .await?;
    Ok(row
        .filter(|row| api_key::matches(presented, &row.api_key_sha256))
        .map(|row| Customer { id: row.id, name: row.name }))
}

/// How long a successful authentication is remembered.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(30);
/// The most keys remembered at once; beyond that the cache is emptied and refilled.
const AUTH_CACHE_ENTRIES: usize = 10_000;

/// Checks API keys, remembering recent successes (never failures: a stream of wrong keys must
/// not push the right ones out).
pub struct Authenticator {
    pool: PgPool,
    /// SHA-256 of a presented key → its customer and when it was checked. Keyed by the digest so
    /// the cache never holds a key itself.
    recent: Mutex<HashMap<[u8; 32], (Customer, Instant)>>,
}

impl Authenticator {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, recent: Mutex::new(HashMap::new()) }
    }

    /// The customer whose API key was presented, if any.
    pub async fn authenticate(&self, presented: &str) -> sqlx::Result<Option<Customer>> {
        let digest = api_key::digest(presented);
        if let Some((customer, checked)) = self.lock().get(&digest)
            && checked.elapsed() < AUTH_CACHE_TTL
        {
            return Ok(Some(customer.clone()));
        }
        let customer = authenticate(&self.pool, presented).await?;
        if let Some(customer) = &customer {
            let mut recent = self.lock();
            if recent.len() >= AUTH_CACHE_ENTRIES {
                recent.retain(|_, (_, checked)| checked.elapsed() < AUTH_CACHE_TTL);
                if recent.len() >= AUTH_CACHE_ENTRIES {
                    recent.clear();
                }
            }
            recent.insert(digest, (customer.clone(), Instant::now()));
        }
        Ok(customer)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (Customer, Instant)>> {
        // The map holds plain data: a panic elsewhere cannot leave it inconsistent.
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
