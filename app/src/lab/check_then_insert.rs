//! `check-then-insert`: the naive claim, kept to be watched failing. It *will* charge twice.
//!
//! ```text
//! A: select … → absent            A: insert, charge ─────────────► 201
//! B:   select … → absent            B: insert, charge ───────────► 201   (a second charge)
//! ```
//!
//! Both requests check before either inserts; nothing unique stops the second insert (the
//! `lab_keys_unique` index leaves this strategy out on purpose), and like most hand-rolled code
//! it sends the gateway a downstream key of its own row, so the gateway cannot catch it either.
//! The race needs no help under real load; [`super::LabSettings::gap`] (50 ms by default,
//! `PAYONCE_LAB_GAP_MS`) pauses between the check and the insert so that a storm of duplicates
//! double charges every time, which a lab needs and a test can rely on.
//!
//! The fix the workshop asks for: `create unique index … on lab_keys (customer_id, key) where
//! strategy = 'check-then-insert'`. The loser's insert then fails (a unique violation, answered
//! 409) before it charges: the database decides, which is what `on-conflict` does in one
//! statement.
//!
//! A crash between the insert and the completion leaves the row `processing` for ever: every retry
//! is answered 409, nobody finishes it. There is no lease.

use std::time::Duration;

use super::store::{self, KeyRow};
use super::{Lab, LabAnswer, LabError, Strategy, downstream_key};
use crate::gateway::Gateway;
use crate::idempotency::Operation;

/// Runs `op`: check, pause, insert, charge.
pub async fn submit(lab: &Lab, pool: &sqlx::PgPool, gateway: &Gateway, op: &Operation) -> Result<LabAnswer, LabError> {
    let request = store::request(op)?;
    // 1. Check. A completed row (any of them, if the race already left several) is replayed.
    let found = sqlx::query_as!(
        KeyRow,
        r#"
        select id, fingerprint, state, fence, response_status, response_headers, response_body
        from lab_keys
        where strategy = 'check-then-insert' and customer_id = $1 and key = $2
        order by state = 'completed' desc, created_at
        limit 1
        "#,
        op.customer_id,
        op.key.as_str(),
    )
    .fetch_optional(pool)
    .await?;
    if let Some(row) = found {
        return match row.replay(op)? {
            Some(answer) => Ok(answer),
            None => Err(LabError::Busy { retry_after: Duration::from_secs(1), reason: "in_flight" }),
        };
    }
    // 2. The window every duplicate that checked meanwhile walks through.
    tokio::time::sleep(lab.settings().gap).await;
    // 3. Insert: nothing unique here, so it succeeds for every one of them.
    let id = uuid::Uuid::now_v7();
    let inserted = sqlx::query!(
        r#"
        insert into lab_keys (id, strategy, customer_id, key, fingerprint)
        values ($1, 'check-then-insert', $2, $3, $4)
        "#,
        id,
        op.customer_id,
        op.key.as_str(),
        op.fingerprint.as_bytes().as_slice(),
    )
    .execute(pool)
    .await;
    match inserted.map_err(LabError::from) {
        Ok(_) => {}
        // The workshop's fix is in place: the database decided against us.
        Err(err) if store::is_unique_violation(&err) => {
            return Err(LabError::Busy { retry_after: Duration::from_secs(1), reason: "in_flight" });
        }
        Err(err) => return Err(err),
    }
    // 4. Charge, with a downstream key of this row: a new one for each duplicate.
    match store::charge(gateway, op, &request, id, downstream_key(Strategy::CheckThenInsert, id)).await {
        Ok(charged) => {
            store::complete(pool, id, 0, &charged).await?;
            Ok(LabAnswer { stored: charged.response, replayed: false })
        }
        Err(err) => {
            // No answer from the gateway: forget the attempt, so a retry checks afresh.
            sqlx::query!("delete from lab_keys where id = $1", id).execute(pool).await?;
            Err(err)
        }
    }
}
