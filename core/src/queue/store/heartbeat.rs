//! Heartbeats: a claim extended (the task row, which is its lease), one
//! claim or many in one statement.

use super::guard::{refuse_alone, update_claim};
use super::sql::STARTED;
use super::{MAX_BATCH, TASK_COLUMNS, TaskError, millis};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::Task;
use sqlx::PgConnection;
use std::time::Duration;

/// Extends the claim on task `id` by `ttl`.
/// Refused (and recorded) unless `processor` holds the current claim.
pub async fn heartbeat(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    ttl: Duration,
) -> Result<Task, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(
                crate::live::Topics::TASKS | crate::live::Topics::LEASES,
            );
            // Race prevented: a heartbeat from a processor whose claim expired,
            // racing the takeover by another worker (see `update_claim`).
            let ms = millis(ttl);
            let (tx, task) = update_claim(
                conn,
                schema,
                id,
                processor,
                token,
                "heartbeat",
                "last_heartbeat_at = now(),
             must_heartbeat_before = now() + make_interval(secs => $4::float8 / 1000)",
                |q| q.bind(ms),
            )
            .await?;
            tx.commit().await?;
            Ok(task)
        }
        .await
    )
}

/// Extends many claims at once, each `(task id, fencing token, processor)`,
/// by `ttl`: one statement, one commit, what
/// a runtime's heartbeats of all its tasks cost. Answers each claim's
/// outcome, in their order: the task with its new deadline, or why it was
/// refused, each refusal recorded like a refused [`heartbeat`].
pub async fn heartbeat_each(
    conn: &mut PgConnection,
    schema: &Schema,
    beats: &[(i64, i64, Holder)],
    ttl: Duration,
) -> Result<Vec<Result<Task, TaskError>>, TaskError> {
    crate::db::atomically!(conn, schema, async {
        let _announced =
            crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
        if beats.len() > MAX_BATCH {
            return Err(TaskError::BadInput(format!(
                "a batch heartbeats at most {MAX_BATCH} claims, not {}",
                beats.len()
            )));
        }
        let mut ordered: Vec<&(i64, i64, Holder)> = beats.iter().collect();
        ordered.sort_unstable_by_key(|b| (b.0, b.1));
        let ids: Vec<i64> = ordered.iter().map(|b| b.0).collect();
        let tokens: Vec<i64> = ordered.iter().map(|b| b.1).collect();
        let processors: Vec<&str> = ordered.iter().map(|b| b.2.as_str()).collect();
        // Race prevented: heartbeats from processors whose claims expired,
        // racing takeovers by other workers (as `heartbeat`, for many claims).
        // The UPDATE locks each task row (in id order: two batches never
        // deadlock) and re-checks processor, token, status and deadline on its
        // newest version, so a claim taken over is never renewed.
        let started = std::time::Instant::now();
        let renewed: Vec<Task> = schema
            .query_as(&format!(
                "WITH beat AS (
                SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[]) AS b(id, token, processor)
             ), renewed AS (
                UPDATE $schema.tasks t
                   SET last_heartbeat_at = now(),
                       must_heartbeat_before = now() + make_interval(secs => $4::float8 / 1000)
                  FROM beat
                 WHERE t.id = beat.id AND t.processor = beat.processor AND t.fencing_token = beat.token
                   AND {STARTED} AND t.must_heartbeat_before > now()
                RETURNING t.*
             )
             SELECT {TASK_COLUMNS} FROM renewed ORDER BY id"
            ))
            .bind(&ids)
            .bind(&tokens)
            .bind(&processors)
            .bind(millis(ttl))
            .fetch_all(&mut *conn)
            .await?;
        crate::metrics::renewed(started.elapsed(), renewed.len());
        let mut accepted: std::collections::HashMap<(i64, i64), Task> = renewed
            .into_iter()
            .map(|t| ((t.id, t.fencing_token.unwrap_or_default()), t))
            .collect();
        let mut outcomes = Vec::with_capacity(beats.len());
        for (id, token, processor) in beats {
            outcomes.push(match accepted.remove(&(*id, *token)) {
                Some(task) => Ok(task),
                None => Err(refuse_alone(conn, schema, *id, processor, *token, "heartbeat").await?),
            });
        }
        Ok(outcomes)
    }
    .await)
}
