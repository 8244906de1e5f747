//! `redis`: the key's lease in Redis, the payment still in PostgreSQL.
//!
//! 1. A completed key in PostgreSQL is replayed without asking Redis.
//! 2. A fencing token: `INCR payonce:lab:fence` (it only grows, while Redis keeps its data).
//! 3. The lease: `SET payonce:lab:lease:<customer>:<key> <token> NX PX <lease>`. Not set: another
//!    request holds the key (409, `Retry-After` from its `PTTL`).
//! 4. Under the lease, the key's row is taken in PostgreSQL *with the token*: inserted, or taken
//!    over if its fence is lower. A row fenced higher belongs to a newer holder: 409.
//! 5. The gateway call; then the payment and the answer are stored only `where fence = token`.
//! 6. The lease is released by a Lua compare-and-delete: only if it still holds *our* token (a
//!    plain `DEL` would free a lease that ran out and was taken by someone else meanwhile).
//!
//! Redis is the lock, not the truth. A lease runs out while its holder is slow (a `PX` shorter
//! than a gateway call), and on a Redis restart without persistence (`--save "" --appendonly no`)
//! every lease vanishes at once and the fencing counter starts again from 1. What then keeps a
//! payment single is PostgreSQL: the fence on the row refuses a second holder's write (a holder
//! with a token from before the restart still finishes; one from after it, with a lower token,
//! is refused for that key until the counter passes it), and the downstream idempotency key, the
//! same for every holder, makes the gateway replay a second call instead of charging again.
//! docs/strategies.md measures it.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Script, cmd};

use super::store::{self, KeyRow};
use super::{Lab, LabAnswer, LabError, Strategy, downstream_key, stable_id};
use crate::gateway::Gateway;
use crate::idempotency::Operation;

/// The counter every fencing token is drawn from.
const FENCE_KEY: &str = "payonce:lab:fence";

/// Deletes the lease only if it still holds our token.
const RELEASE: &str = r"
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
";

impl Lab {
    /// The Redis connection, opened on first use (a server that never runs the redis strategy
    /// never connects). It reconnects by itself after Redis restarts; meanwhile commands fail
    /// fast (503) instead of waiting.
    pub async fn redis(&self) -> Result<ConnectionManager, LabError> {
        let manager = self
            .redis
            .get_or_try_init(|| async {
                let client = ::redis::Client::open(self.settings.redis_url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(Some(Duration::from_secs(2)))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                client.get_connection_manager_with_config(config).await
            })
            .await?;
        Ok(manager.clone())
    }
}

/// The Redis key of a customer's idempotency key's lease.
fn lease_key(op: &Operation) -> String {
    format!("payonce:lab:lease:{}:{}", op.customer_id.simple(), op.key.as_str())
}

/// Runs `op` under a Redis lease.
pub async fn submit(lab: &Lab, pool: &sqlx::PgPool, gateway: &Gateway, op: &Operation) -> Result<LabAnswer, LabError> {
    if let Some(row) = find(pool, op).await?
        && let Some(answer) = row.replay(op)?
    {
        return Ok(answer);
    }
    let mut redis = lab.redis().await?;
    // The first command after Redis restarted finds the old connection dead (and the manager
    // reconnects): nothing was done yet, so trying once more is safe.
    let token: i64 = match cmd("INCR").arg(FENCE_KEY).query_async(&mut redis).await {
        Err(err) if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            cmd("INCR").arg(FENCE_KEY).query_async(&mut redis).await?
        }
        other => other?,
    };
    let lease = lease_key(op);
    let lease_ms = lab.settings().redis_lease.as_millis().max(1) as u64;
    let taken: Option<String> =
        cmd("SET").arg(&lease).arg(token).arg("NX").arg("PX").arg(lease_ms).query_async(&mut redis).await?;
    if taken.is_none() {
        let left_ms: i64 = cmd("PTTL").arg(&lease).query_async(&mut redis).await.unwrap_or(1000);
        let retry_after = Duration::from_millis(left_ms.max(1000) as u64);
        return Err(LabError::Busy { retry_after, reason: "in_flight" });
    }
    let result = holding(pool, gateway, op, token).await;
    let released: Result<i64, _> = Script::new(RELEASE).key(&lease).arg(token).invoke_async(&mut redis).await;
    match released {
        Ok(1) => {}
        Ok(_) => tracing::warn!(key = op.key.as_str(), token, "the redis lease ran out before it was released"),
        Err(err) => tracing::warn!(key = op.key.as_str(), token, error = %err, "could not release the redis lease"),
    }
    result
}

/// The work, while this request holds the lease with `token`.
async fn holding(pool: &sqlx::PgPool, gateway: &Gateway, op: &Operation, token: i64) -> Result<LabAnswer, LabError> {
    let request = store::request(op)?;
    // Take the row with our token: a new row, or one left processing by a holder with a lower
    // token (it died, or its lease ran out). The unique index makes this one statement.
    let taken = sqlx::query_scalar!(
        r#"
        insert into lab_keys (id, strategy, customer_id, key, fingerprint, fence)
        values ($1, 'redis', $2, $3, $4, $5)
        on conflict (strategy, customer_id, key) where strategy <> 'check-then-insert'
        do update set fence = excluded.fence
            where lab_keys.state = 'processing' and lab_keys.fence < excluded.fence
              and lab_keys.fingerprint = excluded.fingerprint
        returning id
        "#,
        uuid::Uuid::now_v7(),
        op.customer_id,
        op.key.as_str(),
        op.fingerprint.as_bytes().as_slice(),
        token,
    )
    .fetch_optional(pool)
    .await?;
    let Some(id) = taken else {
        // Completed meanwhile (replay), another payload (422), or fenced by a newer holder (409).
        let row = find(pool, op).await?.ok_or_else(|| LabError::Corrupt("a redis key vanished".into()))?;
        let fence = row.fence;
        return match row.replay(op)? {
            Some(answer) => Ok(answer),
            None => {
                tracing::info!(key = op.key.as_str(), token, fence, "fenced out by a newer holder");
                Err(LabError::Busy { retry_after: Duration::from_secs(1), reason: "fenced" })
            }
        };
    };
    let seed = stable_id(Strategy::Redis, op);
    let charged = store::charge(gateway, op, &request, seed, downstream_key(Strategy::Redis, seed)).await?;
    if store::complete(pool, id, token, &charged).await? {
        return Ok(LabAnswer { stored: charged.response, replayed: false });
    }
    // A newer holder took the row while we charged (our lease ran out): its answer is the key's.
    match find(pool, op).await?.map(|row| row.replay(op)).transpose()?.flatten() {
        Some(answer) => Ok(answer),
        None => Err(LabError::Busy { retry_after: Duration::from_secs(1), reason: "fenced" }),
    }
}

async fn find(pool: &sqlx::PgPool, op: &Operation) -> Result<Option<KeyRow>, LabError> {
    Ok(sqlx::query_as!(
        KeyRow,
        r#"
        select id, fingerprint, state, fence, response_status, response_headers, response_body
        from lab_keys
        where strategy = 'redis' and customer_id = $1 and key = $2
        "#,
        op.customer_id,
        op.key.as_str(),
    )
    .fetch_optional(pool)
    .await?)
}
