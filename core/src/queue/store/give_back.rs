//! Giving back claims a worker never started on (a runtime's prefetched
//! tasks, see [`crate::worker::batch`]): many in one transaction, each
//! task pending again at its old place in the queue, its attempt not
//! counted, its lease released, and its history saying so.

use super::guard::refuse_alone;
use super::sql::STARTED;
use super::{MAX_BATCH, TASK_COLUMNS, TaskError, bounded_error};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::Task;
use sqlx::{Connection, PgConnection};

/// Gives back the claims `(task id, fencing token, processor)`, none of
/// which a handler has run: each task goes back to pending, claimable at
/// once and at its old place in the queue (its `scheduled_at` is kept),
/// with its attempt count back by one, its lease released. Its history
/// records it: the attempt ends as `given_back` (with `why` as its error),
/// and `lease_events` has a `given_back` row (detail `{"reason": why}`)
/// after the lease's `released` one. One transaction of two statements,
/// one commit, for up to [`MAX_BATCH`] claims.
///
/// Answers each claim's outcome, in their order: the task as it now is, or
/// why it was refused (the claim is no longer current: its lease ran out,
/// another worker took it over, an operator cancelled it), each refusal
/// recorded like a refused [`heartbeat`](super::heartbeat).
pub async fn give_back_each(
    conn: &mut PgConnection,
    schema: &Schema,
    claims: &[(i64, i64, Holder)],
    why: &str,
) -> Result<Vec<Result<Task, TaskError>>, TaskError> {
    crate::db::atomically!(conn, schema, async {
        let _announced = crate::live::announce_on_return(
            crate::live::Topics::TASKS | crate::live::Topics::LEASES | crate::live::Topics::WORK,
        );
        if claims.len() > MAX_BATCH {
            return Err(TaskError::BadInput(format!(
                "a batch gives back at most {MAX_BATCH} claims, not {}",
                claims.len()
            )));
        }
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let why = bounded_error(why).into_owned();
        let mut ordered: Vec<&(i64, i64, Holder)> = claims.iter().collect();
        ordered.sort_unstable_by_key(|c| (c.0, c.1));
        let ids: Vec<i64> = ordered.iter().map(|c| c.0).collect();
        let tokens: Vec<i64> = ordered.iter().map(|c| c.1).collect();
        let processors: Vec<&str> = ordered.iter().map(|c| c.2.as_str()).collect();
        let mut tx = conn.begin().await?;
        // Race prevented: a give-back from a runtime whose waiting claim ran
        // out, racing the takeover by another worker (a waiting claim is
        // renewed in bulk; a renewal that came too late loses it). The
        // UPDATE locks each task row (in id order: two batches never
        // deadlock) and re-checks processor, token, status and deadline on
        // its newest version, as every processor write does (`HOLDS_CLAIM`):
        // once the deadline passed or a takeover committed (a new token),
        // the old claim's give-back changes nothing and is refused, so a
        // give-back never ends another term (the task row is the claim's
        // lease; the trigger records its release).
        let back: Vec<Task> = schema
            .query_as(&format!(
                "WITH claim AS (
                SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[]) AS c(id, token, processor)
             ), back AS (
                UPDATE $schema.tasks t
                   SET status = 'pending', attempts = GREATEST(t.attempts - 1, 0),
                       must_heartbeat_before = NULL
                  FROM claim
                 WHERE t.id = claim.id AND t.processor = claim.processor AND t.fencing_token = claim.token
                   AND {STARTED} AND t.must_heartbeat_before > now()
                RETURNING t.*
             )
             SELECT {TASK_COLUMNS} FROM back ORDER BY id"
            ))
            .bind(&ids)
            .bind(&tokens)
            .bind(&processors)
            .fetch_all(&mut *tx)
            .await?;
        if !back.is_empty() {
            // The attempts trigger closed each attempt as `snoozed` (its
            // count went back by one); say which it was, and record the
            // give-back in the lease's history, in the same transaction.
            // The ids are matched as an array too: attempts' primary key
            // then bounds the scan in any plan (a generic plan hash-joined a
            // scan of the whole table: 43 ms for 512 claims at a shutdown).
            let back_ids: Vec<i64> = back.iter().map(|t| t.id).collect();
            let back_tokens: Vec<i64> = back.iter().map(|t| t.fencing_token.unwrap_or_default()).collect();
            let back_processors: Vec<&str> =
                back.iter().map(|t| t.processor.as_deref().unwrap_or_default()).collect();
            schema
                .query(
                    "WITH b AS (
                        SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[]) AS b(id, token, processor)
                     ), recorded AS (
                        UPDATE $schema.attempts a SET outcome = 'given_back', error = $4
                          FROM b
                         WHERE a.task_id = ANY ($1::int8[])
                           AND a.task_id = b.id AND a.fencing_token = b.token AND a.outcome = 'snoozed'
                     )
                     INSERT INTO $schema.lease_events (resource, holder, fencing_token, kind, detail)
                     SELECT 'task:' || b.id, b.processor, b.token, 'given_back',
                            jsonb_build_object('reason', $4::text)
                       FROM b ORDER BY b.id",
                )
                .bind(&back_ids)
                .bind(&back_tokens)
                .bind(&back_processors)
                .bind(&why)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        let mut accepted: std::collections::HashMap<(i64, i64), Task> = back
            .into_iter()
            .map(|t| ((t.id, t.fencing_token.unwrap_or_default()), t))
            .collect();
        let mut outcomes = Vec::with_capacity(claims.len());
        for (id, token, processor) in claims {
            outcomes.push(match accepted.remove(&(*id, *token)) {
                Some(task) => Ok(task),
                None => Err(refuse_alone(conn, schema, *id, processor, *token, "give_back").await?),
            });
        }
        Ok(outcomes)
    }
    .await)
}
