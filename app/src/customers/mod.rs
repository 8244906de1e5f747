//! Customers of the API and their keys.

pub mod api_key;

use sqlx::PgPool;
use uuid::Uuid;

pub use api_key::ApiKey;

/// A customer's public id: `cus_` and the hex of its uuid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CustomerId(pub Uuid);

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
