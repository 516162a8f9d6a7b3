//! The original design's claim and completion, a baseline driven by
//! [`super::throughput`]. (The other baselines: pgbench's ceilings in
//! [`super::ceilings`], graphile-worker in [`super::graphile`].)

use anyhow::Result;
use leasekeeper_core::lease::Holder;
use sqlx::{Connection, PgConnection};

/// The original design's claim: in one transaction, the `offset`-th pending
/// task by `scheduled_at`, locked and waited for (`FOR UPDATE`, no `SKIP
/// LOCKED`), then its lease in a separate statement, then the task row.
pub(super) async fn original_claim(
    conn: &mut PgConnection,
    me: &Holder,
    offset: i64,
) -> Result<Option<(i64, i64)>> {
    let mut tx = conn.begin().await?;
    let id: Option<i64> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE status = 'pending' AND scheduled_at <= now()
          ORDER BY scheduled_at LIMIT 1 OFFSET $1 FOR UPDATE",
    )
    .bind(offset)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        tx.commit().await?;
        return Ok(None);
    };
    let token: Option<i64> = sqlx::query_scalar(
        "INSERT INTO leases AS l (resource, holder, expires_at, ttl_ms, fencing_token)
         VALUES ('task:' || $1, $2, now() + interval '30 s', 30000, 1)
         ON CONFLICT (resource) DO UPDATE
            SET holder = EXCLUDED.holder, acquired_at = now(), released_at = NULL,
                expires_at = EXCLUDED.expires_at, renew_count = 0,
                fencing_token = l.fencing_token + 1
          WHERE l.expires_at <= now()
         RETURNING fencing_token",
    )
    .bind(id)
    .bind(me.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(token) = token else {
        tx.rollback().await?;
        return Ok(None);
    };
    sqlx::query(
        "UPDATE tasks SET status = 'started', processor = $2, fencing_token = $3,
                started_at = now(), last_heartbeat_at = now(),
                must_heartbeat_before = now() + interval '30 s', attempts = attempts + 1
          WHERE id = $1",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some((id, token)))
}

/// The original design's completion: the task row, then the lease release.
pub(super) async fn original_complete(
    conn: &mut PgConnection,
    me: &Holder,
    id: i64,
    token: i64,
) -> Result<()> {
    let mut tx = conn.begin().await?;
    sqlx::query(
        "UPDATE tasks SET status = 'processed', processed_at = now(), must_heartbeat_before = NULL
          WHERE id = $1 AND processor = $2 AND fencing_token = $3 AND status = 'started'",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE leases SET released_at = now(), expires_at = now()
          WHERE resource = 'task:' || $1 AND holder = $2 AND fencing_token = $3",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}
