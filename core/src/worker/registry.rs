//! The `workers` table: registering, reporting and reading workers.
//! (Retention deletes dead ones: `maintenance`.)
//!
//! Workers report themselves on every state change and heartbeat (see
//! [`Report`]); the fleet marks the ones it kills. The table is for
//! watching only: no correctness decision reads it (the task's lease and
//! fencing token decide who may write).

use super::{Report, WorkerInfo, WorkerKind, WorkerState};
use crate::db::Schema;
use crate::lease::Holder;
use sqlx::PgConnection;
use std::time::Duration;

/// Columns of a [`WorkerInfo`], with the ages computed by the database
/// clock. `$1` is the liveness window in milliseconds.
const WORKER_COLUMNS: &str = "id, seq, instance_id, kind, state, task_id, fencing_token, \
    last_heartbeat_at, last_seen_at, started_at, tasks_done, tasks_abandoned, \
    (EXTRACT(EPOCH FROM (now() - last_heartbeat_at)) * 1000)::bigint AS heartbeat_age_ms, \
    (EXTRACT(EPOCH FROM (now() - last_seen_at)) * 1000)::bigint AS last_seen_age_ms, \
    (state NOT IN ('crashed', 'stopped') \
     AND last_seen_at > now() - make_interval(secs => $1::float8 / 1000)) AS alive";

/// The most workers [`list_alive`] returns (the newest first): chaos
/// crashes add a row each, so a long demo could otherwise grow the list
/// without bound.
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
    schema: &Schema,
    id: &Holder,
    kind: WorkerKind,
    instance_id: Option<&str>,
    report: &Report,
    lease_ttl: Duration,
) -> Result<Option<WorkerInfo>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<WorkerInfo>, sqlx::Error>,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::WORKERS);
            // Race prevented: a report a killed worker had already sent landing
            // after the fleet marked it crashed. Only a fresh run may revive a
            // crashed or stopped row; an http process may never take over the row
            // of a simulated worker (or the reverse).
            schema
                .query_as(&format!(
            "INSERT INTO $schema.workers AS w (id, instance_id, kind, state, task_id, fencing_token,
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
        .await
    )
}

/// Records many workers' reports in one statement (what a runtime's
/// reporter writes every few hundred milliseconds: the newest report of
/// each of its workers), creating rows on first sight. The same rules as
/// [`record`]: a report is refused for a worker of another kind, and
/// (unless `fresh`) for a worker already marked crashed or stopped.
/// Answers how many rows were written.
pub async fn record_each(
    conn: &mut PgConnection,
    schema: &Schema,
    kind: WorkerKind,
    instance_id: Option<&str>,
    reports: &[(Holder, Report)],
) -> Result<u64, sqlx::Error> {
    crate::db::atomically!(conn, schema, async {
        let _announced = crate::live::announce_on_return(crate::live::Topics::WORKERS);
        let mut ordered: Vec<&(Holder, Report)> = reports.iter().collect();
        ordered.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        ordered.dedup_by(|a, b| a.0 == b.0);
        let ids: Vec<&str> = ordered.iter().map(|(id, _)| id.as_str()).collect();
        let states: Vec<WorkerState> = ordered.iter().map(|(_, r)| r.state).collect();
        let task_ids: Vec<Option<i64>> = ordered.iter().map(|(_, r)| r.task_id).collect();
        let tokens: Vec<Option<i64>> = ordered.iter().map(|(_, r)| r.fencing_token).collect();
        let beats: Vec<bool> = ordered.iter().map(|(_, r)| r.heartbeat).collect();
        let done: Vec<i64> = ordered.iter().map(|(_, r)| r.tasks_done).collect();
        let abandoned: Vec<i64> = ordered.iter().map(|(_, r)| r.tasks_abandoned).collect();
        let fresh: Vec<bool> = ordered.iter().map(|(_, r)| r.fresh).collect();
        // Races prevented, as in `record`: a report a killed worker had already
        // sent landing after the fleet marked it crashed (only a fresh run
        // revives a crashed or stopped row), and a worker of one kind taking
        // over the row of another. Rows are updated in id order, so two
        // reporters never deadlock; a row another reporter inserts meanwhile
        // is left alone (ON CONFLICT DO NOTHING) and this report of it is lost,
        // to be replaced by the next.
        let written: i64 = schema.query_scalar(
            "WITH r AS (
                SELECT * FROM unnest($3::text[], $4::text[], $5::int8[], $6::int8[], $7::bool[],
                                     $8::int8[], $9::int8[], $10::bool[])
                           AS r(id, state, task_id, fencing_token, heartbeat, done, abandoned, fresh)
             ), updated AS (
                UPDATE $schema.workers w
                   SET instance_id = $2, state = r.state, task_id = r.task_id,
                       fencing_token = r.fencing_token,
                       last_heartbeat_at = CASE WHEN r.heartbeat THEN now()
                                                WHEN r.fresh THEN NULL
                                                ELSE w.last_heartbeat_at END,
                       last_seen_at = now(),
                       started_at = CASE WHEN r.fresh THEN now() ELSE w.started_at END,
                       tasks_done = r.done, tasks_abandoned = r.abandoned
                  FROM r
                 WHERE w.id = r.id AND w.kind = $1 AND (r.fresh OR w.state NOT IN ('crashed', 'stopped'))
                RETURNING w.id
             ), inserted AS (
                INSERT INTO $schema.workers (id, instance_id, kind, state, task_id, fencing_token,
                                     last_heartbeat_at, tasks_done, tasks_abandoned)
                SELECT r.id, $2, $1, r.state, r.task_id, r.fencing_token,
                       CASE WHEN r.heartbeat THEN now() END, r.done, r.abandoned
                  FROM r
                 WHERE NOT EXISTS (SELECT 1 FROM $schema.workers w WHERE w.id = r.id)
                 ORDER BY r.id
                ON CONFLICT (id) DO NOTHING
                RETURNING id
             )
             SELECT (SELECT count(*) FROM updated) + (SELECT count(*) FROM inserted)",
        )
        .bind(kind)
        .bind(instance_id)
        .bind(&ids)
        .bind(&states)
        .bind(&task_ids)
        .bind(&tokens)
        .bind(&beats)
        .bind(&done)
        .bind(&abandoned)
        .bind(&fresh)
        .fetch_one(&mut *conn)
        .await?;
        Ok(u64::try_from(written).unwrap_or(0))
    }
    .await)
}

/// Marks worker `id` as `state` (the fleet's record of a kill, a crash or a
/// shutdown), keeping the task and token it held when it stopped.
pub async fn mark(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    state: WorkerState,
) -> Result<(), sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::WORKERS);
            schema
                .query("UPDATE $schema.workers SET state = $2, last_seen_at = now() WHERE id = $1")
                .bind(id)
                .bind(state)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }
        .await
    )
}

/// Worker `id`, if any; `alive` judged with `lease_ttl`.
pub async fn get(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    lease_ttl: Duration,
) -> Result<Option<WorkerInfo>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<WorkerInfo>, sqlx::Error>,
        async {
            schema
                .query_as(&format!(
                    "SELECT {WORKER_COLUMNS} FROM $schema.workers WHERE id = $2"
                ))
                .bind(millis(alive_window(lease_ttl)))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
        }
        .await
    )
}

/// A page of the workers, newest (first recorded last) first; `alive`
/// judged with `lease_ttl`.
pub async fn list_page(
    conn: &mut PgConnection,
    schema: &Schema,
    lease_ttl: Duration,
    cursor: crate::paging::Cursor,
) -> Result<crate::paging::Paged<WorkerInfo>, sqlx::Error> {
    crate::db::atomically!(conn, schema, async {
        let rows = schema
            .query_as(&format!(
                "SELECT {WORKER_COLUMNS} FROM $schema.workers WHERE seq < $2 ORDER BY seq DESC LIMIT $3"
            ))
            .bind(millis(alive_window(lease_ttl)))
            .bind(cursor.bound())
            .bind(cursor.limit)
            .fetch_all(&mut *conn)
            .await?;
        Ok(crate::paging::Paged::of(rows, cursor, |w: &WorkerInfo| {
            w.seq
        }))
    }
    .await)
}

/// The alive workers (at most [`LIST_LIMIT`]), newest first; `alive` judged
/// with `lease_ttl`. For the overview, which counts them and says what each holds.
pub async fn list_alive(
    conn: &mut PgConnection,
    schema: &Schema,
    lease_ttl: Duration,
) -> Result<Vec<WorkerInfo>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<WorkerInfo>, sqlx::Error>,
        async {
            schema
                .query_as(&format!(
                    "SELECT * FROM (SELECT {WORKER_COLUMNS} FROM $schema.workers) w
              WHERE alive ORDER BY started_at DESC, id LIMIT $2"
                ))
                .bind(millis(alive_window(lease_ttl)))
                .bind(LIST_LIMIT)
                .fetch_all(&mut *conn)
                .await
        }
        .await
    )
}

/// The ids of instance `instance_id`'s workers that have not stopped or
/// crashed (idle, working or paused), as last recorded.
pub async fn running_ids(
    conn: &mut PgConnection,
    schema: &Schema,
    instance_id: &str,
) -> Result<Vec<String>, sqlx::Error> {
    crate::db::atomically!(conn, schema, async {
        schema.query_scalar(
            "SELECT id FROM $schema.workers WHERE instance_id = $1 AND state IN ('idle', 'working', 'paused')",
        )
        .bind(instance_id)
        .fetch_all(&mut *conn)
        .await
    }
    .await)
}
