//! `for-update`: the textbook transaction. `BEGIN; SELECT … FOR UPDATE`; if absent, `INSERT`;
//! call the gateway; store the answer; `COMMIT`. The transaction, and so the row lock, is held
//! across the gateway call.
//!
//! What it gets right: a crash anywhere rolls everything back and releases the lock (there is
//! no lease to wait out and no sweeper to run), and a duplicate *waits* for the first request and
//! is then replayed, instead of being answered 409.
//!
//! What it costs, and why it works at all (docs/strategies.md):
//! - **PostgreSQL does not lock a row that does not exist.** There is no "gap lock" (InnoDB's
//!   next-key lock): while the first request's row is uncommitted it is invisible, so every
//!   duplicate's `SELECT … FOR UPDATE` finds nothing, locks nothing and goes on to insert. What
//!   stops it is the unique index `lab_keys_unique`: the duplicate's `INSERT` waits on the first
//!   transaction, then fails with a unique violation once it commits, and the duplicate looks
//!   again, finding the completed row. Without the index this *is* check-then-insert.
//! - **The pool drains under a slow gateway.** Every request in flight holds a pooled connection
//!   for the whole gateway call, and every duplicate holds one more while it waits on the index.
//!   With a pool of 16 and a 2 s gateway, at most 16 payments are in flight at once, everything
//!   else (other keys, the dashboard, the readiness probe) queues for a connection and times out
//!   (503), and a duplicate that waits longer than `lock_timeout` gives up with a 503 too.
//! - The row vanishes with a rolled-back transaction, so the downstream key and the payment id
//!   are derived from the customer's key ([`super::stable_id`]), not from the row: the retry after
//!   a crash sends the gateway the same request, which replays it instead of charging again.

use super::store::{self, KeyRow};
use super::{LabAnswer, LabError, Strategy, downstream_key, stable_id};
use crate::gateway::Gateway;
use crate::idempotency::Operation;

/// Runs `op` in one transaction held across the gateway call.
pub async fn submit(pool: &sqlx::PgPool, gateway: &Gateway, op: &Operation) -> Result<LabAnswer, LabError> {
    match attempt(pool, gateway, op).await {
        // We waited on the unique index behind a duplicate, which committed: its row is visible now.
        Err(err) if store::is_unique_violation(&err) => attempt(pool, gateway, op).await,
        other => other,
    }
}

async fn attempt(pool: &sqlx::PgPool, gateway: &Gateway, op: &Operation) -> Result<LabAnswer, LabError> {
    let request = store::request(op)?;
    let mut tx = pool.begin().await?;
    let found = sqlx::query_as!(
        KeyRow,
        r#"
        select id, fingerprint, state, fence, response_status, response_headers, response_body
        from lab_keys
        where strategy = 'for-update' and customer_id = $1 and key = $2
        for update
        "#,
        op.customer_id,
        op.key.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(row) = found {
        // Only committed rows are visible, and this strategy commits only completed ones.
        let answer = row.replay(op)?.ok_or_else(|| LabError::Corrupt("a for-update key left processing".into()))?;
        tx.commit().await?;
        return Ok(answer);
    }
    // Absent: nothing was locked (PostgreSQL has no gap locks). This insert is where a duplicate
    // waits, on the unique index, until the first transaction ends.
    let id = uuid::Uuid::now_v7();
    sqlx::query!(
        r#"
        insert into lab_keys (id, strategy, customer_id, key, fingerprint)
        values ($1, 'for-update', $2, $3, $4)
        "#,
        id,
        op.customer_id,
        op.key.as_str(),
        op.fingerprint.as_bytes().as_slice(),
    )
    .execute(&mut *tx)
    .await?;
    let seed = stable_id(Strategy::ForUpdate, op);
    // The gateway call, inside the transaction: the connection stays checked out meanwhile.
    // An error drops `tx`, which rolls back: the key is free again, nothing is stored.
    let charged = store::charge(gateway, op, &request, seed, downstream_key(Strategy::ForUpdate, seed)).await?;
    if !store::complete(&mut *tx, id, 0, &charged).await? {
        return Err(LabError::Corrupt("a for-update key changed under its own transaction".into()));
    }
    tx.commit().await?;
    Ok(LabAnswer { stored: charged.response, replayed: false })
}
