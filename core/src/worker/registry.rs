//! The `workers` table: every SQL statement that reads or changes it.
//!
//! Workers report themselves on every state change and heartbeat (see
//! [`Report`]); the fleet marks the ones it kills. The table is for
//! watching only: no correctness decision reads it (the task's lease and
//! fencing token decide who may write).

use super::{Report, WorkerInfo, WorkerKind, WorkerState};
use crate::lease::Holder;
use sqlx::PgConnection;
use std::time::Duration;

/// Columns of a [`WorkerInfo`], with the ages computed by the database
/// clock. `$1` is the liveness window in milliseconds.
const WORKER_COLUMNS: &str = "id, instance_id, kind, state, task_id, fencing_token, \
    last_heartbeat_at, last_seen_at, started_at, tasks_done, tasks_abandoned, \
    (EXTRACT(EPOCH FROM (now() - last_heartbeat_at)) * 1000)::bigint AS heartbeat_age_ms, \
    (EXTRACT(EPOCH FROM (now() - last_seen_at)) * 1000)::bigint AS last_seen_age_ms, \
    (state NOT IN ('crashed', 'stopped') \
     AND last_seen_at > now() - make_interval(secs => $1::float8 / 1000)) AS alive";

/// The most workers [`list`] returns (the newest first): chaos crashes add
/// a row each, so a long demo would otherwise grow the list without bound.
pub const LIST_LIMIT: i64 = 500;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How long a worker counts as alive after its last report: two lease TTLs
/// (idle workers report every heartbeat interval, at most a TTL apart).
pub fn alive_window(lease_ttl: Duration) -> Duration {
    lease_ttl.saturating_mul(2)
}

/// Records `report` for worker `id`, creating its row on first sight
/// (`alive` in the answer judged with `lease_ttl`).
/// Answers the row, or `None` when the report was refused: the id belongs
/// to a worker of the other kind, or (unless the report is `fresh`) the
/// worker was already marked crashed or stopped.
pub async fn record(
    conn: &mut PgConnection,
    id: &Holder,
    kind: WorkerKind,
    instance_id: Option<&str>,
    report: &Report,
    lease_ttl: Duration,
) -> Result<Option<WorkerInfo>, sqlx::Error> {
    let _announced = crate::live::announce_on_return(crate::live::Topics::WORKERS);
    // Race prevented: a report a killed worker had already sent landing
    // after the fleet marked it crashed. Only a fresh run may revive a
    // crashed or stopped row; an http process may never take over the row
    // of a simulated worker (or the reverse).
    sqlx::query_as(&format!(
        "INSERT INTO workers AS w (id, instance_id, kind, state, task_id, fencing_token,
                                   last_heartbeat_at, tasks_done, tasks_abandoned)
         VALUES ($2, $3, $4, $5, $6, $7, CASE WHEN $8 THEN now() END, $9, $10)
         ON CONFLICT (id) DO UPDATE
            SET instance_id = EXCLUDED.instance_id, state = EXCLUDED.state,
                task_id = EXCLUDED.task_id, fencing_token = EXCLUDED.fencing_token,
                last_heartbeat_at = CASE WHEN $8 THEN now()
                                         WHEN $11 THEN NULL
                                         ELSE w.last_heartbeat_at END,
                last_seen_at = now(),
                started_at = CASE WHEN $11 THEN now() ELSE w.started_at END,
                tasks_done = EXCLUDED.tasks_done, tasks_abandoned = EXCLUDED.tasks_abandoned
          WHERE w.kind = EXCLUDED.kind AND ($11 OR w.state NOT IN ('crashed', 'stopped'))
         RETURNING {WORKER_COLUMNS}"
    ))
    .bind(millis(alive_window(lease_ttl)))
    .bind(id.as_str())
    .bind(instance_id)
    .bind(kind)
    .bind(report.state)
    .bind(report.task_id)
    .bind(report.fencing_token)
    .bind(report.heartbeat)
    .bind(report.tasks_done)
    .bind(report.tasks_abandoned)
    .bind(report.fresh)
    .fetch_optional(&mut *conn)
    .await
}

/// Marks worker `id` as `state` (the fleet's record of a kill, a crash or a
/// shutdown), keeping the task and token it held when it stopped.
pub async fn mark(
    conn: &mut PgConnection,
    id: &str,
    state: WorkerState,
) -> Result<(), sqlx::Error> {
    let _announced = crate::live::announce_on_return(crate::live::Topics::WORKERS);
    sqlx::query("UPDATE workers SET state = $2, last_seen_at = now() WHERE id = $1")
        .bind(id)
        .bind(state)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Worker `id`, if any; `alive` judged with `lease_ttl`.
pub async fn get(
    conn: &mut PgConnection,
    id: &str,
    lease_ttl: Duration,
) -> Result<Option<WorkerInfo>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers WHERE id = $2"
    ))
    .bind(millis(alive_window(lease_ttl)))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
}

/// The newest [`LIST_LIMIT`] workers, newest first; `alive` judged with `lease_ttl`.
pub async fn list(
    conn: &mut PgConnection,
    lease_ttl: Duration,
) -> Result<Vec<WorkerInfo>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers ORDER BY started_at DESC, id LIMIT $2"
    ))
    .bind(millis(alive_window(lease_ttl)))
    .bind(LIST_LIMIT)
    .fetch_all(&mut *conn)
    .await
}

/// The alive workers (at most [`LIST_LIMIT`]), newest first; `alive` judged
/// with `lease_ttl`. For the overview, which counts them and says what each holds.
pub async fn list_alive(
    conn: &mut PgConnection,
    lease_ttl: Duration,
) -> Result<Vec<WorkerInfo>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT * FROM (SELECT {WORKER_COLUMNS} FROM workers) w
          WHERE alive ORDER BY started_at DESC, id LIMIT $2"
    ))
    .bind(millis(alive_window(lease_ttl)))
    .bind(LIST_LIMIT)
    .fetch_all(&mut *conn)
    .await
}

/// The ids of instance `instance_id`'s workers that have not stopped or
/// crashed (idle, working or paused), as last recorded.
pub async fn running_ids(
    conn: &mut PgConnection,
    instance_id: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM workers WHERE instance_id = $1 AND state IN ('idle', 'working', 'paused')",
    )
    .bind(instance_id)
    .fetch_all(&mut *conn)
    .await
}
